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
from descentlab.data.bpe import BPEConfig, make_tokenizer
from descentlab.data.lm_blocks import lm_blocks
from descentlab.errors import NumericalError
from descentlab.experiments.sparse_lm.config import SparseLMConfig
from descentlab.experiments.sparse_lm.jobs import (
    cached_lm_data,
    criterion_text,
    dense_eligible,
    evenly_spaced,
    load_corpus,
    pick_candidate,
    smollm2_sweep,
    train_and_prune,
)
from descentlab.experiments.sparse_lm.legacy import NLL, design_extra
from descentlab.experiments.sparse_lm.report import summarise
from descentlab.io import load_arrays
from descentlab.report.results import Results
from descentlab.study.cells import CellStore, Design
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
            train_and_prune, workers=cfg.workers, cache_dir=run.path / "jobs", threads=cfg.threads or 1
        ) as jobs:
            tuned = tune_then_replicate(
                cfg.method_configs(),
                tuning_plan(cfg),
                submit=partial(submit_job, jobs, cfg, data, str(run.path)),
                choose=partial(choose_setting, cfg.tune_dense_within),
                meanwhile=partial(smollm2_sweep, cfg, test_text) if cfg.smollm2 else None,
            )
    finally:
        torch.set_num_threads(threads)
    final, grids = tuned.per_seed, {k: runs for k, runs in tuned.results.items() if runs}
    if broken := [r["tag"] for runs in final.values() for r in runs if r["diverged"]]:
        raise NumericalError(f"final runs {broken} diverged; their metrics.jsonl says why (lower lr / alpha)")

    # 3. the claims' cells (the per-block test NLLs at every level, the per-matrix weight shape) into the
    # cell store; results: test perplexity curves with seed-level intervals, tables and notes
    cells = {k: _cells(run, runs) for k, runs in final.items()}
    tuning_runs = [r for runs in grids.values() for r in runs if not r["diverged"]]
    cell_store(cfg, cells, final, tuning_runs).save(run.path, writer=run.writer)
    every = {r["tag"]: r for r in [*tuning_runs, *(r for runs in final.values() for r in runs)]}
    criterion = criterion_text(cfg.tune_on, cfg.tune_dense_within)
    eligible = {k: dense_eligible(runs, cfg.tune_dense_within) for k, runs in grids.items()}
    opts = {k: getattr(cfg, k) for k in ("seed_spread", "small_weight", "smollm2")}
    body = summarise(
        final, cells, list(every.values()), grids, tuned.picks, tuned.meanwhile,
        **opts, criterion=criterion, eligible=eligible,
    )  # fmt: skip
    return Results(
        experiment="sparse-lm",
        config=config_to_dict(cfg),
        protocol=protocol(cfg, data, tok.name, tuned.chosen, grids, final, criterion),
        methods=body["methods"],
        tables=body["tables"],
        notes=body["notes"],
        # figure data: figures.py draws the histograms from the weights files
        extra={
            "arrays": {
                "weights": {k: runs[0]["weights"] for k, runs in final.items() if runs[0]["weights"]},
                "nll": {k: [r["nll"] for r in runs] for k, runs in final.items()},
            },
            "checks": body["checks"],
            "selection": body["selection"],
            "runs": body["runs"],
        },
    ).to_dict()


def load_data(cfg: SparseLMConfig) -> tuple[dict[str, Any], str, Any]:
    """``(blocks, test text, tokenizer)``: the train / val / test blocks (val and test ``eval_blocks`` /
    ``test_blocks`` evenly spaced), vocabulary size and end-of-text id; from the token cache at paper scale."""
    ctx = cfg.model.n_positions
    if cfg.token_cache:  # paper scale: token files next to the corpus; the training blocks stay on disk
        cached = cached_lm_data(cfg)
        test_text, tok = cached.test_text, cached.tokenizer
        train, val, test = cached.train, cached.val, cached.test
    else:
        splits = load_corpus(cfg)
        test_text = splits["test"]
        tok = make_tokenizer(cfg.tokenizer, splits["train"], BPEConfig(vocab_size=cfg.bpe_vocab))
        train = lm_blocks(tok, splits["train"], ctx, max_blocks=cfg.max_train_blocks).blocks
        val = evenly_spaced(lm_blocks(tok, splits["validation"], ctx).blocks, cfg.eval_blocks)
        test = evenly_spaced(lm_blocks(tok, splits["test"], ctx).blocks, cfg.test_blocks)
    return (
        {"train": train, "val": val, "test": test, "vocab": tok.vocab_size, "eos": tok.eos_id},
        test_text,
        tok,
    )


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


def choose_setting(dense_within: float | None, arm: str, results: Sequence[Mapping[str, Any]]) -> int:
    """The tuning pick among every candidate ``arm`` has run (validation only, :func:`pick_candidate`)."""
    return pick_candidate(results, dense_within)


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
    cfg: SparseLMConfig,
    data: dict[str, Any],
    tokenizer: str,
    chosen: Mapping[str, MethodConfig],
    grids: Mapping[str, list[dict]],
    final: Mapping[str, list[dict]],
    criterion: str,
) -> dict[str, Any]:
    """The results' protocol block, from the config, the data and the tuning outcome."""
    ctx, train = cfg.model.n_positions, data["train"]
    n_val, n_test = data["val"].shape[0], data["test"].shape[0]
    steps = cfg.train.total_steps(len(train))
    first = final[next(iter(final))][0]
    return {
        "corpus": cfg.corpus,
        "split": "test (tuning on validation only)",
        "tokenizer": tokenizer,
        "vocab": data["vocab"],
        "context": ctx,
        "model": f"GPT-2 {cfg.model.n_layer} layers x {cfg.model.n_embd}, {first['params']:,} parameters",
        "train_blocks": int(train.shape[0]),
        "steps": steps,
        "tokens_seen": steps * cfg.train.batch_size * ctx,
        "epochs": round(steps * cfg.train.batch_size / int(train.shape[0]), 3),
        "lr": {k: m.optimizer.lr for k, m in chosen.items()},
        "alpha": {k: m.optimizer.alpha for k, m in chosen.items()},
        "weight_decay": {k: m.optimizer.weight_decay for k, m in chosen.items()},
        "tuning": (
            f"validation novel only ({int(n_val)} blocks), seed {cfg.tune_seed}, {criterion}"
            + (f"; lr from {cfg.lr_from}" if cfg.lr_from else "")
            if cfg.tune
            else "none (the specs' own lr / alpha)"
        ),
        "n_val_blocks": int(n_val),
        "n_test_blocks": int(n_test),
        "n_eval_tokens": int(n_test * (ctx - 1)),
        "seeds": list(cfg.seeds),
        "tune_seed": cfg.tune_seed if cfg.tune else None,
        "candidates": {k: len(g) for k, g in grids.items()},
        "pruning": "one-shot, layer-wise magnitude, block Linear/Conv1D weights; embeddings and head dense",
        "claims": f"seed-level intervals over (seeds x test blocks); matched-ols: the slope from the "
        f"{sum(len(g) for g in grids.values())} tuning runs' validation NLLs; seed-spread "
        f"limit {100 * cfg.seed_spread:g} %",
    }


def _cells(run: RunDir, jobs: list[dict]) -> torch.Tensor:
    """``[seeds, levels, test blocks]`` per-block test NLLs of one method's final runs, from the saved arrays."""
    return torch.stack([torch.as_tensor(load_arrays(run.path / j["nll"])["test"]) for j in jobs])


def cell_store(
    cfg: SparseLMConfig, cells: Mapping[str, torch.Tensor], final: Mapping[str, list[dict]], grid: list[dict]
) -> CellStore:
    """The claims' cells under the design record (methods, levels 0 + ``sparsities``, seeds, test blocks,
    claim levels and the tuning grid): ``nll/<method>/<level>`` ``[seeds, blocks]`` test NLLs, and per
    method the fraction of each block matrix's weights below the threshold (``frac_below/<method>``) and
    its excess kurtosis (``kurtosis/<method>``), ``[seeds, matrices]``, of the trained dense models."""
    levels = [0.0, *cfg.sparsities]
    blocks = int(next(iter(cells.values())).shape[-1])
    design = Design(
        tuple(cells), tuple(levels), tuple(cfg.seeds), blocks, design_extra(config_to_dict(cfg), grid)
    )
    store = CellStore(design)
    for label, nll in cells.items():
        for i, p in enumerate(levels):
            store.put(NLL, label, p, nll[:, i].double().numpy())
        for stat in ("frac_below", "kurtosis"):
            store.put(
                stat, label, None, np.asarray([j["shape"][stat] for j in final[label]], dtype=np.float64)
            )
    return store
