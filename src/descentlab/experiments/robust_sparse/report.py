"""robust-sparse's report: each method's block of ``results.json`` (a γ-curve per sparsity, accuracy against
the sparsity reached), the tables (accuracy against γ at every sparsity, each constrained method's paired
difference to ERM with the same optimizer, the final multipliers), one summary line per method, and the
figures, drawn from ``results.json`` alone so ``descentlab report`` redraws them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from descentlab.evaluation import RobustnessCurves
from descentlab.evaluation.config import NoiseEvalConfig
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import column_mean_std, mean_std, paired_interval
from descentlab.report.tables import multiplier_tables
from descentlab.study.figures import panel_figure, plot_band
from descentlab.study.tables import Table, pm, signed_ci

if TYPE_CHECKING:
    from descentlab.experiments.robust_sparse.config import RobustSparseConfig
    from descentlab.experiments.robust_sparse.jobs import JobResult
    from descentlab.train.recipe import MethodConfig

FIGURE = "figures/accuracy_vs_gamma_by_sparsity.png"
SPARSITY_FIGURE = "figures/accuracy_vs_sparsity_by_method.png"
SUFFIX = "_vs_sparsity"


def summarise(cfg: RobustSparseConfig, outcome: Mapping[str, list[JobResult]]) -> dict[str, Any]:
    """``methods``, ``tables`` and ``notes`` of ``results.json`` from every method's job results
    (``outcome[label][i]``: evaluation seed ``cfg.seeds[i]``); the tables pair each constrained method with
    ERM on the same optimizer."""
    ev, levels = cfg.evaluation, list(cfg.pruning.sparsities)
    kind = ev.kinds[0]
    blocks = {label: method_result(runs, levels, ev) for label, runs in outcome.items()}
    methods = {label: result.to_dict() for label, (result, _) in blocks.items()}
    correct = {label: [c.examples[kind] for c in joined] for label, (_, joined) in blocks.items()}
    pairs = erm_baselines(cfg.method_configs())
    return {
        "methods": {label: result for label, (result, _) in blocks.items()},
        "tables": accuracy_tables(methods, correct, pairs, levels, kind, ev.gammas),
        "notes": summary_notes(methods, levels, kind),
    }


def method_result(
    per_seed: list[JobResult], levels: list[float], ev: NoiseEvalConfig
) -> tuple[MethodResult, list[RobustnessCurves]]:
    """One method's block (and its curves per level, seeds joined): a γ-curve per sparsity, and accuracy
    against the sparsity reached at γ = 0 and every γ >= 1.

    Metrics: clean accuracy and the mean over the γ grid at every level (``accuracy@s=0.5``,
    ``gaussian_mean_over_grid@s=0.5``); std is over (seed, draw) pairs (ddof 0, numpy, as the tables).
    """
    joined = [RobustnessCurves.concat([job.points[i].curve for job in per_seed]) for i in range(len(levels))]
    reached = [
        mean_std([job.points[i].reached for job in per_seed], ddof=0, impl="numpy")[0]
        for i in range(len(levels))
    ]
    result = MethodResult()
    for s, curve in zip(levels, joined, strict=True):
        for kind, block in curve.curves().items():
            result.curves[f"{kind}@s={s:g}"] = Curve.from_dict(block)
        clean = curve.values[ev.kinds[0]][:, 0, 0]  # [seeds]: every draw is the clean input at γ = 0
        result.metrics[f"accuracy@s={s:g}"] = mean_std(clean, ddof=0, impl="numpy")[0]
        for kind, over_grid in curve.summary().items():
            result.metrics[f"{kind}_mean_over_grid@s={s:g}"] = over_grid
    result.metrics["accuracy"] = result.metrics[f"accuracy@s={levels[0]:g}"]
    for kind in ev.kinds:
        for gamma in [0.0, *[g for g in ev.gammas if g >= 1.0]]:
            g = list(ev.gammas).index(gamma)
            stats = [mean_std(c.values[kind][..., g].reshape(-1), ddof=0, impl="numpy") for c in joined]
            result.curves[f"{kind}@gamma={gamma:g}_vs_sparsity"] = Curve(
                "sparsity", reached, "accuracy", [m for m, _ in stats], [sd for _, sd in stats]
            )
    result.layer_loss = {
        f"clean@s={s:g}": column_mean_std([job.points[i].profile for job in per_seed], impl="numpy")[0]
        for i, s in enumerate(levels)
    }
    result.sparsity = {
        "global": reached[-1],
        **{f"reached@s={s:g}": r for s, r in zip(levels, reached, strict=True)},
    }
    multipliers = [job.multipliers for job in per_seed if job.multipliers is not None]
    if multipliers:
        result.extra["multipliers"] = column_mean_std(multipliers, impl="numpy")[0]
    return result, joined


def erm_baselines(methods: dict[str, MethodConfig]) -> list[tuple[str, str]]:
    """``(method, baseline)`` pairs: each non-ERM method against the first ERM method that differs from it
    in the objective only (same optimizer, same AC/DC)."""
    erm = {b: (e.optimizer, e.acdc) for b, e in methods.items() if e.objective == "erm"}
    pairs = [(a, [b for b, k in erm.items() if k == (m.optimizer, m.acdc)]) for a, m in methods.items()]
    return [(a, same[0]) for a, same in pairs if same and a not in erm]


def accuracy_tables(
    methods: Mapping[str, Any],
    correct: Mapping[str, Sequence[np.ndarray]],
    pairs: Sequence[tuple[str, str]],
    levels: Sequence[float],
    kind: str,
    gammas: Sequence[float],
) -> list[dict[str, Any]]:
    """Accuracy vs γ at every sparsity (``methods``: the results.json blocks); per ``(method, baseline)``
    pair and γ, ``method − baseline`` on ``correct`` (per method and sparsity, ``[seed, draw, γ, example]``)
    with its seed-level 95 % interval (:func:`~descentlab.report.stats.paired_interval`; examples only with
    one seed); the final multipliers."""
    grid = Table(
        f"Test accuracy against γ ({kind} embedding noise) at each sparsity, mean ± std over (seed, draw)",
        ["method", "sparsity reached", *[f"γ={g:g}" for g in gammas]],
    )
    for method, block in methods.items():
        for s in levels:
            c = block["curves"][f"{kind}@s={s:g}"]
            reached = f"{block['sparsity'][f'reached@s={s:g}']:.3f}"
            grid.add(method, reached, *[pm(m, sd) for m, sd in zip(c["mean"], c["std"], strict=True)])
    paired = Table(
        "Accuracy difference to ERM with the same optimizer: mean [95 % interval over training seeds (same "
        "seeds, same noise; examples only with one seed)]",
        ["methods", "sparsity", *[f"γ={g:g}" for g in gammas]],
    )
    for method, base in pairs:
        for i, s in enumerate(levels):
            a, b = np.asarray(correct[method][i]), np.asarray(correct[base][i])
            cis = [paired_interval(a[:, :, g], b[:, :, g]) for g in range(len(gammas))]
            paired.add(f"{method} − {base}", f"{s:g}", *[signed_ci(c.mean, c.low, c.high) for c in cis])
    tables = [grid.to_dict(), *([paired.to_dict()] if paired.rows else [])]
    return tables + multiplier_tables(dict(methods))


def summary_notes(methods: Mapping[str, Any], levels: Sequence[float], kind: str) -> list[str]:
    """One line per method: dense vs sparsest, clean and averaged over the γ grid."""
    lo, hi = f"s={levels[0]:g}", f"s={levels[-1]:g}"
    return [
        f"{m}: clean accuracy {v['metrics'][f'accuracy@{lo}']:.4f} at {lo} -> {v['metrics'][f'accuracy@{hi}']:.4f}"
        f" at sparsity {v['sparsity']['global']:.3f}; {kind} accuracy over the γ grid "
        f"{v['metrics'][f'{kind}_mean_over_grid@{lo}']:.4f} -> {v['metrics'][f'{kind}_mean_over_grid@{hi}']:.4f}"
        for m, v in methods.items()
    ]


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """One panel per method: accuracy against γ, one line per sparsity; then one panel per γ (0 and every
    γ >= 1): accuracy against the sparsity reached, one line per method."""
    methods = results.get("methods", {})
    kind = results["config"]["evaluation"]["kinds"][0]
    levels = results["config"]["pruning"]["sparsities"]
    if not methods:
        return []

    def by_sparsity(ax: Any, method: str) -> None:
        for s in levels:
            c = methods[method]["curves"][f"{kind}@s={s:g}"]
            plot_band(ax, c["x"], c["mean"], c["std"], label=f"s={s:g}")
        ax.set(title=method, xlabel="γ (embedding noise)", ylabel="accuracy")

    def by_method(ax: Any, key: str) -> None:
        for method, block in methods.items():
            c = block["curves"][key]
            plot_band(ax, c["x"], c["mean"], c["std"], label=method, alpha=0.12)
        title = key[len(f"{kind}@") : -len(SUFFIX)].replace("gamma", "γ")
        ax.set(title=title, xlabel="sparsity reached", ylabel="accuracy")

    first = next(iter(methods.values()))["curves"]
    keys = sorted(
        (k for k in first if k.startswith(f"{kind}@gamma=") and k.endswith(SUFFIX)),
        key=lambda k: float(k[len(f"{kind}@gamma=") : -len(SUFFIX)]),
    )
    return [
        *panel_figure(run_dir, FIGURE, list(methods), by_sparsity, sharey=True, legend="sparsity",
                      caption=f"Test accuracy against γ ({kind}), one line per one-shot sparsity; band = ± std"),
        *panel_figure(run_dir, SPARSITY_FIGURE, keys, by_method, sharey=True,
                      caption=f"Test accuracy against the sparsity reached, one panel per γ ({kind}), one line "
                      "per method; band = ± std"),
    ]  # fmt: skip
