"""Issue 33 (14): parallel workers no longer interleave their progress bars: one bar over the jobs."""

from __future__ import annotations

import os

from descentlab.study.jobs import PROGRESS_ENV, JobRunner, progress_allowed


def test_workers_run_with_per_step_bars_off_and_the_parent_shows_one_bar(capsys, monkeypatch) -> None:
    monkeypatch.setenv(PROGRESS_ENV, "1")  # a bar although the captured stderr is not a terminal
    assert progress_allowed()  # in this (parent) process
    with JobRunner(progress_allowed, workers=2) as jobs:
        flags = [jobs.submit(f"job{i}").result() for i in range(3)]
    assert flags == [False, False, False]  # fit() in a worker draws no bar
    err = capsys.readouterr().err
    assert "jobs (2 workers)" in err and "3/3" in err
    assert progress_allowed() and os.environ.get(PROGRESS_ENV) != "0"


def test_the_bar_can_be_turned_off(capsys) -> None:
    with JobRunner(progress_allowed, workers=2, progress=False) as jobs:
        assert jobs.submit("one").result() is False
    assert "jobs (" not in capsys.readouterr().err
