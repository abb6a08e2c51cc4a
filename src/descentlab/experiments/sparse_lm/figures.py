"""sparse-lm's figures, redrawn from ``results.json`` and the weight samples each first-seed job saved under
``arrays/`` (their paths are in ``results["arrays"]["weights"]``, by method), so ``descentlab report
RUN_DIR`` rebuilds them without a model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.io import load_arrays
from descentlab.report.figures import new_figure, save_figure

Methods = Mapping[str, Mapping[str, Any]]  # results.json "methods"


def plot_perplexity(methods: Methods, path: Path) -> Path:
    """Perplexity vs sparsity, log scale: the trained methods, and one panel per pretrained model."""
    trained = [m for m, block in methods.items() if "layerwise" in block["curves"]]
    pretrained = [m for m, block in methods.items() if "smollm2" in block["curves"]]
    fig, axes = new_figure(1, 1 + len(pretrained), figsize=(5 + 4 * len(pretrained), 3.6))
    ax = axes[0][0]
    for name in trained:
        c = methods[name]["curves"]["layerwise"]
        lo = c.get("ci_low") or [m - s for m, s in zip(c["mean"], c["std"], strict=True)]
        hi = c.get("ci_high") or [m + s for m, s in zip(c["mean"], c["std"], strict=True)]
        ax.plot(c["x"], c["mean"], marker="o", ms=3, label=name)
        ax.fill_between(c["x"], lo, hi, alpha=0.2)
    ylabel = "test perplexity (95 % seed-level interval)" if c.get("ci_low") else "perplexity (± std)"
    ax.set(yscale="log", xlabel="sparsity (layer-wise)", ylabel=ylabel, title="small GPT-2")
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
                "caption": "Test perplexity after one-shot layer-wise magnitude pruning (no fine-tuning), "
                "95 % seed-level interval over seeds x test blocks; log scale",
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
