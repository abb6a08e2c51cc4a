"""regime-map's job: one sweep point, an ordinary run of another study, resumed where it stopped.

Each point runs under ``<run>/points/<label>/`` through the registry (:func:`~descentlab.experiments.
run_experiment`), so it keeps that study's config, job cache and report; the regime map reads only the
point's saved cell store and job results. A point whose run finished is read back; one that stopped is
resumed. Either way it must be the point the config asks for.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from descentlab.errors import ConfigError
from descentlab.study.cells import CellStore


def run_point(
    root: Path, label: str, study: str, preset: str, overrides: Sequence[str]
) -> tuple[Path, CellStore]:
    """The run folder and cell store of ``study``'s run at ``preset`` + ``overrides`` under ``root/label``
    (run, resumed, or read back when done)."""
    from descentlab.experiments import run_experiment

    out = root / label
    earlier = sorted(p for p in out.glob(f"{study}-*") if (p / "config.yaml").is_file())
    argv = ["descentlab", "run", study, "--preset", preset, *overrides]
    if not earlier:
        path = run_experiment(study, preset=preset, overrides=list(overrides), out=out, argv=argv)
    else:
        path = earlier[-1]
        _check_same(path, preset, overrides)
        if _state(path) != "done":
            path = run_experiment(study, resume=path, out=out, argv=argv)
    store = CellStore.load(path)
    if store is None:
        raise ConfigError(f"{path}: the {study} run saved no cell store")
    return path, store


def trained_params(run_dir: Path) -> int:
    """The parameter count of the GPT-2 a sparse-lm point trained: the ``params`` every one of its job
    results (``jobs/<tag>.json``) records; one architecture per point, and a diverged job records none."""
    found = {json.loads(p.read_text()).get("params") for p in (run_dir / "jobs").glob("*.json")} - {None}
    if len(found) != 1:
        raise ConfigError(f"{run_dir}/jobs: the job results record parameter counts {sorted(found)}, not one")
    return found.pop()


def _state(run_dir: Path) -> str:
    status = run_dir / "status.json"
    return json.loads(status.read_text()).get("state", "") if status.is_file() else ""


def _check_same(run_dir: Path, preset: str, overrides: Sequence[str]) -> None:
    """A point read back or resumed must be the point the config asks for (a config may not change under a
    resume, and a finished point of another config is not this point's)."""
    saved = json.loads((run_dir / "config.json").read_text())
    if saved.get("preset") != preset or list(saved.get("overrides", [])) != list(overrides):
        raise ConfigError(
            f"{run_dir} was started with --preset {saved.get('preset')} {saved.get('overrides')}, "
            f"not --preset {preset} {list(overrides)}: move it away or start a new regime-map run"
        )
