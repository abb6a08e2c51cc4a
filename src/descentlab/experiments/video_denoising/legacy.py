"""Reader for video-denoising runs made before the cell store (the committed ``docs/results/video-denoising``
runs, their companions ``full-dust`` and ``full-dust-same-lr``, and ``earlier/``, ``earlier/budget/``).

Those runs saved ``arrays/claims.npz`` (``final/<name>`` ``[S, G, N]``, ``layers/<name>`` ``[S, L+1, N]``,
and the names ``methods``, ``baselines``, ``gammas``, ``budget_steps`` as arrays) or, the earlier ones,
nothing but ``results.json``, whose per-seed pooled RMSE (``methods.<m>.per_seed_rmse``,
``baselines.<b>.rmse``, ``budget_curve.rows``) the claims then read. :func:`legacy_store` gathers either
into a :class:`~descentlab.study.cells.CellStore` keyed as new runs are (:mod:`.claims`), with the design
built from what the run recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.video_denoising.config import LAYER_MSE, MSE, RMSE, budget_name, cell_design
from descentlab.io import load_arrays
from descentlab.study.cells import CellStore

OLD_METRICS = {"final": MSE, "layers": LAYER_MSE, "rmse": RMSE}  # claims.npz's prefixes -> the store's
OLD_NAMES = ("gammas", "methods", "baselines", "budget_steps")  # claims.npz's non-cell entries


def legacy_store(run_dir: Path | str) -> CellStore | None:
    """The old run's cells: ``arrays/claims.npz`` when it saved one, and the pooled RMSE per seed of its
    ``results.json``; None when the run has neither."""
    path, results_path = Path(run_dir) / "arrays" / "claims.npz", Path(run_dir) / "results.json"
    arrays: dict[str, Any] = dict(load_arrays(path)) if path.is_file() else {}
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    if results:
        arrays = _with_results(arrays, results)
    return store_from_arrays(arrays, results.get("config", {}).get("seeds")) if arrays else None


def _with_results(arrays: dict[str, Any], results: Mapping[str, Any]) -> dict[str, Any]:
    """``arrays`` with ``rmse/<name>`` (``[seeds, G]``) of every method, baseline and budget point of
    ``results``, and the names a run without ``claims.npz`` did not save as arrays."""
    pooled = {m: block["per_seed_rmse"] for m, block in results.get("methods", {}).items()}
    pooled |= {b: block["rmse"] for b, block in results.get("baselines", {}).items()}
    rows = (results.get("budget_curve") or {}).get("rows", [])
    for row in rows:
        pooled[budget_name(f"{row['architecture']}-{row['label']}", row["steps"])] = [row["test_rmse"]]
    out = arrays | {f"rmse/{name}": np.asarray(v, dtype=np.float64) for name, v in pooled.items()}
    recorded = {
        "gammas": results.get("protocol", {}).get("gammas"),
        "methods": list(results.get("methods", {})),
        "baselines": list(results.get("baselines", {})),
        "budget_steps": sorted({r["steps"] for r in rows}),
    }
    return out | {k: np.asarray(v) for k, v in recorded.items() if k not in out and v is not None}


def store_from_arrays(arrays: Mapping[str, Any], seeds: list[int] | None = None) -> CellStore:
    """A store of the ``claims.npz`` layout: its cell prefixes renamed, its names moved to the design.

    ``seeds`` default to ``0..S-1`` (S: the first method's first axis)."""
    names = {k: np.asarray(arrays[k]).tolist() for k in OLD_NAMES if k in arrays}
    cells = {
        f"{OLD_METRICS[prefix]}/{name}": np.asarray(value)
        for key, value in arrays.items()
        if key not in OLD_NAMES
        for prefix, name in [key.split("/", 1)]
    }
    methods, baselines = names.get("methods", []), names.get("baselines", [])
    if seeds is None:
        first = next((cells[k] for k in cells if k.split("/", 1)[1] in methods), None)
        seeds = list(range(first.shape[0])) if first is not None else []
    examples = next((int(v.shape[-1]) for k, v in cells.items() if k.startswith(f"{MSE}/")), None)
    record = cell_design(
        methods=methods,
        baselines=baselines,
        gammas=[float(g) for g in names.get("gammas", [])],
        seeds=seeds,
        budget_steps=[int(s) for s in names.get("budget_steps", [])],
        budget_arms=list(dict.fromkeys(k.split("/", 1)[1] for k in cells if "@" in k)),
        examples=examples,
    )
    return CellStore(record, cells)
