"""implicit-bias's tables: the regression and classification tables (mean ± std over seeds of every method's
metrics) and the heterogeneous-scale study's tables (margins per spread, the validation grid). The claims are
not here: the claims engine judges and renders them (``claims.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import column_mean_std, mean_std
from descentlab.study.tables import Table


def _cell(values: Sequence[float], digits: int = 3) -> str:
    """``mean ± sd`` (sample sd) of the finite values to ``digits`` significant digits, naming how many seeds
    diverged; the toolkit's formatters print fixed decimals, and these tables mix ratios near 1 with
    residuals near 1e-12, so they keep significant digits."""
    finite = [v for v in values if np.isfinite(v)]
    if not finite:
        return "diverged"
    mean, std = mean_std(finite, impl="numpy")
    text = f"{mean:.{digits}g} ± {std:.2g}" if len(finite) > 1 else f"{mean:.{digits}g}"
    return text if len(finite) == len(values) else f"{text} ({len(values) - len(finite)} diverged)"


def main_tables(per: Mapping[str, Mapping[str, Sequence[float]]], methods: Sequence[str]) -> list[dict]:
    """The regression and classification tables: mean ± std over seeds of every method's metrics."""

    regression = Table(
        "Regression (from w = 0): norms of the interpolant found, relative to the exact minima",
        ["method", "||w||2 / pinv", "||w||1 / min L1", "||w||inf / min Linf", "max residual", "max |w - pinv|",
         "non-zeros"],
    )  # fmt: skip
    classification = Table(
        "Separable classification: normalised margins relative to the optimal margins (linprog)",
        ["method", "L1 margin / optimal", "Linf margin / optimal", "non-zeros"],
    )
    for m in methods:
        rec = per[m]
        regression.add(m, _cell(rec["reg_l2_ratio"], 4), _cell(rec["reg_l1_ratio"], 4),
                       _cell(rec["reg_linf_ratio"], 4), _cell(rec["reg_residual"], 2),
                       _cell(rec["reg_dist_pinv"], 2), _cell(rec["reg_nnz"]))  # fmt: skip
        classification.add(m, _cell(rec["cls_l1_margin_ratio"], 4), _cell(rec["cls_linf_margin_ratio"], 4),
                           _cell(rec["cls_nnz"]))  # fmt: skip
    return [regression.to_dict(), classification.to_dict()]


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
    table = Table(
        "Heterogeneous column scales: margins relative to the linprog optima, mean ± std over seeds (alpha "
        "chosen on the validation seeds)",
        ["decades", "method", "alpha", "L1 margin / optimal", "Linf margin / optimal", "non-zeros",
         "L1 share, upper half of scales"],
    )  # fmt: skip
    for kappa, methods in scales.items():
        for name, rec in methods.items():
            alpha = chosen.get(kappa, {}).get(name)
            table.add(f"{kappa:g}", name, "—" if alpha is None else f"{alpha:g}",
                      _cell(rec["l1_margin_ratio"], 4), _cell(rec["linf_margin_ratio"], 4),
                      _cell(rec["nnz"]), _cell(rec["large_share"]))  # fmt: skip
        table.add(f"{kappa:g}", "LP optimum (L1)", "—", "1", "—", "—", _cell(lp_share[kappa]))
    return [table.to_dict()]


def alpha_table(validation: Mapping[float, Mapping[str, Mapping[float, float]]]) -> dict[str, Any]:
    """The validation grid: mean L1 margin ratio over the validation seeds of every (method, alpha)."""
    table = Table(
        "Validation seeds: mean L1 margin / optimal for each alpha (the highest is chosen)",
        ["decades", "method", "grid"],
    )
    for kappa, methods in validation.items():
        for name, grid in methods.items():
            cells = [
                f"α={a:g}: " + ("diverged" if not np.isfinite(m) else f"{m:.3f}") for a, m in grid.items()
            ]
            table.add(f"{kappa:g}", name, "; ".join(cells))
    return table.to_dict()
