"""Tables and figures of the sparse-lm experiment (perplexity against sparsity, paired gaps, histograms)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch


def mean_std(rows: list[list[float]]) -> tuple[list[float], list[float]]:
    """Column-wise mean and sample standard deviation (0 for a single row)."""
    t = torch.tensor(rows, dtype=torch.float64)
    std = t.std(0, correction=1) if t.shape[0] > 1 else torch.zeros(t.shape[1], dtype=torch.float64)
    return t.mean(0).tolist(), std.tolist()


def perplexity_table(methods: dict, optimizers: list[str]) -> dict:
    """Validation perplexity (mean ± std over seeds) per optimizer and sparsity."""
    xs = methods[optimizers[0]]["curves"]["layerwise"]["x"]
    rows = []
    for name in optimizers:
        c = methods[name]["curves"]["layerwise"]
        rows.append([name, *[f"{m:.2f} ± {s:.2f}" for m, s in zip(c["mean"], c["std"], strict=True)]])
    return {
        "title": "Validation perplexity after one-shot layer-wise pruning (mean ± std over seeds)",
        "columns": ["optimizer", *[f"{x:.0%}" for x in xs]],
        "rows": rows,
    }


def sparsity_table(sweeps: dict[str, list[dict]], optimizers: list[str]) -> dict:
    """Requested against reached sparsity: the exact-zero fraction over all pruned matrices, and its range."""
    first = sweeps[optimizers[0]][0]
    rows = []
    for i, x in enumerate(first["x"]):
        runs = [s for o in optimizers for s in sweeps[o]]
        rows.append(
            [
                f"{x:.2f}",
                f"{min(s['reached'][i] for s in runs):.6f}",
                f"{min(s['reached_min'][i] for s in runs):.6f}",
                f"{max(s['reached_max'][i] for s in runs):.6f}",
            ]
        )
    return {
        "title": "Sparsity reached (exact zeros in the block matrices; min over runs, and the least / most "
        "sparse single matrix)",
        "columns": ["requested", "reached (all matrices)", "least sparse matrix", "most sparse matrix"],
        "rows": rows,
    }


def gap_table(sweeps: dict[str, list[dict]], a: str, b: str) -> dict:
    """Paired-by-seed log-perplexity gap ``log ppl_a - log ppl_b`` (negative: ``a`` is better) per sparsity."""
    xs = sweeps[a][0]["x"]
    diffs = [
        [pa - pb for pa, pb in zip(ra["nll"], rb["nll"], strict=True)]
        for ra, rb in zip(sweeps[a], sweeps[b], strict=True)
    ]
    mean, std = mean_std(diffs)
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


def damage_table(methods: dict, optimizers: list[str]) -> dict:
    """Pruning damage ``log ppl(s) - log ppl(0)`` of each trained model, mean ± std over seeds.

    Each run is compared with its own dense model, so the seed-to-seed spread of the dense perplexity (large
    for short runs) drops out and only the sensitivity to pruning remains.
    """
    xs = methods[optimizers[0]]["curves"]["layerwise"]["x"]
    rows = []
    for name in optimizers:
        per_seed = methods[name]["curves"]["layerwise"]["per_seed"]
        mean, std = mean_std([[math.log(p / run[0]) for p in run] for run in per_seed])
        rows.append([name, *[f"{m:+.3f} ± {s:.3f}" for m, s in zip(mean[1:], std[1:], strict=True)]])
    return {
        "title": "Pruning damage: log ppl(pruned) - log ppl(dense) of the same run (mean ± std over seeds)",
        "columns": ["optimizer", *[f"{x:.0%}" for x in xs[1:]]],
        "rows": rows,
    }


def plot_perplexity(methods: dict, optimizers: list[str], path: Path) -> Path:
    """Perplexity vs sparsity, log scale: the trained optimizers, and the pretrained SmolLM2 if present."""
    smol = [m for m in methods if m not in optimizers]
    fig, axes = plt.subplots(1, 1 + len(smol), figsize=(5 + 4 * len(smol), 3.6), squeeze=False)
    ax = axes[0][0]
    for name in optimizers:
        c = methods[name]["curves"]["layerwise"]
        lo = [m - s for m, s in zip(c["mean"], c["std"], strict=True)]
        hi = [m + s for m, s in zip(c["mean"], c["std"], strict=True)]
        ax.plot(c["x"], c["mean"], marker="o", ms=3, label=name)
        ax.fill_between(c["x"], lo, hi, alpha=0.2)
    ax.set(yscale="log", xlabel="sparsity (layer-wise)", ylabel="validation perplexity", title="small GPT-2")
    ax.legend(fontsize=8)
    for ax, name in zip(axes[0][1:], smol, strict=True):
        c = methods[name]["curves"]["smollm2"]
        ax.plot(c["x"], c["mean"], marker="o", ms=3, color="k")
        ax.set(yscale="log", xlabel="sparsity (layer-wise)", title=name)
    for ax in axes[0]:
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_weight_histograms(weights: dict[str, torch.Tensor], path: Path) -> Path:
    """Histograms of the trained block-matrix weights per optimizer (log counts, central 99.9 %)."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    # kthvalue, not quantile: torch.quantile refuses tensors above 16 M entries (GPT-2 small has 85 M)
    lim = max(
        float(w.float().abs().kthvalue(max(1, math.ceil(0.999 * w.numel()))).values) for w in weights.values()
    )
    for name, w in weights.items():
        # the outermost 0.1 % fall outside the range and are left out, rather than piled into the edge bins
        ax.hist(w.float().numpy(), bins=201, range=(-lim, lim), histtype="step", label=name)
    ax.set(yscale="log", xlabel="weight value", ylabel="count")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


__all__ = [
    "damage_table",
    "gap_table",
    "mean_std",
    "perplexity_table",
    "plot_perplexity",
    "plot_weight_histograms",
    "sparsity_table",
]
