"""Run directories: ``<root>/<name>-<timestamp>[-k]``, never shared between two runs.

Creation relies on ``mkdir`` being atomic: two runs that start in the same second race for the same name,
one wins, the other takes the next free suffix. Every file is written atomically (temporary file, fsync,
rename), so a killed run leaves either the old or the new version of a file, never half of one.

One writer per directory: ``.lock`` holds the writing process (pid and start time, see
:mod:`descentlab.train.procs`). :meth:`RunDir.create` writes it; :meth:`RunDir.open` (a resume) takes it
over only when that process is gone, and also refuses while a worker recorded in ``jobs/.workers`` by a
:class:`~descentlab.study.jobs.JobRunner` of an earlier, killed run still runs. Ranks > 0 of a
multi-process launch (``RANK`` > 0) share rank 0's directory without taking the lock.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from descentlab.errors import ConfigError
from descentlab.io import atomic_write_bytes, atomic_write_text, dumps_json, save_arrays, save_json
from descentlab.io import jsonable as _jsonable
from descentlab.train.procs import process_alive, process_identity

LOCK = ".lock"


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _take_lock(path: Path) -> None:
    """Record this process as the writer of ``path``, unless another live process already is."""
    if _rank() != 0:
        return
    me = os.getpid()
    lock = path / LOCK
    try:
        held = json.loads(lock.read_text())
        pid, ident = int(held["pid"]), held.get("start")
    except (OSError, ValueError, KeyError, TypeError):
        pid, ident = 0, None
    if pid and pid != me and process_alive(pid, ident):
        raise ConfigError(
            f"{path} is being written by another run (pid {pid}, still running); stop it (kill {pid}) or "
            "wait for it to finish before resuming"
        )
    workers = _live_workers(path / "jobs" / ".workers")
    if workers:
        raise ConfigError(
            f"{path} still has {len(workers)} worker process(es) of an earlier run writing to it (pids "
            f"{', '.join(map(str, workers))}); stop them (kill {' '.join(map(str, workers))}) before resuming"
        )
    atomic_write_text(lock, json.dumps({"pid": me, "start": process_identity(me), "time": time.time()}))


def _live_workers(registry: Path) -> list[int]:
    """Pids of the workers recorded in ``registry`` that still run and are not this process's own."""
    try:
        lines = registry.read_text().splitlines()
    except OSError:
        return []
    live = []
    for line in lines:
        parts = line.split()
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        pid, ident = int(parts[0]), None if parts[1] == "-" else parts[1]
        if process_alive(pid, ident) and _parent_of(pid) != os.getpid():
            live.append(pid)
    return live


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])


# the writers moved to descentlab.io; experiments import them from here
__all__ = ["RunDir", "atomic_write_bytes", "atomic_write_text", "discard_untrained", "dumps_json"]


def discard_untrained(path: Path | str) -> bool:
    """Remove a run directory that this process made and that failed before anything was trained.

    "Before anything was trained": ``status.json`` says ``failed`` with this process's pid, and there is no
    ``metrics.jsonl``, ``results.json``, cached job result or checkpoint. Such a folder holds only the
    config of a run that never started (a bad dataset or model name found once the run began); the
    command line removes it so that a failed input leaves nothing behind. Returns whether it was removed.
    """
    import shutil

    path = Path(path)
    try:
        status = json.loads((path / "status.json").read_text())
    except (OSError, ValueError):
        return False
    if status.get("state") != "failed" or status.get("pid") != os.getpid():
        return False
    if any((path / name).exists() for name in ("metrics.jsonl", "results.json")):
        return False
    if any(path.glob("jobs/*.json")) or any(path.glob("checkpoints/*/step-*")):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not path.exists()


class RunDir:
    """One run's folder: config, ``metrics.jsonl``, checkpoints, ``results.json``, ``report.md``, figures."""

    def __init__(self, path: Path, writer: bool = True, curves: bool = False) -> None:
        self.path = Path(path)
        # False on the ranks > 0 of a torchrun / accelerate launch: they share rank 0's folder and their
        # writes are dropped, so one run leaves one metrics.jsonl, one results.json, one set of figures.
        self.writer = writer
        # True: ``fit`` also writes its log steps as curves (metrics.csv, TensorBoard events under
        # tensorboard/, see descentlab.logs.CurveWriter). Off for a library user's own RunDir, who may
        # log elsewhere; the experiment runner (``descentlab run``) turns it on.
        self.curves = curves
        # where the runner's JobRunners send jobs (descentlab.study.launchers.LauncherConfig); None: this
        # machine's pool. Set by the experiment runner from launcher.* overrides, saved in config.json.
        self.launcher: Any = None

    @classmethod
    def create(cls, root: Path | str, name: str) -> RunDir:
        """Make a fresh directory ``<root>/<name>-<YYYYmmdd-HHMMSS>``, adding ``-2``, ``-3``... on collision."""
        root = Path(root)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        try:
            root.mkdir(parents=True, exist_ok=True)
            for k in range(1, 10_000):
                path = root / (f"{name}-{stamp}" if k == 1 else f"{name}-{stamp}-{k}")
                try:
                    path.mkdir()
                except FileExistsError:
                    continue
                _take_lock(path)
                return cls(path)
        except OSError as exc:  # not writable, not a folder, a read-only or pseudo file system
            raise ConfigError(
                f"cannot create a run directory under {root}: {exc.strerror or exc}; pass --out a writable folder"
            ) from None
        raise RuntimeError(f"could not find a free run directory name under {root}")

    @classmethod
    def open(cls, path: Path | str) -> RunDir:
        """An existing run directory, to resume it: this process becomes its one writer (module docstring).

        Raises:
            ConfigError: not a run directory, or another live process (a run, or a worker of a killed run)
                still writes to it.
        """
        path = Path(path)
        if not (path / "config.yaml").is_file():
            raise ConfigError(
                f"{path} is not a descentlab run directory (no config.yaml); pass a folder made by `descentlab run`"
            )
        _take_lock(path)
        return cls(path)

    def log(self, step: int | None = None, **metrics: Any) -> None:
        """Append one JSON line to ``metrics.jsonl``; lines are small, so an append is effectively atomic."""
        if not self.writer:
            return
        record = {"time": round(time.time(), 3), **({"step": step} if step is not None else {}), **metrics}
        with open(self.path / "metrics.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(_jsonable(record), allow_nan=False) + "\n")

    def metrics(self) -> list[dict[str, Any]]:
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def figure(self, name: str) -> Path:
        """Path for a PNG figure, ``figures/<name>.png`` (the folder is created; a scratch folder off rank 0)."""
        if not self.writer:
            return Path(tempfile.mkdtemp(prefix="descentlab-figure-")) / f"{name}.png"
        folder = self.path / "figures"
        folder.mkdir(exist_ok=True)
        return folder / f"{name}.png"

    def save_json(self, name: str, obj: Any) -> Path:
        path = self.path / name
        if self.writer:
            save_json(path, obj)
        return path

    def save_arrays(self, name: str, **arrays: Any) -> Path:
        """Figure data as ``<name>`` (an ``.npz`` file, see :func:`descentlab.io.save_arrays`); rank 0 only."""
        path = self.path / name
        if self.writer:
            save_arrays(path, **arrays)
        return path

    def load_json(self, name: str) -> Any:
        return json.loads((self.path / name).read_text())

    def checkpoint_dir(self, tag: str = "") -> Path:
        """Folder holding the checkpoints of one training job of this run (one per method/seed ``tag``)."""
        folder = self.path / "checkpoints" / (tag or "main")
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"
