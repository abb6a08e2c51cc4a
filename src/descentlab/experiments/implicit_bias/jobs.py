r"""implicit-bias's jobs: one vector trained by a named optimizer geometry on a synthetic float64 problem with
an exact reference (:mod:`descentlab.data.synthetic`).

* The main problems from w = 0 (:func:`train_job`): under-determined least squares, where GD reaches the
  pseudo-inverse, L_inf steepest descent ("sign", scaled by ||g||_1 so it settles) a near-min-L_inf
  interpolant and coordinate / hyperbolic mirror descent near-min-L1 ones; and separable classification with
  the exponential loss, its normalised margins min_i y_i <x_i, w> / ||w||_p against the optimal L1 / L_inf
  margins (``linprog``).
* Theorem 4.7's objects (:func:`theorem_path`): L_p steepest descent (p = 2, 3, 4, 8, ∞) composed with the
  hyperbolic mirror step at the decaying step ``lr / sqrt(k)``.
* Heterogeneous column scales (:func:`scale_job`), the problem that separates HORST from HAM. Both take
  AdamW's step, then multiply each weight by exp(-a_j sign(w_j)), clamped, with a_j = alpha u_j (HORST, u
  the Adam update) or a_j = eta alpha g_j (HAM, the raw gradient). With g_j = s_j gamma_j, Adam's update is
  invariant under g_j -> c_j g_j, so HORST's exponent does not see s_j: columns of scale 10^-2 gain L1 mass
  as fast as columns of scale 10^2 while adding 10^-4 times the margin per unit of it. HAM's exponent grows
  each coordinate at the rate it buys margin per unit of L1 norm, which the L1-optimal separator rewards,
  at the price of an alpha chosen for the problem: each method's alpha is chosen on validation seeds from
  grids of the same size (:func:`scale_job`, ``run.tuning_plan``).

Every geometry is a real optimizer of :mod:`descentlab.optim`: the steepest operators of
:func:`~descentlab.optim.compose.compose`, the hyperbolic mirror map composed with them in either order,
exact hyperbolic mirror descent (``dual``), HORST / HAM from an
:class:`~descentlab.optim.config.OptimizerConfig` (mirror step on the raw tensor, no weight decay, HAM's
beta = 0) and Theorem 4.7's ``lp<p>+mirror_after`` (:class:`~descentlab.optim.compose.LpMirrorAfter`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any

import numpy as np
import torch
from torch import Tensor

from descentlab.data.synthetic import (
    classification_grad,
    count_nonzeros,
    make_heterogeneous_classification,
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
from descentlab.train.rundir import RunDir

TRAJECTORY_POINTS = 60  # recorded steps of the first seed's figure data (trajectories, margin paths)

# ---- one vector, one geometry -------------------------------------------------------------------------


def make_optimizer(
    name: str, w: Tensor, lr: float, cfg: ImplicitBiasConfig, *, regression: bool, alpha: float | None = None
) -> torch.optim.Optimizer:
    """The optimizer called ``name`` over ``w``; in regression "sign" is L_inf steepest descent scaled by
    ||g||_1 (plain sign steps never settle on an interpolant), and ``lp<p>`` likewise L_p steepest descent
    scaled by ||g||_q.

    ``cfg.horst_alpha`` drives HORST and the mirror_after compositions (clamp 5), ``cfg.ham_alpha`` HAM
    (``alpha``, when given, replaces both), ``cfg.gamma`` the width of the hyperbolic potential of
    mirror_before and dual (their alpha is 1).
    """
    horst_alpha = cfg.horst_alpha if alpha is None else alpha
    ham_alpha = cfg.ham_alpha if alpha is None else alpha
    sign = "linf" if regression else "sign"
    after = HyperbolicMirror(alpha=horst_alpha, exp_clamp=5.0)
    before = HyperbolicMirror(alpha=1.0, gamma=cfg.gamma)
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


def curve_grids(cfg: ImplicitBiasConfig) -> tuple[list[int], list[int]]:
    """The steps of the regression and classification curves (every seed)."""
    return log_grid(cfg.regression.steps, cfg.curve_points), log_grid(
        cfg.classification.steps, cfg.curve_points
    )


def figure_grids(cfg: ImplicitBiasConfig) -> tuple[list[int], list[int]]:
    """The steps the first seed's figure data records: regression iterates, classification margins."""
    reg = sorted(set(curve_grids(cfg)[0]) | set(log_grid(cfg.regression.steps, TRAJECTORY_POINTS)))
    return reg, log_grid(cfg.classification.steps, TRAJECTORY_POINTS)


def train_job(
    name: str, cfg: ImplicitBiasConfig, x: Tensor, y: Tensor, z: Tensor
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``name`` from w = 0 on one seed's main problems, the least squares ``x w = y`` and the separable rows
    ``z`` (constant step): its norms against the exact minima and its margins over the optima (``*_curve``:
    at :func:`curve_grids`' steps), and its figure data by file under ``arrays/``: the regression iterates,
    the final classification weights and the L1 margin path (at :func:`figure_grids`' steps)."""
    rc, cc = cfg.regression, cfg.classification
    ref, best = regression_references(x, y), optimal_margins(z)
    (reg_grid, cls_grid), (record, margin_grid) = curve_grids(cfg), figure_grids(cfg)
    lr = rc.lr if rc.lr is not None else regression_lr(name, x)
    w, snaps = train(
        torch.zeros(rc.d, dtype=torch.float64),
        partial(regression_grad, x=x, y=y),
        partial(make_optimizer, name, lr=lr, cfg=cfg, regression=True),
        rc.steps,
        record,
    )
    v, path = train(
        torch.zeros(cc.d, dtype=torch.float64),
        partial(classification_grad, z=z),
        partial(make_optimizer, name, lr=cc.lr, cfg=cfg, regression=False),
        cc.steps,
        sorted(set(cls_grid) | set(margin_grid)),
    )

    def l1_margin(u: Tensor) -> float:
        return normalized_margin(u, z, 1) / best["l1"]

    metrics = {
        "reg_l2_ratio": float(w.norm()) / ref["l2"],
        "reg_l1_ratio": float(w.abs().sum()) / ref["l1"],
        "reg_linf_ratio": float(w.abs().max()) / ref["linf"],
        "reg_dist_pinv": float((w - ref["w_l2"]).abs().max()),
        "reg_residual": float((x @ w - y).abs().max()),
        "reg_nnz": count_nonzeros(w, cfg.nnz_rel_tol),
        "reg_l1_curve": [float(snaps[k].abs().sum()) / ref["l1"] for k in reg_grid],
        "cls_l1_margin_ratio": l1_margin(v),
        "cls_linf_margin_ratio": normalized_margin(v, z, math.inf) / best["linf"],
        "cls_nnz": count_nonzeros(v, cfg.nnz_rel_tol),
        "cls_margin_curve": [l1_margin(path[k]) for k in cls_grid],
    }
    return metrics, {
        "trajectories": torch.stack([snaps[k] for k in sorted(snaps)]),
        "final-weights": v,
        "margins": [l1_margin(path[k]) for k in margin_grid],
    }


def theorem_path(name: str, z: Tensor, cfg: ImplicitBiasConfig, grid: list[int]) -> list[float]:
    """Theorem 4.7's object ``name`` on ``z`` at the decaying step ``lr / sqrt(k)``
    (:class:`~descentlab.experiments.implicit_bias.config.TheoremConfig`): its L1 margin over the optimal
    one at the steps ``grid`` (nan throughout when the run overflowed)."""
    th = cfg.theorem
    fit = fit_classification(
        name, z, cfg, th.steps, th.lr, th.alpha, record=grid, lr_at=lambda k: th.lr / math.sqrt(k)
    )
    if fit is None:
        return [math.nan] * len(grid)
    best = optimal_margins(z)["l1"]
    return [normalized_margin(fit[1][k], z, 1) / best for k in grid]


# ---- heterogeneous scales: alpha tuned on the validation seeds, then every evaluation seed -------------


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


def scale_job(
    cfg: ImplicitBiasConfig, run: RunDir, arm: str, alpha: float | None, seed: int
) -> float | tuple[dict[str, float], Tensor | None]:
    """One job of the alpha search (``run.tuning_plan``) for ``arm`` (``method@decades``). On the tuning seed,
    which names the validation set: the mean L1 margin ratio at ``alpha`` over ``scales.validation_seeds``
    (-inf if one overflows). Else the method on one evaluation problem: its :func:`separator_metrics` and
    final weights."""
    sc, (method, kappa) = cfg.scales, (arm.split("@", 1)[0], float(arm.split("@", 1)[1]))
    if seed == sc.validation_seeds[0] and seed not in cfg.seeds:
        ratios = []
        for val_seed in sc.validation_seeds:
            z, _, best, _ = scale_problem(sc.n, sc.d, sc.support, val_seed, kappa)
            w = fit_classification(method, z, cfg, sc.steps, sc.lr, alpha)
            ratios.append(-math.inf if w is None else normalized_margin(w, z, 1) / best["l1"])
        return float(np.mean(ratios))
    z, _, best, large = scale_problem(sc.n, sc.d, sc.support, seed, kappa)
    w = fit_classification(method, z, cfg, sc.steps, sc.lr, alpha)
    metrics = separator_metrics(w, z, best, large, cfg.nnz_rel_tol)
    run.log(decades=kappa, seed=seed, method=method, **metrics)
    return metrics, w


@dataclass
class ScalesRun:
    """The scale study's results, by spread (nan where a run overflowed, -inf for its validation score)."""

    per: dict[float, dict[str, dict[str, list[float]]]]  # method -> metric -> per-seed values
    chosen: dict[float, dict[str, float]]  # tuned method -> its alpha
    scores: dict[float, dict[str, dict[float, float]]]  # tuned method -> alpha -> mean validation ratio
    lp_share: dict[float, list[float]]  # the LP separator's L1 share on the large-scale half, per seed
    weights: dict[str, Tensor]  # the first seed's scales, LP separator and final weights, largest spread


@dataclass
class Outcome:
    """What a run gathered (``report.summarise`` reads it): the main problems' per-seed values (method ->
    metric -> values; ``*_curve``: one recorded path per seed) and the first seed's figure data (file under
    ``arrays/`` -> its arrays); Theorem 4.7's recorded steps and, per object, its L1 margin over the
    optimal one ``[seeds, steps]`` (nan for a run that overflowed; empty when skipped); the scale study
    (None when skipped)."""

    per: dict[str, dict[str, list]]
    figures: dict[str, dict[str, Any]]
    theorem_steps: list[int] = field(default_factory=list)
    theorem: dict[str, np.ndarray] = field(default_factory=dict)
    scales: ScalesRun | None = None
