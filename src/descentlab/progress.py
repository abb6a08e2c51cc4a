"""One progress-bar style for every study: tqdm on stderr, shown only to a person watching a terminal.

A bar is drawn when all of these hold:

* the caller asks for it (``enabled``: e.g. ``TrainConfig.progress``, rank 0 only);
* ``DESCENTLAB_PROGRESS`` is not ``0`` (a :class:`~descentlab.study.jobs.JobRunner` worker sets it: the
  parent's one bar over jobs replaces the workers' per-step bars, so parallel bars never interleave);
* stderr is a terminal, or ``DESCENTLAB_PROGRESS=1`` forces bars on. Redirected to a file, a pipe, a CI
  log or a notebook, stderr gets no bar at all (a bar there is a wall of carriage returns); the run's
  progress is then in ``metrics.jsonl`` / ``metrics.csv``.

Every bar has the same layout (``desc: 42%|████      | 21/50 steps [00:03<00:04, 6.1 steps/s]``), redraws at
most twice a second and adapts to the terminal's width.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from tqdm import tqdm

__all__ = ["PROGRESS_ENV", "progress_allowed", "progress_bar", "progress_shown"]

PROGRESS_ENV = "DESCENTLAB_PROGRESS"  # "0": never a bar in this process; "1": a bar even without a terminal


def progress_allowed() -> bool:
    """False where bars must stay off whatever the terminal: ``DESCENTLAB_PROGRESS=0`` (set in workers)."""
    return os.environ.get(PROGRESS_ENV, "") != "0"


def progress_shown(enabled: bool = True) -> bool:
    """Whether :func:`progress_bar` draws a bar now (module docstring)."""
    if not enabled or not progress_allowed():
        return False
    if os.environ.get(PROGRESS_ENV) == "1":
        return True
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty is not None and isatty())


def progress_bar(
    total: int | None,
    *,
    desc: str,
    unit: str = "step",
    initial: int = 0,
    enabled: bool = True,
    leave: bool = False,
) -> tqdm[Any]:
    """A tqdm bar in the house style on stderr; a silent one (same methods, no output) when
    :func:`progress_shown` says no. ``leave=False``: the finished bar is erased, the next one takes its
    line."""
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit=unit,
        disable=not progress_shown(enabled),
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=0.5,
        leave=leave,
    )
