"""Head-to-head win rates: how often method A beats method B on paired examples (ties count half)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from descentlab.errors import ConfigError


@dataclass(frozen=True)
class WinRate:
    """``rate = (wins + tie_weight·ties) / n`` with its binomial standard error."""

    rate: float
    stderr: float
    wins: int
    ties: int
    losses: int

    @property
    def n(self) -> int:
        return self.wins + self.ties + self.losses


def win_rate(
    score_a: Sequence[float] | np.ndarray,
    score_b: Sequence[float] | np.ndarray,
    *,
    higher_is_better: bool = True,
    tie_tol: float = 0.0,
    tie_weight: float = 0.5,
) -> WinRate:
    """Win rate of A over B from paired per-example scores (judge scores, log-likelihoods, correctness).

    Example i is a win when ``s_a - s_b > tie_tol`` (sign flipped if lower is better), a tie when
    ``|s_a - s_b| <= tie_tol``. ``stderr = sqrt(r (1 - r) / n)``. Swapping A and B gives ``1 - rate``.
    """
    a = np.asarray(score_a, dtype=np.float64)
    b = np.asarray(score_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ConfigError(
            f"win_rate needs two equal-length non-empty 1-D score arrays, got {a.shape}, {b.shape}."
        )
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ConfigError("win_rate got non-finite scores; drop or fix those examples first.")
    diff = a - b if higher_is_better else b - a
    wins = int((diff > tie_tol).sum())
    losses = int((diff < -tie_tol).sum())
    ties = a.size - wins - losses
    rate = (wins + tie_weight * ties) / a.size
    return WinRate(
        rate=rate, stderr=math.sqrt(rate * (1 - rate) / a.size), wins=wins, ties=ties, losses=losses
    )
