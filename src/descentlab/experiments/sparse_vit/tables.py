"""sparse-vit's results body: a block per method, the accuracy / sparsity / tuning / weight-shape tables and
the tuning record. The claims are not here: the claims engine judges them from ``arrays/claims.npz``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import mean_std, paired_interval
from descentlab.sparsity.report import excess_kurtosis, selection_record
from descentlab.study.tables import pm

PAPER = "DeiT-base, ImageNet, 90 %: HORST 76.83 vs AdamW 68.86; DeiT-small 90 %: HORST 70.5 vs HAM 60.06"
DENSE_SUFFIX = "-dense"
BEFORE, FINAL = "before_final_pruning", "final"

Job = Mapping[str, Any]  # one training run's result (jobs.train_job)


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    # float64 torch, sample std (ddof 1): the summation the experiment always used
    return mean_std(values, ddof=1, impl="torch")


def fmt_pct(values: Sequence[float]) -> str:
    mean, std = _mean_std(values)
    return pm(mean, std, 2, scale=100)


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


def summary_tables(
    sparse: Mapping[str, Mapping[float, Sequence[Job]]],
    dense: Mapping[str, Sequence[Job]],
    *,
    seeds: Sequence[int],
    tuning: Sequence[Sequence[Any]] = (),
    tune_sparsity: float | None = None,
    tune_seed: int | None = None,
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
        tune_seed: the seed the tuning ran with (never one of ``seeds``).
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
                "title": f"Tuning on the validation split (sparsity {tune_sparsity:g}, tuning seed {tune_seed}, "
                "never an evaluation seed; accuracy %)",
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
                pm(mean, std, 2, signed=True),
                f"{wins}/{len(diffs)}",
            ]
        )
    if rows:  # the verdicts are the claims' (claims.py), with seed-level intervals
        notes.append(f"Paper, for scale: {PAPER}.")
    return notes, rows


def shape_table(
    sparse: Mapping[str, Mapping[float, Sequence[Job]]],
    dense: Mapping[str, Sequence[Job]],
    at: float,
    threshold: float,
) -> dict[str, Any] | None:
    """Per optimizer at sparsity ``at`` (and each dense reference): the fraction of prunable weights below
    ``threshold`` and the excess kurtosis of all of them, mean ± std over seeds."""
    rows = []
    series = [(label, by_s[at]) for label, by_s in sparse.items() if at in by_s]
    series += [(f"{label} (dense, end)", runs) for label, runs in dense.items()]
    for name, jobs in series:
        if not jobs[0].get("shape"):
            continue
        cols = []
        for key in ("global_frac_below", "global_kurtosis"):
            v = torch.tensor([j["shape"][key] for j in jobs], dtype=torch.float64)
            std = float(v.std()) if len(v) > 1 else 0.0
            cols.append(pm(float(v.mean()), std))
        rows.append([name, *cols])
    if not rows:
        return None
    return {
        "title": f"Prunable weights before the final pruning at {100 * at:g} % (dense: at the end): how peaked "
        "at 0, mean ± std over seeds",
        "columns": ["optimizer", f"fraction |w| < {threshold:g}", "excess kurtosis"],
        "rows": rows,
    }


def summarise(
    sparse: Mapping[str, Mapping[float, Sequence[Job]]],
    dense: Mapping[str, Sequence[Job]],
    grids: Mapping[str, Sequence[Job]],
    picks: Mapping[str, int],
    *,
    seeds: Sequence[int],
    tune_sparsity: float,
    tune_seed: int,
    claim_sparsity: float,
    small_weight: float,
    weights: Mapping[str, Mapping[str, np.ndarray]],
    paper_like: Mapping[str, Sequence[Job]] | None = None,
    paper_like_sparsity: float | None = None,
) -> dict[str, Any]:
    """``tables``, ``notes`` and ``selection`` of a run: :func:`summary_tables`, the weight-shape table, the
    paper-like arm's accuracies, and one note per tuned value at an edge of its grid.

    ``grids``: label -> the tuning-seed job of every tuning candidate (a method with one candidate has no
    entry); ``picks``: label -> the chosen index;
    ``weights``: the first seed's saved weights at ``claim_sparsity`` (and of the dense runs);
    ``paper_like``: label -> per-seed jobs of the paper-like arm (block Linears at ``paper_like_sparsity``).
    """
    tuning = [
        [label, r["lr"], r["alpha"], f"{100 * r['val']:.2f}", "✓" if i == picks[label] else ""]
        for label, runs in grids.items()
        for i, r in enumerate(runs)
    ]
    tables, notes = summary_tables(
        sparse,
        dense,
        seeds=seeds,
        tuning=tuning,
        tune_sparsity=tune_sparsity,
        tune_seed=tune_seed,
        weights=weights,
        weights_sparsity=claim_sparsity,
    )
    selection, edge_notes = selection_record(grids, picks)
    if (shapes := shape_table(sparse, dense, claim_sparsity, small_weight)) is not None:
        tables.append(shapes)
    if paper_like:
        tables.append(
            {
                "title": f"Paper-like arm: AC/DC over the block Linears only at {100 * (paper_like_sparsity or 0):g} "
                "%, the chosen settings; test accuracy (%), mean ± std over its seeds",
                "columns": ["optimizer", "seeds", "test accuracy"],
                "rows": [
                    [k, len(runs), fmt_pct([r["test"] for r in runs])] for k, runs in paper_like.items()
                ],
            }
        )
    return {"tables": tables, "notes": [*notes, *edge_notes], "selection": selection}
