"""implicit-bias's tables: the regression and classification tables (mean ± std over seeds of every method's
metrics) and the heterogeneous-scale study's tables (margins per spread, the validation grid). The claims are
not here: the claims engine judges and renders them (``claims.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import column_mean_std, mean_std


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
