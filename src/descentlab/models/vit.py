"""A small ViT image classifier built from a transformers ``ViTConfig``, and its prunable block Linears.

The block Linears (attention q/k/v/out and MLP fc1/fc2) are found by module type and position inside each
transformer block, so the same code works with transformers 4.x (``vit.encoder.layer.N.attention.attention
.query`` ...) and 5.x (``vit.layers.N.attention.q_proj`` ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from descentlab.errors import ConfigError, ModelError
from descentlab.sparsity.masks import PrunableTensor, Selection, find_blocks, select_prunable

__all__ = ["BLOCK_LINEAR_ROLES", "ViTSpec", "build_vit", "vit_block_linears"]

# Registration order of a ViT block's Linears in both transformers 4.x and 5.x.
BLOCK_LINEAR_ROLES = ("q", "k", "v", "out", "fc1", "fc2")


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


def vit_block_linears(model: nn.Module) -> dict[str, list[PrunableTensor]]:
    """The Linear weights of every ViT block, by role (q, k, v, out, fc1, fc2).

    Selection is by type (``nn.Linear``) and position inside each block of the block list found
    structurally, never by name.

    Returns:
        Role -> one prunable tensor per block, in block order.

    Raises:
        ModelError: if a block does not hold exactly six Linears (not a standard ViT block).
    """
    find_blocks(model)  # raises a clear ModelError when there is no block list
    tensors = select_prunable(model, Selection(module_types=(nn.Linear,)))
    per_block: dict[int, list[PrunableTensor]] = {}
    for t in tensors:
        per_block.setdefault(t.block, []).append(t)
    roles: dict[str, list[PrunableTensor]] = {r: [] for r in BLOCK_LINEAR_ROLES}
    for block in sorted(per_block):
        linears = per_block[block]
        if len(linears) != len(BLOCK_LINEAR_ROLES):
            raise ModelError(
                f"ViT block {block} holds {len(linears)} Linears, expected {len(BLOCK_LINEAR_ROLES)} "
                "(q, k, v, out, fc1, fc2); select the weights with descentlab.sparsity.Selection instead."
            )
        for role, t in zip(BLOCK_LINEAR_ROLES, linears, strict=True):
            roles[role].append(t)
    return roles
