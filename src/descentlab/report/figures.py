"""Standard figures drawn from results.json: robustness curves with std bands, per-layer loss profiles.

This module is the one place that picks matplotlib's backend (Agg: files only, no display, safe in worker
processes); figure code elsewhere imports :func:`new_figure` / :func:`save_figure` from here.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from descentlab.io import atomic_write_bytes
from descentlab.report.tables import curve_names

__all__ = ["new_figure", "plot_curves", "plot_layer_loss", "plt", "save_figure"]


def new_figure(
    nrows: int = 1, ncols: int = 1, *, panel_size: tuple[float, float] = (4.2, 3.4), **kwargs: Any
) -> tuple[Any, Any]:
    """``(figure, axes)`` with ``axes`` always a 2-D ``[nrows, ncols]`` array, each panel ``panel_size`` inches."""
    figsize = kwargs.pop("figsize", (panel_size[0] * ncols, panel_size[1] * nrows))
    return plt.subplots(nrows, ncols, figsize=figsize, squeeze=False, **kwargs)


def plot_multipliers(ax: Any, steps: Sequence[int], lam: Any) -> list[int]:
    """Draw λ_l(t) of one constrained method on ``ax``: ``lam [seeds, steps, L]``; per layer l each seed
    thin and the mean over seeds thick, in one colour, labelled ``λ_l``. Returns the layers (1-based) whose
    λ is 0 at every step of every seed, which are not drawn."""
    lam = np.asarray(lam, dtype=np.float64)
    idle = []
    for layer in range(lam.shape[2]):
        if not np.any(lam[:, :, layer]):
            idle.append(layer + 1)
            continue
        color = f"C{layer % 10}"
        for seed in lam[:, :, layer]:
            ax.plot(steps, seed, color=color, lw=0.6, alpha=0.4)
        ax.plot(steps, lam[:, :, layer].mean(0), color=color, lw=1.8, label=f"λ_{layer + 1}")
    return idle


def save_figure(fig: Any, path: Path | str, *, dpi: int = 120) -> Path:
    """Save ``fig`` as a PNG at ``path`` atomically and close it (Agg PNGs are byte-for-byte reproducible)."""
    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path


Methods = Mapping[str, Mapping[str, Any]]


def _panels(names: Sequence[str], draw: Callable[[Any, str], None], path: Path, title: str) -> Path | None:
    """One panel per name, drawn by ``draw(ax, name)``, saved as a PNG; None when there is nothing to draw."""
    if not names:
        return None
    fig, axes = new_figure(1, len(names))
    for ax, name in zip(axes[0], names, strict=True):
        draw(ax, name)
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


def plot_curves(methods: Methods, path: Path, title: str = "") -> Path | None:
    """One panel per curve name; one line per method with a ±1 std band."""

    def draw(ax: Any, name: str) -> None:
        for method, block in methods.items():
            curve = block.get("curves", {}).get(name)
            if not curve:
                continue
            x, mean = curve["x"], curve["mean"]
            std = curve.get("std") or [0.0] * len(x)
            ax.plot(x, mean, marker="o", ms=3, label=method)
            low = [m - s for m, s in zip(mean, std, strict=True)]
            high = [m + s for m, s in zip(mean, std, strict=True)]
            ax.fill_between(x, low, high, alpha=0.2)
            ax.set_xlabel(curve.get("x_name", "x"))
            ax.set_ylabel(curve.get("metric", ""))

    return _panels(curve_names(methods), draw, path, title)


def plot_layer_loss(methods: Methods, path: Path, title: str = "") -> Path | None:
    """Loss read out at layers 0..L, one panel per condition, one line per method."""
    conditions: list[str] = []
    for block in methods.values():
        conditions.extend(c for c in block.get("layer_loss", {}) if c not in conditions)

    def draw(ax: Any, condition: str) -> None:
        for method, block in methods.items():
            values = block.get("layer_loss", {}).get(condition)
            if values:
                ax.plot(range(len(values)), values, marker="o", ms=3, label=method)
        ax.set_xlabel("layer")
        ax.set_ylabel("loss")

    return _panels(conditions, draw, path, title)
