"""sparse-lm's job: train one GPT-2, then prune it one-shot at every level and score validation and test blocks;
the data it trains on; and what a run gathers for its report (:class:`Outcome`).

A job's result is JSON (the job cache); the per-block test and validation NLLs it measured go to
``arrays/nll-<tag>.npz`` (``test``, ``val``: ``[levels, blocks]`` float64, level 0 = dense) and, for the first
seed, the block weights to ``arrays/weights-<tag>.npz`` (the histograms). Top level and picklable, so the
jobs can run in worker processes. At the paper's scale (``token_cache=true``) the training split stays on
disk (:class:`~descentlab.data.token_cache.MemmapBlocks`); only the evaluation blocks are gathered into RAM.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from descentlab.data.bpe import BPEConfig, TextTokenizer, make_tokenizer
from descentlab.data.lm_blocks import LMBlocks, lm_blocks, load_local_corpus
from descentlab.data.token_cache import MemmapBlocks, token_files
from descentlab.errors import AssetMissingError, ConfigError, NumericalError
from descentlab.experiments.sparse_lm.config import SparseLMConfig
from descentlab.io import save_arrays
from descentlab.models.gpt2 import build_gpt2, num_params
from descentlab.models.perplexity import block_nlls
from descentlab.sparsity.masks import select_prunable
from descentlab.sparsity.pruning import prune_magnitude
from descentlab.sparsity.report import tensor_shape_stats
from descentlab.study.tuning import Tuned
from descentlab.train.loop import fit, seed_everything
from descentlab.train.recipe import MethodConfig, build_recipe
from descentlab.train.rundir import RunDir

HISTOGRAM_SAMPLE = 1 << 21  # block weights kept for the histogram; a larger model saves a uniform sample


@torch.no_grad()
def prune_sweep(
    model: torch.nn.Module, splits: dict[str, torch.Tensor], sparsities: list[float], batch_size: int
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Score the dense model, then for each level: restore the dense weights, prune layer-wise, score.

    Returns the summary ``{"x", "reached", "reached_min", "reached_max"}`` (x[0] = 0 = dense; ``reached*``:
    the exact-zero fraction of the pruned matrices, all together and the least / most sparse one) and, per
    split name, the ``[levels, blocks]`` per-block mean NLLs (:func:`~descentlab.models.perplexity.block_nlls`).
    The model is left dense.
    """
    prunable = select_prunable(model)
    dense = {t.name: t.param.detach().clone() for t in prunable}
    zeros0 = sum(int((t.param == 0).sum()) for t in prunable) / sum(t.param.numel() for t in prunable)
    out: dict[str, Any] = {"x": [0.0], "reached": [zeros0], "reached_min": [zeros0], "reached_max": [zeros0]}
    nll = {name: [block_nlls(model, b, batch_size=batch_size)] for name, b in splits.items()}
    for s in sparsities:
        for t in prunable:
            t.param.copy_(dense[t.name])
        report = prune_magnitude(model, s, scope="layer")
        for name, b in splits.items():
            nll[name].append(block_nlls(model, b, batch_size=batch_size))
        per = [c.sparsity for c in report.tensors.values()]
        out["x"].append(float(s))
        out["reached"].append(report.global_sparsity)
        out["reached_min"].append(min(per))
        out["reached_max"].append(max(per))
    for t in prunable:
        t.param.copy_(dense[t.name])
    return out, {name: torch.stack(rows) for name, rows in nll.items()}


def evenly_spaced(blocks: torch.Tensor, k: int | None) -> torch.Tensor:
    """``k`` blocks evenly spaced over the split (all of them when k is None or >= their number)."""
    n = blocks.shape[0]
    if k is None or k >= n:
        return blocks
    return blocks[torch.linspace(0, n - 1, k).round().long()]


def tune_score(val_nll: list[float], levels: list[float], tune_on: float | None) -> float:
    """The tuning criterion: the validation log-perplexity at sparsity ``tune_on`` (0: the dense model), or
    with None the mean over the pruned levels (``levels[1:]``; ``levels[0]`` is dense)."""
    if tune_on is None:
        return sum(val_nll[1:]) / max(1, len(val_nll) - 1)
    return val_nll[levels.index(tune_on)]


def dense_eligible(jobs: Sequence[Mapping[str, Any]], dense_within: float | None = None) -> list[int]:
    """The tuning candidates allowed to compete: with ``dense_within``, those whose dense validation
    perplexity is at most ``(1 + dense_within)`` times the grid's best (all of them with None)::

        eligible = {i : val_nll_i(0) <= min_j val_nll_j(0) + log(1 + dense_within)}

    so that a criterion at a pruned level cannot pick a model that is more prunable only because it is
    worse trained.
    """
    if dense_within is None:
        return list(range(len(jobs)))
    bound = min(j["val_nll"][0] for j in jobs) + math.log1p(dense_within)
    return [i for i, j in enumerate(jobs) if j["val_nll"][0] <= bound]


def criterion_text(tune_on: float | None, dense_within: float | None) -> str:
    """The tuning rule of :func:`tune_score` and ``run.choose``, in words."""
    if tune_on is None:
        text = "mean validation log-ppl over the pruning levels"
    else:
        text = f"validation log-ppl at {100 * tune_on:g} % sparsity"
    if dense_within is not None:
        text += f", among candidates within {100 * dense_within:g} % of the grid's best dense ppl"
    return text


def train_job(
    cfg: SparseLMConfig, label: str, method: MethodConfig, seed: int, data: dict, run_path: str, tag: str
) -> dict[str, Any]:
    """One job: train a fresh GPT-2 by ``method`` at ``seed``, then sweep one-shot pruning (JSON-able result).

    ``val_nll`` / ``test_nll``: the mean NLL per level (log-perplexity); ``tune_score``: the tuning
    criterion (validation only, :func:`tune_score`); ``shape``:
    :func:`~descentlab.sparsity.report.tensor_shape_stats` of the trained (dense) block matrices;
    ``nan_reverted``: the elements the optimizer's NaN guard reverted (0 for AdamW).
    A run that diverges (:class:`NumericalError` from ``fit``) returns its settings with ``diverged`` (the
    reason) and infinite NLLs, so a tuning grid goes on without it.
    """
    run = RunDir(Path(run_path))
    seed_everything(seed)
    model = build_gpt2(cfg.model, data["vocab"], eos_id=data["eos"], seed=seed)
    train = data["train"]  # an in-RAM tensor of blocks, or the token cache's on-disk blocks
    train_data = train if isinstance(train, MemmapBlocks) else LMBlocks(train)
    train_cfg = replace(cfg.train, seed=seed, progress=cfg.train.progress and cfg.workers == 1)
    recipe = build_recipe(method, model, total_steps=train_cfg.total_steps(len(train_data)))
    opt = method.optimizer
    info = {"label": label, "seed": seed, "tag": tag, "optimizer": opt.name, "lr": opt.lr}
    info |= {"alpha": float(recipe.optimizer.defaults.get("alpha", 0.0)), "weight_decay": opt.weight_decay}
    try:
        result = fit(model, train_data, cfg=train_cfg, run=run, tag=tag, **recipe.fit_kwargs())
    except NumericalError as exc:  # a diverged candidate (too large an alpha) loses the grid, not the run
        run.log(tag=tag, event="diverged", reason=str(exc))
        inf = [math.inf] * (1 + len(cfg.sparsities))
        return {**info, "diverged": str(exc), "val_nll": inf, "test_nll": inf, "tune_score": math.inf}

    sweep, nll = prune_sweep(
        model, {"val": data["val"], "test": data["test"]}, cfg.sparsities, cfg.eval_batch_size
    )
    val, test = nll["val"].mean(1).tolist(), nll["test"].mean(1).tolist()
    nll_file = f"arrays/nll-{tag}.npz"
    save_arrays(run.path / nll_file, val=nll["val"].numpy(), test=nll["test"].numpy())
    run.log(
        tag=tag,
        event="prune_sweep",
        **{f"test_ppl@{x:g}": math.exp(v) for x, v in zip(sweep["x"], test, strict=True)},
    )
    prunable = select_prunable(model)
    sweep.update(
        **info,  # alpha: the mirror strength used (0: none)
        diverged=None,
        params=num_params(model),
        final_loss=float(result.last_logs.get("loss", math.nan)),
        # elements HORST / HAM's NaN guard reverted (it warns once per process): a run that needed it is
        # named in the notes, not only in one worker's stderr
        nan_reverted=int(getattr(recipe.optimizer, "reverted_total", 0)),
        val_nll=val,
        test_nll=test,
        tune_score=tune_score(val, [0.0, *cfg.sparsities], cfg.tune_on),
        nll=nll_file,
        shape=tensor_shape_stats([t.param for t in prunable], cfg.small_weight),
        weights=None,
    )
    if seed == cfg.seeds[0]:
        w = torch.cat([t.param.detach().flatten() for t in prunable])
        # a fixed generator: the sample does not touch the global RNG and is the same on every rerun
        sample = torch.randint(w.numel(), (HISTOGRAM_SAMPLE,), generator=torch.Generator().manual_seed(0))
        keep = w if w.numel() <= HISTOGRAM_SAMPLE else w[sample]
        sweep["weights"] = f"arrays/weights-{tag}.npz"
        save_arrays(run.path / sweep["weights"], weights=keep.float().cpu().numpy(), total=w.numel())
    return sweep


def smollm2_sweep(cfg: SparseLMConfig, text: str) -> dict[str, Any] | None:
    """The pruning sweep on the pretrained SmolLM2-135M (its own tokenizer), or None if the asset is missing."""
    from descentlab.data import load_causal_lm
    from descentlab.data.bpe import TransformersTokenizer

    try:
        model, hf_tok = load_causal_lm("smollm2")
    except AssetMissingError:
        return None
    tok = TransformersTokenizer(hf_tok, name="smollm2")
    blocks = lm_blocks(tok, text, cfg.model.n_positions, max_blocks=cfg.smollm2_blocks).blocks
    sweep, nll = prune_sweep(model, {"test": blocks}, cfg.sparsities, batch_size=min(4, cfg.eval_batch_size))
    sweep["perplexity"] = [math.exp(v) for v in nll["test"].mean(1).tolist()]
    sweep["tokens"] = blocks.shape[0] * (blocks.shape[1] - 1)
    return sweep


def load_corpus(cfg: SparseLMConfig) -> dict[str, str]:
    """The train / validation / test splits of the configured corpus (Austen: split by novel)."""
    if cfg.corpus != "austen":
        return load_local_corpus(cfg.corpus, max_chars=cfg.corpus_max_chars)
    from descentlab.data import load_austen

    splits = load_austen()
    return {k: v[: cfg.corpus_max_chars] if cfg.corpus_max_chars else v for k, v in splits.items()}


def load_data(cfg: SparseLMConfig) -> tuple[dict[str, Any], str, TextTokenizer]:
    """``(blocks, test text, tokenizer)``: the train / val / test blocks (``eval_blocks`` / ``test_blocks``
    evenly spaced over their splits), the vocabulary size and end-of-text id. The tokenizer learns from the
    training split only. With ``token_cache``, the splits are token files next to the corpus (built on the
    first run, reused after) and the test text is the decoded test blocks (SmolLM2 re-tokenizes text).

    Raises:
        ConfigError: ``token_cache`` with ``tokenizer=bpe``, which learns its merges from the whole training
            text in RAM.
    """
    ctx = cfg.model.n_positions
    if cfg.token_cache:
        if cfg.tokenizer == "bpe":
            raise ConfigError(
                "token_cache=true needs a fixed tokenizer (tokenizer=gpt2 or a tokenizer folder): "
                "tokenizer=bpe trains on the whole training text in RAM"
            )
        tok = make_tokenizer(cfg.tokenizer)
        files = token_files(cfg.corpus, tok, max_chars=cfg.corpus_max_chars)
        train = MemmapBlocks(files["train"], ctx, max_blocks=cfg.max_train_blocks)
        val = MemmapBlocks(files["validation"], ctx).evenly_spaced(cfg.eval_blocks)
        test = MemmapBlocks(files["test"], ctx).evenly_spaced(cfg.test_blocks)
        test_text = "".join(tok.decode(row.tolist()) for row in test[: 2 * cfg.smollm2_blocks])
    else:
        splits = load_corpus(cfg)
        test_text = splits["test"]
        tok = make_tokenizer(cfg.tokenizer, splits["train"], BPEConfig(vocab_size=cfg.bpe_vocab))
        train = lm_blocks(tok, splits["train"], ctx, max_blocks=cfg.max_train_blocks).blocks
        val = evenly_spaced(lm_blocks(tok, splits["validation"], ctx).blocks, cfg.eval_blocks)
        test = evenly_spaced(lm_blocks(tok, splits["test"], ctx).blocks, cfg.test_blocks)
    data = {"train": train, "val": val, "test": test, "vocab": tok.vocab_size, "eos": tok.eos_id}
    return data, test_text, tok


@dataclass
class Outcome:
    """What a run gathered, for its report: the planner's record ``tuned`` (the chosen settings; per method
    the tuning candidates, their results and the pick; the final runs per seed; the SmolLM2 sweep or None as
    ``meanwhile``) and ``cells``, each method's ``[seeds, levels, test blocks]`` test NLLs."""

    tuned: Tuned
    cells: dict[str, np.ndarray]

    @property
    def grids(self) -> dict[str, list[dict[str, Any]]]:
        """Method -> its tuning runs (the tuned methods only)."""
        return {k: runs for k, runs in self.tuned.results.items() if runs}

    @property
    def tuning_runs(self) -> list[dict[str, Any]]:
        """Every tuning run that trained to the end (the matched-ols slope's sample)."""
        return [r for runs in self.grids.values() for r in runs if not r["diverged"]]
