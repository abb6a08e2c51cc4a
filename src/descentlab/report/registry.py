"""Which module draws an experiment's own figures, beyond the generic curves and layer-loss panels.

``FIGURES`` maps an experiment name to a module under ``descentlab.report``; that module exposes
``figures(results: dict, run_dir: Path) -> list[dict]``, which draws from ``results.json`` data and arrays
saved in the run directory (:func:`descentlab.io.load_arrays`) only, never a live model, writes PNGs under
``run_dir / "figures"`` and returns ``{"path": "figures/<name>.png", "caption": ...}`` entries (paths
relative to the run directory). A name without an entry, or whose module does not exist yet, has no
figures of its own.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

FIGURES: dict[str, str] = {
}


def experiment_figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """Draw the experiment's own figures (see the module docs); [] when it has no figure module."""
    module_path = FIGURES.get(str(results.get("experiment", "")))
    if module_path is None:
        return []
    try:
        module = importlib.import_module(module_path)
    except ModuleNotFoundError as exc:
        if exc.name != module_path:  # the module exists but one of its imports is missing: a real error
            raise
        return []
    (Path(run_dir) / "figures").mkdir(exist_ok=True)
    return list(module.figures(results, Path(run_dir)))
