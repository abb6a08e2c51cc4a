"""train.tuning: the grid runs on a tuning seed that is never an evaluation seed, the chosen candidate runs
on every evaluation seed, and compared methods get equal tuning budgets."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from descentlab.errors import ConfigError
from descentlab.train.tuning import check_equal_budgets, check_tune_seed, tune_and_replicate


class FakeJobs:
    """A submit that records every (group, index, candidate, seed) and returns an already-done Future whose
    result names the job; ``val`` gives each candidate's validation score (lower wins)."""

    def __init__(self, val: dict[str, float]) -> None:
        self.val = val
        self.submitted: list[tuple[str, int, str, int]] = []

    def __call__(self, group: str, index: int, candidate: str, seed: int) -> Future:
        self.submitted.append((group, index, candidate, seed))
        future: Future = Future()
        future.set_result({"group": group, "candidate": candidate, "seed": seed, "val": self.val[candidate]})
        return future


GROUPS = {"adamw": ["lr=1", "lr=2", "lr=3"], "horst": ["a=1", "a=2", "a=3"]}
VAL = {"lr=1": 0.5, "lr=2": 0.2, "lr=3": 0.9, "a=1": 0.4, "a=2": 0.4, "a=3": 0.1}


def test_the_grid_runs_on_the_tuning_seed_and_the_choice_on_every_evaluation_seed() -> None:
    jobs, seen = FakeJobs(VAL), []
    grid, chosen, per_seed = tune_and_replicate(
        GROUPS,
        [0, 1, 2],
        submit=jobs,
        score=lambda r: r["val"],
        then=lambda g, i, results: seen.append((g, i, [r["seed"] for r in results])),
        tune_seed=1000,
    )
    assert chosen == {"adamw": 1, "horst": 2}
    # the grid: every candidate once, all on the tuning seed
    assert {g: [(r["candidate"], r["seed"]) for r in runs] for g, runs in grid.items()} == {
        g: [(c, 1000) for c in cands] for g, cands in GROUPS.items()
    }
    # the reported results: the chosen candidate on each evaluation seed, in order; no tuning run among them
    for g, results in per_seed.items():
        assert [(r["candidate"], r["seed"]) for r in results] == [
            (GROUPS[g][chosen[g]], s) for s in (0, 1, 2)
        ]
    assert all(r["seed"] != 1000 for results in per_seed.values() for r in results)
    assert seen == [("adamw", 1, [0, 1, 2]), ("horst", 2, [0, 1, 2])]
    # 6 tuning jobs + 2 methods x 3 evaluation seeds; the evaluation jobs use the chosen index
    assert len(jobs.submitted) == 12
    assert sorted(j for j in jobs.submitted if j[3] != 1000) == sorted(
        (g, chosen[g], GROUPS[g][chosen[g]], s) for g in GROUPS for s in (0, 1, 2)
    )


def test_ties_go_to_the_first_candidate_and_a_single_candidate_is_not_tuned() -> None:
    jobs = FakeJobs({**VAL, "only": 0.3})
    grid, chosen, per_seed = tune_and_replicate(
        {"horst": ["a=1", "a=2"], "ham": ["only"]}, [5], submit=jobs, score=lambda r: r["val"], tune_seed=7
    )
    assert chosen == {"horst": 0, "ham": 0}  # a=1 and a=2 tie at 0.4
    assert grid["ham"] == [] and [r["seed"] for r in per_seed["ham"]] == [5]
    assert [j for j in jobs.submitted if j[0] == "ham"] == [("ham", 0, "only", 5)]  # no tuning-seed run


def test_a_tuning_seed_among_the_evaluation_seeds_is_refused_before_any_job() -> None:
    jobs = FakeJobs(VAL)
    with pytest.raises(ConfigError, match=r"tune_seed=1 is also an evaluation seed \[0, 1, 2\]"):
        tune_and_replicate(GROUPS, [0, 1, 2], submit=jobs, score=lambda r: r["val"], tune_seed=1)
    with pytest.raises(ConfigError, match="at least one evaluation seed"):
        tune_and_replicate(GROUPS, [], submit=jobs, score=lambda r: r["val"], tune_seed=1000)
    with pytest.raises(ConfigError, match="'ham' has no candidate"):
        tune_and_replicate({"ham": []}, [0], submit=jobs, score=lambda r: r["val"], tune_seed=1000)
    assert jobs.submitted == []
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
