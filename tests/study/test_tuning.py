"""study.tuning: the planner's order (rounds on the tuning seed, then the evaluation seeds), that no tuning
run is ever reported, that a setting tried in an earlier round is not trained again, and the config's
checks (tuning seed, equal budgets)."""

from __future__ import annotations

from concurrent.futures import Future
from functools import partial

import pytest

from descentlab.errors import ConfigError
from descentlab.study.tuning import Round, TuningConfig, tune_then_replicate

# a validation loss with a known minimum: arm a is best at lr 3, arm b at lr 1; alpha best at 10
BEST_LR = {"a": 3.0, "b": 1.0, "c": 5.0}


def _loss(arm: str, setting: tuple[float, float]) -> float:
    lr, alpha = setting
    return abs(lr - BEST_LR[arm]) + abs(alpha - 10.0) / 100


class Jobs:
    """A fake job runner: every submit is logged, every result read is logged, results are deterministic."""

    def __init__(self) -> None:
        self.log: list[tuple] = []

    def submit(self, arm: str, setting: tuple[float, float], seed: int) -> Future:
        self.log.append(("submit", arm, setting, seed))
        future: Future = Future()
        future.set_result({"arm": arm, "setting": setting, "seed": seed, "loss": _loss(arm, setting)})
        return _Logged(future, self.log)


class _Logged(Future):
    def __init__(self, inner: Future, log: list) -> None:
        super().__init__()
        self.inner, self.log = inner, log

    def result(self, timeout=None):
        out = self.inner.result()
        self.log.append(("read", out["arm"], out["setting"], out["seed"]))
        return out


def lr_grid(lrs: list[float], arm: str, chosen) -> list[tuple[float, float]]:
    return [(lr, chosen[arm][1]) for lr in lrs]


def alpha_at_lr_of(source: str, alphas: list[float], arm: str, chosen) -> list[tuple[float, float]]:
    return [(chosen[source][0], a) for a in alphas]


def choose(arm: str, results) -> int:
    return min(range(len(results)), key=lambda i: results[i]["loss"])


START = {"a": (1.0, 1.0), "b": (2.0, 1.0), "c": (5.0, 1.0)}  # c is never tuned


def _lr_from_plan(**kw) -> TuningConfig:
    rounds = [
        Round(("a",), partial(lr_grid, [1.0, 2.0, 3.0])),
        Round(("b",), partial(alpha_at_lr_of, "a", [1.0, 10.0])),
    ]
    return TuningConfig(seeds=[0, 1], tune_seed=1000, rounds=rounds, **kw)


def test_rounds_run_in_order_and_later_rounds_see_earlier_choices() -> None:
    jobs = Jobs()
    tuned = tune_then_replicate(START, _lr_from_plan(), jobs.submit, choose)
    assert tuned.chosen == {"a": (3.0, 1.0), "b": (3.0, 10.0), "c": (5.0, 1.0)}
    assert tuned.tried["b"] == [(3.0, 1.0), (3.0, 10.0)] and tuned.picks == {"a": 2, "b": 1}
    submits = [e[1:] for e in jobs.log if e[0] == "submit"]
    assert submits == [
        ("c", (5.0, 1.0), 0), ("c", (5.0, 1.0), 1),  # no round tunes c: replicated at once
        ("a", (1.0, 1.0), 1000), ("a", (2.0, 1.0), 1000), ("a", (3.0, 1.0), 1000),  # round 1
        ("a", (3.0, 1.0), 0), ("a", (3.0, 1.0), 1),  # a is final after round 1: replicated before round 2
        ("b", (3.0, 1.0), 1000), ("b", (3.0, 10.0), 1000),  # round 2, at a's chosen lr
        ("b", (3.0, 10.0), 0), ("b", (3.0, 10.0), 1),
    ]  # fmt: skip
    # round 2 is only submitted after every round-1 result was read
    first_b = jobs.log.index(("submit", "b", (3.0, 1.0), 1000))
    assert all(jobs.log.index(("read", "a", (lr, 1.0), 1000)) < first_b for lr in (1.0, 2.0, 3.0))


def test_no_tuning_run_is_reported_and_every_seed_is() -> None:
    tuned = tune_then_replicate(START, _lr_from_plan(), Jobs().submit, choose)
    for arm, runs in tuned.per_seed.items():
        assert [r["seed"] for r in runs] == [0, 1]
        assert all(r["setting"] == tuned.chosen[arm] for r in runs)
    assert all(r["seed"] == 1000 for runs in tuned.results.values() for r in runs)
    assert tuned.results["c"] == [] and "c" not in tuned.picks


def test_a_setting_tried_earlier_is_not_trained_again_and_the_pick_is_over_all_tried() -> None:
    rounds = [
        Round(("a", "b"), partial(lr_grid, [1.0, 3.0])),
        Round(("a", "b"), partial(lr_grid, [1.0, 2.0, 2.0])),  # 1.0 repeats an earlier setting, 2.0 itself
    ]
    jobs = Jobs()
    tuned = tune_then_replicate(START, TuningConfig([0], 7, rounds), jobs.submit, choose)
    tuning = [e for e in jobs.log if e[0] == "submit" and e[3] == 7]
    assert len(tuning) == len(set(tuning)) == 6  # a, b: 1, 3, then 2 only
    assert tuned.tried["a"] == [(1.0, 1.0), (3.0, 1.0), (2.0, 1.0)]
    # round 2 searched around the round-1 choice; a's best of all three tried is still lr 3 from round 1
    assert tuned.chosen["a"] == (3.0, 1.0) and tuned.chosen["b"] == (1.0, 1.0)


def test_follow_up_hook_and_meanwhile() -> None:
    jobs, seen = Jobs(), []
    at_meanwhile = []

    def meanwhile() -> str:
        at_meanwhile.append(list(jobs.log))
        return "smol"

    def then(arm, setting, runs) -> None:
        seen.append((arm, setting, [r["seed"] for r in runs]))

    tuned = tune_then_replicate(START, _lr_from_plan(), jobs.submit, choose, then=then, meanwhile=meanwhile)
    assert tuned.meanwhile == "smol"
    (log,) = at_meanwhile  # called once: after round 1 was submitted, before any result was read
    assert sum(e[0] == "submit" and e[3] == 1000 for e in log) == 3 and not any(e[0] == "read" for e in log)
    assert seen == [("a", (3.0, 1.0), [0, 1]), ("b", (3.0, 10.0), [0, 1]), ("c", (5.0, 1.0), [0, 1])]
    untuned = tune_then_replicate(START, TuningConfig([0], 7), Jobs().submit, choose, meanwhile=lambda: 1)
    assert untuned.meanwhile == 1 and untuned.chosen == START and untuned.picks == {}


def test_the_config_refuses_a_tuning_seed_among_the_evaluation_seeds_and_unequal_budgets() -> None:
    with pytest.raises(ConfigError, match="tune_seed=1 is also an evaluation seed"):
        _lr_from_plan().__class__([0, 1], 1, _lr_from_plan().rounds)
    TuningConfig([0, 1], 1)  # no round: the tuning seed trains nothing, so it may be anything
    with pytest.raises(ConfigError, match="unequal tuning budgets"):
        TuningConfig([0], 9, budgets={"adamw": 4, "horst": 6})
    assert TuningConfig([0], 9, budgets={"adamw": 4, "horst": 4}).budgets == {"adamw": 4, "horst": 4}
    with pytest.raises(ConfigError, match="repeat"):
        TuningConfig([0, 0], 9)
    with pytest.raises(ConfigError, match="arms \\['z'\\]"):
        tune_then_replicate(
            START, TuningConfig([0], 9, [Round(("z",), partial(lr_grid, [1.0]))]), Jobs().submit, choose
        )
    with pytest.raises(ConfigError, match="offers a no candidate"):
        tune_then_replicate(
            START, TuningConfig([0], 9, [Round(("a",), partial(lr_grid, []))]), Jobs().submit, choose
        )
