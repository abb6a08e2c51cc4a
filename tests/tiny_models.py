"""Tiny random models for the tests, built from transformers configs (nothing to download).

One factory per family, used across the suite: ``from tiny_models import tiny_bert`` (tests/conftest.py
puts this folder on ``sys.path``; a script run by itself inserts it). Dropout is off unless asked for, so a
model's output depends on its weights and inputs only. Each factory seeds torch with ``seed`` first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
    *,
    layers: int = 2,
    hidden: int = 32,
    vocab: int = VOCAB,
    num_labels: int = 2,
    seed: int = 0,
    heads: int = 2,
    positions: int = 64,
    dropout: float = 0.0,
    **config: object,
) -> BertForSequenceClassification:
    """A BERT sequence classifier: ``layers`` blocks of width ``hidden``, ``heads`` heads, MLP width 2x.

    ``config`` entries override the ``BertConfig`` fields (``pad_token_id``, ...).
    """
    torch.manual_seed(seed)
    fields = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": 2 * hidden,
        "max_position_embeddings": positions,
        "num_labels": num_labels,
        "pad_token_id": PAD,
        "hidden_dropout_prob": dropout,
        "attention_probs_dropout_prob": dropout,
    }
    return BertForSequenceClassification(BertConfig(**{**fields, **config}))


def tiny_gpt2(
    *,
    layers: int = 2,
    hidden: int = 16,
    vocab: int = 50,
    positions: int = 32,
    seed: int = 0,
    heads: int = 2,
    dropout: float = 0.0,
    **config: object,
) -> GPT2LMHeadModel:
    """A GPT-2 causal LM (tied embeddings). ``config`` entries override the ``GPT2Config`` fields."""
    torch.manual_seed(seed)
    fields = {
        "vocab_size": vocab,
        "n_positions": positions,
        "n_embd": hidden,
        "n_layer": layers,
        "n_head": heads,
        "resid_pdrop": dropout,
        "embd_pdrop": dropout,
        "attn_pdrop": dropout,
    }
    return GPT2LMHeadModel(GPT2Config(**{**fields, **config}))


def tiny_llama(
    *,
    layers: int = 2,
    hidden: int = 32,
    vocab: int = VOCAB,
    seed: int = 0,
    heads: int = 4,
    kv_heads: int = 2,
    positions: int = 64,
    tie: bool = False,
    **config: object,
) -> LlamaForCausalLM:
    """A Llama causal LM with grouped-query attention; the LM head is untied unless ``tie``.

    ``config`` entries override the ``LlamaConfig`` fields (``pad_token_id``, ``bos_token_id``, ...).
    """
    torch.manual_seed(seed)
    fields = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": positions,
        "tie_word_embeddings": tie,
    }
    return LlamaForCausalLM(LlamaConfig(**{**fields, **config}))


def tiny_vit(
    *,
    layers: int = 2,
    hidden: int = 32,
    image: int = 8,
    patch: int = 4,
    num_labels: int = 3,
    seed: int = 0,
    heads: int = 2,
    **config: object,
) -> ViTForImageClassification:
    """A ViT image classifier on ``image``x``image`` grey images. ``config`` overrides ``ViTConfig`` fields."""
    torch.manual_seed(seed)
    fields = {
        "image_size": image,
        "patch_size": patch,
        "num_channels": 1,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": 2 * hidden,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "num_labels": num_labels,
    }
    return ViTForImageClassification(ViTConfig(**{**fields, **config}))


def lm_rows(n: int, *, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` rows for a tiny causal LM (a Trainer dataset): 10 random token ids in [1, 97), an all-ones mask,
    and the ids as labels, drawn from a generator seeded by ``seed``."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        ids = torch.randint(1, 97, (10,), generator=g)
        rows.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return rows


def classification_rows(
    n: int, *, seed: int = 0, label: Callable[[torch.Tensor], Any] | None = None
) -> list[dict[str, torch.Tensor]]:
    """``n`` rows for a tiny sequence classifier (a Trainer dataset): 12 random token ids, an all-ones mask,
    and the label ``label(ids)`` (default ``ids[0] < 50``), drawn from a generator seeded by ``seed``."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        ids = torch.randint(5, 97, (12,), generator=g)
        y = ids[0] < 50 if label is None else label(ids)
        rows.append(
            {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor(int(y))}
        )
    return rows


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


# --- one tiny random model per Hugging Face family, for the readout family table -----------------------
# name -> (kind, config class, task-model class, config kwargs). kind: "text" (sequence classifier),
# "lm" (causal LM) or "image" (image classifier). Sizes: 2 layers, width 32, 4 heads, vocabulary 97.

_TEXT = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
_FF = {"intermediate_size": 64}
_NODROP = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
_LM = {**_TEXT, **_FF, "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": False}
_IMAGE = {
    "image_size": 8,
    "patch_size": 4,
    "num_channels": 1,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "num_labels": 3,
    **_NODROP,
}

FAMILIES: dict[str, tuple[str, str, str, dict]] = {
    # encoders (sequence classification)
    "BERT": ("text", "BertConfig", "BertForSequenceClassification", {**_TEXT, **_FF, **_NODROP}),
    "DistilBERT": (
        "text",
        "DistilBertConfig",
        "DistilBertForSequenceClassification",
        {
            "vocab_size": VOCAB,
            "dim": 32,
            "n_layers": 2,
            "n_heads": 4,
            "hidden_dim": 64,
            "dropout": 0.0,
            "attention_dropout": 0.0,
            "seq_classif_dropout": 0.0,
        },
    ),
    "RoBERTa": (
        "text",
        "RobertaConfig",
        "RobertaForSequenceClassification",
        {**_TEXT, **_FF, **_NODROP, "pad_token_id": 1},
    ),
    "XLM-R": (
        "text",
        "XLMRobertaConfig",
        "XLMRobertaForSequenceClassification",
        {**_TEXT, **_FF, **_NODROP, "pad_token_id": 1},
    ),
    "ALBERT": (
        "text",
        "AlbertConfig",
        "AlbertForSequenceClassification",
        {
            **_TEXT,
            **_FF,
            "embedding_size": 16,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            "classifier_dropout_prob": 0.0,
        },
    ),
    "ELECTRA": (
        "text",
        "ElectraConfig",
        "ElectraForSequenceClassification",
        {**_TEXT, **_FF, **_NODROP, "embedding_size": 16},
    ),
    "DeBERTa": ("text", "DebertaConfig", "DebertaForSequenceClassification", {**_TEXT, **_FF, **_NODROP}),
    "DeBERTa-v2/v3": (
        "text",
        "DebertaV2Config",
        "DebertaV2ForSequenceClassification",
        {
            **_TEXT,
            **_FF,
            **_NODROP,
            "relative_attention": True,
            "position_biased_input": False,
            "pos_att_type": ["p2c", "c2p"],
            "max_relative_positions": -1,
            "position_buckets": 8,
        },
    ),
    "MPNet": ("text", "MPNetConfig", "MPNetForSequenceClassification", {**_TEXT, **_FF, **_NODROP}),
    "ModernBERT (mean)": (
        "text",
        "ModernBertConfig",
        "ModernBertForSequenceClassification",
        {
            **_TEXT,
            **_FF,
            "classifier_pooling": "mean",
            "pad_token_id": PAD,
            "global_attn_every_n_layers": 2,
            "local_attention": 8,
            "attn_implementation": "eager",
        },
    ),
    "ModernBERT (cls)": (
        "text",
        "ModernBertConfig",
        "ModernBertForSequenceClassification",
        {
            **_TEXT,
            **_FF,
            "classifier_pooling": "cls",
            "pad_token_id": PAD,
            "global_attn_every_n_layers": 2,
            "local_attention": 8,
            "attn_implementation": "eager",
        },
    ),
    "GPT-2 (classifier)": (
        "text",
        "GPT2Config",
        "GPT2ForSequenceClassification",
        {
            "vocab_size": VOCAB,
            "n_embd": 32,
            "n_layer": 2,
            "n_head": 4,
            "n_positions": 64,
            "pad_token_id": PAD,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        },
    ),
    "Llama (classifier)": (
        "text",
        "LlamaConfig",
        "LlamaForSequenceClassification",
        {**_LM, "pad_token_id": PAD},
    ),
    # decoders (causal LM)
    "GPT-2": (
        "lm",
        "GPT2Config",
        "GPT2LMHeadModel",
        {
            "vocab_size": VOCAB,
            "n_embd": 32,
            "n_layer": 2,
            "n_head": 4,
            "n_positions": 64,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        },
    ),
    "Llama": ("lm", "LlamaConfig", "LlamaForCausalLM", _LM),
    "Qwen2": ("lm", "Qwen2Config", "Qwen2ForCausalLM", _LM),
    "Qwen3": ("lm", "Qwen3Config", "Qwen3ForCausalLM", {**_LM, "head_dim": 8}),
    "Mistral": ("lm", "MistralConfig", "MistralForCausalLM", _LM),
    "Gemma": ("lm", "GemmaConfig", "GemmaForCausalLM", {**_LM, "head_dim": 8}),
    "Gemma2": (
        "lm",
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {**_LM, "head_dim": 8, "sliding_window": 4, "query_pre_attn_scalar": 8},
    ),
    "Phi": ("lm", "PhiConfig", "PhiForCausalLM", {**_LM, "resid_pdrop": 0.0, "embd_pdrop": 0.0}),
    "Phi-3": ("lm", "Phi3Config", "Phi3ForCausalLM", {**_LM, "pad_token_id": PAD}),
    "GPT-NeoX": (
        "lm",
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        {**_TEXT, **_FF, "max_position_embeddings": 64, "hidden_dropout": 0.0, "attention_dropout": 0.0},
    ),
    "OLMo": ("lm", "OlmoConfig", "OlmoForCausalLM", _LM),
    "OLMo2": ("lm", "Olmo2Config", "Olmo2ForCausalLM", _LM),
    "OPT": (
        "lm",
        "OPTConfig",
        "OPTForCausalLM",
        {
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "ffn_dim": 64,
            "max_position_embeddings": 64,
            "dropout": 0.0,
            "attention_dropout": 0.0,
            "pad_token_id": 1,
        },
    ),
    "OPT (project_out)": (
        "lm",
        "OPTConfig",
        "OPTForCausalLM",
        {
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "ffn_dim": 64,
            "max_position_embeddings": 64,
            "dropout": 0.0,
            "attention_dropout": 0.0,
            "pad_token_id": 1,
            "word_embed_proj_dim": 16,
        },
    ),
    "Falcon": (
        "lm",
        "FalconConfig",
        "FalconForCausalLM",
        {
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "hidden_dropout": 0.0,
            "attention_dropout": 0.0,
        },
    ),
    "Bloom": (
        "lm",
        "BloomConfig",
        "BloomForCausalLM",
        {
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "n_layer": 2,
            "n_head": 4,
            "hidden_dropout": 0.0,
            "attention_dropout": 0.0,
        },
    ),
    "GPT-J": (
        "lm",
        "GPTJConfig",
        "GPTJForCausalLM",
        {
            "vocab_size": VOCAB,
            "n_embd": 32,
            "n_layer": 2,
            "n_head": 4,
            "rotary_dim": 4,
            "n_positions": 64,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        },
    ),
    "StableLM": ("lm", "StableLmConfig", "StableLmForCausalLM", {**_LM, "hidden_dropout": 0.0}),
    "Cohere": ("lm", "CohereConfig", "CohereForCausalLM", {**_LM, "logit_scale": 0.5}),
    "Granite": ("lm", "GraniteConfig", "GraniteForCausalLM", {**_LM, "logits_scaling": 4.0}),
    # vision (image classification)
    "ViT": ("image", "ViTConfig", "ViTForImageClassification", _IMAGE),
    "DeiT": ("image", "DeiTConfig", "DeiTForImageClassification", _IMAGE),
    "BEiT": ("image", "BeitConfig", "BeitForImageClassification", {**_IMAGE, "use_mean_pooling": True}),
    "DINOv2": (
        "image",
        "Dinov2Config",
        "Dinov2ForImageClassification",
        {k: v for k, v in _IMAGE.items() if k != "intermediate_size"},
    ),
}


def tiny_family(name: str, *, seed: int = 0) -> torch.nn.Module:
    """The tiny random task model of one :data:`FAMILIES` entry, in float32 and eval mode, random norms."""
    import transformers

    _, config_cls, model_cls, kwargs = FAMILIES[name]
    kwargs = dict(kwargs)
    attn = kwargs.pop("attn_implementation", None)
    config = getattr(transformers, config_cls)(**kwargs)
    if "num_labels" not in kwargs and FAMILIES[name][0] == "text":
        config.num_labels = 2
    if attn is not None:
        config._attn_implementation = attn
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).float().eval()
    # fresh norms are near-idempotent (weight 1, bias 0): norm(norm(x)) ~ norm(x) would hide a norm applied
    # twice; random affine parameters make every norm count
    with torch.no_grad():
        for module in model.modules():
            if "norm" in type(module).__name__.lower():
                for pname, param in module.named_parameters(recurse=False):
                    param.copy_(
                        (1.0 + 0.5 * torch.randn_like(param))
                        if pname == "weight"
                        else 0.2 * torch.randn_like(param)
                    )
    return model


def family_batch(name: str, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """A batch for one :data:`FAMILIES` entry: padded token ids (with labels for classifiers) or images."""
    kind = FAMILIES[name][0]
    g = torch.Generator().manual_seed(seed)
    if kind == "image":
        return {"pixel_values": torch.randn(3, 1, 8, 8, generator=g), "labels": torch.tensor([0, 2, 1])}
    ids = torch.randint(5, VOCAB, (4, 11), generator=g)
    lengths = [11, 8, 11, 5]
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids = ids.masked_fill(mask == 0, PAD)
    batch = {"input_ids": ids, "attention_mask": mask}
    if kind == "text":
        batch["labels"] = torch.tensor([0, 1, 1, 0])
    return batch
