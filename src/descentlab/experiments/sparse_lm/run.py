"""sparse-lm: GPT-2-architecture LMs trained with AdamW, HORST and HAM, then one-shot magnitude pruning.

The HORST paper (arXiv 2605.21104), one-shot pruning: the same small GPT-2 trained by each optimizer at the
same budget, pruned once, layer-wise (one magnitude threshold per weight matrix inside the blocks;
embeddings and the tied LM head stay dense), with no fine-tuning, and scored by perplexity. The Austen
corpus is split by novel (four training novels, *Northanger Abbey* for validation, *Persuasion* for test);
lr and α are chosen on the validation novel only (``tuning_plan``), then every seed trains at the chosen
settings and is scored on the test blocks, the examples of the claims' cells. A pretrained SmolLM2-135M is
pruned the same way, a sanity check of the pruning and evaluation.
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
from descentlab.errors import NumericalError
from descentlab.experiments.sparse_lm import report
from descentlab.experiments.sparse_lm.config import SparseLMConfig, design
from descentlab.experiments.sparse_lm.jobs import (
    Outcome,
    criterion_text,
    dense_eligible,
    load_data,
    smollm2_sweep,
    train_job,
)
from descentlab.experiments.sparse_lm.legacy import NLL, design_extra
from descentlab.io import load_arrays
from descentlab.report.results import Results
from descentlab.study.cells import CellStore
from descentlab.study.jobs import JobRunner
from descentlab.study.tuning import Round, TuningConfig, lr_alpha_grid, tune_then_replicate
from descentlab.train.recipe import MethodConfig
from descentlab.train.rundir import RunDir


def run(cfg: SparseLMConfig, run: RunDir) -> dict:
    # 1. data: the tokenizer learns from the training split only; blocks are fixed-length and deterministic
    data, test_text, tok = load_data(cfg)

    # 2. the validation rounds on the tuning seed (tuning_plan), then every (method, evaluation seed) at the
    # chosen settings; the SmolLM2 sanity check runs here while the first jobs train; finished jobs come
    # from the job cache on resume
    threads = torch.get_num_threads()
    if cfg.threads is not None or cfg.workers > 1:
        torch.set_num_threads(cfg.threads or 1)
    try:
        with JobRunner(
            train_job, workers=cfg.workers, cache_dir=run.path / "jobs", threads=cfg.threads or 1
        ) as jobs:
            tuned = tune_then_replicate(
                cfg.method_configs(),
                tuning_plan(cfg),
                submit=partial(submit_job, jobs, cfg, data, str(run.path)),
                choose=partial(choose, dense_within=cfg.tune_dense_within),
                meanwhile=partial(smollm2_sweep, cfg, test_text) if cfg.smollm2 else None,
            )
    finally:
        torch.set_num_threads(threads)
    if broken := [r["tag"] for runs in tuned.per_seed.values() for r in runs if r["diverged"]]:
        raise NumericalError(f"final runs {broken} diverged; their metrics.jsonl says why (lower lr / alpha)")

    # 3. the claims' cells (the per-block test NLLs at every level, the per-matrix weight shape) into the
    # cell store; results: test perplexity curves with seed-level intervals, tables and notes
    cells = {
        k: np.stack([load_arrays(run.path / r["nll"])["test"] for r in runs]).astype(np.float64)
        for k, runs in tuned.per_seed.items()
    }
    outcome = Outcome(tuned, cells)
    cell_store(cfg, outcome).save(run.path, writer=run.writer)
    return Results(
        experiment="sparse-lm",
        config=config_to_dict(cfg),
        protocol=protocol(cfg, data, tok.name, outcome),
        **report.summarise(cfg, outcome),
    ).to_dict()


def tuning_plan(cfg: SparseLMConfig) -> TuningConfig:
    """The search rounds on the validation novel (none without ``tune``):

    * ``lr_from``: that method's lr x α grid, then every other method's α at the lr it chose;
    * ``lr_first``: every method's lr at its own α, then each method's α at its chosen lr;
    * otherwise one joint grid per method, ``lr_candidates`` x α (x weight decay), of equal size.
    """
    arms = tuple(cfg.methods)
    rounds: list[Round] = []
    if cfg.tune and cfg.lr_from is not None:
        others = tuple(k for k in arms if k != cfg.lr_from)
        rounds = [Round((cfg.lr_from,), partial(candidates, cfg, "tune", True)),
                  Round(others, partial(candidates, cfg, "from", True))]  # fmt: skip
    elif cfg.tune and cfg.lr_first:
        alphas = tuple(k for k in arms if cfg.tune_alpha.get(k))
        rounds = [Round(arms, partial(candidates, cfg, "tune", False)),
                  Round(alphas, partial(candidates, cfg, "chosen", True))]  # fmt: skip
    elif cfg.tune:
        rounds = [Round(arms, partial(candidates, cfg, "own", True))]
    joint = cfg.tune and cfg.lr_from is None and not cfg.lr_first
    return TuningConfig(cfg.seeds, cfg.tune_seed, rounds, cfg.candidate_counts() if joint else {})


def candidates(
    cfg: SparseLMConfig, lrs: str, alpha: bool, arm: str, chosen: Mapping[str, MethodConfig]
) -> list[MethodConfig]:
    """``arm``'s candidates around its current choice: lrs from ``tune_lr`` (``"tune"``), its own
    ``lr_candidates`` (``"own"``), its chosen lr (``"chosen"``) or ``lr_from``'s chosen lr (``"from"``);
    crossed with its ``tune_alpha`` when ``alpha``, then with its ``tune_weight_decay``."""
    base = chosen[arm]
    if lrs == "tune":
        grid_lrs = list(cfg.tune_lr)
    elif lrs == "own":
        grid_lrs = cfg.lr_candidates(arm)
    else:
        grid_lrs = [chosen[cfg.lr_from if lrs == "from" else arm].optimizer.lr]
    grid = lr_alpha_grid(base, grid_lrs, cfg.tune_alpha.get(arm, []) if alpha else [])
    decays = cfg.tune_weight_decay.get(arm, [])
    return [
        replace(m, optimizer=replace(m.optimizer, weight_decay=wd)) for m in grid for wd in decays
    ] or grid


def choose(arm: str, results: Sequence[Mapping[str, Any]], dense_within: float | None = None) -> int:
    """The tuning pick among every candidate ``arm`` has run, on validation only:
    ``argmin_{i in dense_eligible(results, dense_within)} tune_score_i`` (the first of equals)."""
    return min(dense_eligible(results, dense_within), key=lambda i: results[i]["tune_score"])


def submit_job(
    jobs: JobRunner,
    cfg: SparseLMConfig,
    data: dict,
    run_path: str,
    label: str,
    method: MethodConfig,
    seed: int,
) -> Future:
    """Queue one (method, seed) job under its tag ``<label>-lr<lr>[-a<α>][-wd<wd>]-seed<seed>``."""
    opt = method.optimizer
    tag = (
        f"{label}-lr{opt.lr:g}"
        + ("" if opt.alpha is None else f"-a{opt.alpha:g}")
        + (f"-wd{opt.weight_decay:g}" if label in cfg.tune_weight_decay else "")
        + f"-seed{seed}"
    )
    return jobs.submit(tag, cfg, label, method, seed, data, run_path, tag)


def protocol(
    cfg: SparseLMConfig, data: Mapping[str, Any], tokenizer: str, outcome: Outcome
) -> dict[str, Any]:
    """The results' protocol block: the data's sizes, the trained model and the tuning outcome (the
    config, beside it in results.json, holds the rest)."""
    ctx, n_train = cfg.model.n_positions, int(data["train"].shape[0])
    n_val, n_test = int(data["val"].shape[0]), int(data["test"].shape[0])
    steps = cfg.train.total_steps(n_train)
    chosen = {k: m.optimizer for k, m in outcome.tuned.chosen.items()}
    first = next(iter(outcome.tuned.per_seed.values()))[0]
    tuning = f"validation novel only ({n_val} blocks), seed {cfg.tune_seed}, "
    tuning += criterion_text(cfg.tune_on, cfg.tune_dense_within)
    tuning += f"; lr from {cfg.lr_from}" if cfg.lr_from else ""
    return {
        "split": "test (tuning on validation only)",
        "tokenizer": tokenizer,
        "vocab": data["vocab"],
        "model": f"GPT-2 {cfg.model.n_layer} layers x {cfg.model.n_embd}, {first['params']:,} parameters",
        "train_blocks": n_train,
        "steps": steps,
        "tokens_seen": steps * cfg.train.batch_size * ctx,
        "epochs": round(steps * cfg.train.batch_size / n_train, 3),
        **{key: {k: getattr(o, key) for k, o in chosen.items()} for key in ("lr", "alpha", "weight_decay")},
        "tuning": tuning if cfg.tune else "none (the specs' own lr / alpha)",
        "n_val_blocks": n_val,
        "n_test_blocks": n_test,
        "n_eval_tokens": n_test * (ctx - 1),
        "seeds": list(cfg.seeds),
        "tune_seed": cfg.tune_seed if cfg.tune else None,
        "candidates": {k: len(g) for k, g in outcome.grids.items()},
        "pruning": "one-shot, layer-wise magnitude, block Linear/Conv1D weights; embeddings and head dense",
        "claims": f"seed-level intervals over (seeds x test blocks); matched-ols: the slope from the "
        f"{sum(len(g) for g in outcome.grids.values())} tuning runs' validation NLLs; seed-spread "
        f"limit {100 * cfg.seed_spread:g} %",
    }


def cell_store(cfg: SparseLMConfig, outcome: Outcome) -> CellStore:
    """The claims' cells under the design record (:func:`~.config.design`, with the number of test blocks
    and the tuning grid): ``nll/<method>/<level>`` ``[seeds, blocks]`` test NLLs, and per method the
    fraction of each block matrix's weights below the threshold (``frac_below/<method>``) and its excess
    kurtosis (``kurtosis/<method>``), ``[seeds, matrices]``, of the trained dense models."""
    blocks = int(next(iter(outcome.cells.values())).shape[-1])
    extra = design_extra(config_to_dict(cfg), outcome.tuning_runs)
    store = CellStore(replace(design(cfg), examples=blocks, extra=extra))
    for label, nll in outcome.cells.items():
        for i, p in enumerate(store.conditions(numeric=True)):
            store.put(NLL, label, p, nll[:, i])
        for stat in ("frac_below", "kurtosis"):
            runs = outcome.tuned.per_seed[label]
            store.put(stat, label, None, np.asarray([r["shape"][stat] for r in runs], dtype=np.float64))
    return store
