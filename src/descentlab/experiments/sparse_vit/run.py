"""sparse-vit's run: lr (and α) tuned on the validation split at ``tune_sparsity`` on ``tune_seed``, then every
chosen setting at every (sparsity, evaluation seed) with the dense reference, and the paper-like arm on
``paper_like_seeds`` (the protocol is the config's docstring). Test accuracy is measured once per run with
the final, exactly sparse weights; the sparsity reported is read back from each saved safetensors
checkpoint. The run saves the claims' cells to its cell store (``config.design``); the claims engine
judges them (``claims.py``).
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
from descentlab.experiments.sparse_vit.jobs import DATA, describe_model, load_data, train_job
from descentlab.experiments.sparse_vit.report import DENSE_SUFFIX, method_blocks, summarise
from descentlab.report.results import Results
from descentlab.study.cells import CellStore
from descentlab.study.jobs import JobRunner
from descentlab.study.tuning import Round, TuningConfig, lr_alpha_grid, tune_then_replicate
from descentlab.train.recipe import MethodConfig
from descentlab.train.rundir import RunDir

_PRUNED = {"blocks": "block Linears", "all": "patch projection, block Linears and head"}


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
    """One future of ``{key: result}`` that completes once every one of ``futures`` has (or the first fails)."""

    def __init__(self, futures: Mapping[Any, Future]) -> None:
        self.future: Future = Future()
        self.futures, self.left = dict(futures), set(futures)
        for k, f in self.futures.items():
            f.add_done_callback(partial(self.finished, k))
        if not self.futures:
            self.future.set_result({})

    def finished(self, key: Any, future: Future) -> None:
        if self.future.done():
            return
        if (error := future.exception()) is not None:
            self.future.set_exception(error)
            return
        self.left.discard(key)
        if not self.left:
            self.future.set_result({k: f.result() for k, f in self.futures.items()})


def submit_arm(
    jobs: JobRunner, cfg: SparseViTConfig, run: RunDir, label: str, method: MethodConfig, seed: int
) -> Future:
    """The planner's job: on the tuning seed, one validation run at ``tune_sparsity``; on an evaluation seed,
    the method at every sparsity (a compared method) and dense (the reference), gathered per level."""
    if seed == cfg.tune_seed:
        return submit_job(jobs, cfg, run, label, method, cfg.tune_sparsity, seed)
    levels: list[float | None] = list(cfg.sparsities) if label in cfg.methods else []
    runs = {s: submit_job(jobs, cfg, run, label, method, s, seed) for s in levels}
    if label == cfg.dense:
        runs[DENSE] = submit_job(jobs, cfg, run, label, method, None, seed)
    return Gathered(runs).future


def candidates(cfg: SparseViTConfig, shared_lr: bool, arm: str, chosen: Mapping[str, MethodConfig]) -> list:
    """``arm``'s (lr, α) candidates from its own config: its lrs (``tuning_lrs``), or with ``shared_lr`` the
    lr ``lr_from`` chose, crossed with its ``tune_alpha``."""
    lrs = [chosen[cfg.lr_from].optimizer.lr] if shared_lr else cfg.tuning_lrs(arm)
    return lr_alpha_grid(cfg.compared([arm])[arm], lrs, cfg.tune_alpha.get(arm, []))


def tuning_plan(cfg: SparseViTConfig) -> tuple[dict[str, MethodConfig], TuningConfig]:
    """The start settings and the search rounds on the validation split (none without ``tune``).

    A method with one candidate has nothing to choose: it starts at that candidate and runs no tuning run.
    With ``lr_from``, that method's lr x α first, then every other method's α at the lr it chose (there a
    method with one α still trains its one candidate on the tuning seed, since its lr is known only then).
    """
    start = cfg.compared()
    if cfg.dense is not None and cfg.dense not in start:  # a reference outside ``methods``: untuned
        start |= cfg.compared([cfg.dense])
    if not cfg.tune:
        return start, TuningConfig(cfg.seeds, cfg.tune_seed)
    own = [k for k in cfg.methods if cfg.lr_from is None or k == cfg.lr_from]
    for k in own:
        if len(grid := candidates(cfg, False, k, start)) == 1:
            start[k] = grid[0]
    rounds = [
        Round(
            tuple(k for k in own if len(candidates(cfg, False, k, start)) > 1),
            partial(candidates, cfg, False),
        )
    ]
    if cfg.lr_from is not None:
        rounds.append(
            Round(tuple(k for k in cfg.methods if k != cfg.lr_from), partial(candidates, cfg, True))
        )
    return start, TuningConfig(cfg.seeds, cfg.tune_seed, [r for r in rounds if r.arms])


def best_validation(arm: str, results: Sequence[Mapping[str, Any]]) -> int:
    """The candidate with the highest validation accuracy (the first of equals)."""
    return max(range(len(results)), key=lambda i: results[i]["val"])


def run(cfg: SparseViTConfig, run: RunDir) -> dict[str, Any]:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dataset_name = load_data(cfg)
    threads = cfg.threads or torch.get_num_threads()
    pool = {"workers": cfg.workers, "initializer": load_data, "initargs": (cfg,), "threads": threads}
    start, plan = tuning_plan(cfg)
    with JobRunner(train_job, cache_dir=run.path / "jobs", **pool) as jobs:
        # lr and α on the validation split at the tuning sparsity and seed, then every chosen setting at every
        # (sparsity, evaluation seed), with the dense reference
        tuned = tune_then_replicate(start, plan, partial(submit_arm, jobs, cfg, run), best_validation)
        paper_futures = {  # with paper_like_seeds: AdamW and HORST at their choices, AC/DC on the block Linears
            k: [submit_job(jobs, cfg, run, k, tuned.chosen[k], cfg.paper_like_sparsity, s, "blocks")
                for s in cfg.paper_like_seeds]
            for k in (PAPER_LIKE_METHODS if cfg.paper_like_seeds else ())
        }  # fmt: skip
        paper = {k: [f.result() for f in fs] for k, fs in paper_futures.items()}
    sparse = {k: {s: [r[s] for r in tuned.per_seed[k]] for s in cfg.sparsities} for k in cfg.methods}
    dense = {cfg.dense: [r[DENSE] for r in tuned.per_seed[cfg.dense]]} if cfg.dense else {}
    save_claim_arrays(cfg, run, sparse, dense, paper)
    grids = {k: tuned.results[k] for k in tuned.picks}  # the tuned methods' validation runs
    return _results(cfg, run, dataset_name, sparse, dense, grids, tuned.picks, paper)


def save_claim_arrays(
    cfg: SparseViTConfig,
    run: RunDir,
    sparse: dict[str, dict[float, list[dict]]],
    dense: dict[str, list[dict]],
    paper: dict[str, list[dict]],
) -> None:
    """The cells every claim reads (``claims.py``), as the run's cell store: per-image correctness per
    (method, sparsity), of the dense reference and of the paper-like arm, ``[seeds, images]``; the
    per-tensor weight shape at the claim sparsity, ``[seeds, tensors]``."""
    store = CellStore(design(cfg))

    def correct(jobs: list[dict]) -> np.ndarray:
        return np.asarray([j["test_correct"] for j in jobs], dtype=np.int8)

    for label, by_s in sparse.items():
        for p, jobs in by_s.items():
            store.put("correct", label, p, correct(jobs))
        at = by_s.get(cfg.claim_sparsity, [])
        if at and all(j.get("shape") for j in at):
            for stat in ("frac_below", "kurtosis"):
                store.put(stat, label, cfg.claim_sparsity, np.asarray([j["shape"][stat] for j in at]))
    for label, jobs in dense.items():
        store.put("correct", label, DENSE, correct(jobs))
    for label, jobs in paper.items():
        store.put("correct", label, PAPER_LIKE, correct(jobs))
    store.save(run.path, writer=run.writer)


def _results(
    cfg: SparseViTConfig,
    run: RunDir,
    dataset_name: str,
    sparse: dict[str, dict[float, list[dict]]],
    dense: dict[str, list[dict]],
    grids: dict[str, list[dict]],
    picks: dict[str, int],
    paper: dict[str, list[dict]],
) -> dict[str, Any]:
    """The results.json body: protocol, methods, tables, selection."""
    at = cfg.claim_sparsity
    files = {label: by_s[at][0]["weights"] for label, by_s in sparse.items()}
    files |= {label + DENSE_SUFFIX: runs[0]["weights"] for label, runs in dense.items()}
    files = {label: path for label, path in files.items() if path and (run.path / path).is_file()}
    body = summarise(cfg, sparse, dense, grids, picks, paper)
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
    protocol = {
        "dataset": dataset_name,
        "split": "test",
        "n_train": len(DATA["train"]),
        "n_val": len(DATA["val"]),
        "n_eval": len(DATA["test"]),
        "seeds": list(cfg.seeds),
        "model": describe_model(cfg),
        "budget": f"{budget}, batch {train.step_size}{accumulated}, wd {opt.weight_decay}, lr schedule {opt.schedule}",
        "acdc": f"global magnitude over the {_PRUNED[cfg.acdc.prune]}; "
        + (str(cfg.acdc) if cfg.acdc.warmup else "reference"),
        "tuning": tuning if cfg.tune else "fixed lr/alpha (no tuning)",
        "claims": f"seed-level intervals over (seeds x test images); weight-shape threshold {cfg.small_weight:g} at "
        f"{100 * at:g} %" + (f"; paper-like arm: {side}" if cfg.paper_like_seeds else ""),
    }
    histograms = {"bins": cfg.histogram_bins, "sparsity": at, "seed": cfg.seeds[0], "files": files}
    return Results(
        experiment=NAME,
        config=config_to_dict(cfg),
        protocol=protocol,
        methods=method_blocks(sparse, dense),
        tables=body["tables"],
        notes=body["notes"],
        extra={"histograms": histograms, "selection": body["selection"]},
    ).to_dict()
