"""win_rate against explicit counting."""

from __future__ import annotations

import numpy as np
import pytest

from descentlab.errors import ConfigError
from descentlab.evaluation import win_rate


def test_win_rate_counts_ties_half_and_is_antisymmetric() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 5, size=200).astype(float)
    b = rng.integers(0, 5, size=200).astype(float)
    wins, ties = int((a > b).sum()), int((a == b).sum())
    result = win_rate(a, b)
    assert (result.wins, result.ties, result.n) == (wins, ties, 200)
    assert result.rate == pytest.approx((wins + 0.5 * ties) / 200)
    assert result.stderr == pytest.approx(np.sqrt(result.rate * (1 - result.rate) / 200))
    assert win_rate(b, a).rate == pytest.approx(1 - result.rate)
    assert win_rate(a, b, higher_is_better=False).rate == pytest.approx(1 - result.rate)


def test_tie_tolerance_and_errors() -> None:
    assert win_rate([1.0, 2.0], [1.05, 1.0], tie_tol=0.1).ties == 1
    with pytest.raises(ConfigError):
        win_rate([1.0], [1.0, 2.0])
    with pytest.raises(ConfigError):
        win_rate([float("nan")], [1.0])
