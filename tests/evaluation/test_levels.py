"""levels_for_ratios: the level at which a monotone degradation reaches each factor."""

from __future__ import annotations

import math

import pytest

from descentlab.errors import ConfigError
from descentlab.evaluation.levels import levels_for_ratios


def test_finds_the_level_of_each_ratio_and_shares_evaluations() -> None:
    calls = []

    def ratio(x: float) -> float:
        calls.append(x)
        return math.exp((x / 0.6) ** 3)

    s = levels_for_ratios(ratio, [10.0, 1.5, 3.0], start=0.5, iters=6)
    for target, level in zip(s.targets, s.levels, strict=True):
        assert ratio(level) == pytest.approx(target, rel=0.02)
    assert len(s.evaluations) == len(set(calls[: len(s.evaluations)])) < 3 * 9  # shared cache
    d = s.to_dict()
    assert d["targets"] == [10.0, 1.5, 3.0] and len(d["evaluations"]) == len(s.evaluations)


def test_brackets_from_a_start_far_off_and_rejects_bad_targets() -> None:
    s = levels_for_ratios(lambda x: 1 + x, [2.0], start=1e-3, iters=8)
    assert s.levels[0] == pytest.approx(1.0, rel=0.02)
    s = levels_for_ratios(lambda x: 1 + x, [2.0], start=1e3, iters=8)
    assert s.levels[0] == pytest.approx(1.0, rel=0.02)
    with pytest.raises(ConfigError):
        levels_for_ratios(lambda x: 1 + x, [1.0], start=1.0)
    with pytest.raises(ConfigError):
        levels_for_ratios(lambda x: 1.0, [2.0], start=1.0, max_expand=3)  # never degrades
