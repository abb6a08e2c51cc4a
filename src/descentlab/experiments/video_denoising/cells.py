"""The cells of the video-denoising study: its key scheme and design record (:mod:`descentlab.study.cells`).

Keys. ``mse/<arm>``: the final estimate's MSE of every test sequence, ``[seeds, G, N]`` over the run's γ
levels (the design's ``extra["gammas"]``, in order) and its N test sequences; ``layer_mse/<arm>``: every
layer's estimate's MSE at γ = 1, ``[seeds, L+1, N]`` (learned methods only); ``rmse/<arm>``: the pooled
test RMSE per seed, ``[seeds, G]`` (read from ``results.json`` for runs that saved no per-sequence errors,
:mod:`.legacy`). An arm is a learned method ``<architecture>-<label>``, a classical baseline, or a point
of the budget curve :func:`budget_name` (first evaluation seed only: ``[1, ...]``).

The design record's ``extra`` holds ``gammas``, ``methods`` (the learned arms, in report order),
``baselines`` and ``budget_steps``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from descentlab.study.cells import CellStore, Design

MSE = "mse"
LAYER_MSE = "layer_mse"
RMSE = "rmse"


def budget_name(method: str, steps: int) -> str:
    """The arm of ``method`` retrained for ``steps`` (a point of the budget curve)."""
    return f"{method}@{int(steps)}"


def design(
    *,
    methods: Sequence[str],
    baselines: Sequence[str],
    gammas: Sequence[float],
    seeds: Sequence[int],
    budget_steps: Sequence[int] = (),
    budget_arms: Sequence[str] = (),
    examples: int | None = None,
) -> Design:
    """The design record: every learned method, baseline and budget point is an arm."""
    return Design(
        arms=(*methods, *baselines, *budget_arms),
        seeds=tuple(seeds),
        examples=examples,
        extra={
            "gammas": [float(g) for g in gammas],
            "methods": list(methods),
            "baselines": list(baselines),
            "budget_steps": sorted(int(s) for s in budget_steps),
        },
    )


def cell_store(
    record: Design,
    errors: Mapping[str, np.ndarray],
    baseline_errors: Mapping[str, np.ndarray],
) -> CellStore:
    """The store of a new run: per learned arm (``errors``: name -> ``[S, G, L+1, N]``) ``mse`` and
    ``layer_mse`` at γ = 1, per baseline (``[S, G, N]``) ``mse``. Budget points keep their one seed."""
    one = record.extra["gammas"].index(1.0)
    arrays: dict[str, np.ndarray] = {}
    for name, e in errors.items():
        arrays[f"{MSE}/{name}"] = e[:, :, -1]
        arrays[f"{LAYER_MSE}/{name}"] = e[:, one]
    arrays |= {f"{MSE}/{b}": e for b, e in baseline_errors.items()}
    for key in arrays:
        record.require(key.split("/", 1)[1])
    return CellStore(record, arrays)
