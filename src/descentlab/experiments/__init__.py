"""Experiment registry and runner: name -> study, and one run of it into a fresh run directory.

A study is one folder, ``experiments/<study>/``, read top to bottom::

    config.py    CONFIG (a dataclass of component configs, offline defaults), PRESETS (quick, full, paper) and
                 design(cfg) -> study.cells.Design: the arms, conditions and seeds a run of cfg measures;
                 the runner writes it as arrays/design.json before the run, and the run's cell store must
                 match it when it saves
    jobs.py      the (arm, seed) job a worker runs: train and evaluate into arrays
    run.py       run(cfg, run: RunDir) -> dict | Results: plan the jobs, save the cells, summarise
    claims.py    CLAIMS: list[ClaimSpec] (one primary endpoint) and their cell functions; optionally
                 claim_arrays(run_dir) -> the arrays the cells read (default: the run's cell store), and
                 FIDELITY, what the presets change against the paper
    report.py    tables and figures(results, run_dir) -> [{"path", "caption"}], drawn from saved arrays only
    legacy.py    where needed: readers for the arrays of runs committed before the study's current layout

``run`` returns ``{"protocol": ..., "methods": {...}}`` plus optional ``tables``, ``figures``, ``notes``;
the runner adds ``experiment``, the resolved ``config`` and the judged ``claims``. A config error is raised
before any directory is made. ``resume=RUN_DIR`` re-enters an existing run with its saved config: every
job comes back from the run's job cache or resumes from its newest good checkpoint. ``descentlab report
RUN_DIR`` re-judges every claim from the run's saved arrays and rebuilds its report.

A one-file study (``smoke``) keeps all of it in one module. Modules are imported on demand, so listing
experiments costs nothing.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from descentlab.errors import ConfigError, DescentlabError

if TYPE_CHECKING:
    from descentlab.study.cells import Design
    from descentlab.train.rundir import RunDir

REGISTRY: dict[str, str] = {
    "text-robustness": "descentlab.experiments.text_robustness",
    "video-denoising": "descentlab.experiments.video_denoising",
    "llm-robustness": "descentlab.experiments.llm_robustness",
    "sparse-vit": "descentlab.experiments.sparse_vit",
    "sparse-lm": "descentlab.experiments.sparse_lm",
    "implicit-bias": "descentlab.experiments.implicit_bias",
    "robust-sparse": "descentlab.experiments.robust_sparse",
    "regime-map": "descentlab.experiments.regime_map",
    "smoke": "descentlab.experiments.smoke",
}

# The headline quick runs of both papers (`make demo`), and everything (`make reproduce`).
DEMO = ["text-robustness", "sparse-vit", "implicit-bias"]


@dataclass(frozen=True)
class Experiment:
    name: str
    module: ModuleType  # the study's package (a folder), or a one-file study's module

    def part(self, part: str) -> ModuleType | None:
        """The study's ``part`` module (config, jobs, run, claims, report); None when it has none."""
        if not hasattr(self.module, "__path__"):  # one-file study
            return self.module
        full = f"{self.module.__name__}.{part}"
        if importlib.util.find_spec(full) is None:
            return None
        return importlib.import_module(full)

    def declared(self, name: str, *parts: str) -> Any:
        """The attribute ``name`` of the first of ``parts`` that defines it (None when none does)."""
        for part in parts:
            module = self.part(part)
            if module is not None and hasattr(module, name):
                return getattr(module, name)
        return None

    def _required(self, part: str) -> ModuleType:
        module = self.part(part)
        if module is None:
            raise RuntimeError(f"the study {self.module.__name__} has no {part}.py")
        return module

    @property
    def config_cls(self) -> type:
        """The study's ``CONFIG`` dataclass."""
        module = self._required("config")
        if getattr(module, "CONFIG", None) is None:
            raise RuntimeError(f"{module.__name__} must define CONFIG, its config dataclass")
        return module.CONFIG

    @property
    def presets(self) -> dict[str, dict]:
        return dict(getattr(self._required("config"), "PRESETS", {}))

    def run(self, cfg: Any, run: RunDir) -> Any:
        return self._required("run").run(cfg, run)

    def design(self, cfg: Any) -> Design | None:
        """The design record of a run of ``cfg``: the study's ``config.design(cfg)`` (None when it has none)."""
        make = self.declared("design", "config")
        return None if make is None else make(cfg)

    @property
    def claims(self) -> list:
        """The study's ``CLAIMS`` (empty when it declares none)."""
        module = self.part("claims")
        return list(getattr(module, "CLAIMS", [])) if module is not None else []

    def claim_arrays(self, run_dir: Path) -> Mapping[str, Any]:
        """The arrays the claims' cells read: the study's ``claim_arrays(run_dir)``, else the run's cell store
        ({} when the run saved none: every claim is then pending)."""
        from descentlab.study.cells import load_store

        return (self.declared("claim_arrays", "claims") or load_store)(Path(run_dir))

    def figures(self, results: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
        """The study's own figures (``report.figures``), drawn from saved data; [] when it has none."""
        draw = self.declared("figures", "report")
        if draw is None:
            return []
        (Path(run_dir) / "figures").mkdir(exist_ok=True)
        return list(draw(results, Path(run_dir)))


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
    name: str,
    preset: str | None,
    overrides: Sequence[str],
    out: Path | str,
    resume: Path | str | None,
    *,
    argv: Sequence[str] | None = None,
    config_file: Path | str | None = None,
) -> tuple[Experiment, Any, RunDir]:
    """Resolve the config and make (or reopen) the run directory; nothing is created on a config error.

    The config is: dataclass defaults <- ``preset`` <- ``config_file`` (YAML, as ``descentlab config``
    prints it) <- ``overrides``. The run directory gets ``provenance.json`` (:mod:`descentlab.provenance`,
    with ``argv``, default ``sys.argv``) as soon as it exists; a resume adds ``provenance-resume-<k>.json``.
    Under a multi-process launch every rank resolves the config (so a bad one fails everywhere), rank 0
    alone creates the directory and writes to it, the others share it without writing.
    """
    from descentlab.config import config_to_dict, config_to_yaml, load_config_yaml, resolve_config
    from descentlab.io import atomic_write_text
    from descentlab.provenance import write_provenance
    from descentlab.study.launchers import LauncherConfig, launcher_from_overrides
    from descentlab.train.rundir import RunDir

    exp = get(name)
    rank, world = launch_rank()
    overrides, launcher = launcher_from_overrides(overrides)  # where jobs run is not part of the config
    if resume is not None:
        if overrides or preset or config_file is not None:
            raise ConfigError(
                "resume=RUN_DIR continues a run with its saved config; drop the other overrides, --preset "
                "and --config"
            )
        run = RunDir.open(resume)
        run.writer = rank == 0
        cfg = load_config_yaml(exp.config_cls, (run.path / "config.yaml").read_text())
        if launcher is None:  # the run's own launcher, unless the resume names another
            saved = json.loads((run.path / "config.json").read_text()).get("launcher")
            launcher = LauncherConfig(**saved) if saved else None
        run.launcher = launcher
        if run.writer:
            write_provenance(run.path, argv=argv, config=config_to_dict(cfg))
        run.curves = True
        return exp, cfg, run
    cfg = resolve_config(
        exp.config_cls,
        preset=preset,
        presets=exp.presets,
        overrides=overrides,
        config_file=config_file,
    )

    exp.design(cfg)  # a design the config cannot make fails here, before the run directory exists

    def make() -> RunDir:
        run = RunDir.create(out, name)
        as_dict = config_to_dict(cfg)
        write_provenance(run.path, argv=argv, config=as_dict)  # first: the record of the run's start
        atomic_write_text(run.path / "config.yaml", config_to_yaml(cfg))
        run.save_json(
            "config.json",
            {
                "experiment": name,
                "preset": preset,
                "config_file": None if config_file is None else str(config_file),
                "overrides": list(overrides),
                "config": as_dict,
                "launcher": None if launcher is None else dataclasses.asdict(launcher),
            },
        )
        return run

    run = make() if world == 1 else _share_run_dir(rank, make)
    run.launcher = launcher
    run.curves = True  # the runner's runs write curves (metrics.csv, TensorBoard); a library fit does not
    return exp, cfg, run


def run_experiment(
    name: str,
    *,
    preset: str | None = None,
    overrides: Sequence[str] = (),
    out: Path | str = "runs",
    resume: Path | str | None = None,
    config_file: Path | str | None = None,
    argv: Sequence[str] | None = None,
) -> Path:
    """Run one experiment end to end and return its run directory.

    ``config_file`` is a YAML config (what ``descentlab config`` prints) applied after ``preset`` and
    before ``overrides``; ``argv`` is the command line recorded in ``provenance.json`` (default
    ``sys.argv``).
    """
    from descentlab.config import config_to_dict
    from descentlab.report.build import write_report
    from descentlab.study.cells import record_design
    from descentlab.study.launchers import launching
    from descentlab.train.loop import TrainingInterrupted

    started = time.monotonic()
    exp, cfg, run = prepare(name, preset, overrides, out, resume, argv=argv, config_file=config_file)
    design = exp.design(cfg)
    if design is not None and run.writer:  # the record the run's cell store must match (study.cells)
        record_design(run.path, design)
    _status(run, "running", resumed=resume is not None)
    try:
        with launching(run.launcher):  # every JobRunner of the study sends its jobs there
            body = exp.run(cfg, run)
    except TrainingInterrupted as exc:
        _end_segment(run, started)
        _status(run, "interrupted", error=str(exc))
        raise
    except DescentlabError as exc:
        _end_segment(run, started)
        _status(run, "failed", error=str(exc))
        raise
    except BaseException as exc:
        _end_segment(run, started)
        _status(run, "failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        raise
    if not isinstance(body, dict) or not isinstance(body.get("methods"), dict):
        raise RuntimeError(f"{exp.module.__name__}.run must return a dict with a 'methods' mapping")
    # the runner owns these two keys: a typed Results body may carry empty placeholders for them
    body = {k: v for k, v in body.items() if k not in ("experiment", "config")}
    results = {"experiment": name, "config": config_to_dict(cfg), **body}
    # every results.json has the typed Results keys (report.results), empty where the study wrote none
    results = {"protocol": {}, "tables": [], "figures": [], "notes": [], **results}
    run.save_json("results.json", results)
    if run.writer:
        rejudge(run.path)
        write_report(run.path, figures=exp.figures)
    _end_segment(run, started)
    _status(run, "done")
    return run.path


def _end_segment(run: RunDir, started: float) -> None:
    """Record this process's wall time in its provenance record (rank 0 only)."""
    from descentlab.provenance import record_segment_end

    if run.writer:
        record_segment_end(run.path, time.monotonic() - started)


def rejudge(run_dir: Path | str) -> list[Any]:
    """Judge every claim of the run's study from the arrays saved in ``run_dir``, and write the rows into its
    ``results.json`` (``claims``). A study that declares no ``CLAIMS`` keeps the rows it wrote."""
    from descentlab.io import save_json
    from descentlab.report.build import load_results
    from descentlab.report.claims import judge

    run_dir = Path(run_dir)
    results = load_results(run_dir)
    exp = get(str(results.get("experiment", "")))
    specs = exp.claims
    if not specs:
        return []
    rows = judge(specs, exp.claim_arrays(run_dir))
    results["claims"] = [row.to_dict() for row in rows]
    save_json(run_dir / "results.json", results)
    return rows


def report_run(run_dir: Path | str) -> Path:
    """``descentlab report RUN_DIR``: re-judge the claims, then rebuild ``report.md`` and the figures."""
    from descentlab.report.build import load_results, write_report

    run_dir = Path(run_dir)
    exp = get(str(load_results(run_dir).get("experiment", "")))
    rejudge(run_dir)
    return write_report(run_dir, figures=exp.figures)


def run_many(names: Sequence[str], *, out: Path | str, preset: str = "quick", title: str) -> Path:
    """Run several experiments' presets and gather them into ``<out>/<title-slug>-<time>/report.md``."""
    from descentlab.report.build import write_combined_report
    from descentlab.train.rundir import RunDir

    root = Path(out)
    paths = [run_experiment(name, preset=preset, out=root) for name in names]
    summary = RunDir.create(root, title.lower().replace(" ", "-"))
    report = write_combined_report(
        summary.path / "report.md", paths, title=title, figures=lambda name: get(name).figures
    )
    return report
