"""Local differential privacy on token embeddings: calibrated mechanisms with an ε.

Two mechanisms act on each token embedding x ∈ R^d independently (the hooked module's output rows):

- **metric LDP** (dχ-privacy, Feyisetan et al. 2020), kind ``metric_ldp``: ``M(x) = x + z`` with density
  ``p(z) ∝ exp(-ε‖z‖₂)``. In polar form ``z = r·u`` with ``u`` uniform on the unit sphere and
  ``r ~ Gamma(d, 1/ε)`` (shape d, scale 1/ε): the density of r is ``∝ r^{d-1} e^{-εr}``. For any outputs y,

      log p(y | x) - log p(y | x') = ε (‖y - x'‖ - ‖y - x‖) <= ε ‖x - x'‖      (triangle inequality),

  so two tokens at distance D are (ε·D)-indistinguishable. ``E‖z‖ = d/ε`` and ``E z_i² = (d+1)/ε²``.
- **the Gaussian mechanism** (ε, δ), kind ``gaussian_mechanism``: ``M(x) = clip_C(x) + σ ξ``, ξ ~ N(0, I),
  ``clip_C(x) = x · min(1, C/‖x‖)``. Any two clipped tokens are within ``Δ = 2C`` (L2), and σ is the
  smallest value for which the analytic Gaussian mechanism (Balle & Wang 2018, Theorem 8) holds:

      δ(σ) = Φ(Δ/(2σ) - εσ/Δ) - e^ε Φ(-Δ/(2σ) - εσ/Δ) <= δ.

  This is exact (necessary and sufficient), so σ is smaller than the classical
  ``sqrt(2 ln(1.25/δ)) Δ/ε`` (which only holds for ε < 1). In the μ = Δ/σ form it is μ-GDP
  (Dong, Roth & Su 2022), ``δ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2)``.

The samplers are pure functions of the counter-based keys of :mod:`.noise`, so the noise is keyed by example
content exactly like the γ kinds: every model sees the same noisy inputs at the same (seed, draw, ε).
Composition over the tokens of a sequence lives in :mod:`descentlab.evaluation.accounting`.
"""

from __future__ import annotations

import functools
import math

import torch
from scipy import optimize, special
from torch import Tensor

from descentlab.errors import ConfigError
from descentlab.perturbations import noise as nz

LDP_KINDS = ("metric_ldp", "gaussian_mechanism")
_RADIUS_TAG = 0x52414449  # "RADI": folds the radius stream apart from the direction's gaussian streams


def check_epsilon(epsilon: float, delta: float | None = None) -> None:
    """Raise a ConfigError unless ``0 < ε < ∞`` (and ``0 < δ < 1`` when given)."""
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"epsilon must be a finite number > 0, got {epsilon!r}.")
    if delta is not None and not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise ConfigError(f"delta must lie in (0, 1), got {delta!r}.")


# --------------------------------------------------------------------------------------------- samplers


def gamma_radius(row_keys: Tensor, tokens: int, d: int, epsilon: float) -> Tensor:
    """Radii ``r[b, t] ~ Gamma(d, 1/ε)`` in float64, shape ``[B, tokens]``, keyed like :mod:`.noise`.

    For an integer shape d, a Gamma(d, 1) variable is a sum of d unit exponentials, so
    ``r = (1/ε) Σ_{i=1}^{d} -ln u_i`` with u_i the keyed uniforms of the token (exact, no rejection).
    """
    check_epsilon(epsilon)
    keys = nz.fold_key(row_keys, _RADIUS_TAG)
    u = nz.bits_to_unit(nz.uniform_bits(keys, tokens * d, nz.STREAM_A))
    return -torch.log(u).reshape(-1, tokens, d).sum(dim=-1) / epsilon


def unit_directions(row_keys: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Uniform directions on the unit sphere of the last axis: ``ξ / ‖ξ‖``, ξ the keyed N(0, I) noise."""
    xi = nz.standard_noise("gaussian", row_keys, shape)
    return xi / xi.norm(dim=-1, keepdim=True)


def metric_ldp_noise(row_keys: Tensor, shape: tuple[int, ...], epsilon: float) -> Tensor:
    """Noise z of density ``∝ exp(-ε‖z‖)`` per vector of the last axis: ``z = r u``, r ~ Gamma(d, 1/ε).

    Args:
        row_keys: one key per example (dim 0), e.g. content keys.
        shape: ``(B, ..., d)``; every length-d vector along the last axis gets its own (r, u).
        epsilon: the dχ-privacy parameter ε (privacy loss per unit of L2 distance).

    Returns:
        float64 tensor of ``shape``.
    """
    d = shape[-1]
    tokens = math.prod(shape[1:-1])
    r = gamma_radius(row_keys, tokens, d, epsilon)
    return (unit_directions(row_keys, shape).reshape(-1, tokens, d) * r.unsqueeze(-1)).reshape(shape)


def metric_ldp_log_density(z: Tensor, epsilon: float) -> Tensor:
    """``log p(z)`` of the metric mechanism's noise, over the last axis (d):

    ``p(z) = ε^d Γ(d/2) / (2 π^{d/2} Γ(d)) · exp(-ε‖z‖)`` (the normaliser is ``S_{d-1} Γ(d) / ε^d`` with
    the sphere's area ``S_{d-1} = 2π^{d/2} / Γ(d/2)``).
    """
    d = z.shape[-1]
    log_norm = d * math.log(epsilon) + math.lgamma(d / 2) - math.log(2) - d / 2 * math.log(math.pi)
    return log_norm - math.lgamma(d) - epsilon * z.double().norm(dim=-1)


def clip_rows(x: Tensor, clip: float) -> Tensor:
    """``x · min(1, C/‖x‖)`` over the last axis: every vector ends up with norm <= C."""
    if not (math.isfinite(clip) and clip > 0):
        raise ConfigError(f"clip must be a positive finite norm, got {clip!r}.")
    norm = x.norm(dim=-1, keepdim=True)
    return x * torch.clamp(clip / norm.clamp_min(torch.finfo(x.dtype).tiny), max=1.0)


# -------------------------------------------------------------------------------- analytic Gaussian


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """δ of the Gaussian mechanism at ε (Balle & Wang 2018, Thm 8), exact for L2 sensitivity Δ:

    ``δ = Φ(Δ/(2σ) - εσ/Δ) - e^ε Φ(-Δ/(2σ) - εσ/Δ)``; the second term in log space
    (``exp(ε + log Φ(·))``), so a large ε does not overflow.
    """
    if sigma <= 0:
        return 1.0
    a, b = sensitivity / (2 * sigma), epsilon * sigma / sensitivity
    first = special.ndtr(a - b)
    second = math.exp(min(epsilon + float(special.log_ndtr(-a - b)), 700.0))
    return float(max(first - second, 0.0))


@functools.lru_cache(maxsize=1024)
def gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """The smallest σ with ``gaussian_delta(σ, ε, Δ) <= δ``: the analytic Gaussian mechanism's calibration.

    δ(σ) decreases in σ, so the root of ``ln δ(σ) - ln δ`` in ``ln σ`` is bracketed and solved by Brent's
    method (relative tolerance 1e-12). Cached: a hook calls it on every forward pass.
    """
    check_epsilon(epsilon, delta)
    if sensitivity <= 0:
        raise ConfigError(f"sensitivity must be > 0, got {sensitivity!r}.")

    def excess(log_sigma: float) -> float:
        value = gaussian_delta(math.exp(log_sigma), epsilon, sensitivity)
        return (math.log(value) if value > 0 else -1e4) - math.log(delta)

    lo = math.log(sensitivity) - 10.0
    hi = math.log(sensitivity) + 10.0
    while excess(lo) < 0:
        lo -= 10.0
    while excess(hi) > 0:
        hi += 10.0
    return math.exp(optimize.brentq(excess, lo, hi, xtol=1e-14, rtol=1e-12))


def gaussian_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """The smallest ε with ``gaussian_delta(σ, ε, Δ) <= δ`` (inverse of :func:`gaussian_sigma`); δ(ε)
    decreases in ε, solved by Brent's method. Returns 0 when even ε = 0 meets δ."""
    check_epsilon(1.0, delta)
    if not (math.isfinite(sigma) and sigma > 0):
        raise ConfigError(f"sigma must be a positive finite number, got {sigma!r}.")
    if gaussian_delta(sigma, 0.0, sensitivity) <= delta:
        return 0.0
    hi = 1.0
    while gaussian_delta(sigma, hi, sensitivity) > delta:
        hi *= 2.0
    return optimize.brentq(
        lambda e: gaussian_delta(sigma, e, sensitivity) - delta, 0.0, hi, xtol=1e-12, rtol=1e-12
    )


def classical_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Dwork & Roth (2014, Thm A.1): ``σ = sqrt(2 ln(1.25/δ)) Δ/ε``, valid for ε < 1 (an upper bound)."""
    check_epsilon(epsilon, delta)
    return math.sqrt(2 * math.log(1.25 / delta)) * sensitivity / epsilon


# ------------------------------------------------------------------------------------ the mechanisms


def metric_ldp_std(epsilon: float, d: int) -> float:
    """Per-coordinate std of the metric noise: ``sqrt(E‖z‖²/d) = sqrt(d + 1)/ε``."""
    return math.sqrt(d + 1) / epsilon


def mechanism_std(kind: str, epsilon: float, d: int, *, delta: float, clip: float) -> float:
    """Per-coordinate noise std of ``kind`` at ε (``sqrt(d+1)/ε``, or the analytic σ with Δ = 2C)."""
    if kind == "metric_ldp":
        return metric_ldp_std(epsilon, d)
    if kind == "gaussian_mechanism":
        return gaussian_sigma(epsilon, delta, 2.0 * clip)
    raise ConfigError(f"unknown LDP kind {kind!r}; choose one of {', '.join(LDP_KINDS)}.")


def privatize(
    kind: str, x: Tensor, row_keys: Tensor, epsilon: float, *, delta: float = 1e-5, clip: float | None = None
) -> Tensor:
    """Apply mechanism ``kind`` at ε to every vector of x's last axis, with keyed noise (module docstring).

    Args:
        kind: ``metric_ldp`` or ``gaussian_mechanism``.
        x: ``[B, ..., d]`` embeddings (e.g. token embeddings ``[B, T, d]``).
        row_keys: one noise key per example (dim 0).
        epsilon: ε of the mechanism (per unit distance for metric LDP; the (ε, δ) ε per token otherwise).
        delta: δ of the Gaussian mechanism.
        clip: C, the norm every token is clipped to before the Gaussian mechanism (required for it).

    Returns:
        The privatised embeddings, in x's dtype.
    """
    check_epsilon(epsilon)
    shape = tuple(x.shape)
    if kind == "metric_ldp":
        return x + metric_ldp_noise(row_keys, shape, epsilon).to(x.dtype)
    if kind == "gaussian_mechanism":
        if clip is None:
            raise ConfigError("the gaussian_mechanism kind needs clip=<norm C>.")
        sigma = gaussian_sigma(epsilon, delta, 2.0 * clip)
        xi = nz.standard_noise("gaussian", row_keys, shape)
        return (clip_rows(x.double(), clip) + sigma * xi).to(x.dtype)
    raise ConfigError(f"unknown LDP kind {kind!r}; choose one of {', '.join(LDP_KINDS)}.")


__all__ = [
    "LDP_KINDS",
    "check_epsilon",
    "classical_gaussian_sigma",
    "clip_rows",
    "gamma_radius",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_sigma",
    "mechanism_std",
    "metric_ldp_log_density",
    "metric_ldp_noise",
    "metric_ldp_std",
    "privatize",
    "unit_directions",
]
