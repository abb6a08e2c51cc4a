"""Reader for robust-sparse runs made before the cell store (the committed ``docs/results/robust-sparse``).

Those runs saved ``arrays/examples.npz``: ``"<method>__s=<s>"`` -> correctness ``[seed, draw, γ,
example]`` and ``"gammas"``, with no design record. :func:`legacy_store` re-keys them as
``correct/<method>/<s>`` and builds the design from the run's ``results.json`` config (the methods it asked
for) and from the saved names (the sparsities), so the claims read old and new runs alike.
"""

from __future__ import annotations

import json
from pathlib import Path

from descentlab.io import load_arrays
from descentlab.study.cells import CellStore, Design

LEGACY_ARRAYS = "arrays/examples.npz"


def legacy_store(run_dir: Path | str) -> CellStore | None:
    """The old run's cells as a :class:`CellStore`; None when the run has no ``arrays/examples.npz``."""
    run_dir = Path(run_dir)
    path = run_dir / LEGACY_ARRAYS
    if not path.is_file():
        return None
    old = load_arrays(path)
    cells = {tuple(k.split("__s=", 1)): v for k, v in old.items() if "__s=" in k}
    levels = sorted({float(s) for _, s in cells}, key=float)
    arms = list(dict.fromkeys(m for m, _ in cells))
    results = run_dir / "results.json"
    if results.is_file():  # the arms the config asked for, saved or not (a missing one pends, as before)
        arms = list(json.loads(results.read_text()).get("config", {}).get("methods", arms))
    first = next(iter(cells.values()), None)
    design = Design(
        arms=tuple(arms),
        conditions=tuple(levels),
        seeds=tuple(range(first.shape[0])) if first is not None else (),
        examples=int(first.shape[-1]) if first is not None else None,
        extra={"gammas": old["gammas"].tolist()} if "gammas" in old else {},
    )
    return CellStore(design, {f"correct/{m}/{float(s):g}": v for (m, s), v in cells.items()})
