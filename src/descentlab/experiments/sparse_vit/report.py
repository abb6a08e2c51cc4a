"""sparse-vit's report: a block per method, the accuracy / sparsity / tuning / weight-shape tables, and the
figures, redrawn from ``results.json``, the cell store and the weights files the run saved (their paths are
in ``results["histograms"]``), so ``descentlab report RUN_DIR`` rebuilds them without a model. The claims
are not here: the claims engine judges them from the cell store (``claims.py``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.sparse_vit import claims
from descentlab.experiments.sparse_vit.config import BEFORE, FINAL, SparseViTConfig
from descentlab.experiments.sparse_vit.jobs import Outcome
from descentlab.io import load_arrays
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import mean_std, paired_interval
from descentlab.sparsity.report import selection_record
from descentlab.study.cells import cell_key
from descentlab.study.figures import panel_figure
from descentlab.study.tables import Table, mean_sd, pm

PAPER = "DeiT-base, ImageNet, 90 %: HORST 76.83 vs AdamW 68.86; DeiT-small 90 %: HORST 70.5 vs HAM 60.06"
DENSE_SUFFIX = "-dense"
PAIRS = (("horst", "adamw"), ("horst", "ham"))  # the paired differences drawn beside the accuracies
SHAPE = ("global_frac_below", "global_kurtosis")  # a job's weight shape over all its prunable weights

Job = Mapping[str, Any]  # one training run's result (jobs.train_job)


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    # float64 torch, sample std (ddof 1): the summation the experiment always used
    return mean_std(values, ddof=1, impl="torch")


def fmt_pct(values: Sequence[float]) -> str:
    return pm(*_mean_std(values), 2, scale=100)


def accuracy_ci(runs: Sequence[Job]) -> list[float] | None:
    """The 95 % seed-level interval of the mean test accuracy over (seeds x test images)
    (:func:`~descentlab.report.stats.paired_interval` against 0); None when the jobs hold no per-image
    correctness (``test_correct``) or there is a single cell."""
    if not all("test_correct" in r for r in runs):
        return None
    cells = np.asarray([r["test_correct"] for r in runs], dtype=np.float64)
    if cells.size < 2:
        return None
    iv = paired_interval(cells, np.zeros_like(cells))
    return [iv.low, iv.high]


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


def summarise(cfg: SparseViTConfig, outcome: Outcome) -> dict[str, Any]:
    """``methods``, ``tables``, ``notes`` and ``extra`` (the tuning ``selection`` and the ``histograms``'
    weights files) of a run."""
    sparse, dense = outcome.sparse, outcome.dense
    levels, top, at = list(cfg.sparsities), max(cfg.sparsities), cfg.claim_sparsity
    accuracy = Table(
        f"Test accuracy (%) against sparsity, mean ± std over seeds {list(cfg.seeds)}",
        ["optimizer", *(["dense"] if dense else []), *[f"{100 * s:g} %" for s in levels]],
    )
    for label, by_s in sparse.items():
        accuracy.add(
            label, *(["–"] if dense else []), *[fmt_pct([r["test"] for r in by_s[s]]) for s in levels]
        )
    for label, runs in dense.items():
        accuracy.add(f"{label} (dense)", fmt_pct([r["test"] for r in runs]), *["–"] * len(levels))
    checkpoints = Table(
        "Sparsity read back from the saved safetensors checkpoints (prunable weights, exact zeros)",
        ["optimizer", "target", "global min", "global max", "per-block range"],
    )
    for label, by_s in sparse.items():
        for s, runs in by_s.items():
            blocks = [b for r in runs for b in r["block_sparsity"]]
            sparsity = [r["checkpoint_sparsity"] for r in runs]
            checkpoints.add(label, f"{100 * s:g} %", f"{min(sparsity):.6f}", f"{max(sparsity):.6f}",
                            f"{min(blocks):.4f}–{max(blocks):.4f}")  # fmt: skip
    tuning = Table(
        f"Tuning on the validation split (sparsity {cfg.tune_sparsity:g}, tuning seed {cfg.tune_seed}, never an "
        "evaluation seed; accuracy %)",
        ["optimizer", "lr", "alpha", "val accuracy", "chosen"],
        [
            [label, r["lr"], r["alpha"], f"{100 * r['val']:.2f}", "✓" if i == outcome.picks[label] else ""]
            for label, runs in outcome.grids.items()
            for i, r in enumerate(runs)
        ],
    )
    differences = Table(
        f"Paired per-seed differences at {100 * top:g} % (test accuracy points)",
        ["comparison", "per seed", "mean ± std", "HORST ahead"],
    )
    for a, b in PAIRS if "horst" in sparse else ():
        if b in sparse:
            diffs = [
                100 * (h["test"] - r["test"]) for h, r in zip(sparse[a][top], sparse[b][top], strict=True)
            ]
            differences.add(f"{a} - {b}", ", ".join(f"{d:+.2f}" for d in diffs),
                            pm(*_mean_std(diffs), 2, signed=True), f"{sum(d > 0 for d in diffs)}/{len(diffs)}")  # fmt: skip
    shapes = Table(
        f"Prunable weights before the final pruning at {100 * at:g} % (dense: at the end): how peaked at 0, "
        "mean ± std over seeds",
        ["optimizer", f"fraction |w| < {cfg.small_weight:g}", "excess kurtosis"],
    )
    series = [(label, by_s[at]) for label, by_s in sparse.items() if at in by_s]
    for name, jobs in series + [(f"{label} (dense, end)", runs) for label, runs in dense.items()]:
        if jobs[0].get("shape"):
            shapes.add(name, *(mean_sd([j["shape"][k] for j in jobs], 4, ddof=1) for k in SHAPE))
    paper_like = Table(
        f"Paper-like arm: AC/DC over the block Linears only at {100 * cfg.paper_like_sparsity:g} %, the chosen "
        "settings; test accuracy (%), mean ± std over its seeds",
        ["optimizer", "seeds", "test accuracy"],
        [[k, len(runs), fmt_pct([r["test"] for r in runs])] for k, runs in outcome.paper_like.items()],
    )
    tables = [accuracy, checkpoints, tuning, differences, shapes, paper_like]
    selection, edge_notes = selection_record(outcome.grids, outcome.picks)
    notes = [f"Paper, for scale: {PAPER}."] if differences.rows else []  # the verdicts are the claims'
    histograms = {"bins": cfg.histogram_bins, "sparsity": at, "seed": cfg.seeds[0], "files": outcome.weights}
    return {
        "methods": method_blocks(sparse, dense),
        "tables": [t.to_dict() for t in tables if t.rows],  # a table with no rows: nothing measured
        "notes": notes + edge_notes,
        "extra": {"histograms": histograms, "selection": selection},
    }


def paired_differences(store: Mapping[str, np.ndarray], levels: list[float]) -> dict[str, list[tuple]]:
    """Per pair ``"a − b"``: ``(level, mean, low, high, per-seed means)`` at every level where both arms
    have cells, the interval the claims engine uses (:func:`~descentlab.report.stats.paired_interval`, the
    training seed the unit of replication), in accuracy points."""
    out: dict[str, list[tuple]] = {}
    for a, b in PAIRS:
        for p in levels:
            ka, kb = cell_key("correct", a, p), cell_key("correct", b, p)
            if ka not in store or kb not in store:
                continue
            ci = paired_interval(store[ka], store[kb])
            per_seed = 100 * (np.asarray(store[ka], float).mean(-1) - np.asarray(store[kb], float).mean(-1))
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
    diffs = paired_differences(claims.claim_arrays(run_dir), levels)

    def draw(ax: Any, panel: str) -> None:
        if panel == "accuracy":
            _draw_accuracies(ax, curves, methods, levels)
        else:
            _draw_differences(ax, diffs, levels)
        ax.set_xticks(range(len(levels)), [f"{100 * v:g}" for v in levels])
        ax.set_xlim(-0.5, len(levels) - 0.5)
        ax.set_xlabel("sparsity of the prunable weights (%)")
        ax.legend(fontsize=8)

    caption = (
        "Test accuracy against sparsity, 95 % seed-level intervals over (seeds x test images); the dense "
        "reference's interval as a grey band."
    )
    if diffs:
        caption += (
            " Right: the paired differences the claims are judged on, with the claims engine's seed-level "
            "95 % interval; dots are the seeds, dotted lines the 1-point smallest effect of interest."
        )
    panels = ["accuracy", *(["differences"] if diffs else [])]
    return panel_figure(run_dir, "figures/accuracy-vs-sparsity.png", panels, draw, caption, legend=None)


def _draw_accuracies(ax: Any, curves: dict[str, Any], methods: dict[str, Any], levels: list[float]) -> None:
    for i, (name, c) in enumerate(curves.items()):
        mean = 100 * np.asarray(c["mean"])
        err = np.abs(100 * np.asarray(c["ci95"]).T - mean)
        x = [levels.index(v) + 0.08 * (i - (len(curves) - 1) / 2) for v in c["x"]]  # side by side
        ax.errorbar(x, mean, yerr=err, marker="o", capsize=3, label=name)
    for name, b in methods.items():
        if "test_accuracy_ci95" in b:
            low, high = (100 * v for v in b["test_accuracy_ci95"])
            ax.axhspan(low, high, alpha=0.2, color="grey", label=f"{name.removesuffix(DENSE_SUFFIX)} dense")
            ax.axhline(100 * b["metrics"]["test_accuracy@0"], color="grey", linestyle="--", linewidth=1)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("accuracy per method (intervals over seeds x images)", fontsize=9)


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
    if missing := [path for path in spec["files"].values() if not (run_dir / path).is_file()]:
        # a committed run leaves its weights files out (their size): the histograms cannot be redrawn
        warnings.warn(f"{run_dir}: no weight histograms, {len(missing)} weights files missing", stacklevel=2)
        return accuracy
    series = {label: load_arrays(run_dir / path) for label, path in spec["files"].items()}
    dense = {label: w for label, w in series.items() if label.endswith(DENSE_SUFFIX)}

    def draw(ax: Any, panel: tuple[str, str]) -> None:
        key, title = panel
        drawn = {label: w[key] for label, w in series.items() if label not in dense and key in w}
        # the dense run's final weights are the reference in both panels
        drawn |= {f"{label.removesuffix(DENSE_SUFFIX)} (dense)": w[FINAL] for label, w in dense.items()}
        for name, w in drawn.items():
            w = w[w != 0] if key == FINAL else w
            if w.size:
                ax.hist(w, bins=spec["bins"], histtype="step", density=True, log=True, label=name)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("weight")
        ax.set_ylabel("density (log)" if key == BEFORE else "")

    panels = [
        (BEFORE, "end of the last decompressed phase (what the final pruning sees)"),
        (FINAL, f"final weights: non-zeros at {100 * spec['sparsity']:g} %"),
    ]
    caption = (
        f"Weight histograms of the prunable weights (seed {spec['seed']}), HORST against AdamW and HAM; the "
        "dense AdamW run for reference. Raw values: the .npz files under weights/."
    )
    return accuracy + panel_figure(run_dir, "figures/weight-histograms.png", panels, draw, caption)
