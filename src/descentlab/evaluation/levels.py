"""Noise levels from a model's own degradation: the level at which a metric grows by given factors.

A fixed γ grid means different things for different models and noise kinds (at γ = 1.5 of σ_E SmolLM2's
perplexity grew ~65-fold; at NEFTune's α = 1.5 it does not move). :func:`levels_for_ratios` instead finds,
for each target factor r (e.g. 1.5, 3, 10), the level x_r with

    ratio(x_r) = metric(x_r) / metric(0) ≈ r,

by bisection on log x, assuming ``ratio`` grows with x (true of perplexity under additive noise, up to the
noise of a finite validation set). Every evaluated point is cached and shared by all targets; each target's
bracket starts from the closest cached points, and the final level interpolates log ratio linearly in log x
between the bracket's ends. The returned record lists every evaluation, so the search can be audited.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from descentlab.errors import ConfigError


@dataclass
class LevelSearch:
    """The outcome of :func:`levels_for_ratios`: one level per target, and every evaluation made."""

    targets: list[float]
    levels: list[float]
    ratios: list[float]  # the measured ratio at each bracket end nearest the target (audit)
    evaluations: dict[float, float] = field(default_factory=dict)  # level -> ratio

    def to_dict(self) -> dict:
        return {
            "targets": self.targets,
            "levels": self.levels,
            "bracket_ratios": self.ratios,
            "evaluations": [[x, r] for x, r in sorted(self.evaluations.items())],
        }


def levels_for_ratios(
    ratio: Callable[[float], float],
    targets: Sequence[float],
    *,
    start: float,
    iters: int = 5,
    grow: float = 2.0,
    max_expand: int = 12,
) -> LevelSearch:
    """For each target r > 1, a level x with ``ratio(x) ≈ r`` (module docstring).

    Args:
        ratio: level -> metric(level) / metric(0), increasing in the level.
        targets: the factors, each > 1.
        start: a first level to try (> 0); the search multiplies or divides it by ``grow`` to bracket.
        iters: bisection steps on log x per target after bracketing.
        grow: bracketing factor (> 1).
        max_expand: bracketing steps before giving up.

    Raises:
        ConfigError: a target <= 1, or a target the ratio never reaches within the expansion.
    """
    if not targets or min(targets) <= 1:
        raise ConfigError(f"targets must be factors > 1, got {list(targets)}")
    if not (start > 0 and grow > 1 and iters >= 0):
        raise ConfigError("need start > 0, grow > 1 and iters >= 0")
    cache: dict[float, float] = {}

    def at(x: float) -> float:
        if x not in cache:
            cache[x] = float(ratio(x))
        return cache[x]

    levels, near = [], []
    for r in sorted(targets):
        below = [x for x, v in cache.items() if v < r]
        above = [x for x, v in cache.items() if v >= r]
        lo = max(below) if below else None
        hi = min(above) if above else None
        if lo is None and hi is None:
            x = start
            if at(x) >= r:
                hi = x
            else:
                lo = x
        n = 0
        while hi is None:
            n += 1
            if n > max_expand:
                raise ConfigError(f"the ratio stayed below {r} up to level {lo:g}; raise start or max_expand")
            x = lo * grow
            if at(x) >= r:
                hi = x
            else:
                lo = x
        while lo is None:
            n += 1
            x = hi / grow
            if n > max_expand:
                lo = 0.0  # the ratio exceeds r at every level tried: take a bracket down to 0
                break
            if at(x) >= r:
                hi = x
            else:
                lo = x
        for _ in range(iters):
            mid = hi / grow if lo <= 0 else math.sqrt(lo * hi)
            if at(mid) >= r:
                hi = mid
            else:
                lo = mid
        if lo <= 0:
            levels.append(hi)
            near.append(cache[hi])
            continue
        # interpolate log ratio linearly in log level between the bracket ends
        a, b = math.log(max(cache[lo], 1e-12)), math.log(cache[hi])
        t = 0.5 if b == a else min(1.0, max(0.0, (math.log(r) - a) / (b - a)))
        levels.append(math.exp(math.log(lo) + t * (math.log(hi) - math.log(lo))))
        near.append(cache[hi] if t > 0.5 else cache[lo])
    order = sorted(range(len(targets)), key=lambda i: targets[i])
    out_levels, out_near = [0.0] * len(targets), [0.0] * len(targets)
    for k, i in enumerate(order):
        out_levels[i], out_near[i] = levels[k], near[k]
    return LevelSearch(list(targets), out_levels, out_near, dict(cache))


__all__ = ["LevelSearch", "levels_for_ratios"]
