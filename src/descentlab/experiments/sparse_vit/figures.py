"""sparse-vit results: the method blocks, tables, the paired HORST comparison, and the weight histograms.

:func:`summarise` turns the per-(method, sparsity, seed) job results into the results.json body;
:func:`figures` redraws the weight histograms from the ``.npz`` files the run saved (their paths are in
``results["histograms"]``), so ``descentlab report RUN_DIR`` rebuilds them without a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from descentlab.io import load_arrays
from descentlab.report.figures import new_figure, save_figure
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import mean_std, paired_bootstrap

PAPER = "DeiT-base, ImageNet, 90 %: HORST 76.83 vs AdamW 68.86; DeiT-small 90 %: HORST 70.5 vs HAM 60.06"
DENSE_SUFFIX = "-dense"
BEFORE, FINAL = "before_final_pruning", "final"

Job = Mapping[
    str, Any
]  # one training run's result: val, test, checkpoint_sparsity, block_sparsity, lr, alpha


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    # float64 torch, sample std (ddof 1): the summation the experiment always used
    return mean_std(values, ddof=1, impl="torch")


def fmt_pct(values: Sequence[float]) -> str:
    mean, std = _mean_std(values)
    return f"{100 * mean:.2f} ± {100 * std:.2f}"


def excess_kurtosis(w: np.ndarray | torch.Tensor) -> float:
    """``E[(w - μ)^4] / E[(w - μ)^2]^2 - 3`` over all entries, in float64 (0 for a Gaussian; NaN for a
    constant tensor)."""
    centred = torch.as_tensor(w).detach().double().flatten()
    centred = centred - centred.mean()
    return float((centred**4).mean() / (centred**2).mean() ** 2 - 3.0)


def weight_stats(w: np.ndarray | torch.Tensor) -> dict[str, float]:
    """Shape of a weight distribution: share of tiny weights, excess kurtosis, and ||w||_1 / (sqrt(n) ||w||_2).

    A Gaussian has excess kurtosis 0 and L1/L2 ratio sqrt(2/pi) ~ 0.80; a distribution sharply peaked at 0
    with heavy tails has a large kurtosis and a small ratio.
    """
    w = torch.as_tensor(w).double()
    return {
        "frac_abs_below_1e-3": float((w.abs() < 1e-3).double().mean()),
        "frac_abs_below_1e-2": float((w.abs() < 1e-2).double().mean()),
        "excess_kurtosis": excess_kurtosis(w),
        "l1_over_l2": float(w.abs().sum() / (w.numel() ** 0.5 * w.norm())),
    }


def accuracy_ci(runs: Sequence[Job], n_boot: int = 2000) -> list[float] | None:
    """The 95 % bootstrap CI of the mean test accuracy over (seeds x test images), resampling both axes;
    None when the jobs hold no per-image correctness (``test_correct``)."""
    if not all("test_correct" in r for r in runs):
        return None
    cells = np.asarray([r["test_correct"] for r in runs], dtype=np.float64)
    ci = paired_bootstrap(cells, np.zeros_like(cells), n_boot=n_boot)
    return [ci.low, ci.high]


def method_blocks(
    sparse: Mapping[str, Mapping[float, Sequence[Job]]], dense: Mapping[str, Sequence[Job]]
) -> dict[str, MethodResult]:
    """One block per sparse method (accuracy against sparsity) and per dense baseline (``<label>-dense``)."""
    methods: dict[str, MethodResult] = {}
    for label, by_sparsity in sparse.items():
        sparsities = list(by_sparsity)
        stats = [_mean_std([r["test"] for r in by_sparsity[s]]) for s in sparsities]
        cis = [accuracy_ci(by_sparsity[s]) for s in sparsities]
        first = by_sparsity[sparsities[0]][0]
        methods[label] = MethodResult(
            metrics={f"test_accuracy@{s:g}": m for s, (m, _) in zip(sparsities, stats, strict=True)}
            | {"lr": first["lr"], "alpha": first["alpha"]},
            curves={
                "test_accuracy": Curve(
                    x_name="sparsity",
                    x=sparsities,
                    metric="accuracy",
                    mean=[m for m, _ in stats],
                    std=[s for _, s in stats],
                    extra={"ci95": cis} if all(cis) else {},
                )
            },
            sparsity={
                f"checkpoint@{s:g}": min(r["checkpoint_sparsity"] for r in runs)
                for s, runs in by_sparsity.items()
            },
        )
    for label, runs in dense.items():
        ci = accuracy_ci(runs)
        methods[label + DENSE_SUFFIX] = MethodResult(
            metrics={"test_accuracy@0": _mean_std([r["test"] for r in runs])[0]},
            sparsity={"checkpoint": max(r["checkpoint_sparsity"] for r in runs)},
            extra={"test_accuracy_ci95": ci} if ci else {},
        )
    return methods


def summary_tables(
    sparse: Mapping[str, Mapping[float, Sequence[Job]]],
    dense: Mapping[str, Sequence[Job]],
    *,
    seeds: Sequence[int],
    tuning: Sequence[Sequence[Any]] = (),
    tune_sparsity: float | None = None,
    weights: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    weights_sparsity: float | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The accuracy, checkpoint-sparsity, tuning, paired-difference and weight-shape tables, and the notes.

    Args:
        sparse: ``{label: {sparsity: [job per seed]}}``.
        dense: ``{label: [job per seed]}`` of the dense baselines.
        seeds: the training seeds, in the jobs' order.
        tuning: rows ``[label, lr, alpha, val accuracy %, chosen mark]`` of the validation tuning.
        tune_sparsity: the sparsity the tuning ran at.
        weights: ``{label or label-dense: {"before_final_pruning" / "final": weights}}`` of the first seed.
        weights_sparsity: the sparsity of the runs ``weights`` come from (default: the largest).
    """
    sparsities = list(next(iter(sparse.values())))
    top = max(sparsities)
    shown = top if weights_sparsity is None else weights_sparsity
    columns = ["optimizer", *(["dense"] if dense else []), *[f"{100 * s:g} %" for s in sparsities]]
    acc_rows = [
        [label, *(["–"] if dense else []), *[fmt_pct([r["test"] for r in by_s[s]]) for s in sparsities]]
        for label, by_s in sparse.items()
    ]
    for label, runs in dense.items():
        acc_rows.append([f"{label} (dense)", fmt_pct([r["test"] for r in runs]), *["–"] * len(sparsities)])
    ckpt_rows = [
        [
            label,
            f"{100 * s:g} %",
            f"{min(r['checkpoint_sparsity'] for r in runs):.6f}",
            f"{max(r['checkpoint_sparsity'] for r in runs):.6f}",
            f"{min(min(r['block_sparsity']) for r in runs):.4f}–{max(max(r['block_sparsity']) for r in runs):.4f}",
        ]
        for label, by_s in sparse.items()
        for s, runs in by_s.items()
    ]
    tables = [
        {
            "title": f"Test accuracy (%) against sparsity, mean ± std over seeds {list(seeds)}",
            "columns": columns,
            "rows": acc_rows,
        },
        {
            "title": "Sparsity read back from the saved safetensors checkpoints (prunable weights, exact zeros)",
            "columns": ["optimizer", "target", "global min", "global max", "per-block range"],
            "rows": ckpt_rows,
        },
    ]
    if tuning:
        tables.append(
            {
                "title": f"Tuning on the validation split (sparsity {tune_sparsity:g}, seed {seeds[0]}; accuracy %)",
                "columns": ["optimizer", "lr", "alpha", "val accuracy", "chosen"],
                "rows": [list(r) for r in tuning],
            }
        )
    notes, diff_rows = compare({label: by_s[top] for label, by_s in sparse.items()}, top)
    if diff_rows:
        tables.append(
            {
                "title": f"Paired per-seed differences at {100 * top:g} % (test accuracy points)",
                "columns": ["comparison", "per seed", "mean ± std", "HORST ahead"],
                "rows": diff_rows,
            }
        )
    weights = weights or {}
    shape_rows = [
        [label, *(f"{v:.4f}" for v in weight_stats(weights[label][BEFORE]).values())]
        for label in sparse
        if BEFORE in weights.get(label, {})
    ]
    shape_rows += [
        [f"{label} (dense, end)", *(f"{v:.4f}" for v in weight_stats(w[FINAL]).values())]
        for label in dense
        if FINAL in (w := weights.get(label + DENSE_SUFFIX, {}))
    ]
    if shape_rows:
        tables.append(
            {
                "title": f"Prunable weights before the final pruning (seed {seeds[0]}, {100 * shown:g} % run): "
                "how peaked at 0",
                "columns": ["optimizer", "|w| < 1e-3", "|w| < 1e-2", "excess kurtosis", "L1/(√n L2)"],
                "rows": shape_rows,
            }
        )
    return tables, notes


def compare(at_top: Mapping[str, Sequence[Job]], top: float) -> tuple[list[str], list[list[str]]]:
    """Per-seed paired differences HORST - AdamW and HORST - HAM at the top sparsity, and the paper's numbers.

    ``at_top`` maps a method label to its per-seed jobs; the comparison runs when ``horst`` is among them.
    """
    notes: list[str] = []
    rows: list[list[str]] = []
    if "horst" not in at_top:
        return notes, rows
    horst = [r["test"] for r in at_top["horst"]]
    for other in ("adamw", "ham"):
        if other not in at_top:
            continue
        diffs = [100 * (h - r["test"]) for h, r in zip(horst, at_top[other], strict=True)]
        mean, std = _mean_std(diffs)
        wins = sum(d > 0 for d in diffs)
        rows.append(
            [
                f"horst - {other}",
                ", ".join(f"{d:+.2f}" for d in diffs),
                f"{mean:+.2f} ± {std:.2f}",
                f"{wins}/{len(diffs)}",
            ]
        )
    if rows:  # the verdicts are the claims' (report.sparse_vit_claims), with paired CIs over test images
        notes.append(f"Paper, for scale: {PAPER}.")
    return notes, rows


def accuracy_figure(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """Test accuracy against sparsity with 95 % CIs (over seeds x test images), each dense run as a band."""
    methods = results.get("methods", {})
    curves = {m: b["curves"]["test_accuracy"] for m, b in methods.items() if "test_accuracy" in b["curves"]}
    if not curves or not all("ci95" in c for c in curves.values()):
        return []
    fig, axes = new_figure(1, 1, figsize=(5.5, 3.8))
    ax = axes[0][0]
    # the levels as evenly spaced categories: 98 / 99 / 99.5 % would crowd on a linear axis
    levels = sorted({v for c in curves.values() for v in c["x"]})
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
    ax.set_xticks(range(len(levels)), [f"{100 * v:g}" for v in levels])
    ax.set_xlim(-0.5, len(levels) - 0.5)
    ax.set_xlabel("sparsity of the prunable weights (%)")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, run_dir / "figures" / "accuracy-vs-sparsity.png", dpi=120)
    return [
        {
            "path": "figures/accuracy-vs-sparsity.png",
            "caption": "Test accuracy against sparsity, 95 % bootstrap CIs over (seeds x test images); the "
            "dense reference's CI as a grey band.",
        }
    ]


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


__all__ = [
    "accuracy_ci",
    "accuracy_figure",
    "compare",
    "excess_kurtosis",
    "figures",
    "fmt_pct",
    "method_blocks",
    "summary_tables",
    "weight_stats",
]
