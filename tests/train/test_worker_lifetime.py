"""A killed run leaves no workers behind, and a resumed run is the only writer of its directory (issue 33)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from descentlab.errors import ConfigError
from descentlab.train.procs import process_alive, process_identity
from descentlab.train.rundir import RunDir

# The parent: a JobRunner with two workers, each sleeping in a job; it prints the worker pids, then waits.
PARENT = textwrap.dedent(
    """
    import sys, time
    from descentlab.study.jobs import JobRunner

    with JobRunner(time.sleep, workers=2, cache_dir=sys.argv[1]) as jobs:
        futures = [jobs.submit(f"sleep{i}", 600.0) for i in range(2)]
        while len(jobs._pool._processes) < 2:
            time.sleep(0.05)
        print(" ".join(str(pid) for pid in jobs._pool._processes), flush=True)
        for f in futures:
            f.result()
    """
)


def _alive(pid: int) -> bool:
    return process_alive(pid, None)


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive:
            return []
        time.sleep(0.1)
    return [pid for pid in pids if _alive(pid)]


@pytest.mark.skipif(sys.platform != "linux", reason="pdeathsig and /proc are Linux's")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_workers_die_with_their_parent_whatever_signal_ends_it(tmp_path: Path, sig: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "jobs")], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        workers = [int(pid) for pid in line.split()]
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
        time.sleep(1.0)  # the workers are inside their jobs
        proc.send_signal(sig)
        proc.wait(timeout=30)
        left = _wait_gone(workers, timeout=15)
        assert left == [], f"workers {left} outlived their parent (signal {sig})"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in workers if "workers" in locals() else []:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _holder(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """Another process that made a run directory and is still running (a live writer)."""
    script = textwrap.dedent(
        f"""
        import time
        from descentlab.train.rundir import RunDir
        run = RunDir.create({str(tmp_path)!r}, "smoke")
        (run.path / "config.yaml").write_text("n_train: 1\\n")
        print(run.path, flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    path = Path(proc.stdout.readline().strip())  # type: ignore[union-attr]
    return proc, path


def test_a_run_directory_has_one_writer(tmp_path: Path) -> None:
    proc, path = _holder(tmp_path)
    try:
        with pytest.raises(ConfigError, match=f"pid {proc.pid}") as info:
            RunDir.open(path)
        assert "\n" not in str(info.value)
    finally:
        proc.kill()
        proc.wait()
    run = RunDir.open(path)  # the writer is gone: its lock is stale and the resume takes it over
    assert run.path == path and f'"pid": {os.getpid()}' in (path / ".lock").read_text()
    assert RunDir.open(path).path == path  # the same process may reopen its own run


def test_a_run_directory_with_live_workers_of_a_dead_run_is_refused(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "smoke")
    (run.path / "config.yaml").write_text("n_train: 1\n")
    # an orphan, as a worker of a killed run is: its parent (the shell) has exited
    started = subprocess.run(
        ["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(600)' >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    orphan = int(started.stdout.strip())
    try:
        (run.path / "jobs").mkdir()
        ident = process_identity(orphan)
        (run.path / "jobs" / ".workers").write_text(f"{orphan} {ident}\n")
        with pytest.raises(ConfigError, match=f"worker process.*{orphan}"):
            RunDir.open(run.path)
    finally:
        os.kill(orphan, signal.SIGKILL)
    assert _wait_gone([orphan], timeout=10) == []
    assert RunDir.open(run.path).path == run.path
