"""Standard figures drawn from results.json: robustness curves with std bands, per-layer loss profiles."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from descentlab.report.tables import curve_names


def plot_curves(methods: Mapping[str, Mapping[str, Any]], path: Path, title: str = "") -> Path | None:
    """One panel per curve name; one line per method with a ±1 std band."""
    names = curve_names(methods)
    if not names:
        return None
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for method, block in methods.items():
            curve = block.get("curves", {}).get(name)
            if not curve:
                continue
            x, mean = curve["x"], curve["mean"]
            std = curve.get("std") or [0.0] * len(x)
            ax.plot(x, mean, marker="o", ms=3, label=method)
            ax.fill_between(
                x,
                [m - s for m, s in zip(mean, std, strict=True)],
                [m + s for m, s in zip(mean, std, strict=True)],
                alpha=0.2,
            )
            ax.set_xlabel(curve.get("x_name", "x"))
            ax.set_ylabel(curve.get("metric", ""))
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_layer_loss(methods: Mapping[str, Mapping[str, Any]], path: Path, title: str = "") -> Path | None:
    """Loss read out at layers 0..L, one line per (method, condition)."""
    conditions: list[str] = []
    for block in methods.values():
        conditions.extend(c for c in block.get("layer_loss", {}) if c not in conditions)
    if not conditions:
        return None
    fig, axes = plt.subplots(1, len(conditions), figsize=(4.2 * len(conditions), 3.4), squeeze=False)
    for ax, condition in zip(axes[0], conditions, strict=True):
        for method, block in methods.items():
            values = block.get("layer_loss", {}).get(condition)
            if values:
                ax.plot(range(len(values)), values, marker="o", ms=3, label=method)
        ax.set_xlabel("layer")
        ax.set_ylabel("loss")
        ax.set_title(condition)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
