"""robust-sparse's figures: accuracy against γ with one line per one-shot sparsity, and accuracy against
sparsity per method. Drawn from ``results.json`` alone (the ``<kind>@s=<s>`` and ``<kind>@gamma=<γ>_vs_sparsity``
curves), so ``descentlab report`` redraws them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from descentlab.report.figures import new_figure, save_figure

FIGURE = "figures/accuracy_vs_gamma_by_sparsity.png"
SPARSITY_FIGURE = "figures/accuracy_vs_sparsity_by_method.png"


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """One panel per method: accuracy against γ, one line per sparsity; then :func:`_sparsity_figure`."""
    methods = results.get("methods", {})
    kind = results["config"]["evaluation"]["kinds"][0]
    levels = results["config"]["pruning"]["sparsities"]
    if not methods:
        return []
    fig, axes = new_figure(1, len(methods), sharey=True)
    for ax, (method, block) in zip(axes[0], methods.items(), strict=True):
        for s in levels:
            c = block["curves"][f"{kind}@s={s:g}"]
            mean, std = np.asarray(c["mean"]), np.asarray(c["std"])
            ax.plot(c["x"], mean, marker="o", label=f"s={s:g}")
            ax.fill_between(c["x"], mean - std, mean + std, alpha=0.15)
        ax.set(title=method, xlabel="γ (embedding noise)", ylabel="accuracy")
        ax.grid(alpha=0.3)
    axes[0][0].legend(title="sparsity", fontsize=8)
    fig.tight_layout()
    save_figure(fig, Path(run_dir) / FIGURE)
    caption = f"Test accuracy against γ ({kind}), one line per one-shot sparsity; band = ± std"
    return [{"path": FIGURE, "caption": caption}, *_sparsity_figure(methods, kind, run_dir)]


def _sparsity_figure(methods: dict[str, Any], kind: str, run_dir: Path) -> list[dict[str, str]]:
    """One panel per γ (0 and every γ >= 1): accuracy against the sparsity reached, one line per method."""
    suffix = "_vs_sparsity"
    first = next(iter(methods.values()))["curves"]
    keys = sorted((k for k in first if k.startswith(f"{kind}@gamma=") and k.endswith(suffix)),
                  key=lambda k: float(k[len(f"{kind}@gamma="):-len(suffix)]))  # fmt: skip
    if not keys:
        return []
    fig, axes = new_figure(1, len(keys), sharey=True)
    for ax, key in zip(axes[0], keys, strict=True):
        for method, block in methods.items():
            c = block["curves"][key]
            mean, std = np.asarray(c["mean"]), np.asarray(c["std"])
            ax.plot(c["x"], mean, marker="o", label=method)
            ax.fill_between(c["x"], mean - std, mean + std, alpha=0.12)
        ax.set(title=key[len(f"{kind}@"):-len(suffix)].replace("gamma", "γ"), xlabel="sparsity reached",
               ylabel="accuracy")  # fmt: skip
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, Path(run_dir) / SPARSITY_FIGURE)
    caption = f"Test accuracy against the sparsity reached, one panel per γ ({kind}), one line per method; band = ± std"
    return [{"path": SPARSITY_FIGURE, "caption": caption}]
