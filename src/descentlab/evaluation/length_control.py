"""Length-controlled win rate: a judge's preference for model A over B with the part explained by A writing
longer (or shorter) answers taken out, as AlpacaEval 2.0's length-controlled win rate does.

LLM judges prefer longer answers. AlpacaEval 2.0 (Dubois et al. 2024, "Length-Controlled AlpacaEval") fits a
logistic model of the judge's preference with a length term and reads the win rate off it with that term
set to zero. For one pair of models, per example i with preference p_i ∈ [0, 1] (1: A wins, ties 1/2):

    z_i = tanh((len^A_i − len^B_i) / sd(len^A − len^B))
    P(A wins | i) = σ(θ + φ z_i)                 (θ, φ: maximum likelihood, p_i as a soft target)
    LC win rate   = σ(θ)                        (the same answers, at equal length)

AlpacaEval's instruction-difficulty term needs many models judged on the same instructions; with one pair
it is left out. The fit is Newton's method on the Bernoulli log-likelihood (:func:`fit_length_model`); its
slow twin is :func:`fit_length_model_reference` (scipy's BFGS on the same likelihood).

Per-example cells for the claims engine (:func:`length_controlled`): ``adjusted_i = p_i − σ(θ + φ z_i) + σ(θ)``.
At the maximum-likelihood fit the intercept's score equation is Σ_i (p_i − σ(θ + φ z_i)) = 0, so the mean of
the adjusted cells is exactly the LC win rate, and each cell is the example's own preference with its
length effect removed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from descentlab.errors import DataError, NumericalError

__all__ = [
    "LengthControlled",
    "fit_length_model",
    "fit_length_model_reference",
    "length_controlled",
    "length_feature",
]


def length_feature(len_a: np.ndarray, len_b: np.ndarray) -> np.ndarray:
    """``tanh((len_a − len_b) / sd)``, sd the population std of the differences; zeros when they are all equal."""
    diff = np.asarray(len_a, dtype=np.float64) - np.asarray(len_b, dtype=np.float64)
    sd = float(diff.std())
    return np.tanh(diff / sd) if sd > 0 else np.zeros_like(diff)


def _sigmoid(x: np.ndarray | float) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))  # overflow-free σ


def fit_length_model(
    p: np.ndarray, z: np.ndarray, *, iters: int = 100, tol: float = 1e-12
) -> tuple[float, float]:
    """``(θ, φ)`` maximising Σ_i p_i log σ(η_i) + (1 − p_i) log(1 − σ(η_i)), η_i = θ + φ z_i (Newton).

    With z ≡ 0 only θ is fitted (φ = 0): σ(θ) is then the raw win rate. Raises NumericalError when the
    preferences are all 0 or all 1 (the maximum is at infinity; :func:`length_controlled` handles that case).
    """
    p = np.asarray(p, dtype=np.float64)
    z = np.asarray(z, dtype=np.float64)
    if p.mean() <= 0.0 or p.mean() >= 1.0:
        raise NumericalError("all preferences are 0 or all are 1: the logistic fit has no finite maximum")
    with_length = bool(np.any(z != 0))
    x = np.stack([np.ones_like(z), z], 1) if with_length else np.ones((len(z), 1))
    rate = p.mean()
    beta = np.zeros(x.shape[1])
    beta[0] = math.log(rate / (1 - rate))
    for _ in range(iters):
        mu = _sigmoid(x @ beta)
        grad = x.T @ (p - mu)
        hess = (x * (mu * (1 - mu))[:, None]).T @ x
        try:
            step = np.linalg.solve(hess, grad)
        except np.linalg.LinAlgError as e:
            raise NumericalError(f"the length model's Hessian is singular: {e}") from e
        # halve the step until the likelihood does not drop (Newton can overshoot far from the optimum)
        loglik = _loglik(x, beta, p)
        scale = 1.0
        while _loglik(x, beta + scale * step, p) < loglik - 1e-12 and scale > 1e-6:
            scale /= 2
        beta = beta + scale * step
        if float(np.abs(scale * step).max()) < tol:
            break
    if not np.all(np.isfinite(beta)) or float(np.abs(beta).max()) > 50:
        raise NumericalError(f"the length model diverged (θ, φ = {beta.tolist()}): a separable design")
    return float(beta[0]), float(beta[1]) if with_length else 0.0


def _loglik(x: np.ndarray, beta: np.ndarray, p: np.ndarray) -> float:
    eta = x @ beta
    # log σ(η) = −softplus(−η), log(1 − σ(η)) = −softplus(η)
    return float(np.sum(-p * np.logaddexp(0.0, -eta) - (1 - p) * np.logaddexp(0.0, eta)))


def fit_length_model_reference(p: np.ndarray, z: np.ndarray) -> tuple[float, float]:
    """Slow twin of :func:`fit_length_model`: scipy's BFGS on the same negative log-likelihood."""
    from scipy.optimize import minimize

    p = np.asarray(p, dtype=np.float64)
    z = np.asarray(z, dtype=np.float64)
    x = np.stack([np.ones_like(z), z], 1)
    res = minimize(lambda b: -_loglik(x, b, p), np.zeros(2), method="BFGS", options={"gtol": 1e-10})
    return float(res.x[0]), float(res.x[1]) if np.any(z != 0) else 0.0


@dataclass(frozen=True)
class LengthControlled:
    """One pair's length-controlled win rate.

    Attributes:
        rate: σ(θ), the win rate at equal length.
        raw_rate: mean preference (the plain win rate).
        theta, phi: the fitted intercept and length coefficient (φ > 0: the judge favours A's longer answers).
        adjusted: per-example cells whose mean is ``rate`` (module docs).
        fitted: False when nothing could be fitted (all preferences equal, or no length difference): then
            ``rate == raw_rate`` and ``adjusted`` are the preferences themselves.
    """

    rate: float
    raw_rate: float
    theta: float
    phi: float
    adjusted: np.ndarray
    fitted: bool


def length_controlled(preferences: np.ndarray, len_a: np.ndarray, len_b: np.ndarray) -> LengthControlled:
    """The length-controlled win rate of A over B from per-example preferences and answer lengths (tokens).

    Raises:
        DataError: empty or mismatched inputs, or preferences outside [0, 1].
    """
    p = np.asarray(preferences, dtype=np.float64).ravel()
    len_a, len_b = np.asarray(len_a).ravel(), np.asarray(len_b).ravel()
    if p.size == 0 or not p.size == len_a.size == len_b.size:
        raise DataError(
            f"preferences ({p.size}) and both models' lengths ({len_a.size}, {len_b.size}) must match"
        )
    if np.any((p < 0) | (p > 1)) or not np.all(np.isfinite(p)):
        raise DataError("preferences must lie in [0, 1]")
    raw = float(p.mean())
    z = length_feature(len_a, len_b)
    if raw in (0.0, 1.0) or not np.any(z != 0):
        theta = math.log(raw / (1 - raw)) if 0.0 < raw < 1.0 else math.copysign(math.inf, raw - 0.5)
        return LengthControlled(raw, raw, theta, 0.0, p.copy(), False)
    theta, phi = fit_length_model(p, z)
    fitted_p = _sigmoid(theta + phi * z)
    rate = float(_sigmoid(theta))
    return LengthControlled(rate, raw, theta, phi, p - fitted_p + rate, True)
