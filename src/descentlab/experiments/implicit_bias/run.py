"""implicit-bias: which norm each optimizer geometry implicitly favours, against exact references.

The main problems, Theorem 4.7's own run and the heterogeneous-scale study (``jobs.py``), each from every
evaluation seed; the per-seed values the claims read go to a cell store (``arrays/cells.npz`` +
``arrays/design.json``, ``claims.py``) and the figure data (``report.py``) under ``arrays/``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from torch import Tensor

from descentlab.config import config_to_dict
from descentlab.experiments.implicit_bias.claims import SCALES_RATIO
from descentlab.experiments.implicit_bias.config import ImplicitBiasConfig, design
from descentlab.experiments.implicit_bias.jobs import (
    MainRun,
    ScalesRun,
    curve_grids,
    figure_grids,
    run_main,
    run_scales,
    run_theorem,
)
from descentlab.experiments.implicit_bias.report import (
    NOTES,
    main_methods,
    main_tables,
    scales_results,
    theorem_methods,
)
from descentlab.report.results import Results
from descentlab.study.cells import CellStore
from descentlab.train.rundir import RunDir

CLAIM_METRICS = ("cls_l1_margin_ratio", "cls_nnz", "reg_l1_ratio")  # the main problems' cells (claims.py)


def run(cfg: ImplicitBiasConfig, run: RunDir) -> dict:
    main = run_main(cfg, run)
    methods = main_methods(main.per, *curve_grids(cfg))
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


def cell_store(
    cfg: ImplicitBiasConfig, main: MainRun, theorem: tuple | None, scales: ScalesRun | None
) -> CellStore:
    """The claims' cells (``claims.py``) under the design record of ``cfg``, with the theorem run's steps."""
    record = design(cfg)
    if theorem is not None:
        steps = [float(k) for k in theorem[0]]
        record = replace(record, extra={"theorem": {"steps": steps, "methods": list(theorem[1])}})
    store = CellStore(record)
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
    """The first seed's arrays ``report.figures`` draws (and the scale study's margins and weights)."""
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


def _numpy(arrays: dict[str, Tensor | list[float]]) -> dict[str, np.ndarray]:
    return {name: np.asarray(a.numpy() if isinstance(a, Tensor) else a) for name, a in arrays.items()}
