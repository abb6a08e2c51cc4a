"""Readers for llm-robustness runs made before the cell store (the committed ``docs/results/llm-robustness``
runs and their companions): ``arrays/claims.npz`` (``win/<method>/<condition>`` as now, the null control as
``null/<condition>``, ``level/<condition>`` and ``erm_ratio/<condition>``, no design record), or, for the
one-seed ``earlier`` run, only the win / tie / loss counts in its ``results.json``. :func:`store_from_arrays`
keys either as new runs are (:mod:`.claims`), ERM's own ``win/erm/c`` being 1/2 on every cell (ERM against
itself ties, which those runs did not save); the design is what they saved.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.llm_robustness.config import (
    BASELINE,
    LEVEL,
    NULL,
    PERPLEXITY_RATIO,
    WIN,
    condition_name,
)
from descentlab.io import load_arrays
from descentlab.study.cells import CellStore, Design, cell_key

CLAIM_ARRAYS = "arrays/claims.npz"
# ERM's per-condition arrays: old key head -> the store's metric
OLD_METRICS = {"level": LEVEL, "erm_ratio": PERPLEXITY_RATIO}
LEGACY_NULL = "erm-reseed"  # the null control of runs saved before the seeds: ERM with another data order


def win_key(method: str, condition: str) -> str:
    """The old key of ``method``'s outcomes against ERM at ``condition`` (the same as the store's)."""
    return f"win/{method}/{condition}"


def null_key(condition: str) -> str:  # the old key of the null control's outcomes
    return f"null/{condition}"


def legacy_store(run_dir: Path | str) -> CellStore | None:
    """An old run's cells: from ``arrays/claims.npz``, else rebuilt from the counts in its ``results.json``;
    None when it has neither (or counts that cannot be rebuilt)."""
    run_dir = Path(run_dir)
    if (run_dir / CLAIM_ARRAYS).is_file():
        arrays = load_arrays(run_dir / CLAIM_ARRAYS)
    elif (run_dir / "results.json").is_file():
        arrays = arrays_from_counts(json.loads((run_dir / "results.json").read_text()))
    else:
        return None
    return store_from_arrays(arrays) if arrays else None


def store_from_arrays(arrays: Mapping[str, Any]) -> CellStore:
    """Old-keyed claim arrays as a :class:`~descentlab.study.cells.CellStore` keyed as new runs are; keys of
    neither scheme (the passages' chapters) are kept as they are."""
    cells: dict[str, np.ndarray] = {}
    arms: dict[str, None] = {BASELINE: None}
    conditions: dict[str, np.ndarray] = {}
    for key, value in arrays.items():
        head, _, rest = key.partition("/")
        if head == "win" and "/" in rest:
            arm, _, condition = rest.partition("/")
        elif head == "null":
            arm, condition = NULL, rest
        elif head in OLD_METRICS and "/" not in rest:
            cells[cell_key(OLD_METRICS[head], BASELINE, rest)] = np.asarray(value)
            continue
        else:
            cells[key] = np.asarray(value)
            continue
        cells[cell_key(WIN, arm, condition)] = np.asarray(value)
        arms[arm] = None
        conditions.setdefault(condition, np.asarray(value))
    for condition, outcomes in conditions.items():  # ERM against itself on the same seed: a tie everywhere
        cells.setdefault(cell_key(WIN, BASELINE, condition), np.full(outcomes.shape, 0.5))
    examples = next((int(v.shape[-1]) for v in conditions.values()), None)
    design = Design(
        arms=(*arms, *([] if NULL in arms else [NULL])), conditions=tuple(conditions), examples=examples
    )
    return CellStore(design, cells)


def arrays_from_counts(results: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The claim arrays (old keys) of a one-seed, one-draw run whose ``results.json`` kept the win / tie /
    loss counts of each head-to-head curve: each ``win/<method>/<condition>`` rebuilt as ``[1, 1, examples]``,
    its losses, ties and wins in that order. The examples' order is lost and no claim needs it (each compares
    the outcomes with the constant 1/2). With more seeds or draws the counts pool cells the interval must keep
    apart: {} (every claim pends). Those runs' null control, ERM re-seeded (``erm-reseed``), becomes
    ``null/<condition>``.
    """
    protocol = results.get("protocol", {})
    if len(protocol.get("seeds", [])) != 1 or int(protocol.get("draws", 0)) != 1:
        return {}
    baseline = results.get("config", {}).get("baseline", BASELINE)
    methods = results.get("methods", {})
    grid = results.get("grid", {}).get("kinds", {})
    base_curves = methods.get(baseline, {}).get("curves", {})
    out: dict[str, np.ndarray] = {}
    for method, block in methods.items():
        for name, curve in block.get("curves", {}).items():
            if not name.startswith("win_rate@") or not {"wins", "ties", "losses"} <= set(curve):
                continue
            kind = name.partition("@")[2]
            found = grid.get(kind, {})
            ratios = dict(zip(found.get("levels", []), found.get("targets", []), strict=True))
            ppl = base_curves.get(f"perplexity@{kind}", {})
            for i, x in enumerate(curve["x"]):
                condition = condition_name(kind, float(x), ratios.get(x))
                p = [0.0] * curve["losses"][i] + [0.5] * curve["ties"][i] + [1.0] * curve["wins"][i]
                key = null_key(condition) if method == LEGACY_NULL else win_key(method, condition)
                out.setdefault(key, np.asarray(p)[None, None, :])
                out[f"level/{condition}"] = np.asarray([float(x)])
                if ppl and x in ppl.get("x", []) and ppl["x"][0] == 0:
                    growth = ppl["mean"][ppl["x"].index(x)] / ppl["mean"][0]
                    if math.isfinite(growth):
                        out[f"erm_ratio/{condition}"] = np.asarray([growth])
    return out
