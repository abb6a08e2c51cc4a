"""Tune on the tuning seed, then replicate on the evaluation seeds: the plan of every study that chooses a
setting on validation, in search rounds.

Protocol. Let ``t`` be the tuning seed and ``S`` the evaluation seeds, ``t ∉ S``. Each arm ``a`` starts
from its own setting ``c⁰_a``. Round ``k`` tunes a set of arms: for each, ``candidates(a, c^{k−1})`` (a
pure function of the arm and every arm's current choice) gives the settings to try; each new one is
trained once, from seed ``t``, and the arm's choice becomes

    c^k_a = T_a[choose(a, r(T_a))],

the pick among *every* setting ``T_a`` the arm has tried so far (a setting tried in an earlier round is
not trained again). Once no later round tunes an arm, its choice ``c*_a`` is trained from every seed of
``S``, and only those runs are reported: a tuning run's validation score chose its setting, so its test
numbers are a draw selected for its luck (:func:`~descentlab.study.tuning_rules.check_tune_seed`). Compared arms
get the same number of tuning candidates (:func:`~descentlab.study.tuning_rules.check_equal_budgets`), since a
larger grid has more chances of a lucky validation score.

Jobs are submitted as soon as their inputs are known (the evaluation runs of an arm no round tunes go out
with the first round), so a pool of workers stays busy; ``meanwhile`` runs in this process while the first
round trains.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from descentlab.errors import ConfigError
from descentlab.study.tuning_rules import check_equal_budgets, check_tune_seed, lr_alpha_grid

__all__ = [
    "Round",
    "Tuned",
    "TuningConfig",
    "check_equal_budgets",
    "check_tune_seed",
    "lr_alpha_grid",
    "tune_then_replicate",
]

C = TypeVar("C")
Candidates = Callable[[str, Mapping[str, Any]], Sequence[Any]]


@dataclass(frozen=True)
class Round:
    """One search round.

    Attributes:
        arms: the arms this round tunes.
        candidates: ``(arm, choices so far) -> settings to try``; a pure function (a module-level function
            or a ``functools.partial`` of one), so the plan reads without mutable closures.
    """

    arms: tuple[str, ...]
    candidates: Candidates

    def __post_init__(self) -> None:
        object.__setattr__(self, "arms", tuple(self.arms))


@dataclass
class TuningConfig:
    """Seeds and search rounds of a tuned study, checked on construction.

    Attributes:
        seeds: the evaluation seeds; every one is reported.
        tune_seed: the seed of every tuning run; never an evaluation seed (checked when any round tunes).
        rounds: the search rounds, in order; none: no tuning, every arm runs its own setting.
        budgets: arm -> its number of tuning candidates, for the arms compared with each other; they must
            agree (:func:`check_equal_budgets`). Empty: not checked (e.g. a round that tunes one shared lr).
    """

    seeds: Sequence[int]
    tune_seed: int
    rounds: Sequence[Round] = ()
    budgets: Mapping[Hashable, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.seeds = [int(s) for s in self.seeds]
        if not self.seeds:
            raise ConfigError("a tuned study needs at least one evaluation seed")
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"evaluation seeds repeat: {self.seeds}")
        if self.rounds:
            check_tune_seed(self.tune_seed, self.seeds)
        if self.budgets:
            check_equal_budgets({arm: range(n) for arm, n in self.budgets.items()})

    def tuned_after(self, k: int) -> set[str]:
        """The arms some round after round ``k`` (0-based) tunes."""
        return {arm for rnd in self.rounds[k + 1 :] for arm in rnd.arms}


@dataclass
class Tuned(Generic[C]):
    """What :func:`tune_then_replicate` hands back.

    Attributes:
        chosen: arm -> its final setting.
        tried: arm -> every setting it tried on the tuning seed, in the order tried (empty if untuned).
        results: arm -> the tuning-seed result of each of ``tried``.
        picks: arm -> the index of ``chosen`` in ``tried`` (absent for an untuned arm).
        per_seed: arm -> the evaluation results of ``chosen``, in the order of the seeds.
        meanwhile: what the ``meanwhile`` callable returned (None without one).
    """

    chosen: dict[str, C]
    tried: dict[str, list[C]]
    results: dict[str, list[Any]]
    picks: dict[str, int]
    per_seed: dict[str, list[Any]]
    meanwhile: Any = None


def tune_then_replicate(
    start: Mapping[str, C],
    plan: TuningConfig,
    submit: Callable[[str, C, int], Future],
    choose: Callable[[str, Sequence[Any]], int],
    *,
    then: Callable[[str, C, list[Any]], None] | None = None,
    meanwhile: Callable[[], Any] | None = None,
) -> Tuned[C]:
    """Run ``plan``'s rounds on its tuning seed, then every arm's choice on every evaluation seed.

    Args:
        start: arm -> its initial setting (the arms, in report order).
        plan: seeds, tuning seed and rounds.
        submit: ``(arm, setting, seed) -> Future`` of the job's result.
        choose: ``(arm, results of every setting the arm tried) -> index of the pick`` (validation only).
        then: follow-up hook, called as ``then(arm, chosen setting, per-seed results)`` once an arm's
            evaluation runs are done, in arm order (e.g. to submit jobs that depend on them).
        meanwhile: run in this process once the first jobs are submitted; its value is ``Tuned.meanwhile``.

    Raises:
        ConfigError: a round names an arm that ``start`` lacks, or offers an arm no candidate.
    """
    if unknown := sorted({a for rnd in plan.rounds for a in rnd.arms} - set(start)):
        raise ConfigError(f"a tuning round names arms {unknown} that the study does not run")
    chosen, seeds = dict(start), list(plan.seeds)
    tried: dict[str, list[C]] = {arm: [] for arm in start}
    results: dict[str, list[Any]] = {arm: [] for arm in start}
    picks: dict[str, int] = {}
    untuned = [arm for arm in start if arm not in plan.tuned_after(-1)]
    finals = _replicate(submit, chosen, untuned, seeds)
    value = None
    for k, rnd in enumerate(plan.rounds):
        pending: dict[str, list[tuple[C, Future]]] = {}
        for arm in rnd.arms:
            offered = list(rnd.candidates(arm, chosen))
            if not offered:
                raise ConfigError(f"tuning round {k + 1} offers {arm} no candidate")
            new = [c for i, c in enumerate(offered) if c not in tried[arm] and c not in offered[:i]]
            pending[arm] = [(c, submit(arm, c, plan.tune_seed)) for c in new]
        if k == 0 and meanwhile is not None:
            value = meanwhile()
        for arm, jobs in pending.items():
            for setting, future in jobs:
                tried[arm].append(setting)
                results[arm].append(future.result())
            picks[arm] = choose(arm, results[arm])
            chosen[arm] = tried[arm][picks[arm]]
        finals |= _replicate(
            submit, chosen, [arm for arm in rnd.arms if arm not in plan.tuned_after(k)], seeds
        )
    if not plan.rounds and meanwhile is not None:
        value = meanwhile()
    per_seed: dict[str, list[Any]] = {}
    for arm in start:
        per_seed[arm] = [finals[arm, s].result() for s in seeds]
        if then is not None:
            then(arm, chosen[arm], per_seed[arm])
    return Tuned(chosen, tried, results, picks, per_seed, value)


def _replicate(
    submit: Callable[[str, C, int], Future],
    chosen: Mapping[str, C],
    arms: Sequence[str],
    seeds: Sequence[int],
) -> dict[tuple[str, int], Future]:
    """Submit every (arm, seed) evaluation run of ``arms`` at their chosen settings, seed-major."""
    return {(arm, s): submit(arm, chosen[arm], s) for s in seeds for arm in arms}
