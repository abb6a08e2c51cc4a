"""Tune on one seed, replicate on the others: the grid-search protocol of the experiments that choose every
setting on validation.

Per group (e.g. an (architecture, method) pair), every candidate runs with the first seed; the one of lowest
``score`` (first in candidate order on ties) runs with every later seed. Jobs are submitted as early as their
inputs allow, so a pool of workers stays busy.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from descentlab.errors import ConfigError
from descentlab.train.recipe import MethodConfig

__all__ = [
    "Selection",
    "candidate_methods",
    "choose_candidate",
    "lr_alpha_grid",
    "settings_diff",
    "tune_and_replicate",
    "with_reference",
]

G = TypeVar("G", bound=Hashable)


def tune_and_replicate(
    groups: Mapping[G, Sequence[str]],
    seeds: Sequence[int],
    submit: Callable[[G, int, str, int], Future],
    score: Callable[[Any], Any],
    then: Callable[[G, int, list[Any]], None] | None = None,
) -> tuple[dict[G, list[Any]], dict[G, int], dict[G, list[Any]]]:
    """Run the grid of every group with ``seeds[0]``, then its best candidate with ``seeds[1:]``.

    Args:
        groups: group -> its candidates (override specs), in grid order.
        seeds: the first tunes, every seed is reported.
        submit: ``(group, candidate index, candidate, seed) -> Future`` of the job's result.
        score: sort key of a first-seed result (lowest wins).
        then: called as ``then(group, chosen index, per-seed results)`` once a group's seeds are done,
            before the next group is waited for (to submit jobs that depend on them).

    Returns:
        ``grid[group]`` (the first-seed result of every candidate), ``chosen[group]`` (an index) and
        ``per_seed[group]`` (the chosen candidate's result for every seed, in order).
    """
    first, later = seeds[0], seeds[1:]
    pending = {(g, i): submit(g, i, c, first) for g, cands in groups.items() for i, c in enumerate(cands)}
    grid: dict[G, list[Any]] = {}
    chosen: dict[G, int] = {}
    later_jobs: dict[tuple[G, int], Future] = {}
    for g, cands in groups.items():
        grid[g] = [pending[g, i].result() for i in range(len(cands))]
        chosen[g] = min(range(len(cands)), key=lambda i: score(grid[g][i]))
        for s in later:
            later_jobs[g, s] = submit(g, chosen[g], cands[chosen[g]], s)
    per_seed: dict[G, list[Any]] = {}
    for g in groups:
        per_seed[g] = [grid[g][chosen[g]], *(later_jobs[g, s].result() for s in later)]
        if then is not None:
            then(g, chosen[g], per_seed[g])
    return grid, chosen, per_seed


def lr_alpha_grid(method: MethodConfig, lrs: Sequence[float], alphas: Sequence[float]) -> list[MethodConfig]:
    """``method`` at every (lr, α) of ``lrs`` × ``alphas``, lr-major; an empty ``alphas`` keeps the
    optimizer's own α (one candidate per lr)."""
    alphas = list(alphas) or [method.optimizer.alpha]
    return [
        replace(method, optimizer=replace(method.optimizer, lr=lr, alpha=a)) for lr in lrs for a in alphas
    ]


def candidate_methods(label: str, method: MethodConfig, selection: Any) -> list[MethodConfig]:
    """``method`` with each of its selection candidates applied to its constraint (one, itself, if none)."""
    if not method.constrained:
        return [method]
    out = []
    for spec in selection.candidates.get(label, [""]):
        try:
            out.append(replace(method, constraint=method.constraint.with_overrides(spec)))
        except ConfigError as e:
            raise ConfigError(f"bad selection candidate {spec!r} of {label}: {e}") from None
    return out


def choose_candidate(
    method: str,
    candidates: Sequence[str],
    scores: Sequence[Mapping[str, float]],
    erm_clean: float | None,
    *,
    criterion: str = "robust",
    max_clean_drop: float = 0.01,
) -> tuple[int, list[list[Any]], str]:
    """Pick a candidate from its validation numbers ``{"clean": .., "robust": ..}``.

    Candidates whose clean validation accuracy is within ``max_clean_drop`` of ERM's are eligible; among
    them the highest ``criterion`` score wins (ties: higher clean accuracy, then the earlier candidate). If
    none is eligible, the same order applies to all. Returns (index, selection-table rows, reason).
    """
    key = "robust" if criterion == "robust" else "clean"
    ranked = [
        (erm_clean is None or s["clean"] >= erm_clean - max_clean_drop, s[key], s["clean"], -i)
        for i, s in enumerate(scores)
    ]
    best = max(range(len(ranked)), key=lambda i: ranked[i])
    rows = [
        [method, c or "(defaults)", s["clean"], s["robust"], "yes" if i == best else ""]
        for i, (c, s) in enumerate(zip(candidates, scores, strict=True))
    ]
    what = "mean accuracy over the gaussian γ grid" if key == "robust" else "clean accuracy"
    eligible = "" if ranked[best][0] else " (no candidate was within the clean-accuracy margin)"
    why = (
        f"highest validation {what} among candidates within {max_clean_drop} clean accuracy of ERM"
        f"{eligible}: {candidates[best] or '(defaults)'!r}"
    )
    return best, rows, why


def settings_diff(settings: Mapping[str, Any], base: Mapping[str, Any]) -> str:
    """The entries of ``settings`` that differ from ``base``, as ``key=value`` words ("nothing" if none)."""
    return " ".join(f"{k}={v}" for k, v in settings.items() if base.get(k) != v) or "nothing"


@dataclass
class Selection:
    """Validation-split choice of the constrained settings (first seed only), never on test.

    Attributes:
        candidates: method -> DescentConfig override specs (e.g. ``"alpha_from=erm"``), applied to that
            method's own constraint; a method without an entry has the one candidate ``""``.
        follow: method -> the method whose chosen spec it takes (applied to its own constraint), e.g. the
            resilient method takes the constrained method's choice and keeps its resilience.
        criterion: ``robust``: validation accuracy averaged over the gaussian γ grid; ``clean``: clean accuracy.
        max_clean_drop: candidates losing more clean validation accuracy than this vs ERM are a last resort.
        draws: noise realisations of the validation curve.
    """

    candidates: dict[str, list[str]] = field(default_factory=lambda: {"constrained": ["", "alpha_from=erm"]})
    follow: dict[str, str] = field(default_factory=lambda: {"resilient": "constrained"})
    criterion: str = "robust"
    max_clean_drop: float = 0.01
    draws: int = 1


def with_reference(method: MethodConfig, reference: list[float] | None) -> MethodConfig:
    """``method`` with ``alpha_from=erm`` resolved into ``alpha_reference`` (unchanged otherwise)."""
    c = method.constraint
    if not method.constrained or c.alpha_from != "erm" or c.alpha_reference is not None:
        return method
    if reference is None:
        raise ConfigError("alpha_from=erm: the ERM validation profile is missing")
    return replace(method, constraint=replace(c, alpha_reference=list(reference)))
