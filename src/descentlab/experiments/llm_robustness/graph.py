"""A job graph on one :class:`~descentlab.train.jobs.JobRunner`: jobs with dependencies and priorities.

llm-robustness's steps depend on each other (reference -> tuning fine-tunes -> noise grid -> validation ->
choice -> evaluation fine-tunes -> evaluation), and its pool's queue is FIFO: submitting every job up front
would put the selection's critical path behind the other fine-tunes. :class:`JobGraph` submits a job only
once its inputs are done, the lowest priority first, and never more than the pool has workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any

from descentlab.train.jobs import JobRunner

# job priorities (lower first): the tuning round, then the constrained methods' fine-tunes (the longest),
# then the others, then the evaluations
TUNING, CHOSEN_TRAIN, OTHER_TRAIN, EVALUATION = 0, 1, 2, 3


@dataclass(order=True)
class _Task:
    priority: int
    order: int
    key: str = field(compare=False)
    kind: str | None = field(compare=False)  # a job kind of jobs.job; None: a step run here
    args: Callable[[Mapping[str, Any]], tuple] = field(compare=False)
    deps: tuple[str, ...] = field(compare=False)
    then: Callable[[Any], None] | None = field(compare=False)


class JobGraph:
    """Jobs with dependencies on one :class:`JobRunner`: each is submitted once every job it depends on is
    done, the lowest priority first, and never more than ``slots`` at a time, so the pool's FIFO queue stays
    empty and a ready job of the critical path never waits behind filler.

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
        known = {t.key for t in self._pending} | {t.key for t in self._running.values()} | set(self.done)
        if key in known:
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


__all__ = ["CHOSEN_TRAIN", "EVALUATION", "OTHER_TRAIN", "TUNING", "JobGraph"]
