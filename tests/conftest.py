"""Shared test settings: offline, deterministic, and gentle on a 2-core machine."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
# tiny_models.py (the tiny model factories) is imported by name from any test folder
sys.path.insert(0, str(Path(__file__).parent))

import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


# The lowest free space seen on the temporary folder's disk, sampled after every test (one statvfs call):
# a suite that errors in tmp_path set-up on a nearly full disk then says so in its last lines.
_lowest_free_disk: list[int] = []


def _free_bytes() -> int:
    import shutil
    import tempfile

    return shutil.disk_usage(tempfile.gettempdir()).free


def pytest_runtest_teardown(item: pytest.Item) -> None:
    free = _free_bytes()
    if not _lowest_free_disk or free < _lowest_free_disk[0]:
        _lowest_free_disk[:] = [free]


def pytest_terminal_summary(terminalreporter) -> None:
    if _lowest_free_disk:
        terminalreporter.write_line(
            f"disk: lowest free space on the temporary folder's disk during the run "
            f"{_lowest_free_disk[0] / 2**30:.2f} GiB (now {_free_bytes() / 2**30:.2f} GiB)"
        )


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2's tokenizer, from its safetensors cache or its GGUF asset; skips when the asset is missing."""
    from transformers import AutoTokenizer

    from descentlab.data import asset_path, cache_dir
    from descentlab.data.pretrained import smollm2_cache_ready
    from descentlab.errors import AssetMissingError

    try:
        gguf = asset_path("smollm2_gguf")
    except AssetMissingError as e:
        pytest.skip(f"the SmolLM2 tokenizer is needed: {e}")
    if smollm2_cache_ready():
        return AutoTokenizer.from_pretrained(cache_dir() / "smollm2", local_files_only=True)
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)


# -- the perturbation and evaluation tests' fixtures: the shared tiny BERT, padded batches, random rows ----


@pytest.fixture
def tiny_bert():
    """2 layers of width 32, vocabulary 97, pad id 0, dropout off (tests/tiny_models.py)."""
    from tiny_models import VOCAB
    from tiny_models import tiny_bert as build

    return build(layers=2, hidden=32, vocab=VOCAB, num_labels=2, seed=0).eval()


@pytest.fixture
def make_batch():
    """Right-padded batch of token ids with attention mask (and labels)."""
    from tiny_models import token_batch

    return token_batch


@pytest.fixture
def random_rows():
    """``rows(n, lo, hi, seed)``: n random token-id rows with lengths in [lo, hi], ids in [1, VOCAB)."""
    from tiny_models import VOCAB

    def rows(n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(lo, hi + 1, (n,), generator=g)
        return [torch.randint(1, VOCAB, (int(k),), generator=g).tolist() for k in lengths]

    return rows
