"""One runner for an experiment's (method, seed) jobs: inline or in 1-thread worker processes, cached.

Jobs are independent (own seed, own checkpoint folder), so running them in parallel changes nothing but
the wall-clock time. Each finished job's result is written to ``<cache_dir>/<key>.json``; a resumed
experiment gets those results back at once and runs only the jobs that had not finished.

Results must be JSON-able: dicts with string keys, lists, str, int, float (NaN and ±Inf included), bool,
None; tuples come back as lists. Anything else (tensors, curve objects) goes through an ``encode`` /
``decode`` pair: the cache stores ``encode(result)`` and every result handed back, fresh or cached, is
``decode(json round trip of encode(result))``, so a resumed run sees exactly what an uninterrupted one does.

With workers, the parent shows one progress bar over the finished jobs, and the workers' own per-step bars
(``fit``'s) are off: ``DESCENTLAB_PROGRESS=0`` is set in every worker
(:func:`~descentlab.progress.progress_allowed`), so parallel bars never interleave on one terminal line.
Both come from :func:`descentlab.progress.progress_bar`: one style, and no bar when stderr is no terminal.

Usage::

    with JobRunner(train_and_eval, workers=cfg.workers, cache_dir=run.path / "jobs") as jobs:
        erm = jobs.submit("erm-seed0", cfg, "erm", 0)          # a Future
        others = jobs.map(["cons-seed0", "cons-seed1"], [cfg, cfg], ["cons", "cons"], [0, 1])
        erm.result()
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from descentlab.errors import ConfigError
from descentlab.io import atomic_write_text
from descentlab.progress import PROGRESS_ENV, progress_bar
from descentlab.progress import progress_allowed as progress_allowed  # its home before descentlab.progress
from descentlab.study.launchers import LauncherConfig, SubmititPool, current_launcher
from descentlab.train.procs import die_with_parent, process_identity

WORKERS_FILE = ".workers"  # in the cache folder: "<pid> <start time>" of each worker, one a line

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+=-]*")


def _identity(value: Any) -> Any:
    return value


def _init_worker(
    threads: int,
    initializer: Callable[..., None] | None,
    initargs: tuple[Any, ...],
    parent: int | None = None,
    registry: str | None = None,
) -> None:
    # first: a worker must never outlive the run that started it (a SIGKILLed parent included)
    if parent is not None:
        die_with_parent(parent)
    os.environ[PROGRESS_ENV] = "0"  # the parent's one bar over jobs replaces the workers' per-step bars
    if registry is not None:  # a resume of the run refuses to start while a recorded worker still runs
        with open(registry, "a", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()} {process_identity(os.getpid()) or '-'}\n")
    # one intra-op thread per worker: `workers` processes share the cores instead of oversubscribing them
    torch.set_num_threads(threads)
    if initializer is not None:
        initializer(*initargs)


def _run_and_encode(fn: Callable[..., Any], encode: Callable[[Any], Any], args: tuple[Any, ...]) -> str:
    # encoded in the worker: the JSON text is what travels back, so inline and pooled runs agree exactly
    return json.dumps(encode(fn(*args)))


class JobRunner:
    """Runs ``fn(*args)`` once per key, inline (``workers <= 1``) or in ``workers`` spawned processes.

    Args:
        fn: the job, a top-level (picklable) function; its arguments must be picklable when ``workers > 1``.
        workers: processes; ``<= 1`` runs each job in this process when it is submitted.
        cache_dir: folder of the per-job result files (``run.path / "jobs"``); None caches nothing.
        initializer, initargs: run once in each worker process after ``torch.set_num_threads(threads)``
            (e.g. to load the data once per worker).
        threads: intra-op threads of each worker.
        encode, decode: map a result to JSON-able data and back (identity by default).
        progress: with workers, show one progress bar over the jobs they run (finished / queued) on stderr;
            the workers' own per-step bars are always off.

    Use it as a context manager: leaving the block waits for the running jobs; leaving it by an exception
    (a failed job, Ctrl-C) cancels the queued ones instead, and the finished ones stay cached.

    Workers die with this process, whatever ends it (SIGKILL included): see
    :func:`~descentlab.train.procs.die_with_parent`. Each worker records its pid in
    ``<cache_dir>/.workers``, and :meth:`~descentlab.train.rundir.RunDir.open` refuses to
    resume a run while one of them is still alive, so a resumed run is the only writer of its directory.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        workers: int = 1,
        cache_dir: Path | str | None = None,
        initializer: Callable[..., None] | None = None,
        initargs: tuple[Any, ...] = (),
        threads: int = 1,
        encode: Callable[[Any], Any] = _identity,
        decode: Callable[[Any], Any] = _identity,
        progress: bool = True,
        launcher: LauncherConfig | None = None,
    ) -> None:
        self.fn, self.workers, self.encode, self.decode = fn, workers, encode, decode
        self.launcher = current_launcher() if launcher is None else launcher
        if self.launcher.remote and cache_dir is None:
            raise ConfigError(
                f"launcher.kind={self.launcher.kind} needs a cache_dir (it records its jobs there)"
            )
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._init = (threads, initializer, initargs)
        self._futures: dict[str, Future] = {}
        self._pool: ProcessPoolExecutor | None = None
        self._queued: list[Future] = []  # the pool's futures, cancelled when the block fails
        self.progress = progress
        self._bar: Any = None  # the one bar over the pool's jobs
        self._bar_lock = threading.Lock()  # done callbacks run in the pool's thread

    def __enter__(self) -> JobRunner:
        if self.launcher.remote:
            assert self.cache_dir is not None
            threads, initializer, initargs = self._init
            self._pool = SubmititPool(  # type: ignore[assignment]
                self.launcher, self.cache_dir / "submitit", initializer, initargs, threads=threads
            )
            self._bar = progress_bar(
                0, desc=f"jobs ({self.launcher.kind})", unit="job", enabled=self.progress, leave=True
            )
        elif self.workers > 1:
            registry = None
            if self.cache_dir is not None:
                self.cache_dir.mkdir(parents=True, exist_ok=True)
                registry = str(self.cache_dir / WORKERS_FILE)
            # spawn, not fork: forking after torch / OpenMP start-up is not safe
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(*self._init, os.getpid(), registry),
            )
            self._bar = progress_bar(
                0, desc=f"jobs ({self.workers} workers)", unit="job", enabled=self.progress, leave=True
            )
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self._pool is None:
            return
        if exc_type is not None:
            # cancelled here, synchronously: the pool's own cancel_futures runs later in its manager thread
            # and only while the executor object is still referenced
            for raw in self._queued:
                raw.cancel()
        self._pool.shutdown(wait=exc_type is None, cancel_futures=exc_type is not None)
        with self._bar_lock:
            self._bar.close()

    def cache_path(self, key: str) -> Path | None:
        if not _KEY.fullmatch(key):
            raise ValueError(f"job key {key!r} must match {_KEY.pattern} (it names a file)")
        return self.cache_dir / f"{key}.json" if self.cache_dir is not None else None

    def submit(self, key: str, *args: Any) -> Future:
        """A Future of ``fn(*args)``: already done when cached, run now inline, else queued to a worker.

        A key submitted twice returns the first Future (the job runs once). Inline, a failing job raises
        here; in workers, it raises from ``Future.result()``.
        """
        if key in self._futures:
            return self._futures[key]
        path = self.cache_path(key)
        future: Future
        if path is not None and path.is_file():
            future = Future()
            future.set_result(self.decode(json.loads(path.read_text())))
        elif self._pool is None:
            if self.workers > 1 or self.launcher.remote:
                raise RuntimeError("JobRunner with workers > 1 must be used as a context manager")
            future = Future()
            future.set_result(self._finish(path, _run_and_encode(self.fn, self.encode, args)))
        else:
            if isinstance(self._pool, SubmititPool):  # keyed: a resumed run re-attaches to its jobs
                raw = self._pool.submit(_run_and_encode, self.fn, self.encode, args, key=key)
            else:
                raw = self._pool.submit(_run_and_encode, self.fn, self.encode, args)
            self._queued.append(raw)
            with self._bar_lock:
                self._bar.total += 1
                self._bar.refresh()
            future = Future()

            def done(f: Future, out: Future = future, path: Path | None = path) -> None:
                if f.cancelled():
                    out.cancel()
                    return
                with self._bar_lock:
                    self._bar.update(1)
                if f.exception() is not None:
                    out.set_exception(f.exception())  # type: ignore[arg-type]
                else:
                    try:
                        out.set_result(self._finish(path, f.result()))
                    except BaseException as exc:  # a failing decode or write belongs to this job
                        out.set_exception(exc)

            # kept pending (not marked running) so that a job the pool cancels reads as cancelled here too
            raw.add_done_callback(done)
        self._futures[key] = future
        return future

    def map(self, keys: Sequence[str], *iterables: Iterable[Any]) -> list[Any]:
        """``[fn(*args) for args in zip(*iterables)]`` keyed by ``keys``, run in parallel, in order."""
        columns = [list(it) for it in iterables]
        if any(len(c) != len(keys) for c in columns):
            raise ValueError("map needs one argument per key in each iterable")
        futures = [self.submit(key, *args) for key, *args in zip(keys, *columns, strict=True)]
        return [f.result() for f in futures]

    def _finish(self, path: Path | None, text: str) -> Any:
        if path is not None:
            atomic_write_text(path, text)
        return self.decode(json.loads(text))


@dataclass(order=True)
class _Task:
    """One job of a :class:`JobGraph` (ordered by priority, then by when it was added)."""

    priority: int
    order: int
    key: str = field(compare=False)
    kind: str | None = field(compare=False)  # a job kind of jobs.JOBS; None: a step run here
    args: Callable[[Mapping[str, Any]], tuple] = field(compare=False)
    deps: tuple[str, ...] = field(compare=False)
    then: Callable[[Any], None] | None = field(compare=False)


class JobGraph:
    """Jobs with dependencies on one :class:`JobRunner`, whose queue is FIFO: each is submitted once every
    job it depends on is done, the lowest priority first, and never more than ``slots`` at a time, so a
    ready job of the critical path (the tuning round) never waits behind filler.

    ``add(key, kind, args, deps, priority, then)``: ``args(done)`` builds the job's arguments from the
    results of the finished jobs (``done[key]``); ``then(result)`` runs here when it finishes and may add
    more jobs. ``kind=None`` adds a step that runs here, not in a worker (e.g. a choice between candidates).
    """

    def __init__(self, jobs: JobRunner, slots: int) -> None:
        self.jobs, self.slots = jobs, max(1, slots)
        self.done: dict[str, Any] = {}
        self._pending: list[_Task] = []
        self._running: dict[Future, _Task] = {}
        self._order = 0

    def add(
        self,
        key: str,
        kind: str | None,
        args: Callable[[Mapping[str, Any]], tuple] = lambda done: (),
        deps: Iterable[str] = (),
        priority: int = 0,
        then: Callable[[Any], None] | None = None,
    ) -> None:
        if key in {t.key for t in (*self._pending, *self._running.values())} | set(self.done):
            raise ValueError(f"job {key!r} was added twice")
        self._order += 1
        self._pending.append(_Task(priority, self._order, key, kind, args, tuple(deps), then))

    def _finish(self, task: _Task, result: Any) -> None:
        self.done[task.key] = result
        if task.then is not None:
            task.then(result)

    def run(self) -> dict[str, Any]:
        """Run every job (and the ones their ``then`` adds); the results by key. A failed job raises."""
        while self._pending or self._running:
            ready = sorted(t for t in self._pending if all(d in self.done for d in t.deps))
            if not ready and not self._running:
                missing = sorted({d for t in self._pending for d in t.deps if d not in self.done})
                raise RuntimeError(f"jobs wait for {missing}, which no job provides")
            progressed = False
            for task in ready:
                if task.kind is not None and len(self._running) >= self.slots:
                    continue
                self._pending.remove(task)
                if task.kind is None:
                    self._finish(task, task.args(self.done))
                    progressed = True
                    break  # a step may add jobs: sort again
                future = self.jobs.submit(task.key, task.kind, *task.args(self.done))
                if future.done():  # cached, or run inline
                    self._finish(task, future.result())
                    progressed = True
                    break
                self._running[future] = task
            if progressed or not self._running:
                continue
            finished, _ = wait(list(self._running), return_when=FIRST_COMPLETED)
            for future in finished:
                self._finish(self._running.pop(future), future.result())
        return self.done
