"""sparse-vit's run: lr (and α) tuned on the validation split at ``tune_sparsity`` on ``tune_seed``, then every
chosen setting at every (sparsity, evaluation seed) with the dense reference, and the paper-like arm on
``paper_like_seeds``; the cells saved to the run's cell store (``config.design``) for the claims engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
import torch

from descentlab.config import config_to_dict
from descentlab.experiments.sparse_vit.config import (
    DENSE,
    NAME,
    PAPER_LIKE,
    PAPER_LIKE_METHODS,
    SparseViTConfig,
    design,
)
from descentlab.experiments.sparse_vit.jobs import DATA, Outcome, describe_model, load_data, train_job
from descentlab.experiments.sparse_vit.report import DENSE_SUFFIX, summarise
from descentlab.report.results import Results
from descentlab.study.cells import CellStore
from descentlab.study.jobs import JobRunner
from descentlab.study.tuning import Round, TuningConfig, lr_alpha_grid, tune_then_replicate
from descentlab.train.recipe import MethodConfig
from descentlab.train.rundir import RunDir

_PRUNED = {"blocks": "block Linears", "all": "patch projection, block Linears and head"}


def run(cfg: SparseViTConfig, run: RunDir) -> dict[str, Any]:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dataset_name = load_data(cfg)
    threads = cfg.threads or torch.get_num_threads()
    pool = {"workers": cfg.workers, "initializer": load_data, "initargs": (cfg,), "threads": threads}
    with JobRunner(train_job, cache_dir=run.path / "jobs", **pool) as jobs:
        # lr and α on the validation split at the tuning sparsity and seed, then every chosen setting at every
        # (sparsity, evaluation seed), with the dense reference
        tuned = tune_then_replicate(
            start_settings(cfg), tuning_plan(cfg), partial(submit_arm, jobs, cfg, run), choose
        )
        paper_futures = {  # with paper_like_seeds: AdamW and HORST at their choices, AC/DC on the block Linears
            k: [submit_job(jobs, cfg, run, k, tuned.chosen[k], cfg.paper_like_sparsity, s, "blocks")
                for s in cfg.paper_like_seeds]
            for k in (PAPER_LIKE_METHODS if cfg.paper_like_seeds else ())
        }  # fmt: skip
        paper_like = {k: [f.result() for f in fs] for k, fs in paper_futures.items()}
    sparse = {k: {s: [r[s] for r in tuned.per_seed[k]] for s in cfg.sparsities} for k in cfg.methods}
    dense = {cfg.dense: [r[DENSE] for r in tuned.per_seed[cfg.dense]]} if cfg.dense else {}
    # the histograms' weights files: the first evaluation seed's runs at the claim sparsity, and dense
    firsts = {k: by_s[cfg.claim_sparsity][0] for k, by_s in sparse.items()}
    firsts |= {k + DENSE_SUFFIX: runs[0] for k, runs in dense.items()}
    weights = {
        k: r["weights"] for k, r in firsts.items() if r["weights"] and (run.path / r["weights"]).is_file()
    }
    grids = {k: tuned.results[k] for k in tuned.picks}  # the tuned methods' validation runs
    outcome = Outcome(sparse, dense, paper_like, grids=grids, picks=tuned.picks, weights=weights)
    cell_store(cfg, outcome).save(run.path, writer=run.writer)
    return Results(
        experiment=NAME,
        config=config_to_dict(cfg),
        protocol=protocol(cfg, dataset_name),
        **summarise(cfg, outcome),
    ).to_dict()


def start_settings(cfg: SparseViTConfig) -> dict[str, MethodConfig]:
    """Every arm's setting before tuning: ``methods`` and the dense reference (untuned when outside
    ``methods``); with ``tune``, a method with one candidate starts at it and trains no tuning run."""
    start = cfg.compared(list(dict.fromkeys([*cfg.methods, *([cfg.dense] if cfg.dense else [])])))
    for k in _own_lr(cfg) if cfg.tune else ():
        if len(grid := candidates(cfg, False, k, start)) == 1:
            start[k] = grid[0]
    return start


def tuning_plan(cfg: SparseViTConfig) -> TuningConfig:
    """The search rounds on the validation split (none without ``tune``): every method with a choice tunes
    lr x α; with ``lr_from``, that method's lr x α first, then every other method's α at the lr it chose
    (there a method with one α still trains its one candidate on the tuning seed, since its lr is known only
    then)."""
    if not cfg.tune:
        return TuningConfig(cfg.seeds, cfg.tune_seed)
    own = tuple(k for k in _own_lr(cfg) if len(candidates(cfg, False, k, {})) > 1)
    rounds = [Round(own, partial(candidates, cfg, False))]
    if cfg.lr_from is not None:
        rounds.append(
            Round(tuple(k for k in cfg.methods if k != cfg.lr_from), partial(candidates, cfg, True))
        )
    return TuningConfig(cfg.seeds, cfg.tune_seed, [r for r in rounds if r.arms])


def _own_lr(cfg: SparseViTConfig) -> list[str]:
    """The methods that tune their own lr: all, or with ``lr_from`` that one."""
    return [k for k in cfg.methods if cfg.lr_from is None or k == cfg.lr_from]


def candidates(cfg: SparseViTConfig, shared_lr: bool, arm: str, chosen: Mapping[str, MethodConfig]) -> list:
    """``arm``'s (lr, α) candidates from its own config: its lrs (``tuning_lrs``), or with ``shared_lr`` the
    lr ``lr_from`` chose, crossed with its ``tune_alpha``."""
    lrs = [chosen[cfg.lr_from].optimizer.lr] if shared_lr else cfg.tuning_lrs(arm)
    return lr_alpha_grid(cfg.compared([arm])[arm], lrs, cfg.tune_alpha.get(arm, []))


def choose(arm: str, results: Sequence[Mapping[str, Any]]) -> int:
    """The candidate with the highest validation accuracy (the first of equals)."""
    return max(range(len(results)), key=lambda i: results[i]["val"])


def submit_job(
    jobs: JobRunner,
    cfg: SparseViTConfig,
    run: RunDir,
    label: str,
    method: MethodConfig,
    sparsity: float | None,
    seed: int,
    prune: str | None = None,
) -> Future:
    """Queue one run of ``method`` at ``sparsity`` (None: dense) from ``seed`` (``prune``: the paper-like
    arm's prunable set) under its tag ``<label>[-<prune>]-s<level>-lr<lr>[-a<α>]-seed<seed>``."""
    acdc = None if sparsity is None else replace(method.acdc, sparsity=sparsity)
    if prune is not None and acdc is not None:
        acdc = replace(acdc, prune=prune)
    lr, alpha = method.optimizer.lr, method.optimizer.alpha
    tag = (
        f"{label}{'' if prune is None else f'-{prune}'}"
        f"-s{'dense' if sparsity is None else f'{100 * sparsity:g}'}-lr{lr:g}"
        f"{'' if alpha is None else f'-a{alpha:g}'}-seed{seed}"
    )
    # the runs the histograms show: the first evaluation seed's
    capture = prune is None and seed == cfg.seeds[0] and sparsity in (None, cfg.claim_sparsity)
    return jobs.submit(tag, cfg, run, replace(method, acdc=acdc), seed, tag, capture)


class Gathered:
    """The jobs of one (method, evaluation seed), one per level, read as one result ``{level: result}``
    (the planner only asks for ``result()``)."""

    def __init__(self, futures: Mapping[Any, Future]) -> None:
        self.futures = dict(futures)

    def result(self) -> dict[Any, Any]:
        return {k: f.result() for k, f in self.futures.items()}


def submit_arm(
    jobs: JobRunner, cfg: SparseViTConfig, run: RunDir, label: str, method: MethodConfig, seed: int
) -> Future | Gathered:
    """The planner's job: on the tuning seed, one validation run at ``tune_sparsity``; on an evaluation seed,
    the method at every sparsity (a compared method) and dense (the reference), gathered per level."""
    if seed == cfg.tune_seed:
        return submit_job(jobs, cfg, run, label, method, cfg.tune_sparsity, seed)
    levels: list[float | None] = list(cfg.sparsities) if label in cfg.methods else []
    runs = {s: submit_job(jobs, cfg, run, label, method, s, seed) for s in levels}
    if label == cfg.dense:
        runs[DENSE] = submit_job(jobs, cfg, run, label, method, None, seed)
    return Gathered(runs)


def cell_store(cfg: SparseViTConfig, outcome: Outcome) -> CellStore:
    """The cells every claim reads (``claims.py`` says what each holds), from the run's jobs."""
    store = CellStore(design(cfg))
    for label, by_s in outcome.sparse.items():
        for p, jobs in by_s.items():
            store.put("correct", label, p, _correct(jobs))
        at = by_s.get(cfg.claim_sparsity, [])
        if at and all(j.get("shape") for j in at):
            for stat in ("frac_below", "kurtosis"):
                store.put(stat, label, cfg.claim_sparsity, np.asarray([j["shape"][stat] for j in at]))
    for condition, arms in ((DENSE, outcome.dense), (PAPER_LIKE, outcome.paper_like)):
        for label, jobs in arms.items():
            store.put("correct", label, condition, _correct(jobs))
    return store


def _correct(jobs: list[dict]) -> np.ndarray:
    return np.asarray([j["test_correct"] for j in jobs], dtype=np.int8)


def protocol(cfg: SparseViTConfig, dataset_name: str) -> dict[str, Any]:
    """The protocol record: the data as loaded, the model, budget, AC/DC, tuning and claims in words."""
    train, opt = cfg.train, cfg.method.optimizer
    accumulated = (
        f" ({train.batch_size} x {train.grad_accum_steps} accumulated)" if train.grad_accum_steps > 1 else ""
    )
    budget = f"{train.max_steps} steps" if train.max_steps else f"{train.epochs} epochs"
    candidates = len(next(iter(cfg.tuning_grids().values())))
    tuning = (
        f"validation split only ({len(DATA['val'])} images), sparsity {cfg.tune_sparsity:g}, tuning seed "
        f"{cfg.tune_seed} (never an evaluation seed; its runs are not reported), {candidates} candidates per "
        f"method{f'; lr from {cfg.lr_from}' if cfg.lr_from else ''}"
    )
    side = f"block Linears at {100 * cfg.paper_like_sparsity:g} %, seeds {list(cfg.paper_like_seeds)}"
    return {
        "dataset": dataset_name,
        "split": "test",
        "n_train": len(DATA["train"]),
        "n_val": len(DATA["val"]),
        "n_eval": len(DATA["test"]),
        "model": describe_model(cfg),
        "budget": f"{budget}, batch {train.step_size}{accumulated}, wd {opt.weight_decay}, lr schedule {opt.schedule}",
        "acdc": f"global magnitude over the {_PRUNED[cfg.acdc.prune]}; "
        + (str(cfg.acdc) if cfg.acdc.warmup else "reference"),
        "tuning": tuning if cfg.tune else "fixed lr/alpha (no tuning)",
        "claims": f"seed-level intervals over (seeds x test images); weight-shape threshold {cfg.small_weight:g} at "
        f"{100 * cfg.claim_sparsity:g} %" + (f"; paper-like arm: {side}" if cfg.paper_like_seeds else ""),
    }
