"""A small ViT image classifier built from a transformers ``ViTConfig`` (its block Linears: descentlab.sparsity.vit).

The block Linears (attention q/k/v/out and MLP fc1/fc2) are found by module type and position inside each
transformer block, so the same code works with transformers 4.x (``vit.encoder.layer.N.attention.attention
.query`` ...) and 5.x (``vit.layers.N.attention.q_proj`` ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from descentlab.errors import ConfigError

__all__ = ["ViTSpec", "build_vit", "correct_predictions"]


@dataclass
class ViTSpec:
    """Architecture of the small ViT (defaults: 4 blocks of width 128 on 28x28 grey images, patch 7)."""

    image_size: int = 28
    patch_size: int = 7
    num_channels: int = 1
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    mlp_ratio: int = 4
    num_labels: int = 10
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ConfigError(
                f"vit.image_size {self.image_size} must be a multiple of patch_size {self.patch_size}"
            )
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"vit.hidden_size {self.hidden_size} must be a multiple of num_heads {self.num_heads}"
            )


def build_vit(spec: ViTSpec, seed: int | None = None) -> nn.Module:
    """A freshly initialised ``ViTForImageClassification`` (input ``pixel_values`` [B, C, H, W])."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=spec.image_size,
        patch_size=spec.patch_size,
        num_channels=spec.num_channels,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        intermediate_size=spec.mlp_ratio * spec.hidden_size,
        hidden_dropout_prob=spec.dropout,
        attention_probs_dropout_prob=spec.dropout,
        num_labels=spec.num_labels,
    )
    if seed is not None:
        torch.manual_seed(seed)
    return ViTForImageClassification(config)


@torch.no_grad()
def correct_predictions(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 500) -> torch.Tensor:
    """Per image: whether the classifier's arg-max class is the label ``y`` (bool [N]); eval mode meanwhile."""
    was_training = model.training
    model.eval()
    hits = [
        model(pixel_values=x[i : i + batch]).logits.argmax(-1) == y[i : i + batch]
        for i in range(0, len(y), batch)
    ]
    model.train(was_training)
    return torch.cat(hits)
