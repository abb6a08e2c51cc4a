"""llm-robustness's config: the model, data, methods, noise grid and evaluation, and the presets.

Every method trains once per evaluation seed (``seeds``) and is compared with ERM of the same seed. Every
choice is made on validation with ``tune_seed``, never an evaluation seed (:mod:`.run` lists the steps). The
primary endpoint (:mod:`.claims`) reads the gaussian level where ERM's perplexity grows ×3.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from descentlab.constrained.config import DescentConfig
from descentlab.data.causal_lm import CausalLMDataConfig
from descentlab.errors import ConfigError
from descentlab.evaluation.judge import PAIRWISE_TEMPLATE
from descentlab.optim.config import OptimizerConfig
from descentlab.perturbations.hooks import EMBEDDING_KINDS
from descentlab.readout import CausalLMReadout
from descentlab.study.cells import Design
from descentlab.study.tuning_rules import (
    CandidateSelection,
    candidate_methods,
    check_equal_budgets,
    check_tune_seed,
)
from descentlab.train.loop import TrainConfig
from descentlab.train.recipe import MethodConfig, with_overrides

MARGIN = 0.05  # the claims' parity margin and smallest effect of interest, in win rate (claims.py)
CONDITION = re.compile(r"^(clean|[a-z]+-x[0-9.]+|[a-z]+@[0-9.eE+-]+)$")  # a condition's name (claims.py)
BASELINE, POSITIVE = "erm", "erm-neftune"
NULL = "erm (another seed)"  # the null control's arm: ERM on the next evaluation seed
WIN, LEVEL, PERPLEXITY_RATIO = "win", "level", "perplexity_ratio"  # the store's metrics


def condition_name(kind: str, level: float, ratio: float | None = None) -> str:
    """``clean`` at level 0, ``<kind>-x<ratio>`` for a level found from ERM's growth, else ``<kind>@<level>``."""
    if level == 0:
        return "clean"
    return f"{kind}-x{ratio:g}" if ratio is not None else f"{kind}@{level:g}"


@dataclass
class ModelConfig:
    name: str = "smollm2"  # "smollm2" (offline) or any HF causal-LM id / local folder
    gradient_checkpointing: bool = False  # recompute each block in backward: pays only for long sequences
    dtype: str = "float32"  # the loaded model's parameter dtype: "float32" or "bfloat16" (half the memory)

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"model.dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")

    @property
    def torch_dtype(self) -> Any:
        """``dtype`` as a ``torch.dtype``."""
        import torch

        return getattr(torch, self.dtype)


@dataclass
class ReadoutConfig:
    """The logit-lens readout of the constrained objective (:class:`~descentlab.readout.CausalLMReadout`)."""

    chunk_size: int = 1024  # tokens per CE chunk
    sample_tokens: int | None = 16  # targets per batch read out at layers 0..L-1 (None: all)
    checkpoint: bool = False  # recompute chunk logits in backward (pays only when chunks are large)

    def build(self, layers: list[int] | None = None) -> CausalLMReadout:
        return CausalLMReadout(layers=layers, **asdict(self))


@dataclass
class ConstraintChoice:
    """Which layers are constrained, and their α, from the pretrained profile on validation data.

    ``select="descending"``: :func:`~descentlab.constrained.descent.profile_constraints` (layers where the
    profile descends by more than ``min_drop``, α_l = min(alpha_cap, alpha_fraction · relative drop), with
    ``alpha_fraction`` / ``alpha_cap`` of each method's own constraint config, so a method spec can change
    them). ``select="config"``: the method's own ``constraint.layers`` / ``alpha`` as given.
    """

    select: str = "descending"
    min_drop: float = 0.0
    val_examples: int = 16  # validation examples of the pretrained profile

    def __post_init__(self) -> None:
        if self.select not in ("descending", "config"):
            raise ConfigError(f"constraints.select must be 'descending' or 'config', got {self.select!r}")


@dataclass
class GridConfig:
    """The noise levels, from ERM's own degradation on validation (:mod:`descentlab.evaluation.levels`)."""

    kinds: list[str] = field(default_factory=lambda: ["gaussian", "neftune"])
    ratios: list[float] = field(default_factory=lambda: [1.5, 3.0, 10.0])  # perplexity growth factors
    # a first level to try per kind (γ of σ_E for gaussian; NEFTune's α for neftune)
    start: dict[str, float] = field(default_factory=lambda: {"gaussian": 0.5, "neftune": 20.0})
    extra: dict[str, list[float]] = field(default_factory=lambda: {"neftune": [1.5]})  # fixed levels
    neftune_ratios: list[float] | None = None  # the neftune kind's own ratios (None: ``ratios``)
    iters: int = 3  # bisection steps per ratio after bracketing
    val_examples: int = 16  # validation examples the perplexity ratio is measured on
    draws: int = 1  # noise draws per (kind, level) on the held-out set
    noise_seed: int = 0
    profile_kind: str = "gaussian"  # the noisy layer profile: this kind at ...
    profile_ratio: float = 3.0  # ... the level of this ratio

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in EMBEDDING_KINDS or k == "substitute"]
        if bad or not self.kinds:
            raise ConfigError(f"grid.kinds must be additive embedding kinds, got {self.kinds}")
        if not self.ratios or min(self.ratios) <= 1:
            raise ConfigError(f"grid.ratios must be factors > 1, got {self.ratios}")
        if missing := [k for k in self.kinds if k not in self.start]:
            raise ConfigError(
                f"grid.start has no first level for {missing}; e.g. grid.start.{missing[0]}=0.5"
            )
        if self.neftune_ratios is not None and (not self.neftune_ratios or min(self.neftune_ratios) <= 1):
            raise ConfigError(f"grid.neftune_ratios must be factors > 1 or null, got {self.neftune_ratios}")
        if self.profile_kind not in self.kinds or self.profile_ratio not in self.ratios_of(self.profile_kind):
            raise ConfigError("grid.profile_kind / profile_ratio must be one of grid.kinds / grid.ratios")

    def ratios_of(self, kind: str) -> list[float]:
        """The perplexity growth factors searched for ``kind``."""
        return list(self.neftune_ratios) if kind == "neftune" and self.neftune_ratios else list(self.ratios)


@dataclass
class EvalConfig:
    batch_size: int = 8
    perplexity_on: str = "all"  # "all" tokens of each example, or the "reference" tokens only
    judge: str = "likelihood"  # only the likelihood judge runs inside the experiment (see the study docs)
    tie_tol: float = 1e-6  # NLLs closer than this (nats) tie
    layer_examples: int = 4  # held-out examples of the logit-lens profiles
    layer_chunk: int = 1024

    def __post_init__(self) -> None:
        if self.judge != "likelihood":
            raise ConfigError(
                "eval.judge must be 'likelihood' here; a generate-then-judge comparison needs a judge LM "
                "stronger than SmolLM2 (descentlab.evaluation.judge.GenerativeJudge, used from your own script)"
            )
        if self.perplexity_on not in ("all", "reference"):
            raise ConfigError(f"eval.perplexity_on must be 'all' or 'reference', got {self.perplexity_on!r}")


@dataclass
class GenerativeJudgeConfig:
    """Generate then judge, AlpacaEval-style: each fine-tune answers the held-out prompts (greedy, under each
    judged condition's noise) and a judge LM compares every method's answer with the baseline's of the same
    seed, both orders; win rates raw and length-controlled. A table, not a claim (the likelihood judge is
    of record). Off while ``model`` is None; a judge must be stronger than the judged models."""

    model: str | None = None  # the judge LM: a local folder or a Hugging Face id
    # condition names judged, as the claims name them: clean, <kind>-x<ratio>, <kind>@<level>
    conditions: list[str] = field(default_factory=lambda: ["clean", "gaussian-x3"])
    examples: int | None = None  # the first this many held-out prompts (None: all)
    max_new_tokens: int = 512
    batch_size: int = 8  # prompts per generate call
    judge_batch_size: int = 4  # judge sequences per forward pass
    soft: bool = False  # the judge's verdict σ(s_1 − s_2) instead of 1[s_1 > s_2]
    dtype: str = "bfloat16"  # the judge's weights: float32, bfloat16 or float16
    template: str = PAIRWISE_TEMPLATE

    def __post_init__(self) -> None:
        bad = [c for c in self.conditions if not CONDITION.match(str(c))]
        if bad or not self.conditions:
            raise ConfigError(
                f"generative.conditions must be condition names (clean, <kind>-x<ratio>, <kind>@<level>), "
                f"got {bad or self.conditions}"
            )
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"generative.dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.examples is not None and self.examples < 1:
            raise ConfigError(f"generative.examples must be >= 1 or null, got {self.examples}")
        if min(self.max_new_tokens, self.batch_size, self.judge_batch_size) < 1:
            raise ConfigError("generative.max_new_tokens, batch_size and judge_batch_size must be >= 1")
        for name in ("{prompt}", "{first}", "{second}"):
            if name not in self.template:
                raise ConfigError(f"generative.template lacks the {name} field")


def _base_method() -> MethodConfig:
    # Fused AdamW (the fast CPU path), no weight decay, as in the paper's fine-tunes. alpha_fraction = 0.5:
    # each descending layer keeps half the pretrained relative drop. η_λ = 0.01: in a 30-step pilot
    # (2026-12-01) λ stayed below 0.02 and settled; at alpha_fraction = 1 and η_λ = 0.02 it reached 0.23 in
    # 20 steps and the clean win rate fell to 19 %.
    return MethodConfig(
        optimizer=OptimizerConfig(name="adamw", lr=5e-5, weight_decay=0.0, decay="all", fused=True),
        constraint=DescentConfig(
            dual_lr=0.01,
            detach_prev=True,
            constrain_first=False,
            alpha_fraction=0.5,
            alpha_cap=0.5,
            penalty=1.0,
        ),
    )


SPECS = {
    "erm": "",
    "hard": "objective=constrained",
    # resilient: the tight constraints (met with equality by the pretrained model) relaxed by slacks of cost
    # (a/2) u², a = 0.5: λ settles at a · u, time constant a / η_λ = 50 steps (at a = 1 still rising at 40)
    "resilient": "objective=constrained constraint.resilient=true constraint.alpha_fraction=1.0 "
    "constraint.penalty=0.5",
    "erm-neftune": "",  # ERM on NEFTune noise (see noisy_training): the positive control
}


def _selection() -> CandidateSelection:
    # Equal budgets: two candidates per constrained method, each on its own knob. In the committed one-seed
    # run both lost clean parity (clean win rate hard 33 %, resilient 17 %, ERM re-seeded 51 %), so each
    # committed setting is offered with a looser one: resilient's slack cost a of (a/2) u², 0.5 or 0.05 (λ
    # settles at a · u); hard's alpha_fraction, the share of the pretrained drop a layer keeps, 0.5 or 0.25.
    # The rule is run.choose's, with the claims' parity margin.
    return CandidateSelection(
        candidates={
            "hard": ["alpha_fraction=0.25", "alpha_fraction=0.5"],
            "resilient": ["penalty=0.05", "penalty=0.5"],
        },
        follow={},
        criterion="robust",
        max_clean_drop=MARGIN,
    )


@dataclass
class LlmRobustnessConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: CausalLMDataConfig = field(
        default_factory=lambda: CausalLMDataConfig(seq_len=64, prompt_tokens=24, continuation_tokens=16)
    )
    method: MethodConfig = field(default_factory=_base_method)  # the base every entry of `specs` edits
    specs: dict[str, str] = field(default_factory=lambda: dict(SPECS))  # label -> `method` overrides
    methods: list[str] = field(default_factory=lambda: list(SPECS))  # the labels to run, in order
    baseline: str = "erm"
    # label -> [kind, level]: that label trains with this embedding noise (fresh draw each step). NEFTune's α =
    # 30 on 64-token windows is std 0.67 σ_E, mid-grid (pretrained SmolLM2's perplexity x2.4 on validation).
    noisy_training: dict[str, list[Any]] = field(default_factory=lambda: {"erm-neftune": ["neftune", 30.0]})
    constraints: ConstraintChoice = field(default_factory=ConstraintChoice)
    readout: ReadoutConfig = field(default_factory=ReadoutConfig)
    grid: GridConfig = field(default_factory=GridConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # evaluation seeds: every one reported
    tune_seed: int = 1000  # ERM's tuning run and every candidate, scored on validation only
    selection: CandidateSelection = field(default_factory=_selection)
    val_n: int = 32  # validation examples cut (the grid, the profile and the selection use their first few)
    selection_examples: int = 32  # validation examples each candidate's win rates are measured on
    # the convergence check: validation loss (mean NLL per token, all tokens) of every fine-tune on the first
    # ``val_curve_examples`` validation examples every ``val_every`` steps and at the last (0: off)
    val_every: int = 0
    val_curve_examples: int = 16
    workers: int = 2  # jobs in this many 1-thread processes (1: inline); results do not depend on it
    torch_threads: int = 1  # intra-op threads per job (2 threads on 2 loaded cores ran 10x slower)
    lambda_every: int = 5  # steps between recorded λ
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(max_steps=250, batch_size=2, log_every=10, progress=False)
    )
    generative: GenerativeJudgeConfig = field(default_factory=GenerativeJudgeConfig)

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in self.specs]
        if unknown or self.baseline not in self.methods:
            raise ConfigError(
                f"methods must be labels of specs ({sorted(self.specs)}) and include baseline={self.baseline!r}; "
                f"got {self.methods}"
            )
        for spec in self.specs.values():
            with_overrides(self.method, spec)  # a bad spec fails here, before any run directory is made
        for label, pair in self.noisy_training.items():
            if len(pair) != 2 or pair[0] not in EMBEDDING_KINDS or not float(pair[1]) > 0:
                raise ConfigError(f"noisy_training.{label} must be [kind, level > 0], got {pair}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must list at least one evaluation seed, each once; got {self.seeds}")
        check_tune_seed(self.tune_seed, self.seeds)
        self._check_selection()
        if self.val_every < 0 or self.val_curve_examples < 1 or self.selection_examples < 1:
            raise ConfigError("val_every must be >= 0, val_curve_examples and selection_examples >= 1")

    def _check_selection(self) -> None:
        sel = self.selection
        if sel.follow:
            raise ConfigError(f"selection.follow is not used by llm-robustness; got {sel.follow}")
        if sel.criterion not in ("robust", "clean"):
            raise ConfigError(f"selection.criterion must be robust or clean, got {sel.criterion!r}")
        if not 0 < sel.max_clean_drop < 0.5:
            raise ConfigError(f"selection.max_clean_drop is a win rate in (0, 0.5), got {sel.max_clean_drop}")
        for label, specs in sel.candidates.items():
            if label not in self.specs or not self.method_config(label).constrained:
                raise ConfigError(f"selection.candidates.{label}: only constrained methods have candidates")
            if not specs:
                raise ConfigError(
                    f"selection.candidates.{label} is empty; give one spec at least ('' = as is)"
                )
            candidate_methods(label, self.method_config(label), sel)  # a bad spec fails here
        constrained = [m for m in self.methods if self.method_config(m).constrained]
        check_equal_budgets({m: sel.candidates.get(m, [""]) for m in constrained})

    def constraint_candidate(self, label: str, spec: str) -> MethodConfig:
        """``label``'s method with one selection candidate (DescentConfig overrides) applied to its constraint."""
        method = self.method_config(label)
        if not spec:
            return method
        try:
            return replace(method, constraint=method.constraint.with_overrides(spec))
        except ConfigError as e:
            raise ConfigError(f"bad selection candidate {spec!r} of {label}: {e}") from None

    def candidates(self, label: str) -> list[str]:
        """``label``'s selection candidates (override specs); ``[""]`` (as configured) when it has none."""
        if not self.method_config(label).constrained:
            return [""]
        return list(self.selection.candidates.get(label, [""]))

    def method_config(self, label: str) -> MethodConfig:
        """The MethodConfig of one label: ``method`` edited by ``specs[label]``."""
        return with_overrides(self.method, self.specs[label])


CONFIG = LlmRobustnessConfig

# The full preset's data, budget, noise grid and tuning seed, which its fresh-seed companion (full-seeds) shares
FULL_RUN: dict[str, Any] = {
    "tune_seed": 1000,
    "train.max_steps": 100,
    "data.n_train": 4000,
    "data.n_eval": 80,
    "data.max_chars": 1_500_000,
    "val_n": 100,
    "selection_examples": 100,
    "val_every": 20,
    "grid.ratios": [1.5, 3.0, 10.0],
    "grid.neftune_ratios": [3.0],
}

PRESETS: dict[str, dict[str, Any]] = {
    # the demo's budget (a few minutes on 2 cores)
    "quick": {
        "methods": ["erm", "hard"],
        "seeds": [0, 1],  # two: the null control and every row get a seed-level interval
        "selection.candidates": {"hard": ["alpha_fraction=0.5"]},  # nothing to choose: no candidate runs
        "train.max_steps": 16,
        "data.n_train": 64,
        "data.n_eval": 24,
        "data.max_chars": 300_000,
        "val_n": 8,
        "constraints.val_examples": 8,
        "grid.ratios": [3.0],
        "grid.iters": 2,
        "grid.val_examples": 8,
        "eval.layer_examples": 2,
    },
    # Every method on 3 evaluation seeds, 2 candidates each for hard and resilient on the tuning seed; the
    # `pilot` preset checks convergence by 100 steps. 36 jobs, about 6,600 worker-seconds (from the pilot's
    # step times): 55 min on 2 cores.
    "full": {**FULL_RUN, "seeds": [1, 2, 3]},
    # The primary endpoint again, on 7 seeds no run has used: ERM and `hard` at what the full run chose on
    # tuning seed 1000 (one candidate, so no tuning round), the full preset's data, budget and noise grid.
    # About 48 min on 2 idle cores; its power, declared before it, is on docs/results/llm-robustness.md.
    "full-seeds": {
        **FULL_RUN,
        "methods": ["erm", "hard"],
        "seeds": [4, 5, 6, 7, 8, 9, 10],
        "selection.candidates": {"hard": ["alpha_fraction=0.25"]},
    },
    # The pilot of the full preset: its budget's convergence check (every method's validation loss changes by
    # < 2 % over the last doubling of steps, 50 -> 100) and the per-seed spread of hard - ERM at gaussian x3
    # the MDE is declared from, on two pilot seeds that are never evaluation seeds. About 16 min on 2 cores.
    "pilot": {
        "methods": ["erm", "hard", "resilient"],
        "seeds": [900, 901],
        "tune_seed": 1000,
        "train.max_steps": 100,
        "data.n_train": 4000,
        "data.n_eval": 50,
        "data.max_chars": 1_500_000,
        "val_every": 10,
        "selection.candidates": {"hard": ["alpha_fraction=0.5"], "resilient": ["penalty=0.5"]},
        "grid.ratios": [1.5, 3.0, 10.0],
        "grid.neftune_ratios": [3.0],
    },
    # The paper's scale (docs/paper-scale.md, which gives the FSDP2 launch): the hub's tatsu-lab/alpaca with
    # DESCENTLAB_ONLINE=1, or a local Alpaca-format JSON (held-out prompts from data.eval_path, e.g.
    # AlpacaEval's 805, else 805 held out of the file); the likelihood judge of record beside the judge LM's.
    "paper": {
        "model.name": "meta-llama/Llama-3.1-8B-Instruct",
        "model.gradient_checkpointing": True,
        "data.source": "alpaca",
        "data.path": "tatsu-lab/alpaca",
        "data.seq_len": 512,
        "data.n_train": None,
        "data.n_eval": 805,
        "method.optimizer.lr": 1e-5,
        "method.optimizer.schedule": "warmup_cosine",
        "method.optimizer.warmup_frac": 0.03,
        "readout.sample_tokens": 64,
        "readout.chunk_size": 4096,
        "constraints.val_examples": 64,
        "grid.val_examples": 64,
        "grid.draws": 2,
        "grid.neftune_ratios": [3.0],
        "eval.batch_size": 16,
        "eval.layer_examples": 32,
        "eval.layer_chunk": 4096,
        "val_n": 128,
        "workers": 1,
        "torch_threads": 0,
        # 5 evaluation seeds, no candidates: 21 fine-tunes (ERM's tuning run, which finds the noise levels, and
        # 4 methods x 5 seeds). Sized from the committed full-seeds run (7 seeds x 80 prompts, hard - ERM at
        # gaussian x3): per-seed win rates sd 0.074, 0.103 at its 80 % upper bound (METHODS 5.2); its
        # interval's example piece (variance 0.0012 at 80 prompts) shrunk to 805 prompts. At that design the
        # seed-level MDE (80 % power, 95 % t) is 0.174 at 5 seeds and 0.217 at 4 (report.stats.seeds_needed
        # gives 5 for the paper's +0.199, 69.93 % - 50 %, and 5 for the CPU estimate +0.177): 5 seeds can
        # reproduce a gain of the paper's size. The 0.05 smallest effect of interest would need 56 seeds (112
        # more 8B fine-tunes), so a refutation at that size is out of reach here; a gain near 0 still reads
        # inconclusive, not refuted. The seed spread of an 8B model on Alpaca is unknown until the run.
        "seeds": [0, 1, 2, 3, 4],
        "tune_seed": 1000,
        "selection.candidates": {"hard": [""], "resilient": [""]},
        "train.max_steps": 800,
        "train.batch_size": 8,
        "train.grad_accum_steps": 8,
        "train.mixed_precision": "bf16",
        "train.loader_workers": 2,
        "train.log_every": 10,
        "train.checkpoint_every": 400,  # a checkpoint of 8B in fp32 with AdamW's moments is about 96 GB
        "generative.model": "Qwen/Qwen2.5-72B-Instruct",
        "generative.conditions": ["clean", "gaussian-x3"],  # the primary endpoint's condition, and clean
        "generative.max_new_tokens": 512,
    },
}


def design(cfg: LlmRobustnessConfig) -> Design:
    """The design record of a run of ``cfg``: ``methods`` and, with two seeds or more, the null control
    (:data:`NULL`); the conditions ``clean``, ``<kind>-x<ratio>`` for every perplexity growth of ``grid``
    and ``<kind>@<level>`` for every fixed level of ``grid.extra``. The run records the number of examples."""
    g = cfg.grid
    conditions = ["clean"]
    for kind in g.kinds:
        conditions += [f"{kind}-x{r:g}" for r in g.ratios_of(kind)]
        conditions += [f"{kind}@{x:g}" for x in sorted(g.extra.get(kind, [])) if x != 0]
    null = ["erm (another seed)"] if len(cfg.seeds) > 1 else []
    return Design((*cfg.methods, *null), tuple(dict.fromkeys(conditions)), tuple(cfg.seeds))
