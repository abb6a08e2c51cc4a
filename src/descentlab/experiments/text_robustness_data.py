"""Data of text-robustness: splits tokenized once, fixed evaluation batches, shift sets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


def encode(split: Any, tokenizer: Any, max_length: int) -> list[dict[str, Any]]:
    """Tokenize a split (``text`` and optional ``text_pair``) into unpadded feature dicts with ``labels``."""
    pairs = list(split["text_pair"]) if "text_pair" in split.column_names else None
    enc = tokenizer(list(split["text"]), pairs, truncation=True, max_length=max_length)
    keys = list(enc.keys())
    return [{**{k: enc[k][i] for k in keys}, "labels": int(y)} for i, y in enumerate(list(split["label"]))]


def eval_batches(features: list[dict[str, Any]], collate: Any, size: int) -> list[dict[str, torch.Tensor]]:
    """Fixed evaluation batches, sorted by length to cut padding (the noise does not depend on batching)."""
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    return [collate([features[i] for i in order[k : k + size]]) for k in range(0, len(order), size)]


@dataclass
class Prepared:
    """Tokenized data shared by every job (picklable, so worker processes get a copy)."""

    train: list[dict[str, Any]]
    val: list[dict[str, torch.Tensor]]
    test: list[dict[str, torch.Tensor]]
    shift: dict[str, list[dict[str, torch.Tensor]]]
    collate: Any
    num_labels: int


def prepare_data(d: Any, model: str) -> Prepared:
    """Load, subsample and tokenize the splits named by ``d`` (a ``TextData``) with ``model``'s tokenizer."""
    from transformers import DataCollatorWithPadding

    from descentlab.data import load_encoder_classifier, load_text_classification

    splits = load_text_classification(
        d.name, seed=d.split_seed, max_train=d.n_train, max_eval=d.n_eval, text_fields=d.text_fields
    )
    num_labels = int(max(splits["train"]["label"])) + 1
    _, tokenizer = load_encoder_classifier(model, num_labels=num_labels)
    collate = DataCollatorWithPadding(tokenizer, return_tensors="pt")

    def batches(split: Any) -> list[dict[str, torch.Tensor]]:
        return eval_batches(encode(split, tokenizer, d.max_length), collate, d.eval_batch_size)

    shift = {
        n: batches(load_text_classification(n, seed=d.split_seed, max_eval=d.n_eval)["test"]) for n in d.shift
    }
    return Prepared(
        encode(splits["train"], tokenizer, d.max_length),
        batches(splits["validation"]),
        batches(splits["test"]),
        shift,
        collate,
        num_labels,
    )
