"""JobRunner: cached jobs are not run again, workers agree with inline, a failure cancels the queue.

Worker jobs are library functions (picklable by reference), since test modules are not importable by
name in spawned processes under --import-mode=importlib.
"""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import CancelledError
from pathlib import Path

import pytest
import torch

from descentlab.report.stats import mean_std
from descentlab.study.jobs import JobRunner

ROWS = [[0.81, 0.79, 0.835], [1.0, 2.0], [3.5], [0.1, 0.2, 0.3, 0.4]]


def test_a_cached_job_is_not_called_again(tmp_path: Path) -> None:
    calls: list[int] = []

    def job(seed: int) -> dict:
        calls.append(seed)
        return {"seed": seed, "loss": 1.0 / (seed + 1), "nan": math.nan, "pair": (seed, seed)}

    with JobRunner(job, cache_dir=tmp_path / "jobs") as jobs:
        first = jobs.map(["erm-seed0", "erm-seed1"], [0, 1])
    assert calls == [0, 1]
    assert json.loads((tmp_path / "jobs" / "erm-seed1.json").read_text())["loss"] == 0.5
    with JobRunner(job, cache_dir=tmp_path / "jobs") as jobs:  # a resumed run
        again = jobs.map(["erm-seed0", "erm-seed1", "erm-seed2"], [0, 1, 2])
        assert jobs.submit("erm-seed2", 2) is jobs.submit("erm-seed2", 2)
    assert calls == [0, 1, 2]
    # fresh and cached results look the same: tuples are lists, NaN stays NaN
    for fresh, cached in zip(first, again, strict=False):
        assert math.isnan(fresh.pop("nan")) and math.isnan(cached.pop("nan"))
        assert fresh == cached and fresh["pair"] == [fresh["seed"]] * 2


def test_encode_decode_carry_non_json_results(tmp_path: Path) -> None:
    def job(n: int) -> torch.Tensor:
        return torch.arange(n, dtype=torch.float64) / 3

    def decode(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float64)

    kwargs = {"cache_dir": tmp_path, "encode": torch.Tensor.tolist, "decode": decode}
    with JobRunner(job, **kwargs) as jobs:  # type: ignore[arg-type]
        fresh = jobs.submit("t", 4).result()
    with JobRunner(job, **kwargs) as jobs:  # type: ignore[arg-type]
        cached = jobs.submit("t", 4).result()
    assert torch.equal(fresh, cached) and torch.equal(fresh, torch.arange(4, dtype=torch.float64) / 3)


def test_bad_keys_are_refused(tmp_path: Path) -> None:
    with JobRunner(mean_std, cache_dir=tmp_path) as jobs, pytest.raises(ValueError, match="job key"):
        jobs.submit("../escape", [1.0])


def test_two_workers_give_the_inline_results_and_use_one_thread(tmp_path: Path) -> None:
    keys = [f"row{i}" for i in range(len(ROWS))]
    with JobRunner(mean_std, workers=1) as jobs:
        inline = jobs.map(keys, ROWS)
    with JobRunner(mean_std, workers=2, cache_dir=tmp_path) as jobs:
        pooled = jobs.map(keys, ROWS)
    assert pooled == inline == [list(mean_std(r)) for r in ROWS]
    results = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert results == sorted(f"{k}.json" for k in keys)
    assert len((tmp_path / ".workers").read_text().splitlines()) == 2  # the two workers, for RunDir.open
    with JobRunner(torch.get_num_threads, workers=2, threads=1) as jobs:
        assert jobs.submit("threads").result() == 1


def test_a_failing_job_propagates_and_cancels_the_queue() -> None:
    start = time.monotonic()
    with pytest.raises(ValueError, match="non-negative"), JobRunner(time.sleep, workers=2) as jobs:
        failing = jobs.submit("bad", -1.0)  # time.sleep(-1) raises ValueError in the worker
        queued = [jobs.submit(f"sleep{i}", 1.0) for i in range(10)]
        failing.result()
    assert time.monotonic() - start < 8  # did not wait for 10 one-second jobs on 2 workers
    cancelled = [f for f in queued if f.cancelled()]
    assert len(cancelled) >= 5  # at most the jobs already handed to a worker still run
    for f in queued:
        if not f.cancelled():
            assert f.result(timeout=30) is None  # they finish (and would be cached) in the background
    with pytest.raises(CancelledError):
        cancelled[0].result()


def test_inline_failure_raises_at_submit() -> None:
    with JobRunner(math.factorial) as jobs, pytest.raises(ValueError):
        jobs.submit("bad", -1)
