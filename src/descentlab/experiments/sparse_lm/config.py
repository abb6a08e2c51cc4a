"""sparse-lm's config: the study's settings (methods as ``specs`` over one base method) and presets; the
claims it judges are in ``claims.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from descentlab.errors import ConfigError
from descentlab.models.gpt2 import GPT2LMConfig
from descentlab.optim.config import OptimizerConfig
from descentlab.study.cells import Design
from descentlab.study.tuning_rules import check_equal_budgets, check_tune_seed
from descentlab.train.loop import TrainConfig
from descentlab.train.recipe import MethodConfig, check_method_names, methods_from_specs

SPECS: dict[str, str] = {
    "adamw": "",
    "horst": "optimizer.name=horst optimizer.alpha=10.0 optimizer.beta=0.0",
    "ham": "optimizer.name=ham optimizer.alpha=200.0 optimizer.beta=1e-3",
    "adamw-l2": "optimizer.weight_decay=0.5",
    # a large mirror strength: the weight-shape claims also read it when it is among ``methods``
    "horst-a30": "optimizer.name=horst optimizer.alpha=30.0 optimizer.beta=0.0",
}


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
        method: the base method (ERM with AdamW; weight decay on matrices only, biases and norms get none).
        specs: label -> override spec of ``method`` (:func:`~descentlab.train.recipe.with_overrides`);
            ``adamw-l2`` is AdamW with weight decay 0.5 (the L2-shrink baseline).
        methods: the labels of ``specs`` to train, in this order.
        sparsities: one-shot layer-wise pruning levels; they must hold ``claim_low`` and ``claim_high``.
        max_train_blocks: cap on training blocks (None: the whole training split).
        eval_blocks: validation blocks (tuning and the seed-spread check), evenly spaced over the split.
        test_blocks: test blocks, evenly spaced over the split (None: all): the bootstrap's block axis.
        eval_batch_size: blocks per evaluation forward pass.
        tune: choose lr / α on the validation split (seed ``tune_seed``) before the final runs.
        tune_seed: the training seed of every tuning run; never an evaluation seed (not in ``seeds``), so
            no evaluation run is the one its settings were chosen on.
        tune_lr: the lr candidates (of ``lr_from``'s method, or of every method without ``lr_from``).
        tune_lr_by: label -> that method's own lr candidates, in place of ``tune_lr`` (joint grid only), so
            that a method with no α (AdamW) can get as many candidates as one that tunes lr x α.
        tune_alpha: label -> α candidates (a label without them keeps its own α).
        tune_weight_decay: label -> weight-decay candidates, crossed with its lrs in the joint grid: AdamW's
            own shrinkage axis, as α is HORST's and HAM's (0.5 is the strong-L2 baseline).
        lr_from: with ``tune``, the label whose lr is tuned first; the others take it and tune α only.
        lr_first: with ``tune`` and no ``lr_from``: each method tunes its lr at its own α first, then its α
            at that lr (a coordinate search; the choice is the best of all the candidates it ran). False:
            the joint lr x α grid, where every method must get the same number of candidates
            (:meth:`candidate_counts`; the equal-budget rule of a judged run).
        tune_on: the tuning criterion: the validation log-ppl at this sparsity (0: dense; one of
            ``sparsities``), or with null the mean over the pruned levels, which can reward a worse dense model.
        tune_dense_within: with ``tune``, only candidates whose dense validation perplexity is within this
            fraction of their grid's best compete (e.g. 0.03: 3 %); null: every candidate
            (:func:`~descentlab.experiments.sparse_lm.run.choose`).
        claim_low, claim_high: the sparsities of the claims (``claims.py``): high is the primary endpoint's
            (HORST against AdamW), low the reference of the gap-widens, damage and control claims.
        seed_spread: the limit of the seed-spread check: (max - min) / mean of the dense validation
            perplexity over seeds, per method.
        small_weight: the histogram claim's threshold (fraction of block weights with |w| below it).
        smollm2: also prune the pretrained SmolLM2 (skipped with a note when the asset is missing).
        smollm2_blocks: test blocks (of ``model.n_positions`` SmolLM2 tokens) for the SmolLM2 row.
        seeds: the evaluation seeds: one training run per method and seed (seed = init + data order).
        workers: training jobs run in parallel processes (each job is seeded on its own, so the numbers
            do not depend on this beyond float summation order).
        threads: torch threads per job (None: torch's default with one worker, 1 with several).
        train: loop settings; the budget is ``train.max_steps`` (or ``train.epochs``).
        token_cache: tokenize each split once into a memory-mapped token file next to the corpus and train
            from it (:func:`~descentlab.experiments.sparse_lm.jobs.load_data`; ``corpus`` may then be
            ``hf:<dataset id>``, streamed with ``DESCENTLAB_ONLINE=1``); needs ``tokenizer=gpt2`` or a
            tokenizer folder. False: the splits are read into RAM and tokenized at every start.
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
    tune_seed: int = 1000
    tune_lr: list[float] = field(default_factory=lambda: [1.5e-3, 3e-3, 6e-3])
    tune_lr_by: dict[str, list[float]] = field(default_factory=dict)
    tune_weight_decay: dict[str, list[float]] = field(default_factory=dict)
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
    smollm2: bool = True
    smollm2_blocks: int = 16
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    workers: int = 1
    threads: int | None = None
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(max_steps=3000, batch_size=16, grad_clip=1.0, log_every=100)
    )
    token_cache: bool = False

    def __post_init__(self) -> None:
        grids = {k: list(getattr(self, k)) for k in ("tune_alpha", "tune_lr_by", "tune_weight_decay")}
        check_method_names(self.specs, methods=self.methods, **grids)
        methods_from_specs(self.method, self.specs)  # validates every spec, naming it
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
        if not (0 < self.seed_spread < 1 and self.small_weight > 0):
            raise ConfigError("seed_spread must lie in (0, 1) and small_weight be > 0")
        if self.tune:
            check_tune_seed(self.tune_seed, self.seeds)
        for key in ("tune_lr_by", "tune_weight_decay"):
            grid: dict[str, list[float]] = getattr(self, key)
            # an lr must be > 0; a weight decay of 0 (none) is a candidate like any other
            least_ok = (lambda x: x > 0) if key == "tune_lr_by" else (lambda x: x >= 0)
            if any(not xs or not all(least_ok(x) for x in xs) for xs in grid.values()):
                kind = "positive" if key == "tune_lr_by" else "non-negative"
                raise ConfigError(f"{key} must list {kind} values, got {grid}")
            if grid and (self.lr_from is not None or self.lr_first):
                raise ConfigError(f"{key} is for the joint grid: it needs lr_from=null and lr_first=false")
        if self.tune and self.lr_from is None and not self.lr_first:  # set tune_lr_by / tune_alpha to agree
            check_equal_budgets({k: range(n) for k, n in self.candidate_counts().items()})

    def lr_candidates(self, label: str) -> list[float]:
        """The lrs ``label`` tunes over in the joint grid: ``tune_lr_by[label]``, else ``tune_lr``."""
        return list(self.tune_lr_by.get(label, self.tune_lr))

    def candidate_counts(self) -> dict[str, int]:
        """Tuning candidates per method in the joint grid: ``|lrs| x max(1, |alphas|) x max(1, |decays|)``."""
        return {
            k: len(self.lr_candidates(k))
            * max(1, len(self.tune_alpha.get(k, [])))
            * max(1, len(self.tune_weight_decay.get(k, [])))
            for k in self.methods
        }

    def method_configs(self) -> dict[str, MethodConfig]:
        """The methods to train, by label, in ``methods`` order."""
        return methods_from_specs(self.method, {label: self.specs[label] for label in self.methods})


CONFIG = SparseLMConfig

# What the pilot and the judged runs share: the full preset's budget (1,500 steps in bf16 autocast) on the
# 2-core machine, 2 worker processes of 1 thread each, no per-step progress bar.
CPU_RUN = {
    "train.max_steps": 1500,
    "train.mixed_precision": "bf16",
    "workers": 2,
    "threads": 1,
    "train.progress": False,
}

# The judged runs' tuning: the joint grid with equal budgets (every optimizer crosses the preset's two lrs
# with two values of its own shrinkage: AdamW's weight decay, 0.5 the strong-L2 baseline; HORST's and HAM's
# α) on a tuning seed of its own, chosen at 90 % among the candidates within 3 % of the grid's best dense ppl.
JOINT_GRID = {
    "methods": ["adamw", "horst", "ham"],
    "tune": True,
    "tune_seed": 1000,
    "lr_from": None,
    "lr_first": False,
    "tune_weight_decay.adamw": [0.1, 0.5],
    "tune_alpha.horst": [3.0, 10.0],
    "tune_alpha.ham": [50.0, 200.0],
    "tune_on": 0.9,
    "tune_dense_within": 0.03,
}

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
        "workers": 2,
        "threads": 1,
    },
    # the pilot of the full preset's budget (its model, data and 1,500 steps), on seeds of its own (never
    # tuning or evaluation seeds): AdamW and HORST at fixed settings, for the per-seed spread of the primary
    # endpoint and the minimum detectable effect of the full run; 6 jobs, about 9 min on 2 idle cores
    "pilot": {
        "methods": ["adamw", "horst"],
        "method.optimizer.lr": 2e-3,
        "specs.horst": "optimizer.name=horst optimizer.alpha=3.0 optimizer.beta=0.0",
        "seeds": [900, 901, 902],
        "smollm2": False,
        **CPU_RUN,
    },
    # the joint grid (4 candidates per optimizer) on the tuning seed, then 8 fresh evaluation seeds; 36 jobs,
    # about 50 min on 2 idle cores. Declared before the run, with the pilot's sizing (docs/results/sparse-lm.md)
    "full": {
        **JOINT_GRID,
        "tune_lr": [2e-3, 4e-3],
        "seeds": [100, 101, 102, 103, 104, 105, 106, 107],
        "smollm2_blocks": 8,
        **CPU_RUN,
    },
    # the declared large-α arm of the weight-shape rows (a probe, not a tuned competitor), and the primary
    # endpoint again on seeds no run has used: no tuning, every method at what the full run chose (HORST α 10
    # at the same lr); 24 jobs, about 30 min on 2 idle cores. Its power: docs/results/sparse-lm.md
    "full-a30": {
        "methods": ["adamw", "horst", "horst-a30"],
        "tune": False,
        "method.optimizer.lr": 4e-3,
        "method.optimizer.weight_decay": 0.1,
        "seeds": [200, 201, 202, 203, 204, 205, 206, 207],
        "smollm2": False,
        **CPU_RUN,
    },
    # GPT-2 small (124M) on SlimPajama-6B, on one GPU (docs/paper-scale.md: the command, GPU hours and
    # memory, estimated), with GPT-2 small's batch and schedule: 524,288 tokens per step, 10,000 steps = 5.2 B
    # tokens (under one epoch); the corpus tokenized once to token files next to it (hf:... streams it with
    # DESCENTLAB_ONLINE=1). The joint grid as in full, then 5 evaluation seeds: 27 runs
    "paper": {
        "corpus": "hf:DKYoon/SlimPajama-6B",
        "tokenizer": "gpt2",
        "token_cache": True,
        "model.n_layer": 12,
        "model.n_embd": 768,
        "model.n_head": 12,
        "model.n_positions": 1024,
        "method.optimizer.lr": 6e-4,
        "method.optimizer.betas": [0.9, 0.95],
        "method.optimizer.weight_decay": 0.1,
        "method.optimizer.warmup_frac": 0.07,
        **JOINT_GRID,
        "tune_lr": [6e-4, 1.2e-3],
        "seeds": [100, 101, 102, 103, 104],
        "sparsities": [0.5, 0.6, 0.7, 0.8, 0.9],
        "eval_blocks": 512,
        "test_blocks": 2048,
        "eval_batch_size": 16,
        "smollm2": False,
        "train.max_steps": 10_000,
        "train.batch_size": 16,
        "train.grad_accum_steps": 32,
        "train.mixed_precision": "bf16",
        "train.log_every": 50,
        "train.checkpoint_every": 500,
        "workers": 1,
    },
}


def design(cfg: SparseLMConfig) -> Design:
    """The design record of a run of ``cfg`` (:mod:`descentlab.study.cells`): every method of ``methods`` at
    level 0 (dense) and every sparsity of ``sparsities`` (its conditions), on ``seeds``, with the claim
    levels and whether the run tunes (``extra``). The run adds what it measures: the number of test blocks
    (``test_blocks`` only caps it) and the tuning runs' validation grid (``extra["grid"]``)."""
    extra = {"claim_low": float(cfg.claim_low), "claim_high": float(cfg.claim_high), "tune": bool(cfg.tune)}
    return Design(tuple(cfg.methods), (0.0, *cfg.sparsities), tuple(cfg.seeds), None, extra)
