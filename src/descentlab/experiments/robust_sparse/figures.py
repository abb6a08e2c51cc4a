"""robust-sparse report: accuracy tables (per sparsity, paired against ERM), summary notes, the
accuracy-against-γ figure with one line per one-shot sparsity, and accuracy against sparsity per method.

The tables take the raw accuracies ``values[method][level]``: arrays ``[seed, draw, γ]`` in the order of the
requested sparsities, so that differences between methods are paired cell by cell (same seed, same noise).
The figure is drawn from ``results.json`` alone (the ``<kind>@s=<s>`` curves), so ``descentlab report``
redraws it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.report.figures import new_figure, save_figure
from descentlab.report.stats import paired_bootstrap
from descentlab.report.tables import multiplier_tables

FIGURE = "figures/accuracy_vs_gamma_by_sparsity.png"
SPARSITY_FIGURE = "figures/accuracy_vs_sparsity_by_method.png"


def _fmt(mean: float, std: float) -> str:
    return f"{mean:.4f} ± {std:.4f}"


def accuracy_tables(
    methods: Mapping[str, Any],
    values: Mapping[str, Sequence[np.ndarray]],
    pairs: Sequence[tuple[str, str]],
    levels: Sequence[float],
    kind: str,
    gammas: Sequence[float],
    n_boot: int = 2000,
) -> list[dict[str, Any]]:
    """Accuracy vs γ at every sparsity; ``(method, baseline)`` paired differences; final multipliers.

    Args:
        methods: the results.json ``methods`` blocks.
        values: per method, per requested sparsity, the ``kind`` accuracies ``[seed, draw, γ]``.
        pairs: ``(method, baseline)`` label pairs; each row is ``method − baseline``: the mean and the
            paired bootstrap 95 % CI (:func:`~descentlab.report.stats.paired_bootstrap`, resampling seeds and
            draws) over the paired (seed, draw) cells, per γ.
        levels: the requested sparsities.
        kind: the perturbation kind tabulated.
        gammas: the γ grid.
        n_boot: bootstrap replicates.
    """
    grid_rows = []
    for method, block in methods.items():
        for s in levels:
            c = block["curves"][f"{kind}@s={s:g}"]
            grid_rows.append(
                [
                    method,
                    f"{block['sparsity'][f'reached@s={s:g}']:.3f}",
                    *[_fmt(m, sd) for m, sd in zip(c["mean"], c["std"], strict=True)],
                ]
            )
    tables = [
        {
            "title": f"Test accuracy against γ ({kind} embedding noise) at each sparsity, mean ± std over "
            "(seed, draw)",
            "columns": ["method", "sparsity reached", *[f"γ={g:g}" for g in gammas]],
            "rows": grid_rows,
        }
    ]
    paired = []
    for method, base in pairs:
        for i, s in enumerate(levels):
            a, b = np.asarray(values[method][i]), np.asarray(values[base][i])
            cis = [paired_bootstrap(a[..., g], b[..., g], n_boot=n_boot) for g in range(len(gammas))]
            paired.append(
                [
                    f"{method} − {base}",
                    f"{s:g}",
                    *[f"{c.mean:+.4f} [{c.low:+.4f}, {c.high:+.4f}]" for c in cis],
                ]
            )
    if paired:
        tables.append(
            {
                "title": "Accuracy difference to ERM with the same optimizer: mean [paired 95 % bootstrap CI over "
                "the (seed, draw) cells: same seeds, same noise]",
                "columns": ["methods", "sparsity", *[f"γ={g:g}" for g in gammas]],
                "rows": paired,
            }
        )
    tables.extend(multiplier_tables(dict(methods)))
    return tables


def summary_notes(methods: Mapping[str, Any], levels: Sequence[float], kind: str) -> list[str]:
    """One line per method: dense vs sparsest, clean and averaged over the γ grid."""
    lo, hi = f"s={levels[0]:g}", f"s={levels[-1]:g}"
    return [
        f"{m}: clean accuracy {v['metrics'][f'accuracy@{lo}']:.4f} at {lo} -> {v['metrics'][f'accuracy@{hi}']:.4f}"
        f" at sparsity {v['sparsity']['global']:.3f}; {kind} accuracy over the γ grid "
        f"{v['metrics'][f'{kind}_mean_over_grid@{lo}']:.4f} -> {v['metrics'][f'{kind}_mean_over_grid@{hi}']:.4f}"
        for m, v in methods.items()
    ]


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
