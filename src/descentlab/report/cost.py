"""A stated cost model for GPU-hours: parameter counts in closed form and the 6·N·T rule. An estimate, never a
measurement.

Compute. A dense transformer of ``N`` trainable parameters spends about ``2·N`` FLOPs per token in a forward
pass (one multiply-add per weight) and about ``4·N`` in the backward pass, so

    training FLOPs   ≈ 6 · N · T + 6 · P_head · T_head
    evaluation FLOPs ≈ 2 · N · T_eval

with ``T`` the tokens (or image patches, or video patches) trained on, ``T_eval`` the tokens scored, and
``P_head · T_head`` the extra passes of a per-layer readout head (a head of ``P_head`` parameters applied to
``T_head`` more tokens than the one pass already inside ``N``). The rule leaves out attention's own
``2 · L · context · d`` FLOPs per token and pass (about ``context / (12 · d)`` of the ``2 · N`` term: 11 % for
GPT-2 small at 1,024 tokens, 1.0 % for Llama-3.1-8B at 512), counts embedding lookups as if they were matrix
products, and leaves out optimizer steps, data loading, communication and generation's memory-bound decoding.

Time. ``GPU-hours = FLOPs / (peak · utilisation) / 3600``, with an assumed sustained fraction of one GPU's dense
peak (:class:`CostModel`; by default 40 % of an H100 SXM's 989 TFLOP/s dense bf16).

Parameters. Closed forms from the architectures' config numbers (no download); each matches a model built
from the same numbers at a tiny size (tests/report/test_cost.py):

* :func:`gpt2_params`: Hugging Face ``GPT2LMHeadModel``;
* :func:`roberta_classifier_params`: ``RobertaForSequenceClassification`` (and BERT-style encoders with the
  same layout);
* :func:`vit_classifier_params`: a ViT / DeiT classifier (timm's ``VisionTransformer``, Hugging Face's
  ``ViTForImageClassification``);
* :func:`llama_params`: ``LlamaForCausalLM``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CostModel",
    "evaluation_flops",
    "gpt2_params",
    "llama_params",
    "roberta_classifier_params",
    "training_flops",
    "vit_classifier_params",
]

H100_BF16_DENSE = 989e12  # FLOP/s, H100 SXM, dense bf16 tensor cores (no sparsity)


@dataclass(frozen=True)
class CostModel:
    """The assumed throughput: ``utilisation`` of one GPU's dense ``peak_flops`` (FLOP/s), sustained."""

    peak_flops: float = H100_BF16_DENSE
    utilisation: float = 0.4
    gpu: str = "H100 SXM, dense bf16"

    def __post_init__(self) -> None:
        if self.peak_flops <= 0 or not 0 < self.utilisation <= 1:
            raise ValueError(
                f"peak_flops must be > 0 and utilisation in (0, 1], got {self.peak_flops}, {self.utilisation}"
            )

    @property
    def sustained(self) -> float:
        """FLOP/s the model assumes a run sustains."""
        return self.peak_flops * self.utilisation

    def gpu_hours(self, flops: float) -> float:
        """``flops / sustained / 3600``."""
        return flops / self.sustained / 3600.0


def training_flops(n_params: int, tokens: float, head_params: int = 0, head_tokens: float = 0) -> float:
    """``6 · N · T + 6 · P_head · T_head``: forward and backward over ``tokens``, plus a readout head's extra
    passes over ``head_tokens``."""
    return 6.0 * (n_params * tokens + head_params * head_tokens)


def evaluation_flops(n_params: int, tokens: float) -> float:
    """``2 · N · T_eval``: one forward pass over ``tokens``."""
    return 2.0 * n_params * tokens


def gpt2_params(vocab: int, n_positions: int, width: int, layers: int, *, tied: bool = True) -> int:
    """GPT-2 with ``V`` tokens, context ``P``, width ``d``, ``L`` blocks:

        V·d + P·d + L·(12·d² + 13·d) + 2·d  (+ V·d for an untied LM head)

    a block being LayerNorm 2d, qkv d·3d + 3d, attention out d² + d, LayerNorm 2d, MLP d·4d + 4d and 4d·d + d.
    GPT-2 small (V = 50,257, P = 1,024, d = 768, L = 12, tied): 124,439,808.
    """
    d = width
    return vocab * d + n_positions * d + layers * (12 * d * d + 13 * d) + 2 * d + (0 if tied else vocab * d)


def roberta_classifier_params(
    vocab: int,
    max_positions: int,
    type_vocab: int,
    width: int,
    layers: int,
    intermediate: int,
    num_labels: int,
) -> int:
    """A RoBERTa / BERT encoder (no pooler) under RoBERTa's classification head:

        (V + P + types)·d + 2·d + L·(4·d² + 2·d·I + 9·d + I) + (d² + d) + (d·C + C)

    an encoder layer being q, k, v, out (4·(d² + d)), two LayerNorms (4d) and the MLP (d·I + I + I·d + d); the
    head a dense d → d then d → C. roberta-base (V = 50,265, P = 514, 1 type, d = 768, L = 12, I = 3,072) with
    2 labels: 124,647,170.
    """
    d = width
    embeddings = (vocab + max_positions + type_vocab) * d + 2 * d
    layer = 4 * d * d + 2 * d * intermediate + 9 * d + intermediate
    return embeddings + layers * layer + (d * d + d) + (d * num_labels + num_labels)


def vit_classifier_params(
    image_size: int,
    patch_size: int,
    channels: int,
    width: int,
    layers: int,
    mlp_ratio: float,
    num_classes: int,
    *,
    class_tokens: int = 1,
) -> int:
    """A ViT / DeiT classifier with ``n = (image/patch)²`` patches, ``c`` class tokens, MLP width ``I = r·d``:

        (channels·p²·d + d) + c·d + (n + c)·d + L·(4·d² + 2·d·I + 9·d + I) + 2·d + (d·C + C)

    (patch projection, class token(s), position embedding, L pre-norm blocks, final LayerNorm, linear head).
    DeiT-small (224 px, patch 16, d = 384, L = 12, r = 4, 1,000 classes): 22,050,664.
    """
    d, hidden = width, int(width * mlp_ratio)
    patches = (image_size // patch_size) ** 2
    embed = channels * patch_size * patch_size * d + d + class_tokens * d + (patches + class_tokens) * d
    layer = 4 * d * d + 2 * d * hidden + 9 * d + hidden
    return embed + layers * layer + 2 * d + (d * num_classes + num_classes)


def llama_params(
    vocab: int,
    width: int,
    layers: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    *,
    head_dim: int | None = None,
    tied: bool = False,
) -> int:
    """Llama (no biases, RMSNorm, SwiGLU, grouped-query attention with ``h_kv`` key/value heads of size
    ``h_d``):

        V·d + L·(2·d·(h·h_d) + 2·d·(h_kv·h_d) + 3·d·I + 2·d) + d  (+ V·d for an untied LM head)

    Llama-3.1-8B (V = 128,256, d = 4,096, L = 32, I = 14,336, 32 heads, 8 key/value heads, untied):
    8,030,261,248.
    """
    d = width
    hd = head_dim if head_dim is not None else d // heads
    layer = 2 * d * heads * hd + 2 * d * kv_heads * hd + 3 * d * intermediate + 2 * d
    return vocab * d + layers * layer + d + (0 if tied else vocab * d)
