"""Text classification data ready for training and evaluation: splits tokenized once, fixed evaluation
batches sorted by length (dynamic padding), and optional dataset-shift test sets.

Used by every experiment that fine-tunes an encoder classifier (text-robustness, robust-sparse).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from descentlab.errors import ConfigError


@dataclass
class TextDataConfig:
    """Which text-classification data, how much of it, and how it is tokenized."""

    name: str = "rotten_tomatoes"  # offline default; or an HF hub name / local path (imdb, sst2, mnli, ...)
    text_fields: list[str] | None = None
    split_seed: int = 0
    n_train: int | None = 3000  # None: the whole training split
    n_eval: int | None = 1000  # cap of validation and test (stratified)
    max_length: int = 64
    eval_batch_size: int = 64
    shift: list[str] = field(default_factory=list)  # extra test sets (names/paths), same label space

    def __post_init__(self) -> None:
        for key in ("n_train", "n_eval"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(
                    f"data.{key} must be >= 1 (a number of examples) or null for all, got {value}"
                )
        if self.max_length < 2:
            raise ConfigError(f"data.max_length must be >= 2 tokens, got {self.max_length}")
        if self.eval_batch_size < 1:
            raise ConfigError(f"data.eval_batch_size must be >= 1, got {self.eval_batch_size}")


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


def prepare_data(d: TextDataConfig, model: str) -> Prepared:
    """Load, subsample and tokenize the splits named by ``d`` with ``model``'s tokenizer."""
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
