"""Reader for implicit-bias runs made before the cell store (the committed ``docs/results/implicit-bias``
and its ``earlier/`` run).

Those runs saved one flat ``arrays/claims.npz``: ``<metric>__<method>`` ``[seeds]`` for the main problems,
``theorem_steps`` ``[P]`` with ``theorem_ratio__<method>`` ``[seeds, P]``, and ``scales_decades`` ``[K]``
with ``scales_l1_margin_ratio__<method>`` ``[K, seeds]``, with no design record. :func:`store_from_flat`
re-keys them as the run now saves them (``claims.py``): ``<metric>/<method>``, ``theorem_ratio/<method>``
and ``scales_l1_margin_ratio/<method>/<decades>``, with the theorem's steps and objects in the design's
``extra["theorem"]``, so the claims read old and new runs alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from descentlab.io import load_arrays
from descentlab.study.cells import CellStore, Design

LEGACY_ARRAYS = "arrays/claims.npz"


def store_from_flat(arrays: Mapping[str, np.ndarray], seeds: Sequence[int] | None = None) -> CellStore:
    """The flat ``claims.npz`` arrays as a :class:`CellStore` (``seeds``: the evaluation seeds, in order;
    default ``0..n-1`` from the arrays' first axis)."""
    per_method = {tuple(k.split("__", 1)): np.asarray(v) for k, v in arrays.items() if "__" in k}
    decades = np.asarray(arrays.get("scales_decades", []), dtype=np.float64)
    arms = tuple(dict.fromkeys(m for _, m in per_method))
    n_seeds = next((v.shape[1] if k == "scales_l1_margin_ratio" else v.shape[0]
                    for (k, _), v in per_method.items()), 0)  # fmt: skip
    extra = {}
    if "theorem_steps" in arrays:
        theorem = [m for k, m in per_method if k == "theorem_ratio"]
        extra["theorem"] = {"steps": np.asarray(arrays["theorem_steps"]).tolist(), "methods": theorem}
    design = Design(
        arms, tuple(decades), tuple(seeds) if seeds is not None else tuple(range(n_seeds)), 1, extra
    )
    store = CellStore(design)
    for (metric, arm), values in per_method.items():
        if metric == "scales_l1_margin_ratio":
            for i, kappa in enumerate(decades):
                store.put(metric, arm, kappa, values[i])
        else:
            store.put(metric, arm, None, values)
    return store


def legacy_store(run_dir: Path | str) -> CellStore | None:
    """The old run's cells as a :class:`CellStore`; None when the run has no ``arrays/claims.npz``."""
    run_dir = Path(run_dir)
    if not (run_dir / LEGACY_ARRAYS).is_file():
        return None
    results = run_dir / "results.json"
    seeds = json.loads(results.read_text())["config"]["seeds"] if results.is_file() else None
    return store_from_flat(load_arrays(run_dir / LEGACY_ARRAYS), seeds)
