"""One-shot magnitude pruning of a model's prunable weights (per matrix, global, or N:M)."""

from __future__ import annotations

import torch
from torch import nn

from descentlab.errors import ConfigError
from descentlab.sparsity.masks import Selection, compute_masks, select_prunable
from descentlab.sparsity.report import SparsityReport, sparsity_report
from descentlab.sparsity.sharded import local_part

__all__ = ["apply_masks_", "prune_magnitude"]

_SCOPES = ("layer", "global", "nm")


@torch.no_grad()
def apply_masks_(params: dict[str, torch.Tensor], masks: dict[str, torch.Tensor]) -> None:
    """Zero, in place, every entry of ``params[name]`` where ``masks[name]`` is False."""
    for name, mask in masks.items():
        local_part(params[name]).masked_fill_(~mask, 0)  # a DTensor's local shard (FSDP2) is masked in place


def prune_magnitude(
    model: nn.Module,
    sparsity: float,
    scope: str = "layer",
    select: Selection | None = None,
    nm: tuple[int, int] = (2, 4),
) -> SparsityReport:
    """Zero the smallest-magnitude prunable weights of ``model`` in place.

    ``scope="layer"`` zeroes exactly ``round(s n_i)`` entries of each selected matrix i (one threshold per
    matrix, as in the LM pruning baselines); ``scope="global"`` zeroes exactly ``round(s Σ n_i)`` entries
    under one threshold shared by all matrices (agreed across ranks under ``torch.distributed``);
    ``scope="nm"`` keeps N of every M consecutive input weights (``sparsity`` must be ``1 - N/M``).

    Args:
        model: The model; its parameters are modified in place, its state-dict keys are untouched.
        sparsity: Fraction of zeros in [0, 1).
        scope: "layer", "global" or "nm".
        select: Which weights (default: Linear / Conv1D weights inside the transformer blocks).
        nm: (N, M) for ``scope="nm"``.

    Returns:
        The sparsity report of the selected weights after pruning (exact zeros, which may exceed the
        request when weights were already zero).

    Raises:
        ConfigError: sparsity outside [0, 1) or an unknown scope.
    """
    if scope not in _SCOPES:
        raise ConfigError(f"unknown pruning scope {scope!r}; use one of {', '.join(_SCOPES)}.")
    if not 0.0 <= float(sparsity) < 1.0:
        raise ConfigError(f"sparsity must lie in [0, 1), got {sparsity}; e.g. 0.5 zeroes half the weights.")
    tensors = select_prunable(model, select)
    masks = compute_masks(tensors, float(sparsity), scope, nm)
    apply_masks_({t.name: t.param for t in tensors}, masks)
    return sparsity_report(model, select)
