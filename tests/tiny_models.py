"""Tiny random models for the tests, built from transformers configs (nothing to download).

One factory per family, used across the suite: ``from tiny_models import tiny_bert`` (tests/conftest.py
puts this folder on ``sys.path``). Dropout is off, so a model's output depends on its weights and inputs only.
"""

from __future__ import annotations

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    ViTConfig,
    ViTForImageClassification,
)

VOCAB = 97
PAD = 0


def tiny_bert(
    *, layers: int = 2, hidden: int = 32, vocab: int = VOCAB, num_labels: int = 2, seed: int = 0
) -> BertForSequenceClassification:
    """A BERT sequence classifier: ``layers`` blocks of width ``hidden``, 2 heads."""
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
        num_labels=num_labels,
        pad_token_id=PAD,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config)


def tiny_gpt2(
    *, layers: int = 2, hidden: int = 16, vocab: int = 50, positions: int = 32, seed: int = 0
) -> GPT2LMHeadModel:
    """A GPT-2 causal LM (tied embeddings)."""
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=positions,
        n_embd=hidden,
        n_layer=layers,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def tiny_llama(*, layers: int = 2, hidden: int = 32, vocab: int = VOCAB, seed: int = 0) -> LlamaForCausalLM:
    """A Llama causal LM with grouped-query attention and an untied LM head."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def tiny_vit(
    *, layers: int = 2, hidden: int = 32, image: int = 8, patch: int = 4, num_labels: int = 3, seed: int = 0
) -> ViTForImageClassification:
    """A ViT image classifier on ``image``x``image`` grey images."""
    torch.manual_seed(seed)
    config = ViTConfig(
        image_size=image,
        patch_size=patch,
        num_channels=1,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=num_labels,
    )
    return ViTForImageClassification(config)


def token_batch(rows: list[list[int]], labels: list[int] | None = None) -> dict[str, torch.Tensor]:
    """A right-padded batch of token ids with its attention mask (and ``labels`` when given)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    batch = {"input_ids": ids, "attention_mask": (ids != PAD).long()}
    if labels is not None:
        batch["labels"] = torch.tensor(labels)
    return batch
