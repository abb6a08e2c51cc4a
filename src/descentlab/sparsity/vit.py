"""The Linear weights of a ViT block, by role (moved here from models/vit.py: models import no method module)."""

from __future__ import annotations

from torch import nn

from descentlab.errors import ModelError
from descentlab.sparsity.masks import PrunableTensor, Selection, find_blocks, select_prunable

# Registration order of a ViT block's Linears in both transformers 4.x and 5.x.
BLOCK_LINEAR_ROLES = ("q", "k", "v", "out", "fc1", "fc2")


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


__all__ = ["BLOCK_LINEAR_ROLES", "vit_block_linears"]
