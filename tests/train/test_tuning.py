"""train.tuning's checks: a tuning seed is never an evaluation seed, and compared methods get equal tuning
budgets (the planner that uses them is descentlab.study.tuning, tested in tests/study)."""

from __future__ import annotations

import pytest

from descentlab.errors import ConfigError
from descentlab.study.tuning_rules import check_equal_budgets, check_tune_seed


def test_a_tuning_seed_among_the_evaluation_seeds_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"tune_seed=1 is also an evaluation seed \[0, 1, 2\]"):
        check_tune_seed(1, [0, 1, 2])
    with pytest.raises(ConfigError, match="tune_seed=3"):
        check_tune_seed(3, [0, 1], [3])  # e.g. a second arm's seeds
    check_tune_seed(1000, [0, 1], [2])


def test_equal_budgets_name_the_counts() -> None:
    assert check_equal_budgets({"adamw": [1, 2, 3, 4], "horst": "abcd", "ham": range(4)}) == 4
    assert check_equal_budgets({}) == 0
    with pytest.raises(
        ConfigError, match=r"unequal tuning budgets \(adamw: 3, horst: 5, ham: 3 candidates\)"
    ):
        check_equal_budgets({"adamw": [1, 2, 3], "horst": [1, 2, 3, 4, 5], "ham": [1, 2, 3]})
