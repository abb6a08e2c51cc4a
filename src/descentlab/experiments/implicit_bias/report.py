"""implicit-bias's report: the methods' blocks and tables of ``results.json``, and the figures.

Tables: the main problems (mean ± std over seeds of every method's metrics) and the heterogeneous-scale
study (margins per spread, the validation grid). Figures: Theorem 4.7's margin path from the claims' cells
(``theorem_ratio/<method>`` ``[seeds, steps]``), and from the arrays the run saved under ``arrays/``: the
first seed's regression iterates (``trajectories.npz``: ``steps`` + ``[steps, d]`` per method), L1 margin
paths (``margins.npz``), final classification weights (``final-weights.npz``), and the scale study's
``[spreads, seeds]`` margin ratios (``scales-margins.npz``) and first-seed weights at the largest spread
(``scales-weights.npz``, with the column ``scales`` and the LP separator).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.implicit_bias.claims import claim_arrays
from descentlab.experiments.implicit_bias.config import ImplicitBiasConfig
from descentlab.experiments.implicit_bias.jobs import Outcome, ScalesRun, curve_grids
from descentlab.io import load_arrays
from descentlab.report.figures import new_figure, save_figure
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import column_mean_std, mean_std
from descentlab.study.cells import CellStore
from descentlab.study.figures import figure_record, panel_figure, plot_band
from descentlab.study.tables import Table

NOTES = [
    "Every number is a mean over seeds (± std across seeds when there is more than one seed).",
    "Heterogeneous scales: 'L1 share' is the fraction of ||w||_1 on the d/2 columns of largest scale "
    "(the same columns at every spread); the LP row is the linprog L1-optimal separator's.",
]
# the geometries whose every coordinate is worth a panel (the others add nothing a reader needs here)
TRAJECTORY_PANELS = ("gd", "sign", "coordinate", "hyperbolic_md", "adam", "horst")
RATIO = "L1 margin / optimal L1 margin"

# ---- results.json: methods and tables -----------------------------------------------------------------


def summarise(cfg: ImplicitBiasConfig, outcome: Outcome) -> dict[str, Any]:
    """``results.json``'s methods, tables, notes and the scale study's block. Per main method: the mean of
    every metric over seeds and its two curves; per Theorem 4.7 object, ``"<method> (theorem)"``: its end
    ratio and its path; per scale-study method, ``"<method> (scales)"``: its L1 margin ratio against the
    spread (every curve mean ± std over seeds)."""
    reg_grid, cls_grid = curve_grids(cfg)
    methods = {}
    for name, rec in outcome.per.items():
        metrics = {k: mean_std(v, impl="numpy")[0] for k, v in rec.items() if not k.endswith("curve")}
        curves = {
            "reg_l1": _band("step", reg_grid, "||w||_1 / min L1 (regression)", rec["reg_l1_curve"]),
            "cls_margin": _band(
                "step", cls_grid, "L1 margin / optimal (classification)", rec["cls_margin_curve"]
            ),
        }
        methods[name] = MethodResult(metrics=metrics, curves=curves)
    for name, path in outcome.theorem.items():
        curve = _band("step", outcome.theorem_steps, "L1 margin / optimal (decaying step)", path)
        methods[f"{name} (theorem)"] = MethodResult(
            metrics={"l1_margin_ratio": curve.mean[-1]}, curves={"theorem_margin": curve}
        )
    tables, extra = main_tables(outcome.per, cfg.methods), {}
    if (scales := outcome.scales) is not None:
        decades = list(scales.per)
        for name in scales.per[decades[0]]:
            ratios = [scales.per[k][name]["l1_margin_ratio"] for k in decades]
            curve = _band("decades", decades, "L1 margin / optimal (heterogeneous)", np.asarray(ratios).T)
            metrics = {f"l1_margin_ratio@{k:g}": m for k, m in zip(decades, curve.mean, strict=True)}
            methods[f"{name} (scales)"] = MethodResult(metrics=metrics, curves={"scales_l1_margin": curve})
        tables += scales_tables(scales)
        extra["scales"] = {
            "chosen_alpha": {f"{k:g}": dict(v) for k, v in scales.chosen.items()},
            "validation": {f"{k:g}": {m: {f"{a:g}": x for a, x in g.items()} for m, g in v.items()}
                           for k, v in scales.scores.items()},
            "per_seed": {f"{k:g}": v for k, v in scales.per.items()},
            "lp_l1_share_large": {f"{k:g}": list(v) for k, v in scales.lp_share.items()},
        }  # fmt: skip
    return {"methods": methods, "tables": tables, "notes": list(NOTES), "extra": extra}


def _band(x_name: str, x: Sequence[float], metric: str, per_seed: Any) -> Curve:
    """The curve of ``per_seed`` ``[seeds, len(x)]`` against ``x``: mean ± std over seeds."""
    return Curve(x_name, list(x), metric, *column_mean_std(per_seed, impl="numpy"))


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


def scales_tables(scales: ScalesRun) -> list[dict[str, Any]]:
    """The scale study's tables: margins per spread (with the LP separator's L1 share) and the validation
    grid."""
    margins = Table(
        "Heterogeneous column scales: margins relative to the linprog optima, mean ± std over seeds (alpha "
        "chosen on the validation seeds)",
        ["decades", "method", "alpha", "L1 margin / optimal", "Linf margin / optimal", "non-zeros",
         "L1 share, upper half of scales"],
    )  # fmt: skip
    for kappa, by_method in scales.per.items():
        for name, rec in by_method.items():
            alpha = scales.chosen.get(kappa, {}).get(name)
            margins.add(f"{kappa:g}", name, "—" if alpha is None else f"{alpha:g}",
                        _cell(rec["l1_margin_ratio"], 4), _cell(rec["linf_margin_ratio"], 4),
                        _cell(rec["nnz"]), _cell(rec["large_share"]))  # fmt: skip
        margins.add(f"{kappa:g}", "LP optimum (L1)", "—", "1", "—", "—", _cell(scales.lp_share[kappa]))
    grid = Table(
        "Validation seeds: mean L1 margin / optimal for each alpha (the highest is chosen)",
        ["decades", "method", "grid"],
    )
    for kappa, by_method in scales.scores.items():
        for name, tried in by_method.items():
            cells = [
                f"α={a:g}: " + ("diverged" if not np.isfinite(m) else f"{m:.3f}") for a, m in tried.items()
            ]
            grid.add(f"{kappa:g}", name, "; ".join(cells))
    return [margins.to_dict(), grid.to_dict()]


# ---- figures ------------------------------------------------------------------------------------------


def _methods(arrays: Mapping[str, np.ndarray], axis: str) -> dict[str, np.ndarray]:
    return {name: a for name, a in arrays.items() if name != axis}


def _two_rows(
    run_dir: Path, path: str, names: Sequence[str], draw: Callable[[Any, str], None], caption: str, title: str
) -> list[dict[str, str]]:
    """One panel per name on two rows (the unused ones hidden), saved with ``title`` over them."""
    if not names:
        return []
    cols = math.ceil(len(names) / 2)
    fig, axes = new_figure(2, cols, panel_size=(3.7, 3.2))
    for ax, name in zip(np.ravel(axes), names, strict=False):
        draw(ax, name)
        ax.set_title(name, fontsize=9)
    for ax in np.ravel(axes)[len(names) :]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, Path(run_dir) / path, dpi=110)
    return [figure_record(path, caption)]


def theorem_figure(run_dir: Path) -> list[dict[str, str]]:
    """Theorem 4.7's run from the claims' cells: L1 margin / optimal against the step, mean ± std over seeds."""
    store = claim_arrays(run_dir)
    theorem = store.design.extra.get("theorem") if isinstance(store, CellStore) else None
    if not theorem or not theorem["methods"]:
        return []

    def draw(ax: Any, _: None) -> None:
        for name in theorem["methods"]:
            ratios = np.asarray(store.get("theorem_ratio", name), dtype=np.float64)
            sd = np.nanstd(ratios, axis=0, ddof=1) if ratios.shape[0] > 1 else None
            label = f"{name} ({ratios.shape[0]} seeds)"
            plot_band(
                ax, theorem["steps"], np.nanmean(ratios, axis=0), sd, label=label, alpha=0.2, marker=None
            )
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(0.9, color="k", lw=0.8, ls=":", label="τ = 0.9")
        ax.set(xscale="log", ylim=(-0.05, 1.05), xlabel="step (lr_k = lr / sqrt(k))", ylabel=RATIO)
        ax.set_title("Theorem 4.7: L_p steepest descent + mirror", fontsize=9)

    caption = "Theorem 4.7's objects at a decaying step: L1 margin relative to the linprog optimum against the step (mean ± std over seeds)."
    return panel_figure(run_dir, "figures/theorem-margins.png", [None], draw, caption)


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """The figures, redrawn from the claims' cells and the arrays in ``run_dir / "arrays"`` (those that exist)."""
    arrays = {p.stem: load_arrays(p) for p in (Path(run_dir) / "arrays").glob("*.npz")}
    drawn = theorem_figure(run_dir)
    if "trajectories" in arrays:
        data = arrays["trajectories"]

        def trajectory(ax: Any, name: str) -> None:
            ax.plot(data["steps"], data[name], lw=0.8)
            ax.set(xscale="log", xlabel="step")

        shown = [m for m in TRAJECTORY_PANELS if m in data]
        drawn += _two_rows(run_dir, "figures/regression-trajectories.png", shown, trajectory,
                           "Weight trajectories on under-determined regression.",
                           "Regression: every coordinate of w against the step (first seed)")  # fmt: skip
    if "margins" in arrays and len(paths := _methods(arrays["margins"], "steps")):

        def margins(ax: Any, _: None) -> None:
            for name, ratios in paths.items():
                ls = "--" if "before" in name else "-"  # mirror first (S∘M) dashed
                ax.plot(arrays["margins"]["steps"], ratios, label=name, lw=1.3, ls=ls)
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set(xscale="log", ylim=(-0.5, 1.05), xlabel="step", ylabel=RATIO)
            ax.set_title("L1 margin, first seed (dashed: mirror first)", fontsize=9)

        drawn += panel_figure(run_dir, "figures/classification-margins.png", [None], margins,
                              "L1 margin relative to the linprog optimum against the step.")  # fmt: skip
    if arrays.get("final-weights"):

        def weights(ax: Any, _: None) -> None:
            for name, w in arrays["final-weights"].items():
                mags = np.clip(np.sort(np.abs(w) / np.abs(w).max())[::-1], 1e-12, None)
                ax.plot(np.arange(1, len(mags) + 1), mags, label=name, lw=1.2)
            ax.set(yscale="log", xlabel="rank", ylabel="|w_i| / max |w|")
            ax.set_title("Sorted final weights (first seed)", fontsize=9)

        drawn += panel_figure(run_dir, "figures/classification-weights.png", [None], weights,
                              "Sorted |w| at the end of classification training.")  # fmt: skip
    if "scales-margins" in arrays and len(ratios := _methods(arrays["scales-margins"], "decades")):

        def spread(ax: Any, _: None) -> None:
            for name, r in ratios.items():
                sd = np.nanstd(r, axis=1, ddof=1) if r.shape[1] > 1 else None
                plot_band(ax, arrays["scales-margins"]["decades"], np.nanmean(r, axis=1), sd, label=name)
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set(xlabel="spread of column scales (decades)", ylabel=RATIO)
            ax.set_title("Heterogeneous scales: final L1 margin", fontsize=9)

        drawn += panel_figure(run_dir, "figures/scales-margins.png", [None], spread,
                              "Heterogeneous column scales: L1 margin relative to the linprog optimum against the spread (mean ± std over seeds).")  # fmt: skip
    if "scales" in (sw := arrays.get("scales-weights", {})):

        def scatter(ax: Any, name: str) -> None:
            w = np.abs(sw[name])
            ax.scatter(sw["scales"], np.clip(w / w.max(), 1e-16, None), s=8)
            ax.set(
                xscale="log",
                yscale="log",
                ylim=(1e-16, 2),
                xlabel="column scale s_j",
                ylabel="|w_j| / max |w|",
            )

        drawn += _two_rows(run_dir, "figures/scales-weights.png", list(_methods(sw, "scales")), scatter,
                           "Heterogeneous column scales: |w_j| against the column scale at the largest spread.",
                           "Largest spread, first seed: where each separator puts its weight")  # fmt: skip
    return drawn
