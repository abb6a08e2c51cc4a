"""Jobs sent to a submitit executor (the local one here, a cluster's SLURM elsewhere) come back as Futures."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from descentlab.errors import ConfigError
from descentlab.train.launchers import LauncherConfig, SubmititPool, _running

submitit = pytest.importorskip("submitit")


def square_and_threads(x: int) -> tuple[int, int, str]:
    import torch

    return x * x, torch.get_num_threads(), os.environ.get("DESCENTLAB_PROGRESS", "")


def fails(x: int) -> None:
    raise ValueError(f"job {x} failed on purpose")


def slow(path: str) -> int:
    time.sleep(30)
    Path(path).write_text("finished")
    return 1


def test_bad_launcher_settings_get_one_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"launcher\.kind"):
        LauncherConfig(kind="kubernetes")
    with pytest.raises(ConfigError, match="cpus_per_job"):
        LauncherConfig(kind="slurm", cpus_per_job=0)
    with pytest.raises(ConfigError, match="partition"):
        LauncherConfig(kind="submitit-local", partition="gpu")
    with pytest.raises(ConfigError, match="SubmititPool"):
        SubmititPool(LauncherConfig(), "unused")


def test_jobs_run_in_their_own_processes_with_the_workers_set_up(tmp_path: Path) -> None:
    pool = SubmititPool(LauncherConfig(kind="submitit-local", cpus_per_job=1, poll_s=0.1), tmp_path)
    futures = [pool.submit(square_and_threads, x, key=f"sq{x}") for x in range(3)]
    broken = pool.submit(fails, 7)
    pool.shutdown(wait=True)
    assert [f.result() for f in futures] == [(0, 1, "0"), (1, 1, "0"), (4, 1, "0")]
    with pytest.raises(Exception, match="job 7 failed on purpose"):
        broken.result()
    assert json.loads((tmp_path / "sq2.job").read_text())["kind"] == "submitit-local"


def test_a_resumed_driver_takes_a_finished_result_and_replaces_an_orphan(tmp_path: Path) -> None:
    cfg = LauncherConfig(kind="submitit-local", poll_s=0.1)
    first = SubmititPool(cfg, tmp_path)
    done = first.submit(square_and_threads, 5, key="done")
    assert done.result(timeout=120)[0] == 25
    orphan = first.submit(slow, str(tmp_path / "orphan-wrote"), key="orphan")
    record = json.loads((tmp_path / "orphan.job").read_text())
    first._stop.set()  # the driver goes away without waiting (as a killed one would)
    pid = int(record["job_id"])
    assert _running(pid)  # the orphan still runs
    second = SubmititPool(cfg, tmp_path)
    again = second.submit(square_and_threads, 5, key="done")  # re-attached: its result is on disk
    assert again.result(timeout=60)[0] == 25
    assert json.loads((tmp_path / "done.job").read_text()) == json.loads((tmp_path / "done.job").read_text())
    replaced = second.submit(square_and_threads, 6, key="orphan")
    assert replaced.result(timeout=120)[0] == 36
    assert json.loads((tmp_path / "orphan.job").read_text())["job_id"] != record["job_id"]
    assert not _running(pid), f"the orphan job {pid} still runs after the resume"
    assert not (tmp_path / "orphan-wrote").exists()
    second.shutdown()
    assert not orphan.done()  # the first driver's future is abandoned with it
