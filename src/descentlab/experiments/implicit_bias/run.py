r"""implicit-bias: which norm each optimizer geometry implicitly favours.

Four synthetic float64 runs with exact references (:mod:`descentlab.data.synthetic`):

* under-determined least squares from w = 0 (n < d): GD should reach the pseudo-inverse (min-L2) solution,
  L_inf steepest descent ("sign", dual-norm scaled so it settles) a near-min-L_inf one, greedy coordinate
  descent and hyperbolic mirror descent near-min-L1 ones; minimum L1 / L_inf norms come from ``linprog``;
* linearly separable classification with the exponential loss: the normalised margins
  min_i y_i <x_i, w> / ||w||_p against the optimal L1 and L_inf margins (``linprog``), and the number of
  non-zeros. HORST (mirror after Adam) should approach the optimal L1 margin (Theorem 4.7); Adam sits near
  the L_inf one;
* Theorem 4.7's own objects on the same classification problem (``theorem.*``): L_p steepest descent at
  p = 2 (normalised GD), 3, 4, 8 (the step of length lr along argmax_{||d||_p <= 1} <g, d>) and p = ∞ (sign
  descent), each composed with the hyperbolic mirror step, at a decaying step, with the L1 margin over the
  optimum recorded along the way;
* the same classification with column scales spread over ``scales.decades`` decades (``scales.*``), the
  problem that separates HORST from HAM.

Why heterogeneous scales separate HORST and HAM. Both take AdamW's step and then multiply each weight by
exp(-a_j sign(w_j)), clamped, with

    HORST:  a_j = alpha u_j,        u_j = eta m_hat_j / (sqrt(v_hat_j) + eps)   (the Adam update)
    HAM:    a_j = eta alpha g_j                                                  (the raw gradient)

On the scaled problem g_j = s_j gamma_j (data/synthetic.py). Adam's update is invariant under
g_j -> c_j g_j, so HORST's exponent does not see s_j: once a coordinate's gradient sign is stable,
|u_j| ~ eta and log|w_j| grows by about eta alpha per step whatever s_j, so columns of scale 10^-2 gain
L1 mass as fast as columns of scale 10^2 while adding 10^-4 times the margin per unit of it. HAM's exponent
is eta alpha s_j gamma_j: multiplicative growth in proportion to the raw gradient, the exponentiated-
gradient step whose coordinates race at the rate each buys margin per unit of L1 norm, which is what the
L1-optimal separator rewards. The price is a scale: eta alpha max_j |g_j| must stay well below the clamp,
so HAM's alpha has to be chosen for the problem, and each method's alpha is chosen on separate validation
seeds before the evaluation seeds run, from grids of the same size. At 0 decades the exponents differ
only through |gamma_j|. Controls of the mechanism: normalised GD + mirror (keeps relative gradient sizes),
sign + mirror (does not).

Every method is a real optimizer from :mod:`descentlab.optim` (``vector_fit.py``). The scale study's alpha
choice is the toolkit's plan (:func:`~descentlab.study.tuning.tune_then_replicate`): one search round
over every (tuned method, spread) arm on the validation set, then the pick on every evaluation seed. The
run saves the per-seed values the claims read in a cell store (``arrays/cells.npz`` + ``arrays/design.json``,
see ``claims.py``) and the figure data (``figures.py``) under ``arrays/``.
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any

import numpy as np
import torch
from torch import Tensor

from descentlab.config import config_to_dict
from descentlab.data.synthetic import (
    classification_grad,
    count_nonzeros,
    l1_max_margin_separator,
    l1_share,
    make_classification,
    make_heterogeneous_classification,
    make_regression,
    normalized_margin,
    optimal_margins,
    regression_grad,
    regression_references,
    separator_metrics,
    upper_half,
)
from descentlab.errors import NumericalError
from descentlab.experiments.implicit_bias.claims import SCALES_RATIO
from descentlab.experiments.implicit_bias.config import ImplicitBiasConfig
from descentlab.experiments.implicit_bias.tables import main_tables, scales_results
from descentlab.experiments.implicit_bias.vector_fit import log_grid, make_geometry, regression_lr, train
from descentlab.report.results import Curve, MethodResult, Results
from descentlab.report.stats import column_mean_std, mean_std
from descentlab.study.cells import CellStore, Design
from descentlab.study.tuning import Round, TuningConfig, tune_then_replicate
from descentlab.train.rundir import RunDir

TRAJECTORY_POINTS = 60  # recorded steps of the first seed's figure data (trajectories, margin paths)
CLAIM_METRICS = ("cls_l1_margin_ratio", "cls_nnz", "reg_l1_ratio")  # the main problems' cells (claims.py)

# ---- methods ------------------------------------------------------------------------------------------


def make_optimizer(
    name: str, w: Tensor, lr: float, cfg: ImplicitBiasConfig, *, regression: bool, alpha: float | None = None
) -> torch.optim.Optimizer:
    """:func:`~descentlab.train.vector_fit.make_geometry` with the config's strengths; ``alpha`` (when
    given) replaces ``horst_alpha`` / ``ham_alpha`` for horst, ham and the mirror_after compositions."""
    horst_alpha = cfg.horst_alpha if alpha is None else alpha
    ham_alpha = cfg.ham_alpha if alpha is None else alpha
    return make_geometry(
        name, w, lr, regression=regression, horst_alpha=horst_alpha, ham_alpha=ham_alpha, gamma=cfg.gamma
    )


def fit_classification(
    name: str, z: Tensor, cfg: ImplicitBiasConfig, steps: int, lr: float, alpha: float | None
) -> Tensor | None:
    """``name`` trained on the rows ``z`` from w = 0 for ``steps``; None when an iterate overflows."""
    try:
        w, _ = train(
            torch.zeros(z.shape[1], dtype=torch.float64),
            partial(classification_grad, z=z),
            partial(make_optimizer, name, lr=lr, cfg=cfg, regression=False, alpha=alpha),
            steps,
            [],
        )
    except NumericalError:
        return None
    return w


# ---- the main problems: regression and classification from w = 0 -------------------------------------


@dataclass
class MainRun:
    """The main problems' results.

    Attributes:
        per: method -> metric -> per-seed values (``*_curve``: one recorded path per seed).
        trajectories: the first seed's regression iterates per method, ``[recorded steps, d]``.
        final_cls: the first seed's final classification weights per method.
        margin_paths: the first seed's L1 margin / optimal at :func:`figure_grids`' margin steps.
    """

    per: dict[str, dict[str, list]]
    trajectories: dict[str, Tensor] = field(default_factory=dict)
    final_cls: dict[str, Tensor] = field(default_factory=dict)
    margin_paths: dict[str, list[float]] = field(default_factory=dict)


def curve_grids(cfg: ImplicitBiasConfig) -> tuple[list[int], list[int]]:
    """The steps of the regression and classification curves (every seed)."""
    return log_grid(cfg.regression.steps, cfg.curve_points), log_grid(
        cfg.classification.steps, cfg.curve_points
    )


def figure_grids(cfg: ImplicitBiasConfig) -> tuple[list[int], list[int]]:
    """The steps the first seed's figure data records: regression iterates, classification margins."""
    reg = sorted(set(curve_grids(cfg)[0]) | set(log_grid(cfg.regression.steps, TRAJECTORY_POINTS)))
    return reg, log_grid(cfg.classification.steps, TRAJECTORY_POINTS)


def fit_regression(
    name: str, x: Tensor, y: Tensor, cfg: ImplicitBiasConfig
) -> tuple[dict, dict[int, Tensor]]:
    """``name`` on the under-determined least squares from w = 0: its norms against the exact minima, and
    its iterates at the recorded steps."""
    rc, ref = cfg.regression, regression_references(x, y)
    lr = rc.lr if rc.lr is not None else regression_lr(name, x)
    record = figure_grids(cfg)[0]
    w, snaps = train(
        torch.zeros(rc.d, dtype=torch.float64),
        partial(regression_grad, x=x, y=y),
        partial(make_optimizer, name, lr=lr, cfg=cfg, regression=True),
        rc.steps,
        record,
    )
    metrics = {
        "reg_l2_ratio": float(w.norm()) / ref["l2"],
        "reg_l1_ratio": float(w.abs().sum()) / ref["l1"],
        "reg_linf_ratio": float(w.abs().max()) / ref["linf"],
        "reg_dist_pinv": float((w - ref["w_l2"]).abs().max()),
        "reg_residual": float((x @ w - y).abs().max()),
        "reg_nnz": count_nonzeros(w, cfg.nnz_rel_tol),
        "reg_l1_curve": [float(snaps[k].abs().sum()) / ref["l1"] for k in curve_grids(cfg)[0]],
    }
    return metrics, snaps


def fit_main_classification(
    name: str, z: Tensor, cfg: ImplicitBiasConfig
) -> tuple[dict, Tensor, list[float]]:
    """``name`` on the separable classification from w = 0 (constant step): its margins over the optima,
    its final weights and its L1 margin path at the figure's steps."""
    cc, best = cfg.classification, optimal_margins(z)
    cls_grid, margin_grid = curve_grids(cfg)[1], figure_grids(cfg)[1]
    w, snaps = train(
        torch.zeros(cc.d, dtype=torch.float64),
        partial(classification_grad, z=z),
        partial(make_optimizer, name, lr=cc.lr, cfg=cfg, regression=False),
        cc.steps,
        sorted(set(cls_grid) | set(margin_grid)),
    )
    metrics = {
        "cls_l1_margin_ratio": normalized_margin(w, z, 1) / best["l1"],
        "cls_linf_margin_ratio": normalized_margin(w, z, math.inf) / best["linf"],
        "cls_nnz": count_nonzeros(w, cfg.nnz_rel_tol),
        "cls_margin_curve": [normalized_margin(snaps[k], z, 1) / best["l1"] for k in cls_grid],
    }
    return metrics, w, [normalized_margin(snaps[k], z, 1) / best["l1"] for k in margin_grid]


def run_main(cfg: ImplicitBiasConfig, run: RunDir) -> MainRun:
    """Every method on both main problems from every evaluation seed."""
    rc, cc = cfg.regression, cfg.classification
    out = MainRun({m: {} for m in cfg.methods})
    for seed in cfg.seeds:
        x, y = make_regression(rc.n, rc.d, rc.support, seed)
        z = make_classification(cc.n, cc.d, cc.support, seed)
        for name in cfg.methods:
            reg, snaps = fit_regression(name, x, y, cfg)
            cls, w, margins = fit_main_classification(name, z, cfg)
            if seed == cfg.seeds[0]:
                out.trajectories[name] = torch.stack([snaps[k] for k in sorted(snaps)])
                out.final_cls[name], out.margin_paths[name] = w, margins
            for key, val in (reg | cls).items():
                out.per[name].setdefault(key, []).append(val)
            run.log(
                seed=seed, method=name, **{k: v for k, v in (reg | cls).items() if not k.endswith("curve")}
            )
    return out


def main_methods(cfg: ImplicitBiasConfig, per: dict[str, dict[str, list]]) -> dict[str, MethodResult]:
    """Per method: the mean of every metric over seeds and its two curves (mean ± std over seeds)."""
    (reg_grid, cls_grid), methods = curve_grids(cfg), {}
    for name, rec in per.items():
        metrics = {k: mean_std(v, impl="numpy")[0] for k, v in rec.items() if not k.endswith("curve")}
        curves = {}
        for key, grid, metric in (
            ("reg_l1_curve", reg_grid, "||w||_1 / min L1 (regression)"),
            ("cls_margin_curve", cls_grid, "L1 margin / optimal (classification)"),
        ):
            mean, std = column_mean_std(rec[key], impl="numpy")
            curves[key.replace("_curve", "")] = Curve("step", grid, metric, mean, std)
        methods[name] = MethodResult(metrics=metrics, curves=curves)
    return methods


# ---- Theorem 4.7's own objects -------------------------------------------------------------------------


def theorem_path(name: str, z: Tensor, cfg: ImplicitBiasConfig, grid: list[int]) -> list[float]:
    """``name``'s L1 margin over the optimal one at the steps ``grid`` of its decaying-step run on ``z``
    (nan throughout when the run overflowed)."""
    th = cfg.theorem
    try:
        _, snaps = train(
            torch.zeros(z.shape[1], dtype=torch.float64),
            partial(classification_grad, z=z),
            partial(make_optimizer, name, lr=th.lr, cfg=cfg, regression=False, alpha=th.alpha),
            th.steps,
            grid,
            lr_at=partial(decaying_lr, th.lr),
        )
    except NumericalError:
        return [math.nan] * len(grid)
    best = optimal_margins(z)["l1"]
    return [normalized_margin(snaps[k], z, 1) / best for k in grid]


def decaying_lr(lr: float, k: int) -> float:
    """Theorem 4.7's step ``lr / sqrt(k)``."""
    return lr / math.sqrt(k)


def run_theorem(cfg: ImplicitBiasConfig, run: RunDir) -> tuple[list[int], dict[str, np.ndarray]]:
    """L_p steepest descent composed with the mirror step at the decaying step ``lr / sqrt(k)``
    (:class:`~descentlab.experiments.implicit_bias.config.TheoremConfig`), per evaluation seed.

    Returns:
        ``(steps, paths)``: the recorded steps and, per method, the L1 margin over the optimal one
        ``[seeds, steps]`` (nan for a run that overflowed).
    """
    th, cc = cfg.theorem, cfg.classification
    grid = log_grid(th.steps, th.points)
    paths: dict[str, list[list[float]]] = {m: [] for m in th.methods}
    for seed in cfg.seeds:
        z = make_classification(cc.n, cc.d, cc.support, seed)
        for name in th.methods:
            paths[name].append(theorem_path(name, z, cfg, grid))
            run.log(seed=seed, method=f"theorem/{name}", l1_margin_ratio=paths[name][-1][-1])
    return grid, {m: np.asarray(v, dtype=np.float64) for m, v in paths.items()}


def theorem_methods(grid: list[int], paths: dict[str, np.ndarray]) -> dict[str, MethodResult]:
    """One ``"<method> (theorem)"`` result per object: its end ratio and its path (mean ± std over seeds)."""
    methods = {}
    for name, path in paths.items():
        mean, std = column_mean_std(path, impl="numpy")
        curve = Curve("step", grid, "L1 margin / optimal (decaying step)", mean, std)
        methods[f"{name} (theorem)"] = MethodResult(
            metrics={"l1_margin_ratio": mean[-1]}, curves={"theorem_margin": curve}
        )
    return methods


# ---- heterogeneous scales: alpha tuned on the validation seeds, then every evaluation seed -------------

TUNED_ON_SCALES = ("horst", "ham")  # the methods whose alpha the scale study chooses per spread


@dataclass
class ScalesRun:
    """The scale study's results.

    Attributes:
        per: spread -> method -> metric -> per-seed values (nan where a run overflowed).
        chosen: spread -> tuned method -> its alpha.
        scores: spread -> tuned method -> alpha -> mean validation L1 margin ratio (-inf: overflowed).
        lp_share: spread -> the LP separator's L1 share on the large-scale half, per seed.
        weights: the first seed's scales, LP separator and final weights at the largest spread.
    """

    per: dict[float, dict[str, dict[str, list[float]]]]
    chosen: dict[float, dict[str, float]]
    scores: dict[float, dict[str, dict[float, float]]]
    lp_share: dict[float, list[float]]
    weights: dict[str, Tensor]


def scale_arm(method: str, kappa: float) -> str:
    """The tuning plan's arm of ``method`` at a spread of ``kappa`` decades."""
    return f"{method}@{kappa:g}"


@lru_cache(maxsize=64)
def scale_problem(
    n: int, d: int, support: int, seed: int, kappa: float
) -> tuple[Tensor, Tensor, dict, Tensor]:
    """``(z, scales, optimal margins, large-scale half)`` of one heterogeneous problem (cached: every
    method of a seed trains on the same one, and linprog is the costly part)."""
    z, s = make_heterogeneous_classification(n, d, support, seed, kappa)
    return z, s, optimal_margins(z), upper_half(d, seed)


def alpha_candidates(cfg: ImplicitBiasConfig, arm: str, chosen: dict) -> list[float]:
    """The alphas a tuned arm tries: its method's grid."""
    method = arm.split("@", 1)[0]
    return list(cfg.scales.horst_alphas if method == "horst" else cfg.scales.ham_alphas)


def scales_plan(cfg: ImplicitBiasConfig) -> TuningConfig:
    """One round over every tuned (method, spread) arm; HORST and HAM compared at equal budgets.

    The plan's tuning seed is the first validation seed: it names the validation set, and a tuning job
    scores an alpha by its mean over every seed of ``scales.validation_seeds`` (:func:`validation_score`).
    """
    sc = cfg.scales
    tuned = [m for m in TUNED_ON_SCALES if m in sc.methods]
    arms = tuple(scale_arm(m, k) for k in sc.decades for m in tuned)
    budgets = {scale_arm(m, k): len(alpha_candidates(cfg, scale_arm(m, k), {})) for k in sc.decades
               for m in tuned} if len(tuned) > 1 else {}  # fmt: skip
    rounds = [Round(arms, partial(alpha_candidates, cfg))] if arms else []
    return TuningConfig(cfg.seeds, sc.validation_seeds[0], rounds, budgets)


def validation_score(cfg: ImplicitBiasConfig, method: str, kappa: float, alpha: float) -> float:
    """The mean L1 margin ratio of ``method`` at ``alpha`` over the validation seeds (-inf if one overflows)."""
    sc, ratios = cfg.scales, []
    for seed in sc.validation_seeds:
        z, _, best, _ = scale_problem(sc.n, sc.d, sc.support, seed, kappa)
        w = fit_classification(method, z, cfg, sc.steps, sc.lr, alpha)
        ratios.append(-math.inf if w is None else normalized_margin(w, z, 1) / best["l1"])
    return float(np.mean(ratios))


def evaluate_scale(
    cfg: ImplicitBiasConfig, run: RunDir, method: str, kappa: float, alpha: float | None, seed: int
) -> tuple[dict[str, float], Tensor | None]:
    """``method`` on one evaluation problem: its :func:`separator_metrics` and final weights."""
    sc = cfg.scales
    z, _, best, large = scale_problem(sc.n, sc.d, sc.support, seed, kappa)
    w = fit_classification(method, z, cfg, sc.steps, sc.lr, alpha)
    metrics = separator_metrics(w, z, best, large, cfg.nnz_rel_tol)
    run.log(decades=kappa, seed=seed, method=method, **metrics)
    return metrics, w


def submit_scale(cfg: ImplicitBiasConfig, run: RunDir, arm: str, alpha: float | None, seed: int) -> Future:
    """One job of the plan, run now: a validation score on the tuning seed, else an evaluation run."""
    method, kappa = arm.split("@", 1)[0], float(arm.split("@", 1)[1])
    done: Future = Future()
    if seed == cfg.scales.validation_seeds[0] and seed not in cfg.seeds:
        done.set_result(validation_score(cfg, method, kappa, alpha))
    else:
        done.set_result(evaluate_scale(cfg, run, method, kappa, alpha, seed))
    return done


def highest_score(arm: str, scores: list[float]) -> int:
    """The first alpha with the highest mean validation ratio."""
    return max(range(len(scores)), key=scores.__getitem__)


def run_scales(cfg: ImplicitBiasConfig, run: RunDir) -> ScalesRun:
    """Alpha per spread on the validation seeds, then every method on every (spread, evaluation seed)."""
    sc = cfg.scales
    start = {scale_arm(m, k): None for k in sc.decades for m in sc.methods}
    tuned = tune_then_replicate(start, scales_plan(cfg), partial(submit_scale, cfg, run), highest_score)
    out = ScalesRun({k: {} for k in sc.decades}, {k: {} for k in sc.decades}, {k: {} for k in sc.decades},
                    {}, {})  # fmt: skip
    for kappa in sc.decades:
        out.lp_share[kappa] = []
        for seed in cfg.seeds:
            z, _, _, large = scale_problem(sc.n, sc.d, sc.support, seed, kappa)
            out.lp_share[kappa].append(l1_share(l1_max_margin_separator(z), large))
        for method in sc.methods:
            arm = scale_arm(method, kappa)
            if arm in tuned.picks:
                out.chosen[kappa][method] = tuned.chosen[arm]
                out.scores[kappa][method] = dict(zip(tuned.tried[arm], tuned.results[arm], strict=True))
            runs = tuned.per_seed[arm]
            out.per[kappa][method] = {key: [m[key] for m, _ in runs] for key in runs[0][0]}
    out.weights = scale_weights(cfg, tuned.per_seed)
    return out


def scale_weights(cfg: ImplicitBiasConfig, per_seed: dict[str, list]) -> dict[str, Tensor]:
    """The figure's data: the first seed's column scales, LP separator and final weights at the largest spread."""
    sc, kappa = cfg.scales, max(cfg.scales.decades)
    z, s, _, _ = scale_problem(sc.n, sc.d, sc.support, cfg.seeds[0], kappa)
    weights = {"scales": s, "LP optimum (L1)": l1_max_margin_separator(z)}
    for method in sc.methods:
        if (w := per_seed[scale_arm(method, kappa)][0][1]) is not None:
            weights[method] = w
    return weights


# ---- saving -------------------------------------------------------------------------------------------


def cell_store(
    cfg: ImplicitBiasConfig, main: MainRun, theorem: tuple | None, scales: ScalesRun | None
) -> CellStore:
    """The claims' cells (``claims.py``) under the design record of ``cfg``."""
    arms = tuple(dict.fromkeys([*cfg.methods, *cfg.theorem.methods, *cfg.scales.methods]))
    extra = {}
    if theorem is not None:
        extra["theorem"] = {"steps": [float(k) for k in theorem[0]], "methods": list(theorem[1])}
    decades = cfg.scales.decades if scales is not None else ()
    store = CellStore(Design(arms, decades, cfg.seeds, 1, extra))
    for name, rec in main.per.items():
        for metric in CLAIM_METRICS:
            store.put(metric, name, None, np.asarray(rec[metric], dtype=np.float64))
    for name, path in (theorem[1] if theorem is not None else {}).items():
        store.put("theorem_ratio", name, None, path)
    for kappa, methods in (scales.per if scales is not None else {}).items():
        for name, rec in methods.items():
            store.put(SCALES_RATIO, name, kappa, np.asarray(rec["l1_margin_ratio"], dtype=np.float64))
    return store


def save_figure_data(cfg: ImplicitBiasConfig, run: RunDir, main: MainRun, scales: ScalesRun | None) -> None:
    """The first seed's arrays ``figures.py`` draws (and the scale study's margins and weights)."""
    record, margin_grid = figure_grids(cfg)
    run.save_arrays("arrays/trajectories.npz", steps=np.asarray(record), **_numpy(main.trajectories))
    run.save_arrays("arrays/margins.npz", steps=np.asarray(margin_grid), **_numpy(main.margin_paths))
    run.save_arrays("arrays/final-weights.npz", **_numpy(main.final_cls))
    if scales is not None:
        sc = cfg.scales
        ratios = {m: [scales.per[k][m]["l1_margin_ratio"] for k in sc.decades] for m in sc.methods}
        run.save_arrays("arrays/scales-margins.npz", decades=np.asarray(sc.decades), **_numpy(ratios))
        run.save_arrays("arrays/scales-weights.npz", **_numpy(scales.weights))


def protocol(cfg: ImplicitBiasConfig) -> dict[str, Any]:
    """The protocol block of ``results.json``, from the config."""
    rc, cc, sc, th = cfg.regression, cfg.classification, cfg.scales, cfg.theorem
    return {
        "regression": f"n={rc.n}, d={rc.d}, {rc.support}-sparse planted solution, squared loss, w0 = 0, "
        f"{rc.steps} steps; 'sign' = L_inf steepest descent scaled by ||g||_1",
        "classification": f"n={cc.n}, d={cc.d}, labels of a {cc.support}-sparse teacher, exponential loss "
        f"(gradient of its log), w0 = 0, {cc.steps} steps, lr={cc.lr}",
        "references": "pinv (min L2); scipy linprog/HiGHS (min L1 / L_inf interpolants, optimal margins)",
        "seeds": list(cfg.seeds),
        "dtype": "float64",
        "horst_alpha": cfg.horst_alpha,
        "ham_alpha": cfg.ham_alpha,
        "gamma": cfg.gamma,
        "nnz": f"|w_i| > {cfg.nnz_rel_tol} max|w|",
        "scales": f"the classification problem (n={sc.n}, d={sc.d}, {sc.support}-sparse teacher) with "
        f"column j scaled by 10^(kappa (r_j - 1/2)), kappa in {list(sc.decades)} decades; {sc.steps} steps, "
        f"lr={sc.lr}; HORST alpha from {list(sc.horst_alphas)} and HAM alpha from {list(sc.ham_alphas)}, "
        f"chosen per spread on validation seeds {list(sc.validation_seeds)}; controls at horst_alpha",
        "theorem": f"Theorem 4.7's objects {list(th.methods)} (mirror step alpha={th.alpha}, clamp 5) on the "
        f"classification problem, decaying step lr_k = {th.lr} / sqrt(k), {th.steps} steps",
        "claims": "the claims engine over per-seed values (arrays/cells.npz), seeds the unit of "
        "replication; primary: L4 steepest descent + mirror reaches >= 0.9 of the optimal L1 margin "
        "(Theorem 4.7 at finite p; p = inf is exploratory)",
    }


NOTES = [
    "Every number is a mean over seeds (± std across seeds when there is more than one seed).",
    "Heterogeneous scales: 'L1 share' is the fraction of ||w||_1 on the d/2 columns of largest scale "
    "(the same columns at every spread); the LP row is the linprog L1-optimal separator's.",
]


# ---- the experiment -----------------------------------------------------------------------------------


def run(cfg: ImplicitBiasConfig, run: RunDir) -> dict:
    main = run_main(cfg, run)
    methods = main_methods(cfg, main.per)
    tables = main_tables(main.per, cfg.methods)
    theorem = run_theorem(cfg, run) if cfg.theorem.methods else None
    if theorem is not None:
        methods.update(theorem_methods(*theorem))
    scales, extra = (run_scales(cfg, run) if cfg.scales.methods else None), {}
    if scales is not None:
        scale_tables, scale_methods, extra["scales"] = scales_results(
            scales.per, scales.chosen, scales.scores, scales.lp_share
        )
        tables += scale_tables
        methods.update(scale_methods)
    cell_store(cfg, main, theorem, scales).save(run.path, writer=run.writer)
    save_figure_data(cfg, run, main, scales)
    return Results(
        experiment="implicit-bias",
        config=config_to_dict(cfg),
        protocol=protocol(cfg),
        methods=methods,
        tables=tables,
        notes=list(NOTES),
        extra=extra,
    ).to_dict()


def _numpy(arrays: dict[str, Tensor | list[float]]) -> dict[str, np.ndarray]:
    return {name: np.asarray(a.numpy() if isinstance(a, Tensor) else a) for name, a in arrays.items()}
