"""sparse-lm: GPT-2-architecture LMs trained with AdamW, HORST and HAM, then one-shot magnitude pruning.

The HORST paper (arXiv 2605.21104), one-shot pruning: train the same small GPT-2 with each optimizer at the same budget (steps, batch, lr schedule,
weight decay), prune each trained model once, layer-wise (one magnitude threshold per weight matrix inside the
blocks; embeddings and the tied LM head stay dense), at 50-90 % sparsity, with no fine-tuning, and measure the
perplexity. The claims under test (``claims.py``): HORST-trained models have a lower perplexity after
pruning than AdamW and HAM, the gap widens with sparsity, and HORST's weights are peaked at 0.

Protocol. The Austen corpus is split by novel (``load_austen``): four training novels, *Northanger Abbey*
for validation, *Persuasion* for test. lr and α are chosen on the validation novel only (``tune``, seed
``tune_seed``, never an evaluation seed; the criterion is ``tune_on`` / ``tune_dense_within``, the search ``lr_from`` / ``lr_first``).
The chosen settings are trained with every seed and scored on the test novel: each of ``test_blocks``
evenly spaced blocks is one example of the claims' cells (one seed = one init and data order for every
method). A pretrained SmolLM2-135M is pruned the same way, a sanity check of the pruning and evaluation.

Defaults: a byte-level BPE trained on the training novels. ``tokenizer=gpt2 corpus=/path/to/SlimPajama-6B``
switches to the real GPT-2 BPE and a local corpus.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace

import numpy as np
import torch

from descentlab.config import config_to_dict
from descentlab.data.bpe import BPEConfig, make_tokenizer
from descentlab.data.lm_blocks import lm_blocks
from descentlab.errors import NumericalError
from descentlab.experiments.sparse_lm.config import SparseLMConfig
from descentlab.experiments.sparse_lm.jobs import (
    criterion_text,
    dense_eligible,
    evenly_spaced,
    load_corpus,
    pick_candidate,
    smollm2_sweep,
    train_and_prune,
)
from descentlab.experiments.sparse_lm.tables import summarise
from descentlab.experiments.sparse_lm.token_data import cached_lm_data
from descentlab.io import load_arrays
from descentlab.report.results import Results
from descentlab.train.jobs import JobRunner
from descentlab.train.recipe import MethodConfig
from descentlab.train.rundir import RunDir
from descentlab.train.tuning import lr_alpha_grid


def run(cfg: SparseLMConfig, run: RunDir) -> dict:
    # 1. data: the tokenizer learns from the training split only; blocks are fixed-length and deterministic
    ctx = cfg.model.n_positions
    if cfg.token_cache:  # paper scale: token files next to the corpus; the training blocks stay on disk
        cached = cached_lm_data(cfg)
        splits, tok = {"test": cached.test_text}, cached.tokenizer
        train_blocks, val_blocks, test_blocks = cached.train, cached.val, cached.test
    else:
        splits = load_corpus(cfg)
        tok = make_tokenizer(cfg.tokenizer, splits["train"], BPEConfig(vocab_size=cfg.bpe_vocab))
        train_blocks = lm_blocks(tok, splits["train"], ctx, max_blocks=cfg.max_train_blocks).blocks
        val_blocks = evenly_spaced(lm_blocks(tok, splits["validation"], ctx).blocks, cfg.eval_blocks)
        test_blocks = evenly_spaced(lm_blocks(tok, splits["test"], ctx).blocks, cfg.test_blocks)
    data = {"train": train_blocks, "val": val_blocks, "test": test_blocks, "vocab": tok.vocab_size}
    data["eos"] = tok.eos_id

    # 2. the validation grid on the tuning seed (with lr_from: that method's lr, then the others' α at it),
    # then every (method, evaluation seed) at the chosen settings; finished jobs come from the job cache on resume
    methods, seed0 = cfg.method_configs(), cfg.tune_seed
    threads = torch.get_num_threads()
    if cfg.threads is not None or cfg.workers > 1:
        torch.set_num_threads(cfg.threads or 1)
    try:
        with JobRunner(
            train_and_prune, workers=cfg.workers, cache_dir=run.path / "jobs", threads=cfg.threads or 1
        ) as jobs:

            def submit(label: str, method: MethodConfig, seed: int) -> Future:
                opt = method.optimizer
                tag = (
                    f"{label}-lr{opt.lr:g}"
                    + ("" if opt.alpha is None else f"-a{opt.alpha:g}")
                    + (f"-wd{opt.weight_decay:g}" if label in cfg.tune_weight_decay else "")
                    + f"-seed{seed}"
                )
                return jobs.submit(tag, cfg, label, method, seed, data, str(run.path), tag)

            chosen, grids, picks, eligible = dict(methods), {}, {}, {}
            tried: dict[str, list[MethodConfig]] = {}

            def trials(
                labels: list[str], lrs: list[float] | None, alphas: bool = True
            ) -> dict[str, tuple[list, list[Future]]]:
                out = {}
                for k in labels:  # around the current choice (the spec before any pick)
                    base = chosen[k]
                    grid = lr_alpha_grid(
                        base, lrs or [base.optimizer.lr], cfg.tune_alpha.get(k, []) if alphas else []
                    )
                    decays = cfg.tune_weight_decay.get(k, [])
                    grid = [with_weight_decay(m, wd) for m in grid for wd in decays] if decays else grid
                    out[k] = (grid, [submit(k, m, seed0) for m in grid])
                return out

            def pick(pending: dict[str, tuple[list, list[Future]]]) -> None:
                # the choice is the best of every candidate this label has run (a repeat is one job)
                for label, (grid, futures) in pending.items():
                    seen = {r["tag"] for r in grids.get(label, [])}
                    for method, future in zip(grid, futures, strict=True):
                        if (result := future.result())["tag"] not in seen:
                            grids.setdefault(label, []).append(result)
                            tried.setdefault(label, []).append(method)
                    eligible[label] = dense_eligible(grids[label], cfg.tune_dense_within)
                    picks[label] = pick_candidate(grids[label], cfg.tune_dense_within)  # validation only
                    chosen[label] = tried[label][picks[label]]

            # the SmolLM2 sanity check runs in this process while the first jobs train
            later: dict[str, tuple[list, list[Future]]] = {}
            first: dict[str, tuple[list, list[Future]]] = {}
            if cfg.tune and cfg.lr_from is not None:
                first = trials([cfg.lr_from], cfg.tune_lr)
            elif cfg.tune and cfg.lr_first:
                first = trials(list(methods), cfg.tune_lr, alphas=False)
            elif cfg.tune:
                later = {k: trials([k], cfg.lr_candidates(k))[k] for k in methods}
            smol = smollm2_sweep(cfg, splits["test"]) if cfg.smollm2 else None
            if first:
                pick(first)
                if cfg.lr_from is not None:
                    later = trials(
                        [k for k in methods if k != cfg.lr_from], [chosen[cfg.lr_from].optimizer.lr]
                    )
                else:  # then each method's alpha at its own chosen lr
                    later = trials([k for k in methods if cfg.tune_alpha.get(k)], None)

            def finals(labels: list[str]) -> dict[tuple[str, int], Future]:
                return {(k, seed): submit(k, chosen[k], seed) for seed in cfg.seeds for k in labels}

            futures = finals([k for k in methods if k not in later])  # queued before the grids are read
            pick(later)
            futures |= finals(list(later))
            final = {k: [futures[k, seed].result() for seed in cfg.seeds] for k in methods}
            every = {
                r["tag"]: r for runs in [*grids.values(), *final.values()] for r in runs if not r["diverged"]
            }
    finally:
        torch.set_num_threads(threads)
    broken = [r["tag"] for runs in final.values() for r in runs if r["diverged"]]
    if broken:
        raise NumericalError(f"final runs {broken} diverged; their metrics.jsonl says why (lower lr / alpha)")

    # 3. results: test perplexity curves with seed-level intervals; the claims' cells are the per-block test
    # NLLs the jobs saved (arrays/nll-*.npz) and the per-matrix weight shape (arrays/shape.npz)
    cells = {k: _cells(run, jobs_) for k, jobs_ in final.items()}
    save_shape_arrays(run, final)
    criterion = criterion_text(cfg.tune_on, cfg.tune_dense_within)
    keys = ("seed_spread", "small_weight", "smollm2")
    opts = {k: getattr(cfg, k) for k in keys} | {"criterion": criterion, "eligible": eligible}
    body = summarise(final, cells, list(every.values()), grids, picks, smol, **opts)
    steps = cfg.train.total_steps(len(train_blocks))
    first = final[next(iter(final))][0]
    return Results(
        experiment="sparse-lm",
        config=config_to_dict(cfg),
        protocol={
            "corpus": cfg.corpus,
            "split": "test (tuning on validation only)",
            "tokenizer": tok.name,
            "vocab": tok.vocab_size,
            "context": ctx,
            "model": f"GPT-2 {cfg.model.n_layer} layers x {cfg.model.n_embd}, {first['params']:,} parameters",
            "train_blocks": int(train_blocks.shape[0]),
            "steps": steps,
            "tokens_seen": steps * cfg.train.batch_size * ctx,
            "epochs": round(steps * cfg.train.batch_size / int(train_blocks.shape[0]), 3),
            "lr": {k: m.optimizer.lr for k, m in chosen.items()},
            "alpha": {k: m.optimizer.alpha for k, m in chosen.items()},
            "weight_decay": {k: m.optimizer.weight_decay for k, m in chosen.items()},
            "tuning": (
                f"validation novel only ({int(val_blocks.shape[0])} blocks), seed {seed0}, {criterion}"
                + (f"; lr from {cfg.lr_from}" if cfg.lr_from else "")
                if cfg.tune
                else "none (the specs' own lr / alpha)"
            ),
            "n_val_blocks": int(val_blocks.shape[0]),
            "n_test_blocks": int(test_blocks.shape[0]),
            "n_eval_tokens": int(test_blocks.shape[0] * (ctx - 1)),
            "seeds": list(cfg.seeds),
            "tune_seed": seed0 if cfg.tune else None,
            "candidates": {k: len(g) for k, g in grids.items()},
            "pruning": "one-shot, layer-wise magnitude, block Linear/Conv1D weights; embeddings and head dense",
            "claims": f"seed-level intervals over (seeds x test blocks); matched-ols: the slope from the "
            f"{sum(len(g) for g in grids.values())} tuning runs' validation NLLs; seed-spread "
            f"limit {100 * cfg.seed_spread:g} %",
        },
        methods=body["methods"],
        tables=body["tables"],
        notes=body["notes"],
        # figure and claim data: figures.py draws the histograms from the weights files, claims.py reads the
        # per-block NLLs
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


def with_weight_decay(method: MethodConfig, weight_decay: float) -> MethodConfig:
    """``method`` with its optimizer's weight decay set to ``weight_decay``."""
    return replace(method, optimizer=replace(method.optimizer, weight_decay=weight_decay))


def _cells(run: RunDir, jobs: list[dict]) -> torch.Tensor:
    """``[seeds, levels, test blocks]`` per-block test NLLs of one method's final runs, from the saved arrays."""
    return torch.stack([torch.as_tensor(load_arrays(run.path / j["nll"])["test"]) for j in jobs])


def save_shape_arrays(run: RunDir, final: dict[str, list[dict]]) -> None:
    """The weight-shape claims' cells to ``arrays/shape.npz``: per method, the fraction of each block matrix's
    weights below the threshold (``frac_below/<method>``) and its excess kurtosis (``kurtosis/<method>``),
    ``[seeds, matrices]``, of the trained dense models."""
    arrays = {
        f"{stat}/{label}": np.asarray([j["shape"][stat] for j in jobs], dtype=np.float64)
        for label, jobs in final.items()
        for stat in ("frac_below", "kurtosis")
    }
    run.save_arrays("arrays/shape.npz", **arrays)
