"""Tune on one seed, replicate on the others: the grid-search protocol of the experiments that choose every
setting on validation.

Per group (e.g. an (architecture, method) pair), every candidate runs with the first seed; the one of lowest
``score`` (first in candidate order on ties) runs with every later seed. Jobs are submitted as early as their
inputs allow, so a pool of workers stays busy.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["tune_and_replicate"]

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
