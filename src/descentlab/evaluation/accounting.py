"""Privacy accounting for the embedding mechanisms of :mod:`descentlab.perturbations.ldp`: per token, per sequence, and γ ↔ ε.

Per token (one token of the input changed, any token to any other):
- metric LDP at ε: two tokens at distance ``D`` are ``ε·D``-indistinguishable; over a vocabulary, D is at
  most the diameter of the embedding rows, bounded here by ``2 max_v ‖e_v‖``;
- the Gaussian mechanism is (ε, δ)-DP per token by calibration (Δ = 2C).

Per sequence of T tokens (every token may change), by composition:
- basic: ``(Σ ε_t, Σ δ_t)`` = ``(T ε, T δ)`` (Dwork & Roth 2014, Thm 3.16); for metric LDP it is exact in
  the sense that the sequence mechanism is ε-dχ-private for the distance ``Σ_t ‖x_t - x'_t‖ <= T·D``;
- advanced (Dwork, Rothblum & Vadhan 2010; Dwork & Roth Thm 3.20): for any δ' > 0, T-fold (ε, δ) is
  ``(ε sqrt(2T ln(1/δ')) + T ε (e^ε - 1), T δ + δ')``;
- Gaussian, exactly: T Gaussian mechanisms of sensitivity Δ and noise σ are one μ-GDP mechanism with
  ``μ = sqrt(T) Δ/σ`` (Dong, Roth & Su 2022, Cor. 3.3), i.e. one Gaussian mechanism of sensitivity
  ``sqrt(T) Δ``: its ε at δ comes from the analytic formula.

dp-accounting (Google) does these and more, but it pins attrs < 24 and needs the compiled dm-tree, so it
does not install beside this project's dependencies; the formulas above are short and tested against
their closed forms instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from descentlab.errors import ConfigError
from descentlab.perturbations import ldp


def basic_composition(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """k-fold composition of an (ε, δ) mechanism, basic theorem: ``(k ε, k δ)``."""
    _check_k(k)
    return k * epsilon, k * delta


def advanced_composition(epsilon: float, delta: float, k: int, delta_slack: float) -> tuple[float, float]:
    """k-fold composition, advanced theorem: ``(ε sqrt(2k ln(1/δ')) + k ε (e^ε - 1), k δ + δ')``.

    ``e^ε - 1`` is ``expm1``; it is ``inf`` for ε > 709 (the bound is then useless, not wrong).
    """
    _check_k(k)
    if not 0 < delta_slack < 1:
        raise ConfigError(f"delta_slack must lie in (0, 1), got {delta_slack!r}")
    growth = math.expm1(epsilon) if epsilon < 709 else math.inf
    eps = epsilon * math.sqrt(2 * k * math.log(1 / delta_slack)) + k * epsilon * growth
    return eps, k * delta + delta_slack


def gaussian_composition_epsilon(sigma: float, sensitivity: float, k: int, delta: float) -> float:
    """ε at δ of k Gaussian mechanisms (σ, Δ) composed: one Gaussian of sensitivity ``sqrt(k) Δ`` (exact)."""
    _check_k(k)
    return ldp.gaussian_epsilon(sigma, delta, math.sqrt(k) * sensitivity)


def _check_k(k: int) -> None:
    if not (isinstance(k, int) and k >= 1):
        raise ConfigError(f"the number of composed mechanisms must be an integer >= 1, got {k!r}")


@dataclass(frozen=True)
class EmbeddingGeometry:
    """What the accounting needs to know about an embedding matrix.

    Attributes:
        d: embedding width.
        sigma_e: σ_E, the RMS of all entries (γ's reference scale).
        max_norm: the largest row norm; ``2 max_norm`` bounds the distance between any two tokens.
        rms_norm: the RMS row norm (``sigma_e · sqrt(d)``), the typical token norm.
    """

    d: int
    sigma_e: float
    max_norm: float
    rms_norm: float

    @property
    def diameter(self) -> float:
        """An upper bound on ``max_{v,w} ‖e_v - e_w‖``: ``2 max_v ‖e_v‖``."""
        return 2.0 * self.max_norm

    @classmethod
    def of(cls, model: nn.Module, module: nn.Module | None = None) -> EmbeddingGeometry:
        """Read it off the model's input-embedding matrix (or ``module.weight``)."""
        from descentlab.perturbations.hooks import input_embedding_module

        target = module if module is not None else input_embedding_module(model)
        weight = getattr(target, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise ConfigError(f"{type(target).__name__} has no 2-d `weight` embedding matrix to account for.")
        with torch.no_grad():
            w = weight.detach().double()
            norms = w.norm(dim=1)
            return cls(
                d=int(w.shape[1]),
                sigma_e=float(w.pow(2).mean().sqrt()),
                max_norm=float(norms.max()),
                rms_norm=float(norms.pow(2).mean().sqrt()),
            )


def token_epsilon(kind: str, epsilon: float, geometry: EmbeddingGeometry) -> float:
    """The standard (replace-one-token) ε of one token: ``ε·D`` for metric LDP, ε for the Gaussian mechanism."""
    if kind == "metric_ldp":
        return epsilon * geometry.diameter
    if kind == "gaussian_mechanism":
        return epsilon
    raise ConfigError(f"unknown LDP kind {kind!r}; choose one of {', '.join(ldp.LDP_KINDS)}.")


def sequence_epsilon(
    kind: str,
    epsilon: float,
    tokens: int,
    geometry: EmbeddingGeometry,
    *,
    delta: float = 1e-5,
    clip: float | None = None,
    delta_slack: float = 1e-5,
) -> dict[str, float]:
    """ε of a whole sequence of ``tokens`` tokens (all may change), by each valid composition, each with
    its δ (``<name>_delta``). Metric LDP: basic (pure, δ = 0) and advanced (δ = δ'). Gaussian: basic
    (δ = Tδ), advanced (δ = Tδ + δ') and the exact GDP composition (at δ = Tδ, comparable with basic).
    ``best`` / ``best_delta``: the smaller of basic and advanced (metric), of basic and GDP (Gaussian).
    """
    per_token = token_epsilon(kind, epsilon, geometry)
    out: dict[str, float] = {}
    if kind == "metric_ldp":
        out["basic"], out["basic_delta"] = basic_composition(per_token, 0.0, tokens)
        out["advanced"], out["advanced_delta"] = advanced_composition(per_token, 0.0, tokens, delta_slack)
        pick = "advanced" if out["advanced"] < out["basic"] else "basic"
    else:
        if clip is None:
            raise ConfigError("the gaussian_mechanism's accounting needs clip=<norm C>.")
        if tokens * delta >= 1:
            raise ConfigError(f"{tokens} tokens at delta={delta:g} per token leave no privacy (T·δ >= 1)")
        sigma = ldp.gaussian_sigma(epsilon, delta, 2.0 * clip)
        out["basic"], out["basic_delta"] = basic_composition(epsilon, delta, tokens)
        out["advanced"], out["advanced_delta"] = advanced_composition(epsilon, delta, tokens, delta_slack)
        out["gdp"] = gaussian_composition_epsilon(sigma, 2.0 * clip, tokens, tokens * delta)
        out["gdp_delta"] = tokens * delta
        pick = "gdp" if out["gdp"] < out["basic"] else "basic"
    out["best"], out["best_delta"] = out[pick], out[f"{pick}_delta"]
    return out


@dataclass(frozen=True)
class PrivacyRow:
    """One line of the γ ↔ ε mapping (every ε "per token" unless named ``sequence``)."""

    kind: str
    epsilon: float  # the mechanism's own ε (metric LDP: per unit distance)
    gamma: float  # equivalent γ: per-coordinate noise std / σ_E
    noise_norm: float  # E‖z‖ (metric: d/ε; gaussian: ≈ σ sqrt(d))
    token_epsilon: float  # replace-one-token ε
    sequence_epsilon: float  # whole-sequence ε (best valid composition)
    sequence_delta: float
    tokens: int


def privacy_rows(
    kind: str,
    epsilons: Sequence[float],
    geometry: EmbeddingGeometry,
    *,
    tokens: int,
    delta: float = 1e-5,
    clip: float | None = None,
) -> list[PrivacyRow]:
    """The accounting of ``kind`` at each ε: equivalent γ, noise norm, per-token and per-sequence ε."""
    if clip is None:
        clip = geometry.max_norm
    rows = []
    for eps in epsilons:
        std = ldp.mechanism_std(kind, eps, geometry.d, delta=delta, clip=clip)
        norm = geometry.d / eps if kind == "metric_ldp" else std * math.sqrt(geometry.d)
        seq = sequence_epsilon(kind, eps, tokens, geometry, delta=delta, clip=clip)
        per_token = token_epsilon(kind, eps, geometry)
        rows.append(
            PrivacyRow(
                kind, eps, std / geometry.sigma_e, norm, per_token, seq["best"], seq["best_delta"], tokens
            )
        )
    return rows


def epsilon_for_gamma(
    kind: str, gamma: float, geometry: EmbeddingGeometry, *, delta: float = 1e-5, clip: float | None = None
) -> float:
    """The ε whose mechanism has per-coordinate noise std ``γ σ_E`` (metric: ``sqrt(d+1)/(γ σ_E)``;
    Gaussian: the analytic ε of σ = γ σ_E with Δ = 2C)."""
    if not gamma > 0:
        raise ConfigError(f"gamma must be > 0 to have a finite epsilon, got {gamma!r}")
    std = gamma * geometry.sigma_e
    if kind == "metric_ldp":
        return math.sqrt(geometry.d + 1) / std
    clip = geometry.max_norm if clip is None else clip
    return ldp.gaussian_epsilon(std, delta, 2.0 * clip)


def mean_sequence_tokens(batches: Iterable[Mapping[str, Any]]) -> int:
    """T of a per-sequence accounting: the mean number of attended tokens per sequence, rounded."""
    counts = [int(n) for b in batches for n in b["attention_mask"].sum(dim=1)]
    if not counts:
        raise ConfigError("mean_sequence_tokens needs at least one batch with an attention_mask")
    return max(1, round(sum(counts) / len(counts)))


DEFAULT_TABLE_GAMMAS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0)


def gamma_epsilon_table(
    model: nn.Module,
    gammas: Sequence[float] = DEFAULT_TABLE_GAMMAS,
    *,
    tokens: int = 32,
    delta: float = 1e-5,
    clip: float | None = None,
    module: nn.Module | None = None,
) -> list[dict[str, Any]]:
    """For each γ and each LDP kind, the ε of equal per-coordinate noise, with its per-token and
    per-sequence (``tokens`` tokens) ε: the rows :func:`print_gamma_epsilon` prints."""
    geometry = EmbeddingGeometry.of(model, module)
    rows = []
    for gamma in gammas:
        for kind in ldp.LDP_KINDS:
            eps = epsilon_for_gamma(kind, gamma, geometry, delta=delta, clip=clip)
            row = privacy_rows(kind, [eps], geometry, tokens=tokens, delta=delta, clip=clip)[0]
            rows.append({**asdict(row), "gamma": gamma})
    return rows


def print_gamma_epsilon(
    model: nn.Module, gammas: Sequence[float] = DEFAULT_TABLE_GAMMAS, **options: Any
) -> list[dict[str, Any]]:
    """Print, for ``model``, which ε each noise level γ (relative to σ_E) corresponds to; returns the rows.

    Per kind: ε of the mechanism with per-coordinate std γσ_E, the expected noise norm, the per-token
    (replace-one-token) ε and the ε of a whole ``tokens``-token sequence (δ noted). ``options`` are those of
    :func:`gamma_epsilon_table` (``tokens``, ``delta``, ``clip``, ``module``).
    """
    rows = gamma_epsilon_table(model, gammas, **options)
    tokens, delta, clip = options.get("tokens", 32), options.get("delta", 1e-5), options.get("clip")
    geometry = EmbeddingGeometry.of(model, options.get("module"))
    c = geometry.max_norm if clip is None else clip
    print(
        f"d = {geometry.d}, σ_E = {geometry.sigma_e:.4g}, RMS token norm {geometry.rms_norm:.4g}, "
        f"max token norm {geometry.max_norm:.4g} (D <= {geometry.diameter:.4g}); Gaussian: clip C = {c:.4g}, "
        f"δ = {delta:g} per token; sequences of {tokens} tokens"
    )
    print(
        f"{'gamma':>6} {'kind':>18} {'epsilon':>11} {'E|z|':>8} {'token eps':>11} {'sequence eps':>13} {'seq delta':>9}"
    )
    for r in rows:
        print(
            f"{r['gamma']:>6g} {r['kind']:>18} {r['epsilon']:>11.4g} {r['noise_norm']:>8.3g} "
            f"{r['token_epsilon']:>11.4g} {r['sequence_epsilon']:>13.4g} {r['sequence_delta']:>9.2g}"
        )
    return rows


__all__ = [
    "EmbeddingGeometry",
    "PrivacyRow",
    "advanced_composition",
    "basic_composition",
    "epsilon_for_gamma",
    "gamma_epsilon_table",
    "gaussian_composition_epsilon",
    "mean_sequence_tokens",
    "print_gamma_epsilon",
    "privacy_rows",
    "sequence_epsilon",
    "token_epsilon",
]
