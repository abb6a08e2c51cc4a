"""Tables and figures of sparse-lm: perplexity against sparsity, pruning damage, paired gaps, weight histograms.

The tables are built by the experiment from its per-seed sweeps and stored in ``results.json``; the figures
are drawn by :func:`figures` from ``results.json`` and the weight samples each first-seed job saved under
``arrays/`` (their paths are listed in ``results["arrays"]["weights"]``, by method).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.io import load_arrays
from descentlab.report.figures import new_figure, save_figure
from descentlab.report.stats import column_mean_std

Sweeps = Mapping[str, Sequence[Mapping[str, Any]]]  # method -> one prune sweep per seed
Methods = Mapping[str, Mapping[str, Any]]  # results.json "methods"


def perplexity_table(methods: Methods, labels: Sequence[str]) -> dict:
    """Validation perplexity (mean ± std over seeds) per method and sparsity."""
    xs = methods[labels[0]]["curves"]["layerwise"]["x"]
    rows = []
    for name in labels:
        c = methods[name]["curves"]["layerwise"]
        rows.append([name, *[f"{m:.2f} ± {s:.2f}" for m, s in zip(c["mean"], c["std"], strict=True)]])
    return {
        "title": "Validation perplexity after one-shot layer-wise pruning (mean ± std over seeds)",
        "columns": ["optimizer", *[f"{x:.0%}" for x in xs]],
        "rows": rows,
    }


def damage_table(methods: Methods, labels: Sequence[str]) -> dict:
    """Pruning damage ``log ppl(s) - log ppl(0)`` of each trained model, mean ± std over seeds.

    Each run is compared with its own dense model, so the seed-to-seed spread of the dense perplexity (large
    for short runs) drops out and only the sensitivity to pruning remains.
    """
    xs = methods[labels[0]]["curves"]["layerwise"]["x"]
    rows = []
    for name in labels:
        per_seed = methods[name]["curves"]["layerwise"]["per_seed"]
        mean, std = column_mean_std([[math.log(p / run[0]) for p in run] for run in per_seed])
        rows.append([name, *[f"{m:+.3f} ± {s:.3f}" for m, s in zip(mean[1:], std[1:], strict=True)]])
    return {
        "title": "Pruning damage: log ppl(pruned) - log ppl(dense) of the same run (mean ± std over seeds)",
        "columns": ["optimizer", *[f"{x:.0%}" for x in xs[1:]]],
        "rows": rows,
    }


def sparsity_table(sweeps: Sweeps, labels: Sequence[str]) -> dict:
    """Requested against reached sparsity: the exact-zero fraction over all pruned matrices, and its range."""
    runs = [s for label in labels for s in sweeps[label]]
    rows = [
        [
            f"{x:.2f}",
            f"{min(s['reached'][i] for s in runs):.6f}",
            f"{min(s['reached_min'][i] for s in runs):.6f}",
            f"{max(s['reached_max'][i] for s in runs):.6f}",
        ]
        for i, x in enumerate(sweeps[labels[0]][0]["x"])
    ]
    return {
        "title": "Sparsity reached (exact zeros in the block matrices; min over runs, and the least / most "
        "sparse single matrix)",
        "columns": ["requested", "reached (all matrices)", "least sparse matrix", "most sparse matrix"],
        "rows": rows,
    }


def gap_table(sweeps: Sweeps, a: str, b: str) -> dict:
    """Paired-by-seed log-perplexity gap ``log ppl_a - log ppl_b`` (negative: ``a`` is better) per sparsity."""
    xs = sweeps[a][0]["x"]
    diffs = [
        [pa - pb for pa, pb in zip(ra["nll"], rb["nll"], strict=True)]
        for ra, rb in zip(sweeps[a], sweeps[b], strict=True)
    ]
    mean, std = column_mean_std(diffs)
    wins = [sum(d[i] < 0 for d in diffs) for i in range(len(xs))]
    rows = [
        [f"{x:.0%}", f"{m:+.4f} ± {s:.4f}", f"{math.exp(m):.3f}", f"{w}/{len(diffs)}"]
        for x, m, s, w in zip(xs, mean, std, wins, strict=True)
    ]
    return {
        "title": f"{a} vs {b}: paired log-perplexity gap per seed (negative = {a} better)",
        "columns": ["sparsity", f"log ppl({a}) - log ppl({b})", "ppl ratio", f"seeds where {a} wins"],
        "rows": rows,
    }


def plot_perplexity(methods: Methods, path: Path) -> Path:
    """Perplexity vs sparsity, log scale: the trained methods, and one panel per pretrained model."""
    trained = [m for m, block in methods.items() if "layerwise" in block["curves"]]
    pretrained = [m for m, block in methods.items() if "smollm2" in block["curves"]]
    fig, axes = new_figure(1, 1 + len(pretrained), figsize=(5 + 4 * len(pretrained), 3.6))
    ax = axes[0][0]
    for name in trained:
        c = methods[name]["curves"]["layerwise"]
        lo = [m - s for m, s in zip(c["mean"], c["std"], strict=True)]
        hi = [m + s for m, s in zip(c["mean"], c["std"], strict=True)]
        ax.plot(c["x"], c["mean"], marker="o", ms=3, label=name)
        ax.fill_between(c["x"], lo, hi, alpha=0.2)
    ax.set(yscale="log", xlabel="sparsity (layer-wise)", ylabel="validation perplexity", title="small GPT-2")
    ax.legend(fontsize=8)
    for ax, name in zip(axes[0][1:], pretrained, strict=True):
        c = methods[name]["curves"]["smollm2"]
        ax.plot(c["x"], c["mean"], marker="o", ms=3, color="k")
        ax.set(yscale="log", xlabel="sparsity (layer-wise)", title=name)
    for ax in axes[0]:
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


def plot_weight_histograms(samples: Mapping[str, Mapping[str, np.ndarray]], path: Path) -> Path:
    """Histograms of the trained block-matrix weights per method (log counts, central 99.9 %).

    ``samples[method]`` holds ``weights`` (all of them, or a uniform sample of a large model) and ``total``
    (how many there are); a sample's counts are scaled by ``total / len(weights)`` to estimate the full ones.
    """
    fig, ax = new_figure(panel_size=(5.5, 3.6))
    ax = ax[0][0]
    # the 99.9 % quantile by partition, not a sort: GPT-2 small has 85 M block weights
    lim = max(_abs_quantile_999(s["weights"]) for s in samples.values())
    for name, s in samples.items():
        w = s["weights"]
        scale = np.full(w.shape, float(s["total"]) / w.size, dtype=np.float64)
        # the outermost 0.1 % fall outside the range and are left out, rather than piled into the edge bins
        ax.hist(w, bins=201, range=(-lim, lim), weights=scale, histtype="step", label=name)
    ax.set(yscale="log", xlabel="weight value", ylabel="count")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


def _abs_quantile_999(w: np.ndarray) -> float:
    """The ceil(0.999 n)-th smallest |w|: the 99.9 % quantile of the magnitudes, without interpolation."""
    k = max(1, math.ceil(0.999 * w.size)) - 1
    return float(np.partition(np.abs(w), k)[k])


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """The perplexity-vs-sparsity figure and the weight histograms, redrawn from the run directory."""
    run_dir = Path(run_dir)
    out = []
    methods = results.get("methods", {})
    if any("layerwise" in b.get("curves", {}) for b in methods.values()):
        plot_perplexity(methods, run_dir / "figures" / "perplexity-vs-sparsity.png")
        out.append(
            {
                "path": "figures/perplexity-vs-sparsity.png",
                "caption": "Validation perplexity after one-shot layer-wise magnitude pruning (no fine-tuning), "
                "mean ± std over seeds; log scale",
            }
        )
    files = results.get("arrays", {}).get("weights", {})
    if files:
        samples = {name: load_arrays(run_dir / rel) for name, rel in files.items()}
        plot_weight_histograms(samples, run_dir / "figures" / "weight-histograms.png")
        seed = results.get("protocol", {}).get("seeds", ["?"])[0]
        sampled = any(s["weights"].size < int(s["total"]) for s in samples.values())
        out.append(
            {
                "path": "figures/weight-histograms.png",
                "caption": f"Block-matrix weights after training (seed {seed})"
                + ("; counts estimated from a uniform sample" if sampled else ""),
            }
        )
    return out


__all__ = [
    "damage_table",
    "figures",
    "gap_table",
    "perplexity_table",
    "plot_perplexity",
    "plot_weight_histograms",
    "sparsity_table",
]
