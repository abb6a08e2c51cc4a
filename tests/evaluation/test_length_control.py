"""Length-controlled win rate: Newton's fit equals scipy's BFGS (its slow twin), a judge that only rewards
length gives an LC win rate near 1/2, and the adjusted cells average to the LC win rate."""

from __future__ import annotations

import numpy as np
import pytest

from descentlab.errors import DataError, NumericalError
from descentlab.evaluation.length_control import (
    fit_length_model,
    fit_length_model_reference,
    length_controlled,
    length_feature,
)


def _pairs(n: int, theta: float, phi: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    len_a = rng.integers(20, 400, n)
    len_b = rng.integers(20, 400, n)
    z = length_feature(len_a, len_b)
    win = rng.random(n) < 1 / (1 + np.exp(-(theta + phi * z)))
    ties = rng.random(n) < 0.1
    return np.where(ties, 0.5, win.astype(float)), len_a, len_b


def test_newton_fit_equals_its_slow_twin() -> None:
    for theta, phi, seed in ((0.0, 1.5, 0), (0.8, -0.7, 1), (-1.2, 0.3, 2)):
        p, a, b = _pairs(600, theta, phi, seed)
        z = length_feature(a, b)
        fast, slow = fit_length_model(p, z), fit_length_model_reference(p, z)
        np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-5)


def test_a_judge_that_only_rewards_length_is_controlled_back_to_parity() -> None:
    p, a, b = _pairs(4000, theta=0.0, phi=3.0)
    a = a + 120  # A writes longer answers: the raw win rate is far above 1/2
    p2 = np.where(
        np.random.default_rng(5).random(len(p)) < 1 / (1 + np.exp(-3.0 * length_feature(a, b))), 1.0, 0.0
    )
    lc = length_controlled(p2, a, b)
    assert lc.raw_rate > 0.7 and lc.fitted and lc.phi > 2
    assert lc.rate == pytest.approx(0.5, abs=0.06)
    assert float(lc.adjusted.mean()) == pytest.approx(lc.rate, abs=1e-9)  # the intercept's score equation


def test_a_real_quality_gap_survives_length_control() -> None:
    p, a, b = _pairs(4000, theta=1.0, phi=0.0, seed=3)
    lc = length_controlled(p, a, b)
    assert lc.rate == pytest.approx(1 / (1 + np.exp(-1.0)), abs=0.03)
    assert abs(lc.phi) < 0.2


def test_degenerate_inputs() -> None:
    same = length_controlled(np.array([1.0, 0.0, 0.5]), np.array([5, 5, 5]), np.array([5, 5, 5]))
    assert not same.fitted and same.rate == same.raw_rate == 0.5
    np.testing.assert_array_equal(same.adjusted, [1.0, 0.0, 0.5])
    sweep = length_controlled(np.ones(4), np.array([1, 2, 3, 4]), np.array([4, 3, 2, 1]))
    assert sweep.rate == 1.0 and not sweep.fitted
    with pytest.raises(NumericalError):
        fit_length_model(np.ones(3), np.array([0.1, 0.2, 0.3]))
    with pytest.raises(DataError):
        length_controlled(np.array([0.5, 1.5]), np.array([1, 2]), np.array([1, 2]))
    with pytest.raises(DataError):
        length_controlled(np.array([0.5]), np.array([1, 2]), np.array([1, 2]))
