r"""implicit-bias: which norm each optimizer geometry implicitly favours (METHODS.md section 2.2).

Three synthetic float64 problems with exact references (:mod:`descentlab.data.synthetic`):

* under-determined least squares from w = 0 (n < d): GD should reach the pseudo-inverse (min-L2) solution,
  L_inf steepest descent ("sign", dual-norm scaled so it settles) a near-min-L_inf one, greedy coordinate
  descent and hyperbolic mirror descent near-min-L1 ones; minimum L1 / L_inf norms come from ``linprog``;
* linearly separable classification with the exponential loss: the normalised margins
  min_i y_i <x_i, w> / ||w||_p against the optimal L1 and L_inf margins (``linprog``), and the number of
  non-zeros. HORST (mirror after Adam) should approach the optimal L1 margin (Theorem 4.7); Adam sits near
  the L_inf one;
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
seeds before the evaluation seeds run. At 0 decades the exponents differ only through |gamma_j|. Controls
of the mechanism: normalised GD + mirror (keeps relative gradient sizes), sign + mirror (does not).
Claims and statistics: :mod:`descentlab.report.implicit_bias_claims`.

Every method is a real optimizer from :mod:`descentlab.optim` (:mod:`descentlab.train.vector_fit`); the
figures are drawn by :mod:`descentlab.report.implicit_bias` from the arrays this run saves under ``arrays/``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
from descentlab.errors import ConfigError, NumericalError
from descentlab.report.implicit_bias_claims import claims_table, evaluate_claims, main_tables, scales_results
from descentlab.report.results import Curve, MethodResult, Results
from descentlab.report.stats import column_mean_std, mean_std
from descentlab.train.rundir import RunDir
from descentlab.train.vector_fit import GEOMETRIES, log_grid, make_geometry, regression_lr, train

METHODS = GEOMETRIES


@dataclass
class ProblemConfig:
    """One synthetic problem: ``n`` examples in ``d`` dimensions, a ``support``-sparse planted solution.

    ``lr`` is every method's step size; None (regression only) gives each method its stable step from the
    Hessian (:func:`regression_lr`).
    """

    n: int
    d: int
    support: int
    steps: int
    lr: float | None = None


SCALE_METHODS = ("adam", "horst", "ham", "ngd+mirror_after", "sign+mirror_after")


@dataclass
class ScalesConfig:
    """The heterogeneous-scale classification (module docs): one problem per spread in ``decades``.

    ``horst_alphas`` / ``ham_alphas``: the grids each method's alpha is chosen from, by the mean L1 margin
    ratio on ``validation_seeds`` (disjoint from the evaluation seeds), per spread; a run that overflows
    scores -inf. The controls ``ngd+mirror_after`` and ``sign+mirror_after`` keep ``horst_alpha``.
    ``methods = []`` skips the study.
    """

    n: int = 40
    d: int = 100
    support: int = 3
    steps: int = 10000
    lr: float = 1e-2
    decades: list[float] = field(default_factory=lambda: [0.0, 1.0, 2.0, 3.0, 4.0])
    methods: list[str] = field(default_factory=lambda: list(SCALE_METHODS))
    horst_alphas: list[float] = field(default_factory=lambda: [0.01, 0.03, 0.1, 0.3, 1.0, 3.0])
    ham_alphas: list[float] = field(default_factory=lambda: [0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0])
    validation_seeds: list[int] = field(default_factory=lambda: [100, 101])


@dataclass
class ClaimsConfig:
    """``l1_threshold``: the fraction tau of the optimal L1 margin that counts as "approaches it" (fixed
    before the run; METHODS.md measured 0.94-0.96 for HORST); ``n_boot``: bootstrap replicates."""

    l1_threshold: float = 0.9
    n_boot: int = 4000


@dataclass
class ImplicitBiasConfig:
    """Top-level keys; ``seeds`` are the evaluation seeds of every problem (one problem draw per seed)."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    regression: ProblemConfig = field(
        default_factory=lambda: ProblemConfig(n=20, d=60, support=4, steps=10000)
    )
    classification: ProblemConfig = field(
        default_factory=lambda: ProblemConfig(n=40, d=100, support=3, steps=5000, lr=1e-2)
    )
    horst_alpha: float = 1.0
    # HAM's own default (200) assumes tiny per-weight gradients; here |grad| ~ 1 and lr * 200 * |g| hits the
    # clamp every step and overflows, so HAM gets HORST's alpha: raw gradient vs Adam update, same strength.
    ham_alpha: float = 1.0
    gamma: float = 1e-6  # width of the hyperbolic potential (mirror_before, dual)
    nnz_rel_tol: float = 1e-3  # |w_i| > tol * max|w| counts as a non-zero
    curve_points: int = 8
    scales: ScalesConfig = field(default_factory=ScalesConfig)
    claims: ClaimsConfig = field(default_factory=ClaimsConfig)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.methods) - set(METHODS))
        if unknown:
            raise ConfigError(f"unknown methods {unknown}; choose from {list(METHODS)}")
        if self.regression.n >= self.regression.d or self.classification.n >= self.classification.d:
            raise ConfigError("implicit bias needs n < d (under-determined / many separators)")
        if not self.seeds:
            raise ConfigError("seeds must list at least one seed")
        sc = self.scales
        if sorted(set(sc.methods) - set(SCALE_METHODS)):
            raise ConfigError(f"scales.methods: choose from {list(SCALE_METHODS)}, got {sc.methods}")
        if sc.methods and (sc.n >= sc.d or not sc.decades or not sc.validation_seeds):
            raise ConfigError("scales needs n < d, at least one spread in decades and one validation seed")
        if set(sc.validation_seeds) & set(self.seeds):
            raise ConfigError("scales.validation_seeds must be disjoint from the evaluation seeds")
        if not sc.horst_alphas or not sc.ham_alphas:
            raise ConfigError("scales.horst_alphas and scales.ham_alphas must list at least one alpha")
        if self.classification.lr is None:
            raise ConfigError("classification.lr must be set (e.g. 1e-2): no Hessian fixes its step size")


CONFIG = ImplicitBiasConfig  # the nested ProblemConfig / ScalesConfig / ClaimsConfig are parts of it

PRESETS = {
    "quick": {"seeds": [0], "regression.steps": 8000, "classification.steps": 5000, "scales.steps": 5000,
              "scales.decades": [0.0, 2.0, 4.0], "scales.validation_seeds": [100]},
    "full": {"seeds": [0, 1, 2, 3, 4], "regression.steps": 30000, "classification.steps": 20000},
}  # fmt: skip


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


# ---- heterogeneous scales -----------------------------------------------------------------------------


def fit_classification(
    name: str, z: Tensor, cfg: ImplicitBiasConfig, steps: int, lr: float, alpha: float | None
) -> Tensor | None:
    """``name`` trained on the rows ``z`` from w = 0 for ``steps``; None when an iterate overflows."""
    try:
        w, _ = train(
            torch.zeros(z.shape[1], dtype=torch.float64),
            lambda v: classification_grad(v, z),
            lambda p: make_optimizer(name, p, lr, cfg, regression=False, alpha=alpha),
            steps,
            [],
        )
    except NumericalError:
        return None
    return w


def choose_alphas(cfg: ImplicitBiasConfig) -> tuple[dict[float, dict[str, float]], dict]:
    """Per spread, HORST's and HAM's alpha with the highest mean L1 margin ratio on the validation seeds.

    Returns:
        ``(chosen, scores)``: spread -> method -> alpha, and spread -> method -> alpha -> mean ratio
        (-inf when a validation run overflowed).
    """
    sc = cfg.scales
    chosen: dict[float, dict[str, float]] = {}
    scores: dict[float, dict[str, dict[float, float]]] = {}
    for kappa in sc.decades:
        problems = [make_heterogeneous_classification(sc.n, sc.d, sc.support, s, kappa)[0]
                    for s in sc.validation_seeds]  # fmt: skip
        best = [optimal_margins(z)["l1"] for z in problems]
        chosen[kappa], scores[kappa] = {}, {}
        for name, grid in (("horst", sc.horst_alphas), ("ham", sc.ham_alphas)):
            if name not in sc.methods:
                continue
            grid_scores = {}
            for alpha in grid:
                ws = [fit_classification(name, z, cfg, sc.steps, sc.lr, alpha) for z in problems]
                ratios = [-math.inf if w is None else normalized_margin(w, z, 1) / b
                          for w, z, b in zip(ws, problems, best, strict=True)]  # fmt: skip
                grid_scores[alpha] = float(np.mean(ratios))
            scores[kappa][name] = grid_scores
            chosen[kappa][name] = max(grid_scores, key=lambda a, g=grid_scores: g[a])
    return chosen, scores


def run_scales(cfg: ImplicitBiasConfig, run: RunDir, chosen: dict[float, dict[str, float]]) -> tuple:
    """Every scale method on every (spread, evaluation seed); a run that overflows records nan.

    Returns:
        ``(per, lp_share, weights)``: spread -> method -> metric -> per-seed values; spread -> the LP
        separator's L1 share on the large-scale half per seed; the first seed's final weights (and scales,
        LP separator) at the largest spread.
    """
    sc = cfg.scales
    per = {k: {m: {} for m in sc.methods} for k in sc.decades}
    lp_share: dict[float, list[float]] = {k: [] for k in sc.decades}
    weights: dict[str, Tensor] = {}
    for kappa in sc.decades:
        for seed in cfg.seeds:
            z, s = make_heterogeneous_classification(sc.n, sc.d, sc.support, seed, kappa)
            best, large, lp = optimal_margins(z), upper_half(sc.d, seed), l1_max_margin_separator(z)
            lp_share[kappa].append(l1_share(lp, large))
            keep = kappa == max(sc.decades) and seed == cfg.seeds[0]
            if keep:
                weights.update({"scales": s, "LP optimum (L1)": lp})
            for name in sc.methods:
                w = fit_classification(name, z, cfg, sc.steps, sc.lr, chosen[kappa].get(name))
                if keep and w is not None:
                    weights[name] = w
                rec = per[kappa][name]
                for key, val in separator_metrics(w, z, best, large, cfg.nnz_rel_tol).items():
                    rec.setdefault(key, []).append(val)
                run.log(decades=kappa, seed=seed, method=name, **{k: v[-1] for k, v in rec.items()})
    return per, lp_share, weights


# ---- the experiment -----------------------------------------------------------------------------------


def run(cfg: ImplicitBiasConfig, run: RunDir) -> dict:
    rc, cc = cfg.regression, cfg.classification
    reg_grid, cls_grid = log_grid(rc.steps, cfg.curve_points), log_grid(cc.steps, cfg.curve_points)
    traj_grid, margin_grid = log_grid(rc.steps, 60), log_grid(cc.steps, 60)
    per: dict[str, dict[str, list]] = {m: {} for m in cfg.methods}
    trajectories: dict[str, Tensor] = {}  # first seed: [recorded steps, d] regression iterates
    final_cls: dict[str, Tensor] = {}
    margin_paths: dict[str, list[float]] = {}

    for seed in cfg.seeds:
        x, y = make_regression(rc.n, rc.d, rc.support, seed)
        ref = regression_references(x, y)
        z = make_classification(cc.n, cc.d, cc.support, seed)
        opt_margin = optimal_margins(z)
        for name in cfg.methods:
            rec = per[name]
            # regression from w = 0
            lr = rc.lr if rc.lr is not None else regression_lr(name, x)
            w, snaps = train(
                torch.zeros(rc.d, dtype=torch.float64),
                lambda v, x=x, y=y: regression_grad(v, x, y),
                lambda p, name=name, lr=lr: make_optimizer(name, p, lr, cfg, regression=True),
                rc.steps,
                sorted(set(reg_grid) | set(traj_grid)),
            )
            if seed == cfg.seeds[0]:
                trajectories[name] = torch.stack([snaps[k] for k in sorted(snaps)])
            for key, val in (
                ("reg_l2_ratio", float(w.norm()) / ref["l2"]),
                ("reg_l1_ratio", float(w.abs().sum()) / ref["l1"]),
                ("reg_linf_ratio", float(w.abs().max()) / ref["linf"]),
                ("reg_dist_pinv", float((w - ref["w_l2"]).abs().max())),
                ("reg_residual", float((x @ w - y).abs().max())),
                ("reg_nnz", count_nonzeros(w, cfg.nnz_rel_tol)),
            ):
                rec.setdefault(key, []).append(val)
            rec.setdefault("reg_l1_curve", []).append(
                [float(snaps[k].abs().sum()) / ref["l1"] for k in reg_grid]
            )
            # classification from w = 0
            w, snaps = train(
                torch.zeros(cc.d, dtype=torch.float64),
                lambda v, z=z: classification_grad(v, z),
                lambda p, name=name: make_optimizer(name, p, cc.lr, cfg, regression=False),
                cc.steps,
                sorted(set(cls_grid) | set(margin_grid)),
            )
            if seed == cfg.seeds[0]:
                final_cls[name] = w
                margin_paths[name] = [
                    normalized_margin(snaps[k], z, 1) / opt_margin["l1"] for k in margin_grid
                ]
            for key, val in (
                ("cls_l1_margin_ratio", normalized_margin(w, z, 1) / opt_margin["l1"]),
                ("cls_linf_margin_ratio", normalized_margin(w, z, math.inf) / opt_margin["linf"]),
                ("cls_nnz", count_nonzeros(w, cfg.nnz_rel_tol)),
            ):
                rec.setdefault(key, []).append(val)
            rec.setdefault("cls_margin_curve", []).append(
                [normalized_margin(snaps[k], z, 1) / opt_margin["l1"] for k in cls_grid]
            )
            run.log(seed=seed, method=name, **{k: v[-1] for k, v in rec.items() if not k.endswith("curve")})

    methods = {}
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

    tables = main_tables(per, cfg.methods)
    sc, scale_per, extra = cfg.scales, {}, {}
    if sc.methods:
        chosen, scores = choose_alphas(cfg)
        scale_per, lp_share, weights = run_scales(cfg, run, chosen)
        scale_tables, scale_methods, extra["scales"] = scales_results(scale_per, chosen, scores, lp_share)
        tables += scale_tables
        methods.update(scale_methods)
        ratios = {m: [scale_per[k][m]["l1_margin_ratio"] for k in sc.decades] for m in sc.methods}
        run.save_arrays("arrays/scales-margins.npz", decades=np.asarray(sc.decades), **_numpy(ratios))
        run.save_arrays("arrays/scales-weights.npz", **_numpy(weights))
    claims = evaluate_claims(per, scale_per, tau=cfg.claims.l1_threshold, n_boot=cfg.claims.n_boot)
    if claims:
        tables.append(claims_table(claims))
    extra["claims"] = claims
    # figure data of the first seed, drawn by report/implicit_bias.py
    record = sorted(set(reg_grid) | set(traj_grid))
    run.save_arrays("arrays/trajectories.npz", steps=np.asarray(record), **_numpy(trajectories))
    run.save_arrays("arrays/margins.npz", steps=np.asarray(margin_grid), **_numpy(margin_paths))
    run.save_arrays("arrays/final-weights.npz", **_numpy(final_cls))
    return Results(
        experiment="implicit-bias",
        config=config_to_dict(cfg),
        protocol={
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
            "claims": f"bootstrap CI over the evaluation seeds ({cfg.claims.n_boot} replicates), "
            f"tau = {cfg.claims.l1_threshold}; report.implicit_bias_claims",
        },
        methods=methods,
        tables=tables,
        notes=[
            "Every number is a mean over seeds (± std across seeds when there is more than one seed).",
            "Heterogeneous scales: 'L1 share' is the fraction of ||w||_1 on the d/2 columns of largest scale "
            "(the same columns at every spread); the LP row is the linprog L1-optimal separator's.",
        ],
        extra=extra,
    ).to_dict()


def _numpy(arrays: dict[str, Tensor | list[float]]) -> dict[str, np.ndarray]:
    return {name: np.asarray(a.numpy() if isinstance(a, Tensor) else a) for name, a in arrays.items()}
