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

Every method is a real optimizer from :mod:`descentlab.optim` (``vector_fit.py``). The run saves the
per-seed values the claims read (``arrays/claims.npz``, see ``claims.py``) and the figure data
(``figures.py``) under ``arrays/``.
"""

from __future__ import annotations

import math

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
from descentlab.experiments.implicit_bias.claims import CLAIM_ARRAYS
from descentlab.experiments.implicit_bias.config import ImplicitBiasConfig
from descentlab.experiments.implicit_bias.tables import main_tables, scales_results
from descentlab.experiments.implicit_bias.vector_fit import log_grid, make_geometry, regression_lr, train
from descentlab.report.results import Curve, MethodResult, Results
from descentlab.report.stats import column_mean_std, mean_std
from descentlab.train.rundir import RunDir

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


# ---- Theorem 4.7's own objects -------------------------------------------------------------------------


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
        best = optimal_margins(z)["l1"]
        for name in th.methods:
            try:
                _, snaps = train(
                    torch.zeros(cc.d, dtype=torch.float64),
                    lambda v, z=z: classification_grad(v, z),
                    lambda p, name=name: make_optimizer(
                        name, p, th.lr, cfg, regression=False, alpha=th.alpha
                    ),
                    th.steps,
                    grid,
                    lr_at=lambda k: th.lr / math.sqrt(k),
                )
                path = [normalized_margin(snaps[k], z, 1) / best for k in grid]
            except NumericalError:
                path = [math.nan] * len(grid)
            paths[name].append(path)
            run.log(seed=seed, method=f"theorem/{name}", l1_margin_ratio=path[-1])
    return grid, {m: np.asarray(v, dtype=np.float64) for m, v in paths.items()}


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
    # the per-seed values every claim reads (claims.py)
    claim_arrays: dict[str, np.ndarray] = {
        f"{key}__{name}": np.asarray(rec[key], dtype=np.float64)
        for name, rec in per.items()
        for key in ("cls_l1_margin_ratio", "cls_nnz", "reg_l1_ratio")
    }
    th = cfg.theorem
    if th.methods:
        theorem_grid, theorem_paths = run_theorem(cfg, run)
        claim_arrays["theorem_steps"] = np.asarray(theorem_grid, dtype=np.float64)
        for name, path in theorem_paths.items():
            claim_arrays[f"theorem_ratio__{name}"] = path
            mean, std = column_mean_std(path, impl="numpy")
            curve = Curve("step", theorem_grid, "L1 margin / optimal (decaying step)", mean, std)
            methods[f"{name} (theorem)"] = MethodResult(
                metrics={"l1_margin_ratio": mean[-1]}, curves={"theorem_margin": curve}
            )
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
        claim_arrays["scales_decades"] = np.asarray(sc.decades, dtype=np.float64)
        claim_arrays.update(
            {f"scales_l1_margin_ratio__{m}": np.asarray(r, dtype=np.float64) for m, r in ratios.items()}
        )
    run.save_arrays(CLAIM_ARRAYS, **claim_arrays)
    # figure data of the first seed, drawn by figures.py
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
            "theorem": f"Theorem 4.7's objects {list(th.methods)} (mirror step alpha={th.alpha}, clamp 5) on the "
            f"classification problem, decaying step lr_k = {th.lr} / sqrt(k), {th.steps} steps",
            "claims": "the claims engine over per-seed values (arrays/claims.npz), seeds the unit of "
            "replication; primary: L4 steepest descent + mirror reaches >= 0.9 of the optimal L1 margin "
            "(Theorem 4.7 at finite p; p = inf is exploratory)",
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
