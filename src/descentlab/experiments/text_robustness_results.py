"""Results of text-robustness in the DESIGN.md shape: method blocks, the paired-gap, selection and λ tables,
and factual notes. Pure functions of the measured arrays, kept apart so that the experiment reads top to bottom.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from descentlab.report.tables import multiplier_tables
from descentlab.robustness import RobustnessCurves


def is_monotone(values: Sequence[float]) -> bool:
    """Whether a per-layer loss profile never increases from one layer to the next."""
    return all(b <= a + 1e-12 for a, b in itertools.pairwise(values))


def choose_candidate(
    method: str,
    candidates: Sequence[str],
    scores: Sequence[Mapping[str, float]],
    erm_clean: float | None,
    *,
    criterion: str = "robust",
    max_clean_drop: float = 0.01,
) -> tuple[int, list[list[Any]], str]:
    """Pick a candidate from its validation numbers ``{"clean": .., "robust": ..}``.

    Candidates whose clean validation accuracy is within ``max_clean_drop`` of ERM's are eligible; among
    them the highest ``criterion`` score wins (ties: higher clean accuracy, then the earlier candidate). If
    none is eligible, the same order applies to all. Returns (index, selection-table rows, reason).
    """
    key = "robust" if criterion == "robust" else "clean"
    ranked = [
        (erm_clean is None or s["clean"] >= erm_clean - max_clean_drop, s[key], s["clean"], -i)
        for i, s in enumerate(scores)
    ]
    best = max(range(len(ranked)), key=lambda i: ranked[i])
    rows = [
        [method, c or "(defaults)", s["clean"], s["robust"], "yes" if i == best else ""]
        for i, (c, s) in enumerate(zip(candidates, scores, strict=True))
    ]
    what = "mean accuracy over the gaussian γ grid" if key == "robust" else "clean accuracy"
    eligible = "" if ranked[best][0] else " (no candidate was within the clean-accuracy margin)"
    why = (
        f"highest validation {what} among candidates within {max_clean_drop} clean accuracy of ERM"
        f"{eligible}: {candidates[best] or '(defaults)'!r}"
    )
    return best, rows, why


def settings_diff(settings: Mapping[str, Any], base: Mapping[str, Any]) -> str:
    """The entries of ``settings`` that differ from ``base``, as ``key=value`` words ("nothing" if none)."""
    return " ".join(f"{k}={v}" for k, v in settings.items() if base.get(k) != v) or "nothing"


def method_block(
    result: RobustnessCurves,
    profiles: Mapping[str, Sequence[Sequence[float]]],
    extra_metrics: Mapping[str, Sequence[float]],
    multipliers: Sequence[Sequence[float]],
    clean_kind: str,
) -> dict[str, Any]:
    """One method's ``metrics`` / ``curves`` / ``layer_loss`` (mean over seeds; std and monotone counts too).

    ``profiles`` maps a condition name ("clean", "gaussian@1") to one profile per seed.
    """
    block = result.curves()
    clean = result.values[clean_kind][:, 0, 0]
    high = [g for g, x in enumerate(result.gammas) if x >= 1.0]
    metrics = {"accuracy": float(clean.mean()), "accuracy_std": float(clean.std())}
    for kind, values in result.values.items():
        metrics[f"{kind}_mean_over_grid"] = block[kind]["summary"]
        if high:
            metrics[f"{kind}_mean_gamma>=1"] = float(values[..., high].mean())
    metrics.update({k: float(np.mean(v)) for k, v in extra_metrics.items()})
    prof = {k: np.asarray(v, dtype=np.float64) for k, v in profiles.items()}
    out: dict[str, Any] = {
        "metrics": metrics,
        "curves": block,
        "layer_loss": {k: v.mean(0).tolist() for k, v in prof.items()},
        "layer_loss_std": {k: v.std(0).tolist() for k, v in prof.items()},
        "layer_loss_monotone_seeds": {k: int(sum(is_monotone(p) for p in v)) for k, v in prof.items()},
    }
    if len(multipliers):
        out["multipliers"] = np.asarray(multipliers, dtype=np.float64).mean(0).tolist()
    return out


def paired_gap_rows(curves: Mapping[str, RobustnessCurves]) -> list[list[Any]]:
    """Method minus ERM accuracy per γ, mean ± std over (seed, draw) pairs.

    Pairs share the training seed and the noise realisation (noise is keyed by content), so the spread is
    that of the *difference*, much smaller than that of either curve.
    """
    if "erm" not in curves:
        return []
    rows = []
    for method, result in curves.items():
        if method == "erm":
            continue
        for kind, values in result.values.items():
            diff = (values - curves["erm"].values[kind]).reshape(-1, len(result.gammas))
            cells = [f"{m:+.4f} ± {s:.4f}" for m, s in zip(diff.mean(0), diff.std(0), strict=True)]
            rows.append([method, kind, *cells])
    return rows


def extra_tables(
    curves: Mapping[str, RobustnessCurves],
    methods: Mapping[str, Mapping[str, Any]],
    selection_rows: list[list[Any]],
    shift_names: Sequence[str],
) -> list[dict[str, Any]]:
    """The tables appended to the standard report."""
    gammas = next(iter(curves.values())).gammas
    tables = []
    gap = paired_gap_rows(curves)
    if gap:
        tables.append(
            {
                "title": "Accuracy minus ERM's (paired: same seeds, same noise), mean ± std over (seed, draw)",
                "columns": ["method", "kind", *[f"γ={g:g}" for g in gammas]],
                "rows": gap,
            }
        )
    if shift_names:
        tables.append(
            {
                "title": "Dataset shift: clean accuracy on extra test sets (mean over seeds)",
                "columns": ["method", "in-distribution", *shift_names],
                "rows": [
                    [m, b["metrics"]["accuracy"], *[b["metrics"].get(f"shift:{s}", "") for s in shift_names]]
                    for m, b in methods.items()
                ],
            }
        )
    if selection_rows:
        tables.append(
            {
                "title": "Selection on the validation split (first seed)",
                "columns": ["method", "candidate", "val clean acc", "val acc, gaussian grid mean", "chosen"],
                "rows": selection_rows,
            }
        )
    tables.extend(multiplier_tables(methods))
    return tables


def notes(methods: Mapping[str, Mapping[str, Any]], n_seeds: int) -> list[str]:
    """Plain statements of what was measured: monotone profiles, clean gap, high-noise gap."""
    out = []
    for method, block in methods.items():
        counts = ", ".join(f"{k}: {v}/{n_seeds}" for k, v in block["layer_loss_monotone_seeds"].items())
        out.append(f"{method}: seeds with a non-increasing per-layer test loss — {counts}")
    if "erm" in methods:
        erm = methods["erm"]["metrics"]
        for method, block in methods.items():
            if method == "erm":
                continue
            m = block["metrics"]
            gaps = [
                f"{k.removesuffix('_mean_gamma>=1')} {m[k] - erm[k]:+.4f}"
                for k in m
                if k.endswith("_mean_gamma>=1") and k in erm
            ]
            out.append(
                f"{method} vs erm: clean accuracy {m['accuracy'] - erm['accuracy']:+.4f}; "
                f"mean accuracy over γ >= 1: {', '.join(gaps)}"
            )
    return out
