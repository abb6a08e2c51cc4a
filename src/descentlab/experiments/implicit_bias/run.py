"""implicit-bias: which norm each optimizer geometry implicitly favours, against exact references.

The main problems, Theorem 4.7's own run and the heterogeneous-scale study (``jobs.py``) on every evaluation
seed; the claims' cells (``claims.py``) and the figure data (``report.py``) are saved under ``arrays/``.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
from torch import Tensor

from descentlab.config import config_to_dict
from descentlab.data.synthetic import l1_max_margin_separator, l1_share, make_classification, make_regression
from descentlab.experiments.implicit_bias.claims import SCALES_RATIO
from descentlab.experiments.implicit_bias.config import ImplicitBiasConfig, design
from descentlab.experiments.implicit_bias.jobs import (
    Outcome,
    ScalesRun,
    figure_grids,
    log_grid,
    scale_arm,
    scale_job,
    scale_problem,
    theorem_path,
    train_job,
)
from descentlab.experiments.implicit_bias.report import summarise
from descentlab.report.results import Results
from descentlab.study.cells import CellStore
from descentlab.study.tuning import Round, TuningConfig, tune_then_replicate
from descentlab.train.rundir import RunDir

CLAIM_METRICS = ("cls_l1_margin_ratio", "cls_nnz", "reg_l1_ratio")  # the main problems' cells (claims.py)
TUNED_ON_SCALES = ("horst", "ham")  # the methods whose alpha the scale study chooses per spread


def run(cfg: ImplicitBiasConfig, run: RunDir) -> dict:
    outcome = seed_runs(cfg, run)
    if cfg.scales.methods:
        outcome.scales = scales_run(cfg, run)
    cell_store(cfg, outcome).save(run.path, writer=run.writer)
    save_figure_data(cfg, run, outcome)
    return Results(
        experiment="implicit-bias",
        config=config_to_dict(cfg),
        protocol=protocol(cfg),
        **summarise(cfg, outcome),
    ).to_dict()


def seed_runs(cfg: ImplicitBiasConfig, run: RunDir) -> Outcome:
    """On every evaluation seed's draw: every method on both main problems (:func:`~.jobs.train_job`, the
    first seed's figure data kept) and Theorem 4.7's objects (:func:`~.jobs.theorem_path`)."""
    rc, cc, th = cfg.regression, cfg.classification, cfg.theorem
    record, margin_grid = figure_grids(cfg)
    figures = {"trajectories": {"steps": record}, "margins": {"steps": margin_grid}, "final-weights": {}}
    grid = log_grid(th.steps, th.points) if th.methods else []
    outcome = Outcome({m: {} for m in cfg.methods}, figures, grid)
    paths: dict[str, list[list[float]]] = {m: [] for m in th.methods}
    for seed in cfg.seeds:
        x, y = make_regression(rc.n, rc.d, rc.support, seed)
        z = make_classification(cc.n, cc.d, cc.support, seed)
        for name in cfg.methods:
            metrics, figure = train_job(name, cfg, x, y, z)
            for stem, data in figure.items() if seed == cfg.seeds[0] else ():
                outcome.figures[stem][name] = data
            for key, val in metrics.items():
                outcome.per[name].setdefault(key, []).append(val)
            run.log(seed=seed, method=name, **{k: v for k, v in metrics.items() if not k.endswith("curve")})
        for name in th.methods:
            paths[name].append(theorem_path(name, z, cfg, grid))
            run.log(seed=seed, method=f"theorem/{name}", l1_margin_ratio=paths[name][-1][-1])
    outcome.theorem = {m: np.asarray(v, dtype=np.float64) for m, v in paths.items()}
    return outcome


# ---- heterogeneous scales: alpha tuned on the validation seeds, then every evaluation seed -------------


def candidates(cfg: ImplicitBiasConfig, arm: str, chosen: dict) -> list[float]:
    """The alphas a tuned arm tries: its method's grid."""
    return list(cfg.scales.horst_alphas if arm.startswith("horst@") else cfg.scales.ham_alphas)


def tuning_plan(cfg: ImplicitBiasConfig) -> TuningConfig:
    """One round over every tuned (method, spread) arm; HORST and HAM compared at equal budgets. The tuning
    seed is the first validation seed: it names the validation set (:func:`~.jobs.scale_job`)."""
    sc = cfg.scales
    tuned = [m for m in TUNED_ON_SCALES if m in sc.methods]
    arms = tuple(scale_arm(m, k) for k in sc.decades for m in tuned)
    budgets = {arm: len(candidates(cfg, arm, {})) for arm in arms} if len(tuned) > 1 else {}
    rounds = [Round(arms, partial(candidates, cfg))] if arms else []
    return TuningConfig(cfg.seeds, sc.validation_seeds[0], rounds, budgets)


def choose(arm: str, results: Sequence[float]) -> int:
    """The first alpha with the highest mean validation ratio."""
    return max(range(len(results)), key=results.__getitem__)


def submit_job(cfg: ImplicitBiasConfig, run: RunDir, arm: str, alpha: float | None, seed: int) -> Future:
    """One job of the plan (:func:`~.jobs.scale_job`), run now."""
    done: Future = Future()
    done.set_result(scale_job(cfg, run, arm, alpha, seed))
    return done


def scales_run(cfg: ImplicitBiasConfig, run: RunDir) -> ScalesRun:
    """Alpha per spread on the validation seeds, then every method on every (spread, evaluation seed)."""
    sc = cfg.scales
    start = {scale_arm(m, k): None for k in sc.decades for m in sc.methods}
    tuned = tune_then_replicate(start, tuning_plan(cfg), partial(submit_job, cfg, run), choose)
    out = ScalesRun({}, {}, {}, {}, {})
    separators: dict[float, list[Tensor]] = {}  # the LP's L1 separator per spread and evaluation seed
    for kappa in sc.decades:
        runs = {m: tuned.per_seed[scale_arm(m, kappa)] for m in sc.methods}  # (metrics, weights) per seed
        out.per[kappa] = {m: {key: [r[key] for r, _ in rs] for key in rs[0][0]} for m, rs in runs.items()}
        tuned_arms = {m: arm for m in sc.methods if (arm := scale_arm(m, kappa)) in tuned.picks}
        out.chosen[kappa] = {m: tuned.chosen[arm] for m, arm in tuned_arms.items()}
        out.scores[kappa] = {
            m: dict(zip(tuned.tried[arm], tuned.results[arm], strict=True)) for m, arm in tuned_arms.items()
        }
        problems = [scale_problem(sc.n, sc.d, sc.support, seed, kappa) for seed in cfg.seeds]
        separators[kappa] = [l1_max_margin_separator(z) for z, _, _, _ in problems]
        out.lp_share[kappa] = [
            l1_share(w, large) for w, (_, _, _, large) in zip(separators[kappa], problems, strict=True)
        ]
    # the figure's data: the first seed's column scales, LP separator and final weights at the largest spread
    _, s, _, _ = scale_problem(sc.n, sc.d, sc.support, cfg.seeds[0], kappa := max(sc.decades))
    out.weights = {"scales": s, "LP optimum (L1)": separators[kappa][0]}
    for method in sc.methods:
        if (w := tuned.per_seed[scale_arm(method, kappa)][0][1]) is not None:
            out.weights[method] = w
    return out


# ---- what the run saves -------------------------------------------------------------------------------


def cell_store(cfg: ImplicitBiasConfig, outcome: Outcome) -> CellStore:
    """The claims' cells (``claims.py``) under the design record of ``cfg``, with the theorem run's steps."""
    record = design(cfg)
    if outcome.theorem:
        steps = [float(k) for k in outcome.theorem_steps]
        record = replace(record, extra={"theorem": {"steps": steps, "methods": list(outcome.theorem)}})
    store = CellStore(record)
    for name, rec in outcome.per.items():
        for metric in CLAIM_METRICS:
            store.put(metric, name, None, np.asarray(rec[metric], dtype=np.float64))
    for name, path in outcome.theorem.items():
        store.put("theorem_ratio", name, None, path)
    for kappa, methods in (outcome.scales.per if outcome.scales is not None else {}).items():
        for name, rec in methods.items():
            store.put(SCALES_RATIO, name, kappa, np.asarray(rec["l1_margin_ratio"], dtype=np.float64))
    return store


def save_figure_data(cfg: ImplicitBiasConfig, run: RunDir, outcome: Outcome) -> None:
    """The first seed's arrays ``report.figures`` draws (and the scale study's margins and weights)."""
    figures = dict(outcome.figures)
    if (scales := outcome.scales) is not None:
        sc = cfg.scales
        ratios = {m: [scales.per[k][m]["l1_margin_ratio"] for k in sc.decades] for m in sc.methods}
        figures |= {"scales-margins": {"decades": sc.decades, **ratios}, "scales-weights": scales.weights}
    for stem, arrays in figures.items():
        run.save_arrays(f"arrays/{stem}.npz", **arrays)


def protocol(cfg: ImplicitBiasConfig) -> dict[str, Any]:
    """What the config does not say; the sizes, steps, seeds and strengths are in ``config``."""
    return {
        "problems": "float64, w0 = 0: least squares with a sparse planted solution (squared loss; 'sign' = "
        "L_inf steepest descent scaled by ||g||_1); separable classification with the labels of a sparse "
        "teacher (exponential loss, gradient of its log)",
        "references": "pinv (min L2); scipy linprog/HiGHS (min L1 / L_inf interpolants, optimal margins)",
        "nnz": f"|w_i| > {cfg.nnz_rel_tol} max|w|",
        "scales": "the classification problem with column j scaled by 10^(kappa (r_j - 1/2)), kappa in "
        "scales.decades; HORST and HAM alpha chosen per spread on scales.validation_seeds, controls at "
        "horst_alpha",
        "theorem": "theorem.methods composed with the mirror step (clamp 5) at the decaying step "
        "lr_k = theorem.lr / sqrt(k)",
        "claims": "the claims engine over per-seed values (arrays/cells.npz), seeds the unit of "
        "replication; primary: L4 steepest descent + mirror reaches >= 0.9 of the optimal L1 margin "
        "(Theorem 4.7 at finite p; p = inf is exploratory)",
    }
