"""JobGraph: jobs with dependencies and priorities on one JobRunner (inline here: the order is observable)."""

from __future__ import annotations

import pytest

from descentlab.study.jobs import JobGraph, JobRunner

CALLS: list[str] = []


def work(kind: str, x: int) -> int:
    CALLS.append(f"{kind}:{x}")
    return {"double": 2 * x, "inc": x + 1}[kind]


def test_a_job_runs_once_its_inputs_are_done_lowest_priority_first_and_may_add_jobs() -> None:
    CALLS.clear()
    with JobRunner(work, workers=1, progress=False) as jobs:
        graph = JobGraph(jobs, slots=1)
        graph.add("late", "inc", lambda done: (100,), priority=5)
        graph.add("first", "double", lambda done: (3,), priority=0)
        graph.add("after", "inc", lambda done: (done["first"],), deps=["first"], priority=0,
                  then=lambda r: graph.add("added", "double", lambda done: (r,)))  # fmt: skip
        graph.add("choose", None, lambda done: max(done["after"], done["late"]), deps=["after", "late"])
        done = graph.run()
    assert done == {"first": 6, "after": 7, "added": 14, "late": 101, "choose": 101}
    # ready jobs go lowest priority first; the job a hook added joins the queue at its own priority
    assert CALLS == ["double:3", "inc:6", "double:7", "inc:100"]


def test_a_missing_input_and_a_key_added_twice_fail_clearly() -> None:
    with JobRunner(work, workers=1, progress=False) as jobs:
        graph = JobGraph(jobs, slots=2)
        graph.add("a", "inc", lambda done: (1,), deps=["nowhere"])
        with pytest.raises(ValueError, match="added twice"):
            graph.add("a", "inc", lambda done: (2,))
        with pytest.raises(RuntimeError, match=r"wait for \['nowhere'\]"):
            graph.run()
