"""Offline by default in the library: a name neither local nor cached fails at once, naming close names."""

from __future__ import annotations

import time

import pytest

from descentlab.data.hub import cached_names, check_hub_name, hub_mode, hub_online, nearest_names
from descentlab.errors import DataError, ModelError

FAST_S = 5.0  # the refusal needs no request; the hub client's retries took ~24 s for one dataset typo


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """A Hugging Face home with an empty cache, and no variable that opens the hub."""
    home = tmp_path / "hf"
    (home / "hub").mkdir(parents=True)
    (home / "datasets").mkdir()
    monkeypatch.setenv("HF_HOME", str(home))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", "DESCENTLAB_ONLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return home


def _timed(fn):
    start = time.perf_counter()
    with pytest.raises((DataError, ModelError)) as info:
        fn()
    return time.perf_counter() - start, str(info.value)


def test_a_dataset_name_typo_fails_at_once_naming_the_close_names(empty_cache) -> None:
    from descentlab.data import load_text_classification

    took, message = _timed(lambda: load_text_classification("imbd"))
    assert took < FAST_S, f"{took:.1f} s: the refusal must not wait for the network"
    assert "'imbd'" in message and "did you mean" in message and "'imdb'" in message, message
    assert "DESCENTLAB_ONLINE=1" in message and len(message.splitlines()) == 1


def test_an_image_dataset_typo_names_the_offline_name(empty_cache) -> None:
    from descentlab.data import load_image_classification

    took, message = _timed(lambda: load_image_classification("fashion_mnsit"))
    assert took < FAST_S and "'fashion_mnist'" in message, message


def test_a_model_name_typo_fails_at_once_naming_the_cached_model(empty_cache) -> None:
    from descentlab.data import load_causal_lm, load_encoder_classifier

    (empty_cache / "hub" / "models--HuggingFaceTB--SmolLM2-360M-Instruct").mkdir()
    took, message = _timed(lambda: load_causal_lm("HuggingFaceTB/SmolLM2-360M-Instrcut"))
    assert took < FAST_S, f"{took:.1f} s"
    assert isinstance(message, str) and "'HuggingFaceTB/SmolLM2-360M-Instruct'" in message, message
    took, message = _timed(lambda: load_encoder_classifier("roberta-bsae"))
    assert took < FAST_S and "'roberta-base'" in message, message


def test_the_alpaca_loader_and_the_token_cache_refuse_an_uncached_hub_id(empty_cache, tmp_path) -> None:
    from descentlab.data.instructions import load_alpaca
    from descentlab.data.token_cache import _iter_hub_texts

    took, message = _timed(lambda: load_alpaca("tatsu-lab/alpacca"))
    assert took < FAST_S and "'tatsu-lab/alpaca'" in message, message
    took, message = _timed(lambda: next(_iter_hub_texts("DKYoon/SlimPajama-6B", "train")))
    assert took < FAST_S and "neither a local path nor in the Hugging Face cache" in message, message


def test_a_cached_or_local_name_passes_offline_and_loads_without_requests(empty_cache, tmp_path) -> None:
    (empty_cache / "hub" / "datasets--stanfordnlp--imdb").mkdir()
    (empty_cache / "datasets" / "nyu-mll___glue").mkdir()
    (empty_cache / "datasets" / "json").mkdir()  # a builder's folder, not a dataset
    assert cached_names("dataset") == ["nyu-mll/glue", "stanfordnlp/imdb"]
    assert cached_names("model") == []
    # False: load it, with the hub client offline for the call
    assert check_hub_name("stanfordnlp/imdb", kind="dataset") is False
    assert check_hub_name("imdb", kind="dataset") is False  # a legacy id resolves to its owner's repo
    assert check_hub_name("nyu-mll/glue", kind="dataset") is False
    assert check_hub_name(str(tmp_path), kind="dataset") is False
    with pytest.raises(ModelError):  # a dataset in the cache is not a model
        check_hub_name("stanfordnlp/imdb", kind="model")


def test_the_environment_or_an_argument_opens_the_hub(empty_cache, monkeypatch) -> None:
    assert hub_online() is False
    assert check_hub_name("no/such-dataset", kind="dataset", online=True) is True
    monkeypatch.setenv("DESCENTLAB_ONLINE", "1")
    assert hub_online() is True and check_hub_name("no/such-dataset", kind="dataset") is True
    with pytest.raises(DataError):  # the explicit argument wins over the environment
        check_hub_name("no/such-dataset", kind="dataset", online=False)
    monkeypatch.delenv("DESCENTLAB_ONLINE")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what the CLI sets: still closed
    assert hub_online() is False
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # the hub client's own switch, set explicitly: open
    assert hub_online() is True


def test_hub_mode_switches_the_clients_for_the_block_only() -> None:
    import datasets.config
    import huggingface_hub.constants

    before = (huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE)
    with hub_mode(False):
        assert huggingface_hub.constants.is_offline_mode() and datasets.config.HF_HUB_OFFLINE
    with hub_mode(True):
        assert not huggingface_hub.constants.is_offline_mode() and not datasets.config.HF_HUB_OFFLINE
    with pytest.raises(RuntimeError), hub_mode(False):
        raise RuntimeError("restored on the way out too")
    assert before == (huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE)


def test_nearest_names_compares_hub_ids_by_their_last_part_too() -> None:
    known = ["stanfordnlp/imdb", "nyu-mll/glue", "rotten_tomatoes"]
    assert nearest_names("imbd", known) == ["stanfordnlp/imdb"]
    assert nearest_names("rotten_tomatos", known) == ["rotten_tomatoes"]
    assert nearest_names("zzzz", known) == []


def test_the_command_line_refuses_a_dataset_typo_at_once_with_exit_2(empty_cache, tmp_path, capsys) -> None:
    from descentlab.cli import main

    start = time.perf_counter()
    assert main(["run", "smoke", "--out", str(tmp_path / "runs"), "dataset=fashion_mnsit", "n_train=10"]) == 2
    took = time.perf_counter() - start
    err = capsys.readouterr().err.strip()
    assert took < FAST_S and len(err.splitlines()) == 1 and "did you mean 'fashion_mnist'" in err, err


def test_the_loader_reads_a_cached_name_offline_and_opens_the_hub_when_asked(
    empty_cache, monkeypatch
) -> None:
    """What the hub client is told at the moment ``datasets.load_dataset`` runs (the call is faked)."""
    import datasets
    import huggingface_hub.constants

    from descentlab.data import load_text_classification

    seen = []

    def fake_load_dataset(*args, **kwargs):
        seen.append((args[0], huggingface_hub.constants.is_offline_mode(), datasets.config.HF_HUB_OFFLINE))
        raise ValueError("faked")

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # as the CLI's environment sets it
    (empty_cache / "hub" / "datasets--someone--cached").mkdir()
    for name, online in (("someone/cached", None), ("someone/elsewhere", True)):
        with pytest.raises(DataError, match="cannot load dataset"):
            load_text_classification(name, online=online)
    assert seen == [("someone/cached", True, True), ("someone/elsewhere", False, False)]
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True  # restored


REFUSE_IN_A_FRESH_PROCESS = """
import json, sys, time
from descentlab.data import load_causal_lm, load_encoder_classifier, load_text_classification
from descentlab.errors import DescentlabError
took = {}
for load, name in ((load_text_classification, "imbd"), (load_causal_lm, "HuggingFaceTB/SmolLM2-135M-Instruc"),
                   (load_encoder_classifier, "roberta-bsae")):
    start = time.perf_counter()
    try:
        load(name)
    except DescentlabError:
        took[name] = time.perf_counter() - start
heavy = sorted(m for m in ("datasets", "transformers", "torch") if m in sys.modules)
print(json.dumps({"took": took, "heavy": heavy}))
"""


def test_a_refused_name_costs_no_import_of_datasets_transformers_or_torch(empty_cache) -> None:
    """The time a user waits in a fresh process: the refusal comes before the heavy imports."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    proc = subprocess.run(
        [sys.executable, "-c", REFUSE_IN_A_FRESH_PROCESS],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["took"]) == 3 and max(out["took"].values()) < FAST_S, out
    assert out["heavy"] == [], out
