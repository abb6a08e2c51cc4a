"""Tiny models for the robustness tests, built from transformers configs (no weights to download)."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

VOCAB = 97
PAD = 0


@pytest.fixture
def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=2,
        pad_token_id=PAD,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config).eval()


def _make_batch(rows: list[list[int]], labels: list[int] | None = None) -> dict[str, torch.Tensor]:
    """Right-padded batch of token ids with attention mask (and labels)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    batch = {"input_ids": ids, "attention_mask": (ids != PAD).long()}
    if labels is not None:
        batch["labels"] = torch.tensor(labels)
    return batch


def _random_rows(n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g)
    return [torch.randint(1, VOCAB, (int(k),), generator=g).tolist() for k in lengths]


@pytest.fixture
def make_batch():
    return _make_batch


@pytest.fixture
def random_rows():
    return _random_rows
