"""Jobs sent to a submitit executor (the local one here, a cluster's SLURM elsewhere) come back as Futures."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from descentlab.errors import ConfigError
from descentlab.study.launchers import LauncherConfig, SubmititPool, _running

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


TINY = ["n_train=256", "n_test=128", "hidden=16", "train.epochs=1", "train.batch_size=32", "seeds=[0,1,2]"]


def _job_results(run_dir: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((run_dir / "jobs").glob("erm-seed*.json"))}


def test_launcher_keys_are_split_from_the_config_and_checked() -> None:
    from descentlab.study.launchers import launcher_from_overrides

    rest, launcher = launcher_from_overrides(["n_train=8", "launcher=slurm", "launcher.gpus_per_job=2"])
    assert rest == ["n_train=8"] and launcher == LauncherConfig(kind="slurm", gpus_per_job=2)
    assert launcher_from_overrides(["a=1"]) == (["a=1"], None)
    with pytest.raises(ConfigError, match=r"did you mean launcher\.gpus_per_job"):
        launcher_from_overrides(["launcher.gpu_per_job=1"])


def test_a_study_through_submitits_local_executor_is_killed_resumed_and_matches(tmp_path: Path) -> None:
    """The done-when of the cluster launcher: a quick study runs through submitit's local executor, its driver
    is SIGKILLed mid-way, ``resume=`` finishes it (re-attaching or replacing the jobs), and every job's result
    equals the in-process run's."""
    import signal
    import subprocess
    import sys

    import torch

    from descentlab.errors import AssetMissingError
    from descentlab.experiments import run_experiment

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the jobs run with 1 thread: the reference does too
    try:
        reference = run_experiment("smoke", overrides=TINY, out=tmp_path / "inline")
    except AssetMissingError as exc:
        pytest.skip(f"no image dataset installed: {exc}")
    finally:
        torch.set_num_threads(threads)
    out = tmp_path / "cluster"
    cmd = [sys.executable, "-m", "descentlab.cli", "run", "smoke", *TINY, "launcher=submitit-local",
           "launcher.poll_s=0.1", "--out", str(out)]  # fmt: skip
    driver = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(out.glob("smoke-*/jobs/erm-seed0.json")):  # one job finished, the others not
        assert driver.poll() is None, driver.communicate()
        assert time.monotonic() < deadline, "the first job never finished"
        time.sleep(0.1)
    driver.send_signal(signal.SIGKILL)
    driver.communicate()
    (run_dir,) = out.glob("smoke-*")
    assert len(_job_results(run_dir)) < 3
    assert json.loads((run_dir / "config.json").read_text())["launcher"]["kind"] == "submitit-local"
    resumed = run_experiment("smoke", resume=run_dir)
    assert _job_results(resumed) == _job_results(reference)
    records = sorted(p.name for p in (run_dir / "jobs" / "submitit").glob("*.job"))
    assert records == ["erm-seed0.job", "erm-seed1.job", "erm-seed2.job"]
