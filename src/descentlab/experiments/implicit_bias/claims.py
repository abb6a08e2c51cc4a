r"""The implicit-bias claims, each a bootstrap CI over seeds and a verdict, and the scale-study tables.

Cells are seeds: each seed draws its own problem, and every method runs on it from w = 0, so the per-seed
values of two methods are paired. With ``r_M[s]`` the normalised L1 margin of method M on seed s divided by
the optimal L1 margin (linprog), ``nnz_M[s]`` its non-zeros and ``q_M[s] = ||w||_1 / min L1`` on regression:

1. ``l1-direction`` (Theorem 4.7, METHODS.md §2.2): ``r_HORST - tau`` > 0, HORST within ``tau`` of the
   optimal L1 margin (``tau`` fixed before the run: ``claims.l1_threshold``); a one-sample bootstrap.
2. ``l1-vs-adam``: ``r_HORST - r_Adam`` > 0.
3. ``sparser-than-adam``: ``nnz_HORST - nnz_Adam`` < 0.
4. ``min-l1-regression``: ``q_HORST - q_Adam`` < 0 (HORST's interpolant nearer the minimum L1 norm).
5. On the heterogeneous problem, at each spread kappa (decades of column scale), with each method at the
   alpha chosen on the validation seeds: ``l1-direction@kappa`` (``r_HORST - tau`` > 0) and
   ``horst-vs-ham@kappa`` (``r_HORST - r_HAM`` > 0, the paper's ordering of the two).

Each CI is :func:`descentlab.report.stats.paired_bootstrap` over the seed axis, its verdict
:func:`~descentlab.report.stats.verdict` (with the minimum detectable effect). With 5 seeds the percentile
interval is coarse (it cannot be wider than the range of the per-seed differences); it is what the seeds
give, and the per-seed values are in ``results.json`` beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import column_mean_std, mean_std, paired_bootstrap, verdict

DESCRIPTIONS = {
    "l1-direction": "HORST reaches >= tau of the optimal L1 margin (separable classification)",
    "l1-vs-adam": "HORST's L1 margin exceeds Adam's",
    "sparser-than-adam": "HORST's separator has fewer non-zeros than Adam's",
    "min-l1-regression": "HORST's interpolant has a smaller ||w||_1 / min L1 than Adam's (regression)",
    "horst-vs-ham": "HORST's L1 margin exceeds HAM's (heterogeneous column scales)",
}


def claim(
    name: str, a: Sequence[float], b: Sequence[float], direction: Literal["greater", "less"],
    *, n_boot: int, problem: str, description: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One claim row: the paired bootstrap CI of ``mean(a - b)`` over seeds and its verdict."""
    a_arr, b_arr = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ci = paired_bootstrap(a_arr, b_arr, n_boot=n_boot)
    v = verdict(ci, direction)
    outcome, reason = v.outcome, v.reason
    if a_arr.size < 2:  # one seed: the "interval" is a point, so no verdict
        outcome, reason = "inconclusive", "one seed: no interval over seeds"
    return {
        "claim": name,
        "problem": problem,
        "description": description or DESCRIPTIONS[name.split("@")[0]],
        "direction": direction,
        "estimate": ci.mean,
        "ci": [ci.low, ci.high],
        "shape": list(ci.shape),
        "a": a_arr.tolist(),
        "b": b_arr.tolist(),
        "verdict": outcome,
        "reason": reason,
        "min_detectable_effect": ci.min_detectable_effect(),
    }


def evaluate_claims(
    per: Mapping[str, Mapping[str, Sequence[float]]],
    scales: Mapping[float, Mapping[str, Mapping[str, Sequence[float]]]],
    *, tau: float, n_boot: int,
) -> list[dict[str, Any]]:  # fmt: skip
    """Every claim of the module docs. ``per``: method -> metric -> per-seed values (the main problems);
    ``scales``: spread -> method -> metric -> per-seed values (the heterogeneous problem)."""
    rows = []
    if "horst" in per:
        horst = per["horst"]
        tau_cells = [tau] * len(horst["cls_l1_margin_ratio"])
        text = f"HORST reaches >= {tau:g} of the optimal L1 margin (separable classification)"
        rows.append(claim("l1-direction", horst["cls_l1_margin_ratio"], tau_cells, "greater",
                          n_boot=n_boot, problem="classification", description=text))  # fmt: skip
        if "adam" in per:
            adam = per["adam"]
            for name, key, direction, problem in (
                ("l1-vs-adam", "cls_l1_margin_ratio", "greater", "classification"),
                ("sparser-than-adam", "cls_nnz", "less", "classification"),
                ("min-l1-regression", "reg_l1_ratio", "less", "regression"),
            ):
                rows.append(claim(name, horst[key], adam[key], direction, n_boot=n_boot, problem=problem))
    for kappa, methods in scales.items():
        if "horst" not in methods:
            continue
        r_h = methods["horst"]["l1_margin_ratio"]
        problem = f"heterogeneous, {kappa:g} decades"
        text = f"HORST reaches >= {tau:g} of the optimal L1 margin ({kappa:g} decades of column scale)"
        rows.append(claim(f"l1-direction@{kappa:g}", r_h, [tau] * len(r_h), "greater", n_boot=n_boot,
                          problem=problem, description=text))  # fmt: skip
        if "ham" in methods:
            rows.append(claim(f"horst-vs-ham@{kappa:g}", r_h, methods["ham"]["l1_margin_ratio"], "greater",
                              n_boot=n_boot, problem=problem))  # fmt: skip
    return rows


def claims_table(claims: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    rows = [
        [c["claim"], c["problem"], f"{c['estimate']:+.4g} [{c['ci'][0]:+.4g}, {c['ci'][1]:+.4g}]",
         c["verdict"], f"{c['min_detectable_effect']:.3g}"]
        for c in claims
    ]  # fmt: skip
    return {
        "title": "Claims: 95 % bootstrap CI over seeds of the paired difference (first minus second; "
        "see the claim descriptions) and the verdict",
        "columns": ["claim", "problem", "difference [95 % CI]", "verdict", "min detectable effect"],
        "rows": rows,
    }


def _cell(values: Sequence[float], digits: int = 3) -> str:
    finite = [v for v in values if np.isfinite(v)]
    if not finite:
        return "diverged"
    mean, std = mean_std(finite, impl="numpy")
    text = f"{mean:.{digits}g} ± {std:.2g}" if len(finite) > 1 else f"{mean:.{digits}g}"
    return text if len(finite) == len(values) else f"{text} ({len(values) - len(finite)} diverged)"


def main_tables(per: Mapping[str, Mapping[str, Sequence[float]]], methods: Sequence[str]) -> list[dict]:
    """The regression and classification tables: mean ± std over seeds of every method's metrics."""

    def c(m: str, key: str, digits: int = 3) -> str:
        return _cell(per[m][key], digits)

    return [
        {
            "title": "Regression (from w = 0): norms of the interpolant found, relative to the exact minima",
            "columns": ["method", "||w||2 / pinv", "||w||1 / min L1", "||w||inf / min Linf", "max residual",
                        "max |w - pinv|", "non-zeros"],
            "rows": [[m, c(m, "reg_l2_ratio", 4), c(m, "reg_l1_ratio", 4), c(m, "reg_linf_ratio", 4),
                      c(m, "reg_residual", 2), c(m, "reg_dist_pinv", 2), c(m, "reg_nnz")] for m in methods],
        },
        {
            "title": "Separable classification: normalised margins relative to the optimal margins (linprog)",
            "columns": ["method", "L1 margin / optimal", "Linf margin / optimal", "non-zeros"],
            "rows": [[m, c(m, "cls_l1_margin_ratio", 4), c(m, "cls_linf_margin_ratio", 4), c(m, "cls_nnz")]
                     for m in methods],
        },
    ]  # fmt: skip


def scales_results(
    per: Mapping[float, Mapping[str, Mapping[str, Sequence[float]]]],
    chosen: Mapping[float, Mapping[str, float]],
    scores: Mapping[float, Mapping[str, Mapping[float, float]]],
    lp_share: Mapping[float, Sequence[float]],
) -> tuple[list[dict[str, Any]], dict[str, MethodResult], dict[str, Any]]:
    """The scale study's tables, one ``"<method> (scales)"`` result per method (its L1 margin ratio
    against the spread) and the ``results.json`` block (chosen alphas, validation grid, per-seed values)."""
    decades = list(per)
    names = list(per[decades[0]]) if decades else []
    methods = {}
    for name in names:
        ratios = np.asarray([per[k][name]["l1_margin_ratio"] for k in decades], dtype=float)
        mean, std = column_mean_std(ratios.T, impl="numpy")
        curve = Curve("decades", decades, "L1 margin / optimal (heterogeneous)", mean, std)
        metrics = {f"l1_margin_ratio@{k:g}": m for k, m in zip(decades, mean, strict=True)}
        methods[f"{name} (scales)"] = MethodResult(metrics=metrics, curves={"scales_l1_margin": curve})
    block = {
        "chosen_alpha": {f"{k:g}": dict(v) for k, v in chosen.items()},
        "validation": {f"{k:g}": {m: {f"{a:g}": x for a, x in g.items()} for m, g in v.items()}
                       for k, v in scores.items()},
        "per_seed": {f"{k:g}": v for k, v in per.items()},
        "lp_l1_share_large": {f"{k:g}": list(v) for k, v in lp_share.items()},
    }  # fmt: skip
    return [*scales_tables(per, chosen, lp_share), alpha_table(scores)], methods, block


def scales_tables(
    scales: Mapping[float, Mapping[str, Mapping[str, Sequence[float]]]],
    chosen: Mapping[float, Mapping[str, float]],
    lp_share: Mapping[float, Sequence[float]],
) -> list[dict[str, Any]]:
    """Per spread: every method's L1 / L_inf margin ratio, non-zeros and L1 share on the large-scale half."""
    rows = []
    for kappa, methods in scales.items():
        for name, rec in methods.items():
            alpha = chosen.get(kappa, {}).get(name)
            rows.append([f"{kappa:g}", name, "—" if alpha is None else f"{alpha:g}",
                         _cell(rec["l1_margin_ratio"], 4), _cell(rec["linf_margin_ratio"], 4),
                         _cell(rec["nnz"]), _cell(rec["large_share"])])  # fmt: skip
        rows.append([f"{kappa:g}", "LP optimum (L1)", "—", "1", "—", "—", _cell(lp_share[kappa])])
    return [
        {
            "title": "Heterogeneous column scales: margins relative to the linprog optima, mean ± std over "
            "seeds (alpha chosen on the validation seeds)",
            "columns": ["decades", "method", "alpha", "L1 margin / optimal", "Linf margin / optimal",
                        "non-zeros", "L1 share, upper half of scales"],
            "rows": rows,
        }
    ]  # fmt: skip


def alpha_table(validation: Mapping[float, Mapping[str, Mapping[float, float]]]) -> dict[str, Any]:
    """The validation grid: mean L1 margin ratio over the validation seeds of every (method, alpha)."""
    rows = []
    for kappa, methods in validation.items():
        for name, grid in methods.items():
            cells = [
                f"α={a:g}: " + ("diverged" if not np.isfinite(m) else f"{m:.3f}") for a, m in grid.items()
            ]
            rows.append([f"{kappa:g}", name, "; ".join(cells)])
    return {
        "title": "Validation seeds: mean L1 margin / optimal for each alpha (the highest is chosen)",
        "columns": ["decades", "method", "grid"],
        "rows": rows,
    }


__all__ = [
    "alpha_table", "claim", "claims_table", "evaluate_claims", "main_tables", "scales_results", "scales_tables",
]  # fmt: skip
