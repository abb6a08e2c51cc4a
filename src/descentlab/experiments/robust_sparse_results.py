"""robust-sparse results: the DESIGN results.json blocks, the accuracy tables and the γ-by-sparsity figure.

Inputs are the sweeps of :mod:`descentlab.experiments.robust_sparse`: per method, one list per seed of
sweep points (``requested``, ``reached`` sparsity, a ``RobustnessCurves`` ``curve``, a layer ``profile``),
in the order of the requested sparsities.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.report.tables import multiplier_tables
from descentlab.robustness import RobustnessCurves


def _fmt(mean: float, std: float) -> str:
    return f"{mean:.4f} ± {std:.4f}"


def method_block(
    per_seed: Sequence[Sequence[Any]],
    levels: Sequence[float],
    kinds: Sequence[str],
    gammas: Sequence[float],
    multipliers: Sequence[Sequence[float]],
) -> dict[str, Any]:
    """One method's block: a γ-curve per sparsity, accuracy-vs-sparsity curves at γ = 0 and γ >= 1.

    Sparsity curves use the sparsity *reached* (mean over seeds) as x; metrics carry clean accuracy and the
    mean over the γ grid at every requested level (``accuracy@s=0.5``, ``gaussian_mean_over_grid@s=0.5``).
    """
    joined = [RobustnessCurves.concat([points[i].curve for points in per_seed]) for i in range(len(levels))]
    reached = [float(np.mean([points[i].reached for points in per_seed])) for i in range(len(levels))]
    curves: dict[str, Any] = {}
    metrics: dict[str, float] = {}
    for s, curve in zip(levels, joined, strict=True):
        for kind, block in curve.curves().items():
            curves[f"{kind}@s={s:g}"] = block
        metrics[f"accuracy@s={s:g}"] = float(curve.values[kinds[0]][:, 0, 0].mean())
        for kind in kinds:
            metrics[f"{kind}_mean_over_grid@s={s:g}"] = float(curve.values[kind].mean())
    metrics["accuracy"] = metrics[f"accuracy@s={levels[0]:g}"]
    for kind in kinds:
        for gamma in [0.0, *[g for g in gammas if g >= 1.0]]:
            g = list(gammas).index(gamma)
            per_level = [c.values[kind][..., g].reshape(-1) for c in joined]
            curves[f"{kind}@gamma={gamma:g}_vs_sparsity"] = {
                "x_name": "sparsity",
                "x": reached,
                "metric": "accuracy",
                "mean": [float(v.mean()) for v in per_level],
                "std": [float(v.std()) for v in per_level],
            }
    block: dict[str, Any] = {
        "metrics": metrics,
        "curves": curves,
        "layer_loss": {
            f"clean@s={s:g}": np.mean([points[i].profile for points in per_seed], axis=0).tolist()
            for i, s in enumerate(levels)
        },
        "sparsity": {
            "global": reached[-1],
            **{f"reached@s={s:g}": r for s, r in zip(levels, reached, strict=True)},
        },
    }
    if multipliers:
        block["multipliers"] = np.asarray(multipliers).mean(0).tolist()
    return block


def accuracy_tables(
    methods_out: dict[str, Any],
    sweeps: dict[str, Sequence[Sequence[Any]]],
    pairs: Sequence[tuple[str, str]],
    levels: Sequence[float],
    kind: str,
    gammas: Sequence[float],
) -> list[dict[str, Any]]:
    """Accuracy vs γ at every sparsity; ``(method, baseline)`` paired differences; final multipliers."""
    grid_rows = []
    for method, block in methods_out.items():
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
            diff = np.concatenate(
                [
                    (a[i].curve.values[kind] - b[i].curve.values[kind]).reshape(-1, len(gammas))
                    for a, b in zip(sweeps[method], sweeps[base], strict=True)
                ]
            )
            means, stds = diff.mean(0), diff.std(0)
            paired.append(
                [
                    f"{method} − {base}",
                    f"{s:g}",
                    *[f"{m:+.4f} ± {sd:.4f}" for m, sd in zip(means, stds, strict=True)],
                ]
            )
    if paired:
        tables.append(
            {
                "title": "Accuracy difference to ERM with the same optimizer (paired: same seeds, same noise)",
                "columns": ["methods", "sparsity", *[f"γ={g:g}" for g in gammas]],
                "rows": paired,
            }
        )
    tables.extend(multiplier_tables(methods_out))
    return tables


def accuracy_figure(path: Path, methods_out: dict[str, Any], kind: str, levels: Sequence[float]) -> None:
    """One panel per method: accuracy against γ, one line per sparsity, band = ± std."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(methods_out), figsize=(4.2 * len(methods_out), 3.4), squeeze=False, sharey=True
    )
    for ax, (method, block) in zip(axes[0], methods_out.items(), strict=True):
        for s in levels:
            c = block["curves"][f"{kind}@s={s:g}"]
            mean, std = np.asarray(c["mean"]), np.asarray(c["std"])
            ax.plot(c["x"], mean, marker="o", label=f"s={s:g}")
            ax.fill_between(c["x"], mean - std, mean + std, alpha=0.15)
        ax.set(title=method, xlabel="γ (embedding noise)", ylabel="accuracy")
        ax.grid(alpha=0.3)
    axes[0][0].legend(title="sparsity", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summary_notes(methods_out: dict[str, Any], levels: Sequence[float], kind: str) -> list[str]:
    """One line per method: dense vs sparsest, clean and averaged over the γ grid."""
    lo, hi = f"s={levels[0]:g}", f"s={levels[-1]:g}"
    return [
        f"{m}: clean accuracy {v['metrics'][f'accuracy@{lo}']:.4f} at {lo} -> {v['metrics'][f'accuracy@{hi}']:.4f}"
        f" at sparsity {v['sparsity']['global']:.3f}; {kind} accuracy over the γ grid "
        f"{v['metrics'][f'{kind}_mean_over_grid@{lo}']:.4f} -> {v['metrics'][f'{kind}_mean_over_grid@{hi}']:.4f}"
        for m, v in methods_out.items()
    ]
