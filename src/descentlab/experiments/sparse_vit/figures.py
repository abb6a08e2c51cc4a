"""sparse-vit's figures, redrawn from ``results.json`` and the weights files the run saved (their paths are in
``results["histograms"]``), so ``descentlab report RUN_DIR`` rebuilds them without a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.sparse_vit import claims
from descentlab.experiments.sparse_vit.tables import BEFORE, DENSE_SUFFIX, FINAL
from descentlab.io import load_arrays
from descentlab.report.figures import new_figure, save_figure
from descentlab.report.stats import paired_interval

PAIRS = (("horst", "adamw"), ("horst", "ham"))  # the paired differences drawn beside the accuracies


def paired_differences(cells: dict[str, np.ndarray], levels: list[float]) -> dict[str, list[tuple]]:
    """Per pair ``"a − b"``: ``(level, mean, low, high, per-seed means)`` at every level where both arms
    have cells, the interval the claims engine uses (:func:`~descentlab.report.stats.paired_interval`, the
    training seed the unit of replication), in accuracy points."""
    out: dict[str, list[tuple]] = {}
    for a, b in PAIRS:
        for p in levels:
            ka, kb = claims.key("correct", a, p), claims.key("correct", b, p)
            if ka not in cells or kb not in cells:
                continue
            ci = paired_interval(cells[ka], cells[kb])
            per_seed = 100 * (np.asarray(cells[ka], float).mean(-1) - np.asarray(cells[kb], float).mean(-1))
            out.setdefault(f"{a} − {b}", []).append((p, 100 * ci.mean, 100 * ci.low, 100 * ci.high, per_seed))
    return out


def accuracy_figure(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """Test accuracy against sparsity with 95 % seed-level intervals, each dense run as a band; and beside
    it, when the run saved its claim cells, the paired differences the claims are judged on."""
    methods = results.get("methods", {})
    curves = {m: b["curves"]["test_accuracy"] for m, b in methods.items() if "test_accuracy" in b["curves"]}
    if not curves or not all("ci95" in c for c in curves.values()):
        return []
    # the levels as evenly spaced categories: 98 / 99 / 99.5 % would crowd on a linear axis
    levels = sorted({v for c in curves.values() for v in c["x"]})
    cells_path = run_dir / "arrays" / "claims.npz"
    diffs = paired_differences(load_arrays(cells_path), levels) if cells_path.is_file() else {}
    fig, axes = new_figure(1, 2 if diffs else 1, figsize=(11, 3.8) if diffs else (5.5, 3.8))
    ax = axes[0][0]
    for i, (name, c) in enumerate(curves.items()):
        mean = 100 * np.asarray(c["mean"])
        err = np.abs(100 * np.asarray(c["ci95"]).T - mean)
        x = [levels.index(v) + 0.08 * (i - (len(curves) - 1) / 2) for v in c["x"]]  # side by side
        ax.errorbar(x, mean, yerr=err, marker="o", capsize=3, label=name)
    for name, b in methods.items():
        if "test_accuracy_ci95" in b:
            low, high = (100 * v for v in b["test_accuracy_ci95"])
            label = f"{name.removesuffix(DENSE_SUFFIX)} dense"
            ax.axhspan(low, high, alpha=0.2, color="grey", label=label)
            ax.axhline(100 * b["metrics"]["test_accuracy@0"], color="grey", linestyle="--", linewidth=1)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("accuracy per method (intervals over seeds x images)", fontsize=9)
    if diffs:
        _draw_differences(axes[0][1], diffs, levels)
    for ax in axes[0]:
        ax.set_xticks(range(len(levels)), [f"{100 * v:g}" for v in levels])
        ax.set_xlim(-0.5, len(levels) - 0.5)
        ax.set_xlabel("sparsity of the prunable weights (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, run_dir / "figures" / "accuracy-vs-sparsity.png", dpi=120)
    caption = (
        "Test accuracy against sparsity, 95 % seed-level intervals over (seeds x test images); the dense "
        "reference's interval as a grey band."
    )
    if diffs:
        caption += (
            " Right: the paired differences the claims are judged on, with the claims engine's seed-level "
            "95 % interval; dots are the seeds, dotted lines the 1-point smallest effect of interest."
        )
    return [{"path": "figures/accuracy-vs-sparsity.png", "caption": caption}]


def _draw_differences(ax: Any, diffs: dict[str, list[tuple]], levels: list[float]) -> None:
    for i, (name, rows) in enumerate(diffs.items()):
        shift = 0.12 * (i - (len(diffs) - 1) / 2)
        x = np.asarray([levels.index(p) + shift for p, *_ in rows])
        mean = np.asarray([r[1] for r in rows])
        err = np.abs(np.asarray([[r[2], r[3]] for r in rows]).T - mean)
        line = ax.errorbar(x, mean, yerr=err, marker="o", capsize=4, linestyle="none", label=name)
        for xi, (*_, per_seed) in zip(x, rows, strict=True):
            ax.scatter(np.full(len(per_seed), xi + 0.04), per_seed, s=8, alpha=0.5, color=line[0].get_color())
    ax.axhline(0.0, color="black", linewidth=0.8)
    for edge in (-100 * claims.ACCURACY_SESOI, 100 * claims.ACCURACY_SESOI):
        ax.axhline(edge, color="grey", linestyle=":", linewidth=1)
    ax.set_ylabel("paired difference (accuracy points)")
    ax.set_title("paired differences, seed-level 95 % interval", fontsize=9)


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """The accuracy figure, and the prunable-weight histograms: before the final pruning, and the
    surviving weights at the end.

    Reads ``results["histograms"]``: ``{"bins", "sparsity", "seed", "files": {label: "weights/x.npz"}}``,
    each file holding ``before_final_pruning`` and / or ``final`` (flattened prunable weights).
    """
    accuracy = accuracy_figure(results, run_dir)
    spec = results.get("histograms")
    if not spec or not spec.get("files"):
        return accuracy
    series = {label: load_arrays(run_dir / path) for label, path in spec["files"].items()}
    dense = {label: w for label, w in series.items() if label.endswith(DENSE_SUFFIX)}
    fig, axes = new_figure(1, 2, figsize=(10, 3.6))
    panels = [
        (BEFORE, "end of the last decompressed phase (what the final pruning sees)"),
        (FINAL, f"final weights: non-zeros at {100 * spec['sparsity']:g} %"),
    ]
    for ax, (key, title) in zip(axes[0], panels, strict=True):
        drawn = {label: w[key] for label, w in series.items() if label not in dense and key in w}
        # the dense run's final weights are the reference in both panels
        drawn |= {f"{label.removesuffix(DENSE_SUFFIX)} (dense)": w[FINAL] for label, w in dense.items()}
        for name, w in drawn.items():
            w = w[w != 0] if key == FINAL else w
            if w.size:
                ax.hist(w, bins=spec["bins"], histtype="step", density=True, log=True, label=name)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("weight")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("density (log)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, run_dir / "figures" / "weight-histograms.png", dpi=120)
    return [
        *accuracy,
        {
            "path": "figures/weight-histograms.png",
            "caption": f"Weight histograms of the prunable weights (seed {spec['seed']}), HORST against AdamW and "
            "HAM; the dense AdamW run for reference. Raw values: the .npz files under weights/.",
        },
    ]
