"""Where a study's jobs run: this machine's worker processes, or a cluster through submitit.

A study is a set of independent (arm, seed) jobs (:class:`~descentlab.study.jobs.JobRunner`). On a
laptop or a 2-core box they run in a local process pool. When a sized design outgrows the machine, the same
jobs go to a cluster: :class:`SubmititPool` sends each one to a `submitit <https://github.com/facebookincubator/submitit>`_
executor (SLURM, or submitit's local executor, which runs each job in its own process and is how the tests
exercise this path) and hands back a :class:`concurrent.futures.Future`, so the runner's cache and resume
work unchanged: a finished job's result is cached by the runner under its key, and a resumed run only
submits what has not finished.

A job that is still queued or running on the cluster when the driver dies is not lost: its id is recorded
beside the runner's cache (``<cache>/<key>.job``), and a resumed run re-attaches to it instead of
submitting it again (SLURM). A local executor's job cannot be re-attached reliably once its parent is gone,
so a resume stops that orphan (it is identified by its recorded pid and submitit's command line) and submits
the job again; jobs are deterministic by seed, so the arrays are the same.

Select it with the config keys of :class:`LauncherConfig`, e.g.::

    descentlab run sparse-lm --preset full launcher.kind=slurm launcher.partition=gpu launcher.gpus_per_job=1
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from descentlab.errors import ConfigError
from descentlab.io import atomic_write_text

__all__ = [
    "KINDS",
    "LauncherConfig",
    "SubmititPool",
    "current_launcher",
    "launcher_from_overrides",
    "launching",
]

#: ``local``: the runner's own process pool on this machine (the default); ``submitit-local``: submitit's
#: local executor, one process per job (a stand-in for a cluster, used by the tests); ``slurm``: SLURM.
KINDS = ("local", "submitit-local", "slurm")


@dataclass(frozen=True)
class LauncherConfig:
    """Where the jobs of a run go.

    Attributes:
        kind: one of :data:`KINDS`.
        partition: the SLURM partition (``slurm`` only; None: the cluster's default).
        gpus_per_job: GPUs each job asks for (``slurm``).
        cpus_per_job: CPU cores each job asks for; also its torch thread count.
        time_min: each job's time limit in minutes.
        poll_s: how often the driver checks its jobs, in seconds.
    """

    kind: str = "local"
    partition: str | None = None
    gpus_per_job: int = 0
    cpus_per_job: int = 1
    time_min: int = 240
    poll_s: float = 0.5

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"launcher.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for name in ("gpus_per_job", "cpus_per_job", "time_min"):
            value = getattr(self, name)
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or value < (1 if name != "gpus_per_job" else 0)
            ):
                raise ConfigError(
                    f"launcher.{name} must be a whole number >= {int(name != 'gpus_per_job')}, got {value!r}"
                )
        if not self.poll_s > 0:
            raise ConfigError(f"launcher.poll_s must be > 0, got {self.poll_s!r}")
        if self.partition is not None and self.kind != "slurm":
            raise ConfigError("launcher.partition applies to launcher.kind=slurm only")

    @property
    def remote(self) -> bool:
        """True when jobs go to a submitit executor rather than the runner's own pool."""
        return self.kind != "local"


_CURRENT: ContextVar[LauncherConfig | None] = ContextVar("descentlab_launcher", default=None)


@contextmanager
def launching(config: LauncherConfig | None) -> Iterator[None]:
    """Within the block, a :class:`~descentlab.study.jobs.JobRunner` made without ``launcher=`` sends its
    jobs where ``config`` says: how ``descentlab run ... launcher.kind=slurm`` reaches every study's runner
    without each study passing it on."""
    token = _CURRENT.set(config)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_launcher() -> LauncherConfig:
    """The launcher of the enclosing :func:`launching` block, else the local pool."""
    return _CURRENT.get() or LauncherConfig()


def launcher_from_overrides(overrides: Sequence[str]) -> tuple[list[str], LauncherConfig | None]:
    """Split ``launcher=KIND`` and ``launcher.<field>=VALUE`` out of a command line's overrides: (the other
    overrides, the launcher they ask for or None). Values are read as YAML scalars, like every override."""
    import difflib

    import yaml

    rest: list[str] = []
    fields: dict[str, Any] = {}
    names = [f.name for f in dataclasses.fields(LauncherConfig)]
    for item in overrides:
        key, sep, value = item.partition("=")
        if key == "launcher":
            fields["kind"] = value
        elif key.startswith("launcher.") and sep:
            name = key.removeprefix("launcher.")
            if name not in names:
                near = difflib.get_close_matches(name, names, n=2)
                hint = f"; did you mean {' or '.join(f'launcher.{n}' for n in near)}?" if near else ""
                raise ConfigError(f"unknown key launcher.{name} (keys: {', '.join(names)}){hint}")
            fields[name] = yaml.safe_load(value) if name != "kind" else value
        else:
            rest.append(item)
    return rest, (LauncherConfig(**fields) if fields else None)


def _run_job(
    threads: int, initializer: Callable[..., None] | None, initargs: tuple[Any, ...], task: Any
) -> Any:
    """The body of a submitted job: the worker set-up the local pool gives its processes, then the task."""
    import torch

    from descentlab.progress import PROGRESS_ENV

    os.environ[PROGRESS_ENV] = "0"  # the driver shows the one bar over jobs
    torch.set_num_threads(threads)
    if initializer is not None:
        initializer(*initargs)
    fn, *args = task
    return fn(*args)


class SubmititPool:
    """The part of :class:`concurrent.futures.Executor` that :class:`~descentlab.study.jobs.JobRunner`
    uses (``submit`` → Future, ``shutdown``), over a submitit executor.

    Args:
        config: the launcher; ``config.kind`` must not be ``local``.
        folder: where submitit keeps each job's pickles and logs, and where job ids are recorded.
        initializer, initargs: run in each job before its task (the pool's worker initializer).
        threads: torch threads of each job (default ``config.cpus_per_job``).
    """

    def __init__(
        self,
        config: LauncherConfig,
        folder: Path | str,
        initializer: Callable[..., None] | None = None,
        initargs: tuple[Any, ...] = (),
        threads: int | None = None,
    ) -> None:
        import submitit

        if not config.remote:
            raise ConfigError("SubmititPool needs launcher.kind submitit-local or slurm")
        self.config = config
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        cluster = "local" if config.kind == "submitit-local" else "slurm"
        self.executor = submitit.AutoExecutor(folder=self.folder / "%j", cluster=cluster)
        params: dict[str, Any] = {"timeout_min": config.time_min, "cpus_per_task": config.cpus_per_job}
        if cluster == "slurm":
            params["gpus_per_node"] = config.gpus_per_job
            if config.partition is not None:
                params["slurm_partition"] = config.partition
        self.executor.update_parameters(**params)
        self._init = (threads or config.cpus_per_job, initializer, initargs)
        self._pending: list[tuple[Any, Future]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="submitit-watcher", daemon=True)
        self._watcher.start()

    def submit(self, fn: Callable[..., Any], *args: Any, key: str | None = None) -> Future:
        """A Future of ``fn(*args)`` run as a submitit job. With ``key``, the job's id is recorded
        (``<folder>/<key>.job``) and a job of that key left by an earlier driver is re-attached (SLURM)
        or stopped and replaced (local executor)."""
        record = None if key is None else self.folder / f"{key}.job"
        job = self._attach(record) if record is not None and record.is_file() else None
        if job is None:
            job = self.executor.submit(_run_job, *self._init, (fn, *args))
            if record is not None:
                atomic_write_text(record, json.dumps({"job_id": str(job.job_id), "kind": self.config.kind}))
        future: Future = Future()
        future.set_running_or_notify_cancel()
        with self._lock:
            self._pending.append((job, future))
        return future

    def _attach(self, record: Path) -> Any | None:
        """The job an earlier driver recorded, when it can be waited on; None when it must be submitted
        again (a local orphan is stopped first)."""
        import submitit

        try:
            recorded = json.loads(record.read_text())
            job_id = str(recorded["job_id"])
        except (OSError, ValueError, KeyError):
            return None
        folder = self.folder / job_id
        if recorded.get("kind") == "slurm" and self.config.kind == "slurm":
            return submitit.SlurmJob(folder=folder, job_id=job_id)
        job = submitit.local.local.LocalJob(folder=folder, job_id=job_id)
        if job.paths.result_pickle.exists():
            return job  # it finished while no driver watched it: its result is on disk
        _stop_orphan(int(job_id))
        return None

    def _watch(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                pending = list(self._pending)
            finished = []
            for job, future in pending:
                if future.cancelled():
                    finished.append((job, future))
                    continue
                if not job.done():
                    continue
                try:
                    future.set_result(job.result())
                except BaseException as exc:  # the job's own exception, or submitit's account of its death
                    future.set_exception(exc)
                finished.append((job, future))
            if finished:
                with self._lock:
                    self._pending = [p for p in self._pending if p not in finished]
            self._stop.wait(self.config.poll_s)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Wait for every submitted job (``wait``), or cancel the ones still queued or running."""
        if cancel_futures:
            with self._lock:
                pending, self._pending = list(self._pending), []
            for job, future in pending:
                job.cancel(check=False)
                if not future.done():
                    future.set_exception(RuntimeError("cancelled with its run"))
        while wait and not cancel_futures:
            with self._lock:
                if not self._pending:
                    break
            time.sleep(self.config.poll_s)
        self._stop.set()
        self._watcher.join()


def _running(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def _stop_orphan(pid: int, grace_s: float = 2.0) -> None:
    """Stop a local submitit job left running by a driver that died, if ``pid`` is still that job.

    SIGTERM first; submitit treats it as a pre-emption and may ignore it, so SIGKILL follows after
    ``grace_s``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return  # gone, or not a Linux /proc: nothing to stop
    if "submitit" not in cmdline:
        return  # the pid was reused by an unrelated process
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not _running(pid):
                return
            time.sleep(0.05)
