"""sparse-lm: GPT-2-architecture LMs trained with AdamW, HORST and HAM, then one-shot magnitude pruning.

METHODS §2.3-2.4: train the same small GPT-2 with each optimizer at the same budget (steps, batch, lr schedule,
weight decay), prune each trained model once, layer-wise (one magnitude threshold per weight matrix inside the
blocks; embeddings and the tied LM head stay dense), at 50-90 % sparsity, with no fine-tuning, and measure the
perplexity. The claims under test (``report.sparse_lm_claims``): HORST-trained models have a lower perplexity
after pruning than AdamW and HAM, the gap widens with sparsity, and HORST's weights are peaked at 0.

Protocol. The Austen corpus is split by novel (``load_austen``): four training novels, *Northanger Abbey*
for validation, *Persuasion* for test. lr and α are chosen on the validation novel only (``tune``, seed
``seeds[0]``; the criterion is ``tune_on`` / ``tune_dense_within``, the search ``lr_from`` / ``lr_first``).
The chosen settings are trained with every seed and scored on the test novel: each of ``test_blocks``
evenly spaced blocks is a unit of the paired bootstrap (one seed = one init and data order for every
method). A pretrained SmolLM2-135M is pruned the same way, a sanity check of the pruning and evaluation.

Methods are one base :class:`~descentlab.train.recipe.MethodConfig` (AdamW, decay on matrices only, warm-up
then cosine), ``specs`` (label -> override spec of it) and ``methods`` (the labels to train), e.g.
``specs.horst-a30="optimizer.name=horst optimizer.alpha=30" methods=[adamw,horst-a30]``. The claims name
``adamw``, ``horst``, ``ham`` and ``adamw-l2`` (AdamW with strong weight decay, the "L2 shrink" baseline).

Defaults: a byte-level BPE trained on the training novels. ``tokenizer=gpt2 corpus=/path/to/SlimPajama-6B``
switches to the real GPT-2 BPE and a local corpus.
"""

from __future__ import annotations

import re
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from descentlab.config import config_to_dict
from descentlab.data.bpe import BPEConfig, make_tokenizer
from descentlab.data.lm_blocks import lm_blocks
from descentlab.errors import ConfigError, NumericalError
from descentlab.experiments._sparse_lm_jobs import (
    criterion_text,
    dense_eligible,
    evenly_spaced,
    load_corpus,
    pick_candidate,
    smollm2_sweep,
    train_and_prune,
)
from descentlab.io import load_arrays
from descentlab.models.gpt2 import GPT2LMConfig
from descentlab.optim.config import OptimizerConfig
from descentlab.report.results import Results
from descentlab.report.sparse_lm import summarise
from descentlab.train.jobs import JobRunner
from descentlab.train.loop import TrainConfig
from descentlab.train.recipe import MethodConfig, methods_from_specs
from descentlab.train.rundir import RunDir
from descentlab.train.tuning import lr_alpha_grid

SPECS: dict[str, str] = {
    "adamw": "",
    "horst": "optimizer.name=horst optimizer.alpha=10.0 optimizer.beta=0.0",
    "ham": "optimizer.name=ham optimizer.alpha=200.0 optimizer.beta=1e-3",
    "adamw-l2": "optimizer.weight_decay=0.5",
}
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")  # it names checkpoint folders and job cache files

__all__ = ["CONFIG", "PRESETS", "SparseLMConfig", "load_corpus", "run"]


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
        specs: label -> override spec of ``method`` (:func:`~descentlab.train.recipe.with_overrides`);
            ``adamw-l2`` is AdamW with weight decay 0.5 (the L2-shrink baseline).
        methods: the labels of ``specs`` to train, in this order.
        sparsities: one-shot layer-wise pruning levels; they must hold ``claim_low`` and ``claim_high``.
        max_train_blocks: cap on training blocks (None: the whole training split).
        eval_blocks: validation blocks (tuning and the seed-spread check), evenly spaced over the split.
        test_blocks: test blocks, evenly spaced over the split (None: all): the bootstrap's block axis.
        eval_batch_size: blocks per evaluation forward pass.
        tune: choose lr / α on the validation split (seed ``seeds[0]``) before the final runs.
        tune_lr: the lr candidates (of ``lr_from``'s method, or of every method without ``lr_from``).
        tune_alpha: label -> α candidates (a label without them keeps its own α).
        lr_from: with ``tune``, the label whose lr is tuned first; the others take it and tune α only.
        lr_first: with ``tune`` and no ``lr_from``: each method tunes its lr at its own α first, then its α
            at that lr (a coordinate search; the choice is the best of all the candidates it ran). False:
            the joint lr x α grid.
        tune_on: the tuning criterion: the validation log-ppl at this sparsity (0: dense; one of
            ``sparsities``), or with null the mean over the pruned levels, which can reward a worse dense model.
        tune_dense_within: with ``tune``, only candidates whose dense validation perplexity is within this
            fraction of their grid's best compete (e.g. 0.03: 3 %); null: every candidate
            (:func:`~descentlab.experiments._sparse_lm_jobs.pick_candidate`).
        claim_low, claim_high: the sparsities of the gap-widens and control claims (high: also HORST vs HAM).
        seed_spread: the limit of the seed-spread check: (max - min) / mean of the dense validation
            perplexity over seeds, per method.
        small_weight: the histogram claim's threshold (fraction of block weights with |w| below it).
        n_boot: bootstrap replicates of every claim's CI.
        smollm2: also prune the pretrained SmolLM2 (skipped with a note when the asset is missing).
        smollm2_blocks: test blocks (of ``model.n_positions`` SmolLM2 tokens) for the SmolLM2 row.
        seeds: one training run per method and seed (seed = init + data order).
        workers: training jobs run in parallel processes (each job is seeded on its own, so the numbers
            do not depend on this beyond float summation order).
        threads: torch threads per job (None: torch's default with one worker, 1 with several).
        train: loop settings; the budget is ``train.max_steps`` (or ``train.epochs``).
    """

    corpus: str = "austen"
    corpus_max_chars: int | None = None
    tokenizer: str = "bpe"
    bpe_vocab: int = 2048
    model: GPT2LMConfig = field(
        default_factory=lambda: GPT2LMConfig(n_layer=4, n_embd=128, n_head=4, n_positions=64)
    )
    method: MethodConfig = field(default_factory=_base_method)
    specs: dict[str, str] = field(default_factory=lambda: dict(SPECS))
    methods: list[str] = field(default_factory=lambda: ["adamw", "horst", "ham"])
    sparsities: list[float] = field(default_factory=lambda: [0.5, 0.6, 0.7, 0.8, 0.9])
    max_train_blocks: int | None = None
    eval_blocks: int = 512
    test_blocks: int | None = 512
    eval_batch_size: int = 64
    tune: bool = False
    tune_lr: list[float] = field(default_factory=lambda: [1.5e-3, 3e-3, 6e-3])
    tune_alpha: dict[str, list[float]] = field(
        default_factory=lambda: {"horst": [1.0, 3.0, 10.0, 30.0], "ham": [50.0, 200.0, 1000.0]}
    )
    lr_from: str | None = "adamw"
    lr_first: bool = False
    tune_on: float | None = None
    tune_dense_within: float | None = None
    claim_low: float = 0.5
    claim_high: float = 0.9
    seed_spread: float = 0.03
    small_weight: float = 1e-3
    n_boot: int = 2000
    smollm2: bool = True
    smollm2_blocks: int = 16
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    workers: int = 1
    threads: int | None = None
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(max_steps=3000, batch_size=16, grad_clip=1.0, log_every=100)
    )

    def __post_init__(self) -> None:
        if not self.methods:
            raise ConfigError(f"methods must name at least one of the specs {sorted(self.specs)}")
        for key, names in (("methods", self.methods), ("tune_alpha", list(self.tune_alpha))):
            unknown = sorted(set(names) - set(self.specs))
            if unknown:
                raise ConfigError(
                    f"{key} names unknown methods {unknown}; the specs define {sorted(self.specs)}"
                )
        methods_from_specs(self.method, self.specs)  # validates every spec, naming it
        bad = [label for label in self.specs if not _LABEL.fullmatch(label)]
        if bad:
            raise ConfigError(f"method labels {bad} must match {_LABEL.pattern}: they name folders")
        if not self.sparsities or any(not 0.0 < s < 1.0 for s in self.sparsities):
            raise ConfigError(f"sparsities must lie in (0, 1), got {self.sparsities}; e.g. [0.5,0.7,0.9]")
        for key in ("claim_low", "claim_high"):
            if getattr(self, key) not in self.sparsities:
                raise ConfigError(f"{key}={getattr(self, key)} is not in sparsities {self.sparsities}")
        if self.tune_on is not None and self.tune_on not in (0.0, *self.sparsities):
            raise ConfigError(f"tune_on={self.tune_on} must be 0 (dense), one of sparsities or null")
        if self.tune_dense_within is not None and not self.tune_dense_within > 0:
            raise ConfigError(f"tune_dense_within={self.tune_dense_within} must be > 0 (e.g. 0.03) or null")
        if self.claim_low >= self.claim_high:
            raise ConfigError(f"claim_low={self.claim_low} must be below claim_high={self.claim_high}")
        if not self.seeds or self.eval_blocks < 1 or self.workers < 1:
            raise ConfigError("need at least one seed, eval_blocks >= 1 and workers >= 1")
        if self.test_blocks is not None and self.test_blocks < 1:
            raise ConfigError(f"test_blocks must be >= 1 or null, got {self.test_blocks}")
        if self.lr_first and self.lr_from is not None:
            raise ConfigError(
                f"lr_first=true tunes every method's own lr: it needs lr_from=null, not {self.lr_from!r}"
            )
        if self.lr_from is not None and self.tune and self.lr_from not in self.methods:
            raise ConfigError(f"lr_from={self.lr_from!r} must be one of methods {self.methods} (or null)")
        if self.tune and (not self.tune_lr or any(lr <= 0 for lr in self.tune_lr)):
            raise ConfigError(f"tune_lr must list positive learning rates, got {self.tune_lr}")
        if not (0 < self.seed_spread < 1 and self.small_weight > 0 and self.n_boot >= 100):
            raise ConfigError("seed_spread must lie in (0, 1), small_weight be > 0 and n_boot >= 100")

    def method_configs(self) -> dict[str, MethodConfig]:
        """The methods to train, by label, in ``methods`` order."""
        return methods_from_specs(self.method, {label: self.specs[label] for label in self.methods})


CONFIG = SparseLMConfig

PRESETS: dict[str, dict] = {
    # a couple of minutes on 2 idle cores: a 2-layer width-96 model, 400 steps, two seeds, no tuning
    "quick": {
        "model.n_layer": 2,
        "model.n_embd": 96,
        "train.max_steps": 400,
        "seeds": [0, 1],
        "eval_blocks": 128,
        "test_blocks": 128,
        "sparsities": [0.5, 0.7, 0.9],
        "smollm2": False,
        "n_boot": 500,
        "workers": 2,
        "threads": 1,
    },
    # 4x128 GPT-2, 3 seeds, the L2-shrink baseline; each method tunes its lr (at alpha 3 / 200), then its
    # alpha at that lr, on seed 0, by the 90 % validation ppl among candidates within 3 % of its best dense
    # one; bf16 autocast (1.6x faster, same dense ppl in a pilot); 24 jobs, about 55 min on 2 idle cores
    "full": {
        "methods": ["adamw", "horst", "ham", "adamw-l2"],
        "specs.horst": "optimizer.name=horst optimizer.alpha=3.0 optimizer.beta=0.0",
        "tune": True,
        "lr_from": None,
        "lr_first": True,
        "tune_lr": [2e-3, 4e-3, 8e-3],
        "tune_alpha.horst": [1.0, 3.0, 10.0],
        "tune_alpha.ham": [50.0, 200.0, 1000.0],
        "tune_on": 0.9,
        "tune_dense_within": 0.03,
        "train.max_steps": 3000,
        "train.mixed_precision": "bf16",
        "smollm2_blocks": 8,
        "workers": 2,
        "threads": 1,
        "train.progress": False,
    },
}


def run(cfg: SparseLMConfig, run: RunDir) -> dict:
    # 1. data: the tokenizer learns from the training split only; blocks are fixed-length and deterministic
    splits = load_corpus(cfg)
    tok = make_tokenizer(cfg.tokenizer, splits["train"], BPEConfig(vocab_size=cfg.bpe_vocab))
    ctx = cfg.model.n_positions
    train_blocks = lm_blocks(tok, splits["train"], ctx, max_blocks=cfg.max_train_blocks).blocks
    val_blocks = evenly_spaced(lm_blocks(tok, splits["validation"], ctx).blocks, cfg.eval_blocks)
    test_blocks = evenly_spaced(lm_blocks(tok, splits["test"], ctx).blocks, cfg.test_blocks)
    data = {"train": train_blocks, "val": val_blocks, "test": test_blocks, "vocab": tok.vocab_size}
    data["eos"] = tok.eos_id

    # 2. the validation grid on the first seed (with lr_from: that method's lr, then the others' α at it),
    # then every (method, seed) at the chosen settings; finished jobs come from the job cache on resume
    methods, seed0 = cfg.method_configs(), cfg.seeds[0]
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
                later = trials(list(methods), cfg.tune_lr)
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

    # 3. results: test perplexity curves with CIs, the claims from the per-block test NLLs
    cells = {k: _cells(run, jobs_) for k, jobs_ in final.items()}
    criterion = criterion_text(cfg.tune_on, cfg.tune_dense_within)
    keys = ("claim_low", "claim_high", "seed_spread", "small_weight", "n_boot", "smollm2")
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
            "pruning": "one-shot, layer-wise magnitude, block Linear/Conv1D weights; embeddings and head dense",
            "claims": f"paired bootstrap over (seeds x test blocks), {cfg.n_boot} replicates; damage-ols: OLS "
            f"over {len(every)} runs; seed-spread limit {100 * cfg.seed_spread:g} %",
        },
        methods=body["methods"],
        tables=body["tables"],
        notes=body["notes"],
        # figure data: report/sparse_lm.py draws the histograms from these files
        extra={
            "arrays": {
                "weights": {k: runs[0]["weights"] for k, runs in final.items() if runs[0]["weights"]},
                "nll": {k: [r["nll"] for r in runs] for k, runs in final.items()},
            },
            "claims": body["claims"],
            "checks": body["checks"],
            "selection": body["selection"],
            "runs": body["runs"],
        },
    ).to_dict()


def _cells(run: RunDir, jobs: list[dict]) -> torch.Tensor:
    """``[seeds, levels, test blocks]`` per-block test NLLs of one method's final runs, from the saved arrays."""
    return torch.stack([torch.as_tensor(load_arrays(run.path / j["nll"])["test"]) for j in jobs])
