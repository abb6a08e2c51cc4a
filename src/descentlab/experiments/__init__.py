"""Experiment registry and runner: name -> module, and one run of it into a fresh run directory.

Each experiment module defines a config dataclass (``CONFIG``), ``PRESETS`` and ``run``::

    @dataclass
    class FooConfig: ...                   # typed fields, offline defaults; nested component configs
    PRESETS = {"quick": {"train.epochs": 1}, "full": {...}}   # dotted-key overrides of the defaults
    def run(cfg: FooConfig, run: RunDir) -> dict | Results:    # the results.json body

``run`` returns ``{"protocol": ..., "methods": {...}}`` plus optional ``tables``, ``figures``, ``notes``
(DESIGN.md); the runner adds ``experiment`` and the resolved ``config``. A config error is raised before
any directory is made. ``resume=RUN_DIR`` re-enters an existing run with its saved config: every job
comes back from the run's job cache or resumes from its newest good checkpoint.

Modules are imported on demand, so listing experiments costs nothing.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from descentlab.errors import ConfigError, DescentlabError

if TYPE_CHECKING:
    from descentlab.train.rundir import RunDir

REGISTRY: dict[str, str] = {
    "text-robustness": "descentlab.experiments.text_robustness",
    "video-denoising": "descentlab.experiments.video_denoising",
    "llm-robustness": "descentlab.experiments.llm_robustness",
    "sparse-vit": "descentlab.experiments.sparse_vit",
    "sparse-lm": "descentlab.experiments.sparse_lm",
    "implicit-bias": "descentlab.experiments.implicit_bias",
    "robust-sparse": "descentlab.experiments.robust_sparse",
    "smoke": "descentlab.experiments.smoke",
}

# The headline quick runs of both papers (`make demo`), and everything (`make reproduce`).
DEMO = ["text-robustness", "sparse-vit", "implicit-bias"]


@dataclass(frozen=True)
class Experiment:
    name: str
    module: ModuleType

    @property
    def config_cls(self) -> type:
        explicit = getattr(self.module, "CONFIG", None)
        if explicit is not None:
            return explicit
        classes = [
            v
            for v in vars(self.module).values()
            if isinstance(v, type)
            and dataclasses.is_dataclass(v)
            and v.__module__ == self.module.__name__
            and v.__name__.endswith("Config")
        ]
        if len(classes) != 1:
            raise RuntimeError(f"{self.module.__name__} must define CONFIG or exactly one *Config dataclass")
        return classes[0]

    @property
    def presets(self) -> dict[str, dict]:
        return dict(getattr(self.module, "PRESETS", {}))


def available() -> list[str]:
    """Names of the experiments whose module is installed."""
    return [name for name, module in REGISTRY.items() if importlib.util.find_spec(module) is not None]


def get(name: str) -> Experiment:
    if name not in REGISTRY or importlib.util.find_spec(REGISTRY[name]) is None:
        raise ConfigError(f"unknown experiment {name!r}; choose one of: {', '.join(available())}")
    return Experiment(name=name, module=importlib.import_module(REGISTRY[name]))


def launch_rank() -> tuple[int, int]:
    """(rank, world size) of this process; under torchrun / accelerate launch the process group starts here.

    The group is Accelerate's (``PartialState`` is a singleton), so the ``Accelerator`` that ``fit`` makes
    later joins the same group.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    import torch
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())
    return state.process_index, state.num_processes


def _share_run_dir(rank: int, make: Any) -> RunDir:
    """Rank 0 makes the run directory (``make()``), the other ranks open the same folder read-only."""
    import torch.distributed as dist

    from descentlab.train.rundir import RunDir

    box: list[Any] = [None]
    if rank == 0:
        try:
            box[0] = make().path
        except BaseException as exc:
            box[0] = exc
            dist.broadcast_object_list(box, src=0)
            raise
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], BaseException):
        raise box[0]
    return RunDir(box[0], writer=rank == 0)


def _status(run: RunDir, state: str, **extra: Any) -> None:
    run.save_json(
        "status.json",
        {"state": state, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "pid": os.getpid(), **extra},
    )


def prepare(
    name: str, preset: str | None, overrides: Sequence[str], out: Path | str, resume: Path | str | None
) -> tuple[Experiment, Any, RunDir]:
    """Resolve the config and make (or reopen) the run directory; nothing is created on a config error.

    Under a multi-process launch every rank resolves the config (so a bad one fails everywhere), rank 0
    alone creates the directory and the others share it without writing to it.
    """
    from descentlab.config import config_to_dict, config_to_yaml, load_config_yaml, resolve_config
    from descentlab.io import atomic_write_text
    from descentlab.train.rundir import RunDir

    exp = get(name)
    rank, world = launch_rank()
    if resume is not None:
        if overrides or preset:
            raise ConfigError(
                "resume=RUN_DIR continues a run with its saved config; drop the other overrides and --preset"
            )
        run = RunDir.open(resume)
        run.writer = rank == 0
        cfg = load_config_yaml(exp.config_cls, (run.path / "config.yaml").read_text())
        return exp, cfg, run
    cfg = resolve_config(exp.config_cls, preset=preset, presets=exp.presets, overrides=overrides)

    def make() -> RunDir:
        run = RunDir.create(out, name)
        atomic_write_text(run.path / "config.yaml", config_to_yaml(cfg))
        run.save_json(
            "config.json",
            {
                "experiment": name,
                "preset": preset,
                "overrides": list(overrides),
                "config": config_to_dict(cfg),
            },
        )
        return run

    run = make() if world == 1 else _share_run_dir(rank, make)
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
    from descentlab.config import config_to_dict
    from descentlab.report.build import write_report
    from descentlab.train.loop import TrainingInterrupted

    exp, cfg, run = prepare(name, preset, overrides, out, resume)
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
    # the runner owns these two keys: a typed Results body may carry empty placeholders for them
    body = {k: v for k, v in body.items() if k not in ("experiment", "config")}
    results = {"experiment": name, "config": config_to_dict(cfg), **body}
    run.save_json("results.json", results)
    if run.writer:
        write_report(run.path)
    _status(run, "done")
    return run.path


def run_many(names: Sequence[str], *, out: Path | str, preset: str = "quick", title: str) -> Path:
    """Run several experiments' presets and gather them into ``<out>/<title-slug>-<time>/report.md``."""
    from descentlab.report.build import write_combined_report
    from descentlab.train.rundir import RunDir

    root = Path(out)
    paths = [run_experiment(name, preset=preset, out=root) for name in names]
    summary = RunDir.create(root, title.lower().replace(" ", "-"))
    report = write_combined_report(summary.path / "report.md", paths, title=title)
    return report
