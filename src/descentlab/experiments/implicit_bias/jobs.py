r"""implicit-bias's jobs: one vector trained by a named optimizer geometry on a synthetic float64 problem with
an exact reference (:mod:`descentlab.data.synthetic`), and the three runs built from it.

* The main problems from w = 0 (:func:`run_main`): under-determined least squares, where GD reaches the
  pseudo-inverse, L_inf steepest descent ("sign", scaled by ||g||_1 so it settles) a near-min-L_inf
  interpolant and coordinate / hyperbolic mirror descent near-min-L1 ones; and separable classification with
  the exponential loss, its normalised margins min_i y_i <x_i, w> / ||w||_p against the optimal L1 / L_inf
  margins (``linprog``).
* Theorem 4.7's objects (:func:`run_theorem`): L_p steepest descent (p = 2, 3, 4, 8, ∞) composed with the
  hyperbolic mirror step at the decaying step ``lr / sqrt(k)``.
* Heterogeneous column scales (:func:`run_scales`), the problem that separates HORST from HAM. Both take
  AdamW's step, then multiply each weight by exp(-a_j sign(w_j)), clamped, with a_j = alpha u_j (HORST, u
  the Adam update) or a_j = eta alpha g_j (HAM, the raw gradient). With g_j = s_j gamma_j, Adam's update is
  invariant under g_j -> c_j g_j, so HORST's exponent does not see s_j: columns of scale 10^-2 gain L1 mass
  as fast as columns of scale 10^2 while adding 10^-4 times the margin per unit of it. HAM's exponent grows
  each coordinate at the rate it buys margin per unit of L1 norm, which the L1-optimal separator rewards,
  at the price of an alpha chosen for the problem: each method's alpha is chosen on validation seeds from
  grids of the same size (:func:`~descentlab.study.tuning.tune_then_replicate`, one round).

Every geometry is a real optimizer of :mod:`descentlab.optim`: the steepest operators of
:func:`~descentlab.optim.compose.compose`, the hyperbolic mirror map composed with them in either order,
exact hyperbolic mirror descent (``dual``), HORST / HAM from an
:class:`~descentlab.optim.config.OptimizerConfig` (mirror step on the raw tensor, no weight decay, HAM's
beta = 0) and Theorem 4.7's ``lp<p>+mirror_after`` (:class:`~descentlab.optim.compose.LpMirrorAfter`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import lru_cache, partial

import numpy as np
import torch
from torch import Tensor

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
from descentlab.experiments.implicit_bias.config import LP_GEOMETRIES, ImplicitBiasConfig
from descentlab.optim.compose import HyperbolicMirror, LpMirrorAfter, compose
from descentlab.optim.config import OptimizerConfig, build_optimizer
from descentlab.study.tuning import Round, TuningConfig, tune_then_replicate
from descentlab.train.rundir import RunDir

TRAJECTORY_POINTS = 60  # recorded steps of the first seed's figure data (trajectories, margin paths)
TUNED_ON_SCALES = ("horst", "ham")  # the methods whose alpha the scale study chooses per spread

# ---- one vector, one geometry -------------------------------------------------------------------------


def make_geometry(
    name: str, w: Tensor, lr: float, *, regression: bool, horst_alpha: float, ham_alpha: float, gamma: float
) -> torch.optim.Optimizer:
    """The optimizer called ``name`` over ``w``; in regression "sign" is L_inf steepest descent scaled by
    ||g||_1 (plain sign steps never settle on an interpolant), and ``lp<p>`` likewise L_p steepest descent
    scaled by ||g||_q.

    ``horst_alpha`` drives HORST and the mirror_after compositions (clamp 5), ``ham_alpha`` HAM, ``gamma``
    the width of the hyperbolic potential of mirror_before and dual (their alpha is 1).
    """
    sign = "linf" if regression else "sign"
    after = HyperbolicMirror(alpha=horst_alpha, exp_clamp=5.0)
    before = HyperbolicMirror(alpha=1.0, gamma=gamma)
    table: dict[str, Callable[[], torch.optim.Optimizer]] = {
        "gd": lambda: compose([w], "gd", lr=lr),
        "sign": lambda: compose([w], sign, lr=lr),
        "coordinate": lambda: compose([w], "coordinate", lr=lr),
        "adam": lambda: compose([w], "adam", lr=lr),
        "hyperbolic_md": lambda: compose([w], "gd", before, "dual", lr=lr, mirror_tensors=True),
        "gd+mirror_before": lambda: compose([w], "gd", before, "mirror_before", lr=lr, mirror_tensors=True),
        "horst": lambda: build_optimizer(
            OptimizerConfig("horst", lr=lr, weight_decay=0.0, alpha=horst_alpha, mirror="all"), [w]
        ),
        "ham": lambda: build_optimizer(
            OptimizerConfig("ham", lr=lr, weight_decay=0.0, alpha=ham_alpha, beta=0.0, mirror="all"), [w]
        ),
        "ngd+mirror_after": lambda: compose([w], "normalized_gd", after, lr=lr, mirror_tensors=True),
        "sign+mirror_after": lambda: compose([w], sign, after, lr=lr, mirror_tensors=True),
        **{
            lp: lambda p=p: LpMirrorAfter([w], lr=lr, p=p, mirror=after, dual_scaled=regression)
            for lp, p in LP_GEOMETRIES.items()
        },
        "sign+mirror_before": lambda: compose([w], sign, before, "mirror_before", lr=lr, mirror_tensors=True),
        "adam+mirror_before": lambda: compose(
            [w], "adam", before, "mirror_before", lr=lr, mirror_tensors=True
        ),
    }
    return table[name]()


def make_optimizer(
    name: str, w: Tensor, lr: float, cfg: ImplicitBiasConfig, *, regression: bool, alpha: float | None = None
) -> torch.optim.Optimizer:
    """:func:`make_geometry` with the config's strengths; ``alpha`` (when given) replaces ``horst_alpha`` /
    ``ham_alpha`` for horst, ham and the mirror_after compositions."""
    horst_alpha = cfg.horst_alpha if alpha is None else alpha
    ham_alpha = cfg.ham_alpha if alpha is None else alpha
    return make_geometry(
        name, w, lr, regression=regression, horst_alpha=horst_alpha, ham_alpha=ham_alpha, gamma=cfg.gamma
    )


def regression_lr(name: str, x: Tensor) -> float:
    """Stable step sizes from the Hessian H = X^T X / n; Adam-like methods use a fixed small step."""
    h = x.T @ x / x.shape[0]
    smooth = float(torch.linalg.eigvalsh(h).max())
    if name in ("sign", "sign+mirror_after", "sign+mirror_before"):
        return 1.0 / float(h.abs().sum())  # smoothness w.r.t. L_inf
    if name == "coordinate":
        return 0.1 / float(h.diagonal().max())
    if name in ("adam", "horst", "ham", "adam+mirror_before", "ngd+mirror_after"):
        return 1e-3
    if name == "hyperbolic_md":  # w' ~ w - lr sqrt(w^2 + gamma^2) g: the curvature grows with |w|
        return 0.5 / smooth
    if name == "gd+mirror_before":  # its explicit (first-order) step is less stable than the exact dual one
        return 0.25 / smooth
    return 1.0 / smooth


def train(
    w0: Tensor, grad_fn: Callable[[Tensor], Tensor], make: Callable[[Tensor], torch.optim.Optimizer],
    steps: int, record: list[int], lr_at: Callable[[int], float] | None = None,
) -> tuple[Tensor, dict[int, Tensor]]:  # fmt: skip
    """Run ``steps`` optimizer steps from ``w0``; return the final w and snapshots at the steps in ``record``.

    ``lr_at(k)`` (when given) is the learning rate of step k = 1..steps, set on every param group before
    the step (a decaying step); otherwise the optimizer keeps the lr it was made with.
    """
    w = torch.nn.Parameter(w0.clone())
    opt = make(w)
    snaps = {0: w0.clone()} if 0 in record else {}
    with torch.no_grad():
        for k in range(1, steps + 1):
            if lr_at is not None:
                for group in opt.param_groups:
                    group["lr"] = lr_at(k)
            w.grad = grad_fn(w.detach())
            opt.step()
            if k in record:
                snaps[k] = w.detach().clone()
    if not torch.isfinite(w).all():
        raise NumericalError("an iterate became non-finite; lower the learning rate or the number of steps")
    return w.detach(), snaps


def log_grid(steps: int, points: int) -> list[int]:
    """About ``points`` steps spread evenly in log scale over 1..steps (duplicates merged)."""
    return sorted({max(1, round(steps ** (i / (points - 1)))) for i in range(points)})


def fit_classification(
    name: str, z: Tensor, cfg: ImplicitBiasConfig, steps: int, lr: float, alpha: float | None, **kw
) -> Tensor | None:
    """``name`` trained on the rows ``z`` from w = 0 for ``steps`` (``kw``: :func:`train`'s ``record`` and
    ``lr_at``); its final weights, with the snapshots when ``record`` is given; None when an iterate
    overflows."""
    try:
        w, snaps = train(
            torch.zeros(z.shape[1], dtype=torch.float64),
            partial(classification_grad, z=z),
            partial(make_optimizer, name, lr=lr, cfg=cfg, regression=False, alpha=alpha),
            steps,
            **{"record": [], **kw},
        )
    except NumericalError:
        return None
    return (w, snaps) if kw.get("record") else w


# ---- the main problems: regression and classification from w = 0 -------------------------------------


@dataclass
class MainRun:
    """The main problems' results: per method, every metric's per-seed values (``*_curve``: one recorded
    path per seed), and the first seed's figure data."""

    per: dict[str, dict[str, list]]
    trajectories: dict[str, Tensor] = field(default_factory=dict)  # regression iterates [recorded steps, d]
    final_cls: dict[str, Tensor] = field(default_factory=dict)  # final classification weights
    margin_paths: dict[str, list[float]] = field(default_factory=dict)  # L1 margin / optimal, figure_grids


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


# ---- Theorem 4.7's own objects -------------------------------------------------------------------------


def theorem_path(name: str, z: Tensor, cfg: ImplicitBiasConfig, grid: list[int]) -> list[float]:
    """``name``'s L1 margin over the optimal one at the steps ``grid`` of its decaying-step run on ``z``
    (nan throughout when the run overflowed)."""
    th = cfg.theorem
    fit = fit_classification(
        name, z, cfg, th.steps, th.lr, th.alpha, record=grid, lr_at=lambda k: th.lr / math.sqrt(k)
    )
    if fit is None:
        return [math.nan] * len(grid)
    best = optimal_margins(z)["l1"]
    return [normalized_margin(fit[1][k], z, 1) / best for k in grid]


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


# ---- heterogeneous scales: alpha tuned on the validation seeds, then every evaluation seed -------------


@dataclass
class ScalesRun:
    """The scale study's results, by spread (nan where a run overflowed, -inf for its validation score)."""

    per: dict[float, dict[str, dict[str, list[float]]]]  # method -> metric -> per-seed values
    chosen: dict[float, dict[str, float]]  # tuned method -> its alpha
    scores: dict[float, dict[str, dict[float, float]]]  # tuned method -> alpha -> mean validation ratio
    lp_share: dict[float, list[float]]  # the LP separator's L1 share on the large-scale half, per seed
    weights: dict[str, Tensor]  # the first seed's scales, LP separator and final weights, largest spread


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
    return list(cfg.scales.horst_alphas if arm.startswith("horst@") else cfg.scales.ham_alphas)


def scales_plan(cfg: ImplicitBiasConfig) -> TuningConfig:
    """One round over every tuned (method, spread) arm; HORST and HAM compared at equal budgets.

    The plan's tuning seed is the first validation seed: it names the validation set, and a tuning job
    scores an alpha by its mean over every seed of ``scales.validation_seeds`` (:func:`validation_score`).
    """
    sc = cfg.scales
    tuned = [m for m in TUNED_ON_SCALES if m in sc.methods]
    arms = tuple(scale_arm(m, k) for k in sc.decades for m in tuned)
    budgets = {arm: len(alpha_candidates(cfg, arm, {})) for arm in arms} if len(tuned) > 1 else {}
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


def run_scales(cfg: ImplicitBiasConfig, run: RunDir) -> ScalesRun:
    """Alpha per spread on the validation seeds, then every method on every (spread, evaluation seed)."""
    sc = cfg.scales
    start = {scale_arm(m, k): None for k in sc.decades for m in sc.methods}
    # the choice: the first alpha with the highest mean validation ratio
    tuned = tune_then_replicate(
        start,
        scales_plan(cfg),
        partial(submit_scale, cfg, run),
        lambda arm, x: max(range(len(x)), key=x.__getitem__),
    )
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
