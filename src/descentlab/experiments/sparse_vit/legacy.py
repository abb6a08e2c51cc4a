"""Reader for sparse-vit runs made before the cell store (the committed ``docs/results/sparse-vit`` and its
``full-paper-like``, ``full-levels`` and ``earlier`` runs).

Those runs saved one flat ``arrays/claims.npz`` (``earlier``: none): the cells under the keys the store
uses now (``correct/<method>/<p | dense | paper-like>``, ``frac_below`` and ``kurtosis``), with the levels
``sparsities``, ``claim_sparsity``, ``paper_like_sparsity`` and (later runs) ``prune`` beside them, and no
design record: the design is read from the run's saved config, the levels from the arrays first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.sparse_vit.config import DENSE, PAPER_LIKE
from descentlab.io import load_arrays
from descentlab.report.claims import MissingArrays
from descentlab.study.cells import CellStore, Design, cell_key

LEGACY_ARRAYS = "arrays/claims.npz"
LEVELS = ("sparsities", "claim_sparsity", "paper_like_sparsity", "prune")


class Unsaved(CellStore):
    """A run that saved no cells at all (``earlier``, from before the claims engine): its design, every
    cell missing, named by its key."""

    def get(self, metric: str, arm: str, condition: float | int | str | None = None) -> np.ndarray:
        self.design.require(arm, condition)
        raise MissingArrays(cell_key(metric, arm, condition))


def legacy_design(config: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Design:
    """The design of an old run, as ``config.design`` gives it: from its saved ``config``, with the levels
    and the prunable set of ``arrays`` where it saved them; a level neither holds stays out of ``extra``."""
    levels = {k: config[k] for k in ("claim_sparsity", "paper_like_sparsity") if k in config}
    levels |= {k: float(arrays[k]) for k in ("claim_sparsity", "paper_like_sparsity") if k in arrays}
    sparsities = (
        np.atleast_1d(arrays["sparsities"]).tolist() if "sparsities" in arrays else config["sparsities"]
    )
    dense, paper = config.get("dense"), list(config.get("paper_like_seeds") or [])
    prune = str(arrays["prune"]) if "prune" in arrays else config.get("acdc", {}).get("prune", "all")
    return Design(
        arms=tuple(dict.fromkeys([*config["methods"], *([dense] if dense else [])])),
        conditions=(*sparsities, *([DENSE] if dense else []), *([PAPER_LIKE] if paper else [])),
        seeds=config.get("seeds", ()),
        examples=config.get("n_test"),
        extra=levels | {"dense": dense, "prune": prune},
        condition_seeds={PAPER_LIKE: paper} if paper else {},
    )


def legacy_store(run_dir: Path | str) -> CellStore | None:
    """The old run's cells as a :class:`CellStore` (:class:`Unsaved` when it saved none); None when the run
    has no ``results.json`` to read its design from."""
    run_dir = Path(run_dir)
    if not (run_dir / "results.json").is_file():
        return None
    config = json.loads((run_dir / "results.json").read_text()).get("config", {})
    path = run_dir / LEGACY_ARRAYS
    arrays = load_arrays(path) if path.is_file() else {}
    design = legacy_design(config, arrays)
    if not path.is_file():
        return Unsaved(design)
    store = CellStore(design)
    for key, values in arrays.items():
        if key not in LEVELS:
            metric, arm, condition = key.split("/")
            store.put(metric, arm, condition, values)
    return store
