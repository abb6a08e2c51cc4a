"""The sparse-vit claims, each a paired bootstrap CI and a verdict, and the selection record of the tuning.

Accuracy cells are test images n of seed s: ``c_M[s, n] ∈ {0, 1}`` says whether method M's model of seed s
(trained at sparsity p) classifies image n correctly; the difference of two methods' accuracies is the
mean of ``c_A - c_B`` over the (seeds x images) cells, its CI the paired bootstrap resampling both axes
(:func:`descentlab.report.stats.paired_bootstrap`). Weight cells are the prunable tensors t of seed s:
``f_M[s, t]`` the fraction of tensor t's entries with ``|w| < threshold`` (each tensor counts once, whatever
its size, so the mean over cells differs from the fraction over all weights) and ``k_M[s, t]`` its excess
kurtosis ``E[(w - w̄)^4] / E[(w - w̄)^2]^2 - 3``, read when the final pruning sees the weights (the end of
the last decompressed phase). Claims, with ``D`` the dense reference and ``A``, ``H``, ``M`` AdamW, HORST,
HAM:

1. ``regime`` (the positive control), at every sparsity p: ``acc(D) - acc(A@p) >= gap`` (claimed size
   ``gap``, e.g. 3 points): pruning must cost the baseline something for a better sparse optimizer to
   recover.
2. ``horst-beats-adamw`` at every sparsity: ``acc(H@p) - acc(A@p) > 0``.
3. ``horst-beats-ham`` at the claim sparsity: ``acc(H@p) - acc(M@p) > 0``.
4. ``horst-peaked`` at the claim sparsity: ``f_H - f_A > 0`` (more weights near 0 than AdamW's).
5. ``horst-heavy-tailed`` at the claim sparsity: ``k_H - k_A > 0`` (a sharper peak with heavier tails).

Verdicts come from :func:`descentlab.report.stats.verdict` (reproduced / refuted / inconclusive, with the
minimum detectable effect).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from descentlab.report.sparse_vit import excess_kurtosis, summary_tables
from descentlab.report.stats import paired_bootstrap, verdict

Job = Mapping[str, Any]  # one training run's result (see experiments.sparse_vit.train_job)

DESCRIPTIONS = {
    "regime": "dense minus {b} with AC/DC: sparsity costs the baseline at least the claimed size",
    "horst-beats-adamw": "HORST with AC/DC more accurate than AdamW with AC/DC",
    "horst-beats-ham": "HORST with AC/DC more accurate than HAM with AC/DC",
    "horst-peaked": "more of HORST's prunable weights below the threshold than AdamW's (before final pruning)",
    "horst-heavy-tailed": "HORST's prunable weights have a larger excess kurtosis than AdamW's",
}


def _frac_kurtosis(w: torch.Tensor, threshold: float) -> tuple[float, float]:
    w = w.detach().double().flatten()
    return float((w.abs() < threshold).double().mean()), excess_kurtosis(w)


def tensor_shape_stats(tensors: Sequence[torch.Tensor], threshold: float) -> dict[str, Any]:
    """Per tensor (``frac_below``, ``kurtosis``: lists) and over all of them at once (``global_frac_below``,
    ``global_kurtosis``): the fraction of entries with ``|w| < threshold`` and the excess kurtosis."""
    per = [_frac_kurtosis(w, threshold) for w in tensors]
    frac, kurt = _frac_kurtosis(torch.cat([w.detach().flatten() for w in tensors]), threshold)
    return {
        "frac_below": [f for f, _ in per],
        "kurtosis": [k for _, k in per],
        "global_frac_below": frac,
        "global_kurtosis": kurt,
    }


def _cells(jobs: Sequence[Job], key: str) -> np.ndarray:
    if key == "test_correct":
        return np.asarray([j["test_correct"] for j in jobs], dtype=np.float64)
    return np.asarray([j["shape"][key] for j in jobs], dtype=np.float64)


def claim_row(
    claim: str,
    a: tuple[str, Sequence[Job]],
    b: tuple[str, Sequence[Job]],
    *,
    key: str,
    sparsity: float,
    n_boot: int,
    claimed_size: float | None = None,
) -> dict[str, Any]:
    """One claim "``a`` minus ``b`` > 0 (by ``claimed_size``)" on the cells ``key`` of both methods' jobs."""
    (name_a, jobs_a), (name_b, jobs_b) = a, b
    cells_a, cells_b = _cells(jobs_a, key), _cells(jobs_b, key)
    ci = paired_bootstrap(cells_a, cells_b, n_boot=n_boot)
    v = verdict(ci, "greater", claimed_size)
    return {
        "claim": claim,
        "sparsity": sparsity,
        "a": name_a,
        "b": name_b,
        "metric": "accuracy" if key == "test_correct" else key,
        "cells": "seeds x test images" if key == "test_correct" else "seeds x prunable tensors",
        "description": DESCRIPTIONS[claim].format(b=name_b.split(" ")[0]),
        "estimate": ci.mean,
        "ci": [ci.low, ci.high],
        "shape": list(ci.shape),
        "a_mean": float(cells_a.mean()),
        "b_mean": float(cells_b.mean()),
        "claimed_size": claimed_size,
        "verdict": v.outcome,
        "reason": v.reason,
        "min_detectable_effect": ci.min_detectable_effect(),
    }


def evaluate_claims(
    sparse: Mapping[str, Mapping[float, Sequence[Job]]],
    dense: Mapping[str, Sequence[Job]],
    *,
    claim_sparsity: float,
    regime_gap: float,
    n_boot: int,
) -> list[dict[str, Any]]:
    """Every claim of the module docs whose methods were run (``sparse``: label -> sparsity -> per-seed jobs)."""
    rows: list[dict[str, Any]] = []
    acc = {"key": "test_correct", "n_boot": n_boot}
    for label, runs in dense.items():
        for s, jobs in sparse.get(label, {}).items():
            pair = ((f"{label} (dense)", runs), (f"{label}@{s:g}", jobs))
            rows.append(claim_row("regime", *pair, sparsity=s, claimed_size=regime_gap, **acc))
    horst = sparse.get("horst", {})
    for s, jobs in horst.items():
        if s in sparse.get("adamw", {}):
            pair = ((f"horst@{s:g}", jobs), (f"adamw@{s:g}", sparse["adamw"][s]))
            rows.append(claim_row("horst-beats-adamw", *pair, sparsity=s, **acc))
    at = claim_sparsity
    if at in horst and at in sparse.get("ham", {}):
        pair = ((f"horst@{at:g}", horst[at]), (f"ham@{at:g}", sparse["ham"][at]))
        rows.append(claim_row("horst-beats-ham", *pair, sparsity=at, **acc))
    if at in horst and at in sparse.get("adamw", {}) and horst[at][0].get("shape"):
        pair = ((f"horst@{at:g}", horst[at]), (f"adamw@{at:g}", sparse["adamw"][at]))
        for claim, key in (("horst-peaked", "frac_below"), ("horst-heavy-tailed", "kurtosis")):
            rows.append(claim_row(claim, *pair, key=key, sparsity=at, n_boot=n_boot))
    return rows


def claims_table(claims: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The claims as one table; accuracy differences in points, weight-shape differences as they are."""
    rows = []
    for c in claims:
        scale = 100.0 if c["metric"] == "accuracy" else 1.0
        est, (lo, hi) = (scale * c["estimate"], [scale * x for x in c["ci"]])
        size = "" if c["claimed_size"] is None else f" (claimed >= {scale * c['claimed_size']:g})"
        rows.append(
            [
                c["claim"],
                f"{c['a']} - {c['b']}",
                f"{scale * c['a_mean']:.4g} vs {scale * c['b_mean']:.4g}",
                f"{est:+.3f} [{lo:+.3f}, {hi:+.3f}]{size}",
                c["verdict"],
                f"{scale * c['min_detectable_effect']:.3g}",
            ]
        )
    return {
        "title": "Claims: paired 95 % bootstrap CI of a minus b over (seeds x test images) for accuracy "
        "(points), over (seeds x prunable tensors) for the weight shape",
        "columns": ["claim", "a - b", "a vs b", "difference [95 % CI]", "verdict", "min detectable effect"],
        "rows": rows,
    }


def claim_notes(claims: Sequence[Mapping[str, Any]]) -> list[str]:
    """One plain sentence per claim: what was claimed, the estimate with its CI, and the verdict."""
    notes = []
    for c in claims:
        scale, unit, f = (100.0, " points", ".2f") if c["metric"] == "accuracy" else (1.0, "", ".4g")
        est, lo, hi = (format(scale * x, "+" + f) for x in (c["estimate"], *c["ci"]))
        notes.append(
            f"{c['claim']} at {100 * c['sparsity']:g} % ({c['a']} - {c['b']}, {c['metric']}): {est}{unit} "
            f"[{lo}, {hi}]: {c['verdict']} ({c['reason']})."
        )
    return notes


def selection_record(
    grids: Mapping[str, Sequence[Mapping[str, Any]]], chosen: Mapping[str, int]
) -> tuple[dict[str, Any], list[str]]:
    """Per tuned method: every candidate ``{lr, alpha, val}``, the chosen one, and which of its values lie at
    an edge of a grid of more than one value (then a note says so: the grid should be widened)."""
    record, notes = {}, []
    for label, runs in grids.items():
        best = runs[chosen[label]]
        edges = []
        for key in ("lr", "alpha"):
            values = sorted({r[key] for r in runs})
            if len(values) > 1 and best[key] in (values[0], values[-1]):
                edges.append(key)
                notes.append(
                    f"{label}: the chosen {key} = {best[key]:g} is at an edge of its grid {values}; the optimum "
                    "may lie outside it (widen the grid)."
                )
        record[label] = {
            "grid": [{"lr": r["lr"], "alpha": r["alpha"], "val": r["val"]} for r in runs],
            "chosen": {"lr": best["lr"], "alpha": best["alpha"], "val": best["val"]},
            "at_edge": edges,
        }
    return record, notes


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
            cols.append(f"{float(v.mean()):.4f} ± {std:.4f}")
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
    claim_sparsity: float,
    regime_gap: float,
    small_weight: float,
    n_boot: int,
    weights: Mapping[str, Mapping[str, np.ndarray]],
) -> dict[str, Any]:
    """``tables``, ``notes``, ``claims`` and ``selection`` of a run: :func:`summary_tables`, then the claims
    table, the weight-shape table, one note per claim and one per tuned value at an edge of its grid.

    ``grids``: label -> the first-seed job of every tuning candidate; ``picks``: label -> the chosen index;
    ``weights``: the first seed's saved weights at ``claim_sparsity`` (and of the dense runs).
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
        weights=weights,
        weights_sparsity=claim_sparsity,
    )
    claims = evaluate_claims(
        sparse, dense, claim_sparsity=claim_sparsity, regime_gap=regime_gap, n_boot=n_boot
    )
    selection, edge_notes = selection_record(grids, picks)
    tables.append(claims_table(claims))
    if (shapes := shape_table(sparse, dense, claim_sparsity, small_weight)) is not None:
        tables.append(shapes)
    return {
        "tables": tables,
        "notes": [*notes, *claim_notes(claims), *edge_notes],
        "claims": claims,
        "selection": selection,
    }


__all__ = [
    "claim_notes",
    "claim_row",
    "claims_table",
    "evaluate_claims",
    "selection_record",
    "shape_table",
    "summarise",
    "tensor_shape_stats",
]
