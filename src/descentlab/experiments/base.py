"""Run an experiment into a fresh run directory: resolve config -> run() -> results.json -> report.md.

An experiment module provides::

    @dataclass
    class FooConfig: ...                   # typed fields, offline defaults; nested dataclasses allowed
    PRESETS = {"quick": {"train.epochs": 1}, "full": {...}}   # dotted-key overrides of the defaults
    def run(cfg: FooConfig, run: RunDir) -> dict:              # returns the results.json body

``run`` returns ``{"protocol": ..., "methods": {...}}`` plus optional ``tables``, ``figures``, ``notes``
(DESIGN.md); this module adds ``experiment`` and the resolved ``config``. A config error is raised before
any directory is made. ``resume=RUN_DIR`` re-enters an existing run with its saved config: every
``fit`` call in it picks up its newest good checkpoint, so finished jobs are skipped and the interrupted
one continues where it stopped.
"""

from __future__ import annotations

import os
import random
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from descentlab import experiments
from descentlab.config import config_to_dict, config_to_yaml, load_config_yaml, resolve_config
from descentlab.errors import ConfigError, DescentlabError
from descentlab.report.build import write_combined_report, write_report
from descentlab.train.loop import TrainingInterrupted
from descentlab.train.rundir import RunDir, atomic_write_text


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA) and Python's ``random``."""
    random.seed(seed)
    torch.manual_seed(seed)


def _status(run: RunDir, state: str, **extra: Any) -> None:
    run.save_json(
        "status.json",
        {"state": state, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "pid": os.getpid(), **extra},
    )


def prepare(
    name: str,
    *,
    preset: str | None = None,
    overrides: Sequence[str] = (),
    out: Path | str = "runs",
    resume: Path | str | None = None,
) -> tuple[experiments.Experiment, Any, RunDir]:
    """Resolve the config and make (or reopen) the run directory; nothing is created on a config error."""
    exp = experiments.get(name)
    if resume is not None:
        if overrides or preset:
            raise ConfigError(
                "resume=RUN_DIR continues a run with its saved config; drop the other overrides and --preset"
            )
        run = RunDir.open(resume)
        cfg = load_config_yaml(exp.config_cls, (run.path / "config.yaml").read_text())
        return exp, cfg, run
    cfg = resolve_config(exp.config_cls, preset=preset, presets=exp.presets, overrides=overrides)
    run = RunDir.create(out, name)
    atomic_write_text(run.path / "config.yaml", config_to_yaml(cfg))
    run.save_json(
        "config.json",
        {"experiment": name, "preset": preset, "overrides": list(overrides), "config": config_to_dict(cfg)},
    )
    return exp, cfg, run


def run_experiment(
    name: str,
    *,
    preset: str | None = None,
    overrides: Sequence[str] = (),
    out: Path | str = "runs",
    resume: Path | str | None = None,
) -> Path:
    """Run one experiment end to end and return its run directory."""
    exp, cfg, run = prepare(name, preset=preset, overrides=overrides, out=out, resume=resume)
    _status(run, "running", resumed=resume is not None)
    try:
        body = exp.module.run(cfg, run)
    except TrainingInterrupted as exc:
        _status(run, "interrupted", error=str(exc))
        raise
    except DescentlabError as exc:
        _status(run, "failed", error=str(exc))
        raise
    except BaseException as exc:
        _status(run, "failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        raise
    if not isinstance(body, dict) or not isinstance(body.get("methods"), dict):
        raise RuntimeError(f"{exp.module.__name__}.run must return a dict with a 'methods' mapping")
    results = {"experiment": name, "config": config_to_dict(cfg), **body}
    run.save_json("results.json", results)
    write_report(run.path)
    _status(run, "done")
    return run.path


def run_many(names: Sequence[str], *, out: Path | str, preset: str = "quick", title: str) -> Path:
    """Run several experiments' presets and gather them into ``<out>/<title-slug>-<time>/report.md``."""
    root = Path(out)
    paths = [run_experiment(name, preset=preset, out=root) for name in names]
    summary = RunDir.create(root, title.lower().replace(" ", "-"))
    report = write_combined_report(summary.path / "report.md", paths, title=title)
    return report
