"""sparse-vit's config: the study's settings, its presets and the design a run of them measures (the claims
it judges are in ``claims.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from descentlab.errors import ConfigError
from descentlab.models.vit import ViTSpec
from descentlab.optim.config import OptimizerConfig
from descentlab.sparsity import ACDCConfig
from descentlab.study.cells import Design
from descentlab.study.tuning_rules import check_equal_budgets, check_tune_seed
from descentlab.train.loop import TrainConfig
from descentlab.train.recipe import MethodConfig, check_method_names, methods_from_specs

NAME = "sparse-vit"
PAPER_LIKE_METHODS = ("adamw", "horst")  # the methods of the paper-like arm
DENSE, PAPER_LIKE = "dense", "paper-like"  # the conditions of the dense reference and of the paper-like arm
# the weights a job saves: before the final pruning, and at the end
BEFORE, FINAL = "before_final_pruning", "final"
TIMM_SHAPE = ("depth", "embed_dim", "num_heads", "patch_size")  # TimmSetup's overrides of the model's sizes


@dataclass
class TimmSetup:
    """The timm model and data pipeline of sparse-vit, DeiT's recipe by default (all unused while ``model`` is
    None: the small ``transformers`` ViT of ``vit`` on the tensors of ``dataset``)."""

    model: str | None = None  # a timm model name: deit_small_patch16_224, deit_base_patch16_224, ...
    img_size: int = 224  # input resolution (crop size) of training and evaluation
    # TIMM_SHAPE: overrides of the model's own sizes (None: the model's), a small model of the same
    # architecture, e.g. for a CPU check
    depth: int | None = None
    embed_dim: int | None = None
    num_heads: int | None = None
    patch_size: int | None = None
    drop_path: float = 0.1  # stochastic depth rate
    activation_checkpointing: bool = False  # recompute each block in backward: less memory, ~30 % more time
    auto_augment: str | None = "rand-m9-mstd0.5-inc1"  # timm's RandAugment policy string; None: off
    re_prob: float = 0.25  # random-erasing probability
    scale_min: float = 0.08  # the smallest area fraction of the random resized crop
    mixup: float = 0.8  # the Mixup and CutMix alphas (0: off)
    cutmix: float = 1.0
    label_smoothing: float = 0.1  # of the soft targets
    eval_crop_pct: float = 0.875  # evaluation resizes to img_size / eval_crop_pct, then centre-crops img_size
    eval_batch_size: int = 256  # images per evaluation batch

    def __post_init__(self) -> None:
        sizes = {k: getattr(self, k) for k in ("img_size", *TIMM_SHAPE, "eval_batch_size")}
        if any(v is not None and v < 1 for v in sizes.values()):
            raise ConfigError(f"timm sizes and eval_batch_size must be >= 1, got {sizes}")
        fractions = {k: getattr(self, k) for k in ("drop_path", "re_prob", "label_smoothing")}
        if any(not 0.0 <= v < 1.0 for v in fractions.values()):
            raise ConfigError(
                f"timm.drop_path, re_prob and label_smoothing must lie in [0, 1), got {fractions}"
            )
        if not 0.0 < self.scale_min <= 1.0 or not 0.0 < self.eval_crop_pct <= 1.0:
            raise ConfigError("timm.scale_min and timm.eval_crop_pct must lie in (0, 1]")
        if self.mixup < 0 or self.cutmix < 0:
            raise ConfigError(f"timm.mixup and timm.cutmix must be >= 0, got {self.mixup}, {self.cutmix}")


@dataclass
class SparseViTConfig:
    """The sparse-vit study.

    Attributes:
        method: what every method shares (objective, optimizer settings).
        acdc: the AC/DC settings every sparse run shares (``acdc.prune``: which weights); ``acdc.sparsity``
            is set per job from ``sparsities``; a method's spec may edit it (``acdc.reset_moments=true``).
        specs: label -> override spec of ``method`` (``with_overrides`` syntax), one per known method.
        methods: labels of ``specs`` to train, in that order.
        dense: label of the method also trained dense (AC/DC off) as the reference; null: none.
        tune_lr, tune_alpha: the validation grid (lr x α per label; a label without α candidates keeps its
            own α); used when ``tune`` is true. A chosen value at an edge of its grid is flagged in a note.
        tune_lr_by: label -> its own lr candidates, replacing ``tune_lr`` for that label (e.g. AdamW tunes 4
            lrs where HORST and HAM tune 2 lrs x 2 α). Every compared method gets the same number of
            candidates (``check_equal_budgets``); a method with one candidate is not tuned.
        tune_seed: the seed every tuning run trains from; never one of ``seeds`` or ``paper_like_seeds``, and
            no tuning run is reported.
        lr_from: with tuning, the label whose lr is tuned (over its lrs) first; every other method takes
            its chosen lr and tunes α only (null: every method tunes lr x α).
        claim_sparsity: the sparsity of the primary endpoint (HORST against AdamW), of HORST against HAM and
            of the weight-shape claims (one of ``sparsities``).
        small_weight: the weight-shape claim's threshold: the fraction of prunable weights with |w| below it.
        paper_like_sparsity, paper_like_seeds: the paper-like arm: AdamW and HORST (their chosen settings)
            with AC/DC over the block Linears only (``acdc.prune=blocks``) at this sparsity, one run per
            seed; no seeds: no such arm (its claim is then pending).
        workers, threads: (spawned) job processes, and torch threads in each (0: torch's default).
        timm: a timm model (DeiT) on the image folder ``dataset`` in place of the small ViT of ``vit``
            (:class:`TimmSetup`; the ``paper`` preset).
    """

    dataset: str = "fashion_mnist"
    n_train: int = 20000
    n_val: int = 2000
    n_test: int = 5000
    split_seed: int = 1234  # the validation split is fixed across training seeds
    vit: ViTSpec = field(default_factory=ViTSpec)
    method: MethodConfig = field(
        default_factory=lambda: MethodConfig(
            optimizer=OptimizerConfig(name="adamw", lr=1e-3, weight_decay=0.05, decay="all")
        )
    )
    acdc: ACDCConfig = field(default_factory=lambda: ACDCConfig(unit="epochs"))
    specs: dict[str, str] = field(
        default_factory=lambda: {
            "adamw": "",
            "horst": "optimizer.name=horst optimizer.alpha=1.0 optimizer.beta=0.0",
            "ham": "optimizer.name=ham optimizer.alpha=200.0 optimizer.beta=0.001",
        }
    )
    methods: list[str] = field(default_factory=lambda: ["adamw", "horst", "ham"])
    dense: str | None = "adamw"
    sparsities: list[float] = field(default_factory=lambda: [0.7, 0.8, 0.9])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    tune: bool = False
    tune_sparsity: float = 0.9
    tune_lr: list[float] = field(default_factory=lambda: [1e-3, 3e-3])
    tune_alpha: dict[str, list[float]] = field(
        default_factory=lambda: {"horst": [1.0, 10.0], "ham": [50.0, 200.0]}
    )
    tune_lr_by: dict[str, list[float]] = field(default_factory=dict)
    tune_seed: int = 1000
    lr_from: str | None = None
    claim_sparsity: float = 0.9
    small_weight: float = 1e-3
    paper_like_sparsity: float = 0.9
    paper_like_seeds: list[int] = field(default_factory=list)
    histogram_bins: int = 80
    workers: int = 1
    threads: int = 1
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(
            epochs=8, batch_size=64, grad_clip=1.0, log_every=50, progress=False
        )
    )
    timm: TimmSetup = field(default_factory=TimmSetup)

    def __post_init__(self) -> None:
        if min(self.n_train, self.n_val, self.n_test) < 1:
            raise ConfigError("n_train, n_val and n_test must be >= 1")
        bad = [s for s in [*self.sparsities, self.tune_sparsity] if not 0.0 < s < 1.0]
        if bad or not self.sparsities:
            raise ConfigError(f"sparsities must lie in (0, 1), got {bad}; e.g. sparsities=[0.7,0.8,0.9]")
        if not self.seeds:
            raise ConfigError("seeds must list at least one seed")
        check_method_names(
            self.specs,
            methods=self.methods,
            tune_alpha=list(self.tune_alpha),
            tune_lr_by=list(self.tune_lr_by),
        )
        bad_lrs = [lrs for lrs in [self.tune_lr, *self.tune_lr_by.values()] if not lrs or min(lrs) <= 0]
        if bad_lrs:
            raise ConfigError(f"every lr grid needs at least one value > 0, got {bad_lrs[0]}")
        check_tune_seed(self.tune_seed, self.seeds, self.paper_like_seeds)
        if self.dense is not None and self.dense not in self.specs:
            raise ConfigError(f"dense={self.dense!r} is not a method; choose one of {sorted(self.specs)}")
        if self.tune and self.lr_from is not None and self.lr_from not in self.methods:
            raise ConfigError(f"lr_from={self.lr_from!r} must be one of methods {self.methods} (or null)")
        if self.tune and self.lr_from is not None and (others := set(self.tune_lr_by) - {self.lr_from}):
            raise ConfigError(
                f"tune_lr_by names {sorted(others)}, but with lr_from={self.lr_from!r} they take its lr: "
                "set lr_from=null to tune every method's own lr"
            )
        if self.tune:
            check_equal_budgets(self.tuning_grids())
        if self.claim_sparsity not in self.sparsities:
            raise ConfigError(f"claim_sparsity={self.claim_sparsity} is not in sparsities {self.sparsities}")
        if not self.small_weight > 0:
            raise ConfigError(f"small_weight must be > 0, got {self.small_weight}")
        if not 0.0 < self.paper_like_sparsity < 1.0:
            raise ConfigError(f"paper_like_sparsity must lie in (0, 1), got {self.paper_like_sparsity}")
        if self.paper_like_seeds and not set(PAPER_LIKE_METHODS) <= set(self.methods):
            raise ConfigError(
                f"paper_like_seeds needs methods to hold {list(PAPER_LIKE_METHODS)}, got {self.methods}"
            )
        # a bad override spec or AC/DC schedule (phases vs the run) fails here, before any run directory
        total, per_epoch = self.train.total_steps(self.n_train), -(-self.n_train // self.train.batch_size)
        for method in self.compared(list(self.specs)).values():
            if method.acdc is not None:
                method.acdc.phases(total, per_epoch)

    def tuning_lrs(self, label: str) -> list[float]:
        """The lr candidates of ``label``: its ``tune_lr_by`` entry, else ``tune_lr``."""
        return list(self.tune_lr_by.get(label, self.tune_lr))

    def tuning_grids(self) -> dict[str, list[tuple[float | None, float | None]]]:
        """Per method, the (lr, α) pairs it tunes over (None: the value it takes, not tunes): lr x α, or with
        ``lr_from`` that method's lrs x α and α alone for the others."""
        grids = {}
        for label in self.methods:
            alphas: list[float | None] = list(self.tune_alpha.get(label, [])) or [None]
            shared = self.lr_from is not None and label != self.lr_from
            lrs: list[float | None] = [None] if shared else list(self.tuning_lrs(label))
            grids[label] = [(lr, a) for lr in lrs for a in alphas]
        return grids

    def compared(self, labels: list[str] | None = None) -> dict[str, MethodConfig]:
        """The methods ``labels`` (default: ``methods``) as MethodConfigs, with the shared AC/DC."""
        labels = labels or self.methods
        base = replace(self.method, acdc=self.method.acdc or self.acdc)
        return methods_from_specs(base, {label: self.specs[label] for label in labels})


def design(cfg: SparseViTConfig) -> Design:
    """The cells a run of ``cfg`` measures: every method at every sparsity and the ``dense`` arm at
    :data:`DENSE`, on ``seeds``; with ``paper_like_seeds``, AdamW and HORST at :data:`PAPER_LIKE` on those
    seeds. ``extra`` holds what the claims read beside the cells: the levels, the dense arm and the
    prunable set ``acdc.prune``."""
    dense = [cfg.dense] if cfg.dense else []
    paper = {PAPER_LIKE: cfg.paper_like_seeds} if cfg.paper_like_seeds else {}
    return Design(
        arms=tuple(dict.fromkeys([*cfg.methods, *dense])),
        conditions=(*cfg.sparsities, *([DENSE] if dense else []), *paper),
        seeds=cfg.seeds,
        examples=cfg.n_test,
        extra={
            "claim_sparsity": cfg.claim_sparsity,
            "paper_like_sparsity": cfg.paper_like_sparsity,
            "dense": cfg.dense,
            "prune": cfg.acdc.prune,
        },
        condition_seeds=paper,
    )


# The primary endpoint's run: every Linear/Conv weight prunable, at 99 % (with the block Linears only,
# or below 98 %, AC/DC costs AdamW < 3 points here: docs/sparse-vit.md, "Regime"). One level only, so that
# 8 fresh evaluation seeds fit the hour; its protocol, cost and power: docs/results/sparse-vit.md.
FULL = {
    "n_train": 55000,
    "n_val": 5000,
    "n_test": 10000,
    "vit.hidden_size": 64,
    "vit.num_layers": 3,
    "sparsities": [0.99],
    "claim_sparsity": 0.99,
    "tune_sparsity": 0.99,
    "seeds": [100, 101, 102, 103, 104, 105, 106, 107],
    "tune_seed": 1000,
    "train.max_steps": 6000,
    "method.optimizer.lr": 2e-3,
    "method.optimizer.schedule": "warmup_cosine",
    "method.optimizer.warmup_frac": 0.05,
    # AC/DC in steps: the reference fractions (10 / 5 / 10 / 15 %) of 6,000 steps
    "acdc.prune": "all",
    "acdc.unit": "steps",
    "acdc.warmup": 600,
    "acdc.phase": 300,
    "acdc.last_decompressed": 600,
    "acdc.final": 900,
    "acdc.min_phase_steps": 300,
    # 4 candidates per method, each tuning its own lr on tune_seed: AdamW 4 lrs (the last run chose 4e-3,
    # the top of its grid), HORST and HAM 2 lrs x their 2 best α on validation in the last run
    "tune": True,
    "tune_lr": [3e-3, 6e-3],
    "tune_lr_by": {"adamw": [2e-3, 4e-3, 6e-3, 8e-3]},
    "tune_alpha": {"horst": [0.3, 1.0], "ham": [200.0, 1000.0]},
    "threads": 1,
    "workers": 2,
}

PRESETS = {
    "quick": {
        "n_train": 4000,
        "n_val": 500,
        "n_test": 2000,
        "vit.hidden_size": 64,
        "vit.num_layers": 2,
        "sparsities": [0.9],
        "seeds": [0],
        "train.epochs": 5,
        "method.optimizer.lr": 2e-3,
        "specs.horst": "optimizer.name=horst optimizer.alpha=10.0 optimizer.beta=0.0",
        "specs.ham": "optimizer.name=ham optimizer.alpha=200.0 optimizer.beta=0.001",
        "threads": 1,
        "workers": 1,
    },
    "full": FULL,
    # The paper-like arm as its own run: AC/DC over the block Linears only (this project's choice for ViTs;
    # the paper does not state its prunable set) at 90 %, everything else as in ``full``, each method tuned
    # in this setting, then 6 fresh evaluation seeds (the power is in claims.py). The grids bracket 2e-3 from
    # above: in the earlier protocol's validation scores in this setting (commit cf00da3, seed 0) AdamW was
    # best at lr 2e-3 of {1, 2, 4}e-3, HORST's two best α were 1 and 10, HAM's 1000 and 200, all at lr 2e-3
    "full-paper-like": FULL
    | {
        "acdc.prune": "blocks",
        "sparsities": [0.9],
        "claim_sparsity": 0.9,
        "tune_sparsity": 0.9,
        "paper_like_sparsity": 0.9,
        "seeds": [200, 201, 202, 203, 204, 205],
        "tune_lr": [2e-3, 3e-3],
        "tune_lr_by": {"adamw": [1.5e-3, 2e-3, 3e-3, 4e-3]},
        "tune_alpha": {"horst": [1.0, 10.0], "ham": [200.0, 1000.0]},
    },
    # The other levels, and the primary again on 6 fresh seeds: AdamW and HORST untuned at what `full` chose
    # at 99 %, no HAM and no dense run (docs/results/sparse-vit.md, `full-levels`)
    "full-levels": FULL
    | {
        "methods": ["adamw", "horst"],
        "dense": None,
        "sparsities": [0.98, 0.99, 0.995],
        "seeds": [300, 301, 302, 303, 304, 305],
        "tune": False,
        "method.optimizer.lr": 8e-3,
        "specs.horst": "optimizer.name=horst optimizer.alpha=1.0 optimizer.beta=0.0 optimizer.lr=3e-3",
    },
    # The moonshot's search at width 128 (a regime where HORST leads AdamW by >= 2 points at >= 95 %), on
    # tuning seeds only: 4 candidates each on tune_seed 1000, every chosen setting then once from seed 1001
    # (no preset's evaluation seed); the rule declared before it ran and its outcome:
    # docs/results/sparse-vit.md, "Moonshot"
    "moonshot-search-w128": FULL
    | {
        "vit.hidden_size": 128,
        "methods": ["adamw", "horst"],
        "dense": None,
        "seeds": [1001],
        "tune_lr": [1.5e-3, 3e-3],
        "tune_lr_by": {"adamw": [1e-3, 2e-3, 4e-3, 8e-3]},
        "tune_alpha": {"horst": [0.3, 1.0]},
    },
    # DeiT on ImageNet with AC/DC at 70 / 80 / 90 %, on one GPU (docs/paper-scale.md, generated from this
    # preset). dataset= an ImageNet-style folder (train/<class>/*.JPEG, val/<class>/*.JPEG);
    # timm.model=deit_small_patch16_224 (default here) or deit_base_patch16_224, random init. DeiT's recipe
    # through timm: 300 epochs at batch 1,024 (256 x 4 accumulated), AdamW lr 1e-3 (5e-4 x 1024 / 512), wd
    # 0.05 on matrices, 5 warm-up epochs then cosine, bf16, RandAugment m9, random erasing 0.25, Mixup 0.8 /
    # CutMix 1.0, label smoothing 0.1, drop path 0.1, 224 px; 10 loader workers. AC/DC on the reference
    # schedule scaled to the run: dense 10 %, alternating 5 % phases, decompressed 10 %, compressed 15 % to
    # the end. The prunable set is every Linear/Conv weight (patch projection, block Linears, head), because
    # that is the set the primary endpoint (horst-adamw, claims.py) was declared on: a block-Linear run could
    # never judge it. The block Linears (this project's choice for ViTs; the paper does not state its prunable
    # set) are the paper-like arm: AdamW and HORST at their chosen settings, block Linears at 90 %, on the
    # same evaluation seeds (paper_like_seeds), which judges the paper-like row. 10,000 training images held
    # out for tuning (tuning seed 1000, at 90 %): AdamW 2 lrs, HORST and HAM 2 alphas at the DeiT lr; then 3
    # evaluation seeds on ImageNet val (the test split): 6 tuning + 27 sparse + 3 dense + 6 paper-like = 42
    # runs. Seeds: the full run's 8 per-seed differences HORST - AdamW had sd 0.71 points (claims.py), 0.96 at
    # its 80 % upper bound; at that sd 3 seeds detect (t_0.975,2 + t_0.8,2) * 0.96 / sqrt(3) = 2.98 points
    # with 80 % power, under the paper's +7.97, and 10 seeds would be needed for the 1-point smallest effect
    # of interest (seeds=[0,...,9])
    "paper": {
        "dataset": "imagenet",
        "n_train": 1_271_167,
        "n_val": 10_000,
        "n_test": 50_000,
        "timm.model": "deit_small_patch16_224",
        "timm.img_size": 224,
        "sparsities": [0.7, 0.8, 0.9],
        "claim_sparsity": 0.9,
        "tune_sparsity": 0.9,
        "paper_like_sparsity": 0.9,
        "seeds": [0, 1, 2],
        "paper_like_seeds": [0, 1, 2],
        "tune": True,
        "tune_seed": 1000,
        "lr_from": None,
        "tune_lr": [1e-3],
        "tune_lr_by": {"adamw": [5e-4, 1e-3]},
        "tune_alpha": {"horst": [1.0, 10.0], "ham": [50.0, 200.0]},
        "method.optimizer.lr": 1e-3,
        "method.optimizer.weight_decay": 0.05,
        "method.optimizer.decay": "matrices",
        "method.optimizer.schedule": "warmup_cosine",
        "method.optimizer.warmup_frac": 0.0167,
        "acdc.prune": "all",
        "acdc.unit": "steps",
        "acdc.min_phase_steps": 1000,
        "train.epochs": 300,
        "train.batch_size": 256,
        "train.grad_accum_steps": 4,
        "train.mixed_precision": "bf16",
        "train.loader_workers": 10,
        "train.log_every": 100,
        "train.checkpoint_every": 2000,
        "workers": 1,
        "threads": 0,
    },
}


CONFIG = SparseViTConfig
