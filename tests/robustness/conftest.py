"""Fixtures of the robustness tests: the shared tiny BERT (tests/tiny_models.py), padded batches, random rows."""

from __future__ import annotations

import pytest
import torch
from transformers import BertForSequenceClassification

from tiny_models import VOCAB, token_batch
from tiny_models import tiny_bert as _tiny_bert


@pytest.fixture
def tiny_bert() -> BertForSequenceClassification:
    # 2 layers of width 32, vocabulary 97, pad id 0, dropout off
    return _tiny_bert(layers=2, hidden=32, vocab=VOCAB, num_labels=2, seed=0).eval()


def _random_rows(n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g)
    return [torch.randint(1, VOCAB, (int(k),), generator=g).tolist() for k in lengths]


@pytest.fixture
def make_batch():
    """Right-padded batch of token ids with attention mask (and labels)."""
    return token_batch


@pytest.fixture
def random_rows():
    return _random_rows
