"""Run directories never collide, even when many runs start in the same second."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from descentlab.errors import ConfigError
from descentlab.train.rundir import RunDir


def test_simultaneous_runs_get_distinct_directories(tmp_path) -> None:
    with ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(lambda _: RunDir.create(tmp_path, "exp"), range(32)))
    assert len({r.path for r in runs}) == 32
    assert all(r.path.is_dir() and r.path.name.startswith("exp-") for r in runs)


def test_log_and_json(tmp_path) -> None:
    run = RunDir.create(tmp_path, "x")
    run.log(step=1, loss=0.5, nan=float("nan"))
    run.save_json("results.json", {"a": [1.0, float("inf")]})
    assert run.metrics()[0]["loss"] == 0.5 and run.metrics()[0]["nan"] is None
    assert run.load_json("results.json")["a"][0] == 1.0
    assert run.figure("f").parent.name == "figures"


def test_open_rejects_a_folder_that_is_not_a_run(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not a descentlab run directory"):
        RunDir.open(tmp_path)
