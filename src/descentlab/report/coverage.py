"""How often an interval covers the truth on simulated crossed designs (seeds × examples).

The design is the one our studies have: S training seeds, each evaluated on the same E examples, so the
paired difference of a cell is

    δ[s, e] = S_s + E_e + R_se,   S_s ~ N(0, σ²_S),  E_e ~ N(0, σ²_E),  R_se ~ N(0, σ²_R),

with true mean 0. An interval's coverage is the share of replicates whose interval contains 0. The
regimes are named by which term dominates ``Var(δ̄) = σ²_S/S + σ²_E/E + σ²_R/(S·E)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from descentlab.report.stats import paired_bootstrap, paired_interval


@dataclass(frozen=True)
class Regime:
    """Standard deviations of the seed, example and residual terms."""

    name: str
    seed_sd: float
    example_sd: float
    residual_sd: float

    def seed_share(self, seeds: int, examples: int) -> float:
        """The share of ``Var(δ̄)`` that lies between seeds."""
        parts = (
            self.seed_sd**2 / seeds,
            self.example_sd**2 / examples,
            self.residual_sd**2 / (seeds * examples),
        )
        return parts[0] / sum(parts)


REGIMES = (
    Regime("seed-dominated", 1.0, 0.3, 0.3),
    Regime("example-dominated", 0.01, 1.0, 0.5),
    Regime("mixed", 0.07, 1.0, 1.0),
)

Interval = Callable[[np.ndarray], tuple[float, float]]


def seed_level(diff: np.ndarray) -> tuple[float, float]:
    """:func:`~descentlab.report.stats.paired_interval` at 95 %."""
    iv = paired_interval(diff, np.zeros_like(diff))
    return iv.low, iv.high


def pigeonhole(diff: np.ndarray, n_boot: int = 500) -> tuple[float, float]:
    """The pigeonhole percentile bootstrap that the verdicts used before (every axis resampled)."""
    ci = paired_bootstrap(diff, np.zeros_like(diff), n_boot=n_boot)
    return ci.low, ci.high


def coverage(
    interval: Interval, regime: Regime, seeds: int, examples: int, *, reps: int, seed: int = 0
) -> float:
    """The share of ``reps`` simulated designs whose interval contains the true difference 0."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(reps):
        diff = (
            regime.seed_sd * rng.standard_normal((seeds, 1))
            + regime.example_sd * rng.standard_normal((1, examples))
            + regime.residual_sd * rng.standard_normal((seeds, examples))
        )
        low, high = interval(diff)
        hits += low <= 0.0 <= high
    return hits / reps
