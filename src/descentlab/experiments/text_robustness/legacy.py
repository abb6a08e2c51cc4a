"""Reader for text-robustness runs made before the cell store (the committed ``docs/results/text-robustness``
run).

Those runs saved the claims' cells in three files and no design record:

* ``arrays/examples.npz``: ``gammas`` and ``<method>__<kind>``, 0/1 correctness ``[seed, draw, γ, example]``;
* ``arrays/layer_loss.npz``: ``<method>``, the clean per-review loss at every layer ``[seed, L+1, example]``;
* ``arrays/erm-val-profile.npz``, when ERM trained on the tuning seed: ``profile`` [L+1].

:func:`legacy_store` gathers them into a :class:`~descentlab.study.cells.CellStore` keyed as new runs are
(``correct/<method>/<kind>``, ``loss/<method>``), with the design a new run would write: the arms are the
methods whose correctness was saved (such a run saved every method it trained), the conditions the noise
kinds in saved order, the seeds those of ``results.json``'s config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from descentlab.experiments.text_robustness.config import CORRECT, LOSS, SEP
from descentlab.io import load_arrays
from descentlab.study.cells import CellStore, Design

EXAMPLES = "arrays/examples.npz"
LAYER_LOSS = "arrays/layer_loss.npz"
ERM_VAL_PROFILE = "arrays/erm-val-profile.npz"


def legacy_store(run_dir: Path | str) -> CellStore | None:
    """The old run's cells; None when it saved no per-review correctness (``arrays/examples.npz``)."""
    run_dir = Path(run_dir)
    if not (run_dir / EXAMPLES).is_file():
        return None
    examples = load_arrays(run_dir / EXAMPLES)
    gammas = examples.pop("gammas")
    correct = {tuple(name.split(SEP, 1)): v for name, v in examples.items() if SEP in name}
    arms = tuple(dict.fromkeys(m for m, _ in correct))
    kinds = tuple(dict.fromkeys(k for _, k in correct))
    extra: dict[str, Any] = {"gammas": [float(g) for g in gammas]}
    if (run_dir / ERM_VAL_PROFILE).is_file():
        extra["erm_val_profile"] = [float(v) for v in load_arrays(run_dir / ERM_VAL_PROFILE)["profile"]]
    results = run_dir / "results.json"
    seeds = json.loads(results.read_text()).get("config", {}).get("seeds", ()) if results.is_file() else ()
    first = next(iter(correct.values()), None)
    design = Design(arms, kinds, tuple(seeds), None if first is None else int(first.shape[-1]), extra)
    store = CellStore(design)
    for (m, kind), v in correct.items():
        store.put(CORRECT, m, kind, v)
    losses = load_arrays(run_dir / LAYER_LOSS) if (run_dir / LAYER_LOSS).is_file() else {}
    for m, v in losses.items():
        if m in arms:
            store.put(LOSS, m, None, v)
    return store
