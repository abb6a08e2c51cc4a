"""regime-map's job: one sweep point, an ordinary run of another study, resumed where it stopped.

Each point runs under ``<run>/points/<label>/`` through the registry (:func:`~descentlab.experiments.
run_experiment`), so it keeps that study's config, job cache and report; the regime map reads only the
point's saved cell store. A point whose run finished is read back; one that stopped is resumed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from descentlab.errors import ConfigError
from descentlab.study.cells import CellStore


def run_point(root: Path, label: str, study: str, preset: str, overrides: Sequence[str]) -> CellStore:
    """The cell store of ``study``'s run at ``preset`` + ``overrides`` under ``root/label`` (run, resumed,
    or read back when done)."""
    from descentlab.experiments import run_experiment

    out = root / label
    earlier = (
        sorted(p for p in out.glob(f"{study}-*") if (p / "config.yaml").is_file()) if out.is_dir() else []
    )
    argv = ["descentlab", "run", study, "--preset", preset, *overrides]
    if not earlier:
        path = run_experiment(study, preset=preset, overrides=list(overrides), out=out, argv=argv)
    elif _state(earlier[-1]) == "done":
        path = earlier[-1]
    else:
        _check_same(earlier[-1], preset, overrides)
        path = run_experiment(study, resume=earlier[-1], out=out, argv=argv)
    store = CellStore.load(path)
    if store is None:
        raise ConfigError(f"{path}: the {study} run saved no cell store")
    return store


def _state(run_dir: Path) -> str:
    status = run_dir / "status.json"
    return json.loads(status.read_text()).get("state", "") if status.is_file() else ""


def _check_same(run_dir: Path, preset: str, overrides: Sequence[str]) -> None:
    """A resumed point must be the point the config asks for (the config may not change under a resume)."""
    saved = json.loads((run_dir / "config.json").read_text())
    if saved.get("preset") != preset or list(saved.get("overrides", [])) != list(overrides):
        raise ConfigError(
            f"{run_dir} was started with --preset {saved.get('preset')} {saved.get('overrides')}, "
            f"not --preset {preset} {list(overrides)}: move it away or start a new regime-map run"
        )
