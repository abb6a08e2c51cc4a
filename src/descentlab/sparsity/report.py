"""Exact-zero counts of the prunable weights: per tensor, per transformer block, and global; the shape of
the weights (how peaked at 0); the record of a tuning grid.

The report counts ``weight == 0`` in the tensors themselves (never a mask), so it measures what a
checkpoint really holds. It reads either a model (tensors chosen by a :class:`~.masks.Selection`) or a
plain state dict such as one loaded from a safetensors file (tensors chosen by name).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from descentlab.sparsity.masks import Selection, select_prunable
from descentlab.sparsity.sharded import is_replicated, is_sharded, local_part

__all__ = [
    "SparsityReport",
    "TensorCount",
    "excess_kurtosis",
    "selection_record",
    "sparsity_report",
    "tensor_shape_stats",
]


@dataclass
class TensorCount:
    """Zeros out of ``numel`` entries."""

    numel: int
    zeros: int

    @property
    def sparsity(self) -> float:
        return self.zeros / self.numel if self.numel else 0.0


@dataclass
class SparsityReport:
    """Exact zeros per tensor, per block and in total over the prunable weights.

    Attributes:
        tensors: Parameter name -> count, in model order.
        blocks: Block index (as a string, "other" outside blocks) -> count.
        total: The count over every reported tensor.
        block_of: Parameter name -> its block key.
    """

    tensors: dict[str, TensorCount] = field(default_factory=dict)
    blocks: dict[str, TensorCount] = field(default_factory=dict)
    total: TensorCount = field(default_factory=lambda: TensorCount(0, 0))
    block_of: dict[str, str] = field(default_factory=dict)

    @property
    def global_sparsity(self) -> float:
        return self.total.sparsity

    def to_dict(self) -> dict:
        """JSON-ready: ``{"global": s, "numel": n, "zeros": z, "blocks": {...}, "tensors": {...}}``."""

        def one(c: TensorCount) -> dict:
            return {"numel": c.numel, "zeros": c.zeros, "sparsity": c.sparsity}

        return {
            "global": self.total.sparsity,
            "numel": self.total.numel,
            "zeros": self.total.zeros,
            "blocks": {k: one(v) for k, v in self.blocks.items()},
            "tensors": {k: one(v) for k, v in self.tensors.items()},
        }

    def to_markdown(self, per_tensor: bool = True) -> str:
        """A Markdown table: one row per tensor (optional), per block, and a global row."""
        lines = ["| tensor | block | entries | zeros | sparsity |", "|---|---|---:|---:|---:|"]
        if per_tensor:
            for name, c in self.tensors.items():
                block = self.block_of.get(name, "other")
                lines.append(f"| `{name}` | {block} | {c.numel} | {c.zeros} | {c.sparsity:.4f} |")
        for block, c in self.blocks.items():
            lines.append(f"| (block total) | {block} | {c.numel} | {c.zeros} | {c.sparsity:.4f} |")
        c = self.total
        lines.append(f"| **global** | all | {c.numel} | {c.zeros} | {c.sparsity:.4f} |")
        return "\n".join(lines)

    def table(self, per_tensor: bool = True) -> str:
        """A plain-text table for the terminal: each block's tensors (one row per layer weight, optional),
        then the block's total, and a global row last."""
        rows = [("tensor", "block", "entries", "zeros", "sparsity")]

        def row(label: str, block: str, c: TensorCount) -> None:
            rows.append((label, block, f"{c.numel:,}", f"{c.zeros:,}", f"{c.sparsity:.4f}"))

        for block, total in self.blocks.items():
            if per_tensor:
                for name, c in self.tensors.items():
                    if self.block_of.get(name, "other") == block:
                        row(name, block, c)
            row("(block total)", block, total)
        row("global", "all", self.total)
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        return "\n".join(
            "  ".join(
                cell.ljust(w) if i < 2 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(r, widths, strict=True))
            )
            for r in rows
        )

    def __str__(self) -> str:
        return self.table()


_BLOCK_INDEX = re.compile(r"\.(\d+)\.")


def sparsity_report(
    source: nn.Module | Mapping[str, torch.Tensor],
    select: Selection | None = None,
    names: Iterable[str] | None = None,
) -> SparsityReport:
    """Count exact zeros in the prunable weights.

    Args:
        source: A model, or a state dict (e.g. ``safetensors.torch.load_file(path)``).
        select: For a model: which tensors (default: Linear weights inside the transformer blocks).
        names: For a state dict: the tensor names to count; default = every tensor of dimension >= 2 whose
            name has a block index (``.N.``) and ends in ``weight``. For a model, restricts the selection.

    Returns:
        The report; blocks are keyed by the block index found in the name.
    """
    entries: list[tuple[str, torch.Tensor, str]] = []
    if isinstance(source, nn.Module):
        wanted = set(names) if names is not None else None
        for t in select_prunable(source, select):
            if wanted is None or t.name in wanted:
                entries.append((t.name, t.param.detach(), "other" if t.block is None else str(t.block)))
    else:
        chosen = (
            list(names)
            if names is not None
            else [
                k
                for k, v in source.items()
                if v.dim() >= 2 and k.endswith("weight") and _BLOCK_INDEX.search(k)
            ]
        )
        for k in chosen:
            match = _BLOCK_INDEX.search(k)
            entries.append((k, source[k].detach(), match.group(1) if match else "other"))

    report = SparsityReport()
    zeros_total = numel_total = 0
    for (name, tensor, block), zeros in zip(entries, _zero_counts([t for _, t, _ in entries]), strict=True):
        numel = tensor.numel()
        report.tensors[name] = TensorCount(numel, zeros)
        b = report.blocks.setdefault(block, TensorCount(0, 0))
        b.numel += numel
        b.zeros += zeros
        report.block_of[name] = block
        numel_total += numel
        zeros_total += zeros
    report.total = TensorCount(numel_total, zeros_total)
    return report


def _zero_counts(tensors: Sequence[torch.Tensor]) -> list[int]:
    """Exact zeros of each tensor; a sharded one (FSDP2 DTensor) is counted on its local rows and the counts
    are summed over its mesh in one all-reduce (every rank must call it then)."""
    local = torch.stack([(local_part(t) == 0).sum() for t in tensors]) if tensors else torch.zeros(0)
    sharded = [is_sharded(t) and not is_replicated(t) for t in tensors]
    if any(sharded):
        group = next(t for t, s in zip(tensors, sharded, strict=True) if s).device_mesh.get_group()
        mine = torch.where(torch.tensor(sharded, device=local.device), local, torch.zeros_like(local))
        torch.distributed.all_reduce(mine, group=group)
        local = torch.where(torch.tensor(sharded, device=local.device), mine, local)
    return [int(v) for v in local.tolist()]


# --- the shape of the prunable weights, and the record of a tuning grid (shared by the sparse studies) ---


def excess_kurtosis(w: np.ndarray | torch.Tensor) -> float:
    """``E[(w - μ)^4] / E[(w - μ)^2]^2 - 3`` over all entries, in float64 (0 for a Gaussian, 3 for a Laplace;
    NaN for a constant tensor)."""
    centred = torch.as_tensor(w).detach().double().flatten()
    centred = centred - centred.mean()
    return float((centred**4).mean() / (centred**2).mean() ** 2 - 3.0)


def _frac_kurtosis(w: torch.Tensor, threshold: float) -> tuple[float, float]:
    w = w.detach().double().flatten()
    return float((w.abs() < threshold).double().mean()), excess_kurtosis(w)


def tensor_shape_stats(tensors: Sequence[torch.Tensor], threshold: float) -> dict[str, Any]:
    """How peaked at 0 the weights are, per tensor (``frac_below``, ``kurtosis``: lists, one entry per tensor)
    and over all of them at once (``global_frac_below``, ``global_kurtosis``): the fraction of entries with
    ``|w| < threshold`` and the excess kurtosis (:func:`excess_kurtosis`)."""
    per = [_frac_kurtosis(w, threshold) for w in tensors]
    frac, kurt = _frac_kurtosis(torch.cat([w.detach().flatten() for w in tensors]), threshold)
    return {
        "frac_below": [f for f, _ in per],
        "kurtosis": [k for _, k in per],
        "global_frac_below": frac,
        "global_kurtosis": kurt,
    }


def selection_record(
    grids: Mapping[str, Sequence[Mapping[str, Any]]], chosen: Mapping[str, int]
) -> tuple[dict[str, Any], list[str]]:
    """The record of a tuning grid per method: every candidate's settings (``lr``, ``alpha`` and, where the
    grid tunes it, ``weight_decay``) and ``val`` (the criterion), the chosen one, and which of its values
    lie at an edge of a grid of more than one value (then a note says so: the grid should be widened).

    Args:
        grids: method -> its candidates' results, each with its settings and ``val``.
        chosen: method -> the index of the chosen candidate.
    """
    record, notes = {}, []
    for label, runs in grids.items():
        best = runs[chosen[label]]
        keys = [k for k in ("lr", "alpha", "weight_decay") if k in runs[0]]
        edges = []
        for key in keys:
            values = sorted({r[key] for r in runs})
            if len(values) > 1 and best[key] in (values[0], values[-1]):
                edges.append(key)
                notes.append(
                    f"{label}: the chosen {key} = {best[key]:g} is at an edge of its grid {values}; the optimum "
                    "may lie outside it (widen the grid)."
                )
        record[label] = {
            "grid": [{k: r[k] for k in [*keys, "val"]} for r in runs],
            "chosen": {k: best[k] for k in [*keys, "val"]},
            "at_edge": edges,
        }
    return record, notes
