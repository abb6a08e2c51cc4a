"""Standard figures drawn from results.json: robustness curves with std bands, per-layer loss profiles."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from descentlab.report.tables import curve_names

Methods = Mapping[str, Mapping[str, Any]]


def _panels(names: Sequence[str], draw: Callable[[Any, str], None], path: Path, title: str) -> Path | None:
    """One panel per name, drawn by ``draw(ax, name)``, saved as a PNG; None when there is nothing to draw."""
    if not names:
        return None
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        draw(ax, name)
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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
