"""regime-map's config: the two effects it re-measures at several sizes, each sweep point an ordinary run of
another study through the registry (with that study's config and job cache): ``horst``, sparse-lm's primary
(HORST − AdamW test log-ppl after one-shot layer-wise pruning) over GPT-2 widths, and ``constrained``,
text-robustness's comparison (constrained − ERM test accuracy under Gaussian embedding noise) over encoder
depths; and its presets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from descentlab.errors import ConfigError
from descentlab.study.cells import Design

# GPT-2 widths (4 layers, context 64, BPE 2,048): about 0.12 M, 0.33 M and 1.06 M parameters, an 9x span
HORST_SIZES = {
    "d32": "model.n_embd=32 model.n_head=2",
    "d64": "model.n_embd=64 model.n_head=4",
    "d128": "model.n_embd=128 model.n_head=4",
}
# sparse-lm's full-a30 preset (its model, data, 1,500-step bf16 budget, 2 workers of 1 thread, the full run's
# chosen settings: AdamW lr 4e-3, weight decay 0.1; HORST lr 4e-3, α 10), with AdamW and HORST only, no tuning run
HORST_BASE = ["methods=[adamw,horst]", "smollm2=false"]
# text-robustness's quick preset at a larger, fixed design: the base constrained method (the full run's choice),
# ERM beside it, Gaussian noise only, one draw per γ
CONSTRAINED_BASE = [
    "methods=[erm,constrained]",
    "data.n_train=1000",
    "data.n_eval=500",
    "train.epochs=2",
    "evaluation.kinds=[gaussian]",
    "evaluation.draws=1",
    "workers=2",
    "train.progress=false",
]
# the paper's scale of the HORST effect: GPT-2 small, 124 M parameters (the prediction's x)
PAPER_PARAMS = 124_439_808


@dataclass
class RegimeMapConfig:
    """Settings of the regime map.

    Attributes:
        parts: the effects to sweep, a subset of ``["horst", "constrained"]``.
        seeds: evaluation seeds of every sweep point (the same seeds at every size, so a seed's effects
            across sizes give it a slope of its own); never sparse-lm's or text-robustness's tuning seed.
        horst_preset / horst_base: sparse-lm's preset and the overrides every size shares.
        horst_sizes: size label -> the overrides that set that size.
        sparsities: the one-shot pruning levels of every HORST size (the primary reads ``primary_sparsity``).
        primary_sparsity: the level of the primary slope.
        constrained_preset / constrained_base: text-robustness's preset and shared overrides.
        constrained_depths: encoder depths (the first k layers of the pretrained encoder).
        paper_params: the parameter count at which the HORST trend is extrapolated (a prediction).
    """

    parts: list[str] = field(default_factory=lambda: ["horst", "constrained"])
    seeds: list[int] = field(default_factory=lambda: [300, 301, 302, 303, 304, 305, 306, 307])
    horst_preset: str = "full-a30"
    horst_base: list[str] = field(default_factory=lambda: list(HORST_BASE))
    horst_sizes: dict[str, str] = field(default_factory=lambda: dict(HORST_SIZES))
    sparsities: list[float] = field(default_factory=lambda: [0.5, 0.7, 0.9, 0.95])
    primary_sparsity: float = 0.9
    constrained_preset: str = "quick"
    constrained_base: list[str] = field(default_factory=lambda: list(CONSTRAINED_BASE))
    constrained_depths: list[int] = field(default_factory=lambda: [2, 4, 6])
    paper_params: int = PAPER_PARAMS

    def __post_init__(self) -> None:
        if not self.parts or set(self.parts) - {"horst", "constrained"}:
            raise ConfigError(f"parts must be a non-empty subset of [horst, constrained], got {self.parts}")
        if len(self.seeds) < 2 or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must list at least 2 distinct seeds, got {self.seeds}")
        if 1000 in self.seeds:
            raise ConfigError(
                "seed 1000 is the sub-studies' tuning seed; tuning seeds are never evaluation seeds"
            )
        if "horst" in self.parts and len(self.horst_sizes) < 3:
            raise ConfigError(f"a trend needs at least 3 sizes, got {list(self.horst_sizes)}")
        if "constrained" in self.parts and len(set(self.constrained_depths)) < 3:
            raise ConfigError(f"a trend needs at least 3 depths, got {self.constrained_depths}")
        if any(d < 2 for d in self.constrained_depths):  # layer 1 is never constrained (constrain_first)
            raise ConfigError(
                f"constrained_depths must be >= 2 (a 1-layer encoder has no constrained layer), "
                f"got {self.constrained_depths}"
            )
        if self.primary_sparsity not in self.sparsities or not all(0 < p < 1 for p in self.sparsities):
            raise ConfigError(
                f"sparsities must lie in (0, 1) and hold primary_sparsity={self.primary_sparsity}, "
                f"got {self.sparsities}"
            )

    def horst_overrides(self, size: str) -> list[str]:
        """sparse-lm's overrides at ``size``."""
        return [
            *self.horst_base,
            *self.horst_sizes[size].split(),
            f"seeds={list(self.seeds)}",
            f"sparsities={list(self.sparsities)}",
        ]

    def constrained_overrides(self, depth: int) -> list[str]:
        """text-robustness's overrides at ``depth`` layers."""
        return [*self.constrained_base, f"model_layers={depth}", f"seeds={list(self.seeds)}"]


CONFIG = RegimeMapConfig


def condition(part: str, size: str | int, at: float | None = None) -> str:
    """A cell's condition: ``d64@0.9`` (a HORST size at a sparsity), ``L4`` (an encoder depth)."""
    if part == "horst":
        return f"{size}@{at:g}"
    return f"L{size}"


def design(cfg: RegimeMapConfig) -> Design:
    """The arms, conditions and seeds the run measures (its design record)."""
    arms: list[str] = []
    conditions: list[str] = []
    if "horst" in cfg.parts:
        arms += ["adamw", "horst"]
        conditions += [condition("horst", s, p) for s in cfg.horst_sizes for p in [0.0, *cfg.sparsities]]
    if "constrained" in cfg.parts:
        arms += ["erm", "constrained"]
        conditions += [condition("constrained", d) for d in cfg.constrained_depths]
    extra = {
        "sizes": list(cfg.horst_sizes),
        "sparsities": list(cfg.sparsities),
        "primary_sparsity": cfg.primary_sparsity,
        "depths": list(cfg.constrained_depths),
        "paper_params": cfg.paper_params,
    }
    return Design(tuple(arms), tuple(conditions), tuple(cfg.seeds), None, extra)


PRESETS: dict[str, dict] = {
    # minutes: 2 seeds, the three widths at 2 layers and 150 steps, three shallow encoders on 200 reviews
    "quick": {
        "seeds": [0, 1],
        "horst_preset": "quick",
        "horst_base": [
            *HORST_BASE,
            "train.max_steps=150",
            "test_blocks=64",
            "eval_blocks=64",
            "model.n_layer=2",
        ],
        "constrained_base": [
            *CONSTRAINED_BASE[:1],
            "data.n_train=200",
            "data.n_eval=100",
            "train.epochs=1",
            "evaluation.kinds=[gaussian]",
            "evaluation.draws=1",
            "workers=2",
        ],
        "constrained_depths": [2, 3, 4],
    },
    # 8 fresh seeds at every point: 48 sparse-lm jobs (3 widths x 2 optimizers x 8 seeds) and 48 text jobs
    # (3 depths x 2 methods x 8 seeds); declared with its power in claims.py before it ran
    "full": {},
}
