"""NoiseEvalConfig: the embedding-noise evaluation grid every robustness experiment shares (:mod:`.curves`).

An experiment composes it with its own fields (an LLM evaluation adds its judge and generation settings):
``kinds`` x ``gammas`` x ``draws`` noise realisations keyed by ``noise_seed``, plus one layer-loss profile
under ``profile_kind`` at ``profile_gamma``. Optionally, ``ldp_kinds`` x ``epsilons``: the calibrated
local-DP mechanisms of :mod:`descentlab.perturbations.ldp`, one curve against ε each (off unless listed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from descentlab.errors import ConfigError
from descentlab.evaluation.curves import DEFAULT_EPSILONS, DEFAULT_GAMMAS, DEFAULT_KINDS
from descentlab.perturbations.hooks import EMBEDDING_KINDS as NOISE_KINDS
from descentlab.perturbations.ldp import LDP_KINDS


@dataclass
class NoiseEvalConfig:
    """The noise grid of an evaluation.

    Attributes:
        kinds: perturbation kinds, each of "gaussian", "uniform", "discrete", "substitute".
        gammas: noise levels γ >= 0; must contain 0 (the clean point every curve starts from).
        draws: noise realisations per (model, kind, γ > 0).
        noise_seed: seed of the content-keyed noise (every model sees the same noisy inputs).
        profile_kind: kind of the noisy per-layer loss profile.
        profile_gamma: γ of the noisy per-layer loss profile.
        ldp_kinds: local-DP mechanisms evaluated against ε, each of "metric_ldp", "gaussian_mechanism";
            empty (the default) evaluates none.
        epsilons: the ε grid of ``ldp_kinds`` (finite, > 0).
        delta: δ per token of the Gaussian mechanism.
        clip: its clip norm C (None: the largest row norm of the pretrained embedding matrix).
    """

    kinds: list[str] = field(default_factory=lambda: list(DEFAULT_KINDS))
    gammas: list[float] = field(default_factory=lambda: list(DEFAULT_GAMMAS))
    draws: int = 3
    noise_seed: int = 0
    profile_kind: str = "gaussian"
    profile_gamma: float = 1.0
    ldp_kinds: list[str] = field(default_factory=list)
    epsilons: list[float] = field(default_factory=lambda: list(DEFAULT_EPSILONS))
    delta: float = 1e-5
    clip: float | None = None

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in NOISE_KINDS]
        if bad or not self.kinds:
            raise ConfigError(
                f"evaluation.kinds must be a non-empty subset of {list(NOISE_KINDS)}, got {self.kinds}"
            )
        if any(g < 0 for g in self.gammas):
            raise ConfigError(f"evaluation.gammas must be >= 0, got {self.gammas}")
        if 0.0 not in self.gammas:
            raise ConfigError("evaluation.gammas must contain 0 (the clean point); e.g. gammas=[0, 0.5, 1]")
        if self.draws < 1:
            raise ConfigError(f"evaluation.draws must be >= 1, got {self.draws}")
        if self.profile_kind not in NOISE_KINDS:
            raise ConfigError(
                f"evaluation.profile_kind must be one of {list(NOISE_KINDS)}, got {self.profile_kind!r}"
            )
        if self.profile_gamma < 0:
            raise ConfigError(f"evaluation.profile_gamma must be >= 0, got {self.profile_gamma}")
        bad = [k for k in self.ldp_kinds if k not in LDP_KINDS]
        if bad or len(set(self.ldp_kinds)) != len(self.ldp_kinds):
            raise ConfigError(
                f"evaluation.ldp_kinds must list distinct kinds of {list(LDP_KINDS)}, got {self.ldp_kinds}"
            )
        if self.ldp_kinds and not self.epsilons:
            raise ConfigError("evaluation.epsilons must list at least one ε when ldp_kinds is set")
        if any(not (0 < e < float("inf")) for e in self.epsilons):
            raise ConfigError(f"evaluation.epsilons must be finite and > 0, got {self.epsilons}")
        if not 0 < self.delta < 1:
            raise ConfigError(f"evaluation.delta must lie in (0, 1), got {self.delta}")
        if self.clip is not None and not self.clip > 0:
            raise ConfigError(
                f"evaluation.clip must be > 0 (or null: the embedding's largest row norm), got {self.clip}"
            )

    @property
    def profile_condition(self) -> str:
        """The name of the noisy profile, ``"<kind>@<gamma>"`` (e.g. ``"gaussian@1"``)."""
        return f"{self.profile_kind}@{self.profile_gamma:g}"


__all__ = ["NoiseEvalConfig"]
