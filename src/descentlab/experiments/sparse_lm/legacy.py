"""Reader for sparse-lm runs made before the cell store (the committed ``docs/results/sparse-lm`` runs).

Those runs wrote array paths into ``results.json`` (``arrays.nll[method]``: one ``nll-<tag>.npz`` per
seed, ``test`` ``[levels, blocks]``), the tuning runs' validation NLLs into its ``runs`` list and the weight
shape into ``arrays/shape.npz`` (``frac_below/<method>``, ``kurtosis/<method>``), with no design record.
:func:`legacy_store` gathers them into a :class:`~descentlab.study.cells.CellStore` keyed as new runs are
(``nll/<method>/<level>``), with the design built from the run's config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.io import load_arrays
from descentlab.study.cells import CellStore, Design

NLL = "nll"


def legacy_store(run_dir: Path | str) -> CellStore | None:
    """The old run's cells; None when the run has no ``results.json`` (or no sparsities in its config).

    The arms are the config's ``methods``; a run from before that record has the arms whose files
    ``results.json`` lists (a listed file that is gone makes its claims pend, as it did)."""
    run_dir = Path(run_dir)
    path = run_dir / "results.json"
    if not path.is_file():
        return None
    results = json.loads(path.read_text())
    cfg = results.get("config", {})
    if "sparsities" not in cfg:
        return None
    listed = results.get("arrays", {}).get("nll", {})
    levels = [0.0, *cfg["sparsities"]]
    per_arm: dict[str, np.ndarray] = {}
    for label, files in listed.items():
        paths = [run_dir / f for f in files]
        if paths and all(p.is_file() for p in paths):
            per_arm[label] = np.stack([load_arrays(p)["test"] for p in paths])  # [seeds, levels, blocks]
    examples = next((int(a.shape[-1]) for a in per_arm.values()), None)
    design = Design(
        arms=tuple(cfg.get("methods", listed)),
        conditions=tuple(levels),
        seeds=tuple(cfg.get("seeds", ())),
        examples=examples,
        extra=design_extra(cfg, _tuning_runs(results, cfg)),
    )
    store = CellStore(design)
    for label, nll in per_arm.items():
        if label not in design.arms:  # files of an arm the config did not ask for: not part of this design
            continue
        for i, p in enumerate(levels):
            store.put(NLL, label, p, nll[:, i])
    if (shape := run_dir / "arrays" / "shape.npz").is_file():
        store = CellStore(design, {**store, **load_arrays(shape)})
    return store


def _tuning_runs(results: dict[str, Any], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    # runs before tune_seed existed tuned on the first evaluation seed
    tuning_seed = cfg.get("tune_seed", cfg.get("seeds", [None])[0])
    return [r for r in results.get("runs", []) if r.get("seed") == tuning_seed]


def design_extra(cfg: dict[str, Any], grid: list[dict[str, Any]]) -> dict[str, Any]:
    """The design record's study fields: the claim levels, whether the run tuned, and the tuning grid
    (each tuning run's label, weight decay and validation NLL per level; absent without tuning runs)."""
    extra: dict[str, Any] = {k: float(cfg[k]) for k in ("claim_low", "claim_high") if k in cfg}
    if "tune" in cfg:
        extra["tune"] = bool(cfg["tune"])
    if grid:
        extra["grid"] = {
            "val_nll": [[float(v) for v in r["val_nll"]] for r in grid],
            "label": [r["label"] for r in grid],
            "weight_decay": [r.get("weight_decay") for r in grid],
        }
    return extra
