"""A SIGKILLed parent takes its worker processes with it within 2 s (issue 45, item 7; before: about 10 s).

The workers here ignore SIGTERM, as a worker inside ``fit`` in effect does (its signal guard turns SIGTERM
into "checkpoint at the end of this step", which can take a whole step): only the kernel's parent-death
SIGKILL, or the watchdog's ``os._exit``, ends them at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from descentlab.train.procs import process_alive

GONE_WITHIN = 2.0  # seconds after the parent's death (issue 45); the kernel's signal takes milliseconds

# A JobRunner with two workers that ignore SIGTERM, each sleeping in a job; it prints the worker pids.
PARENT = textwrap.dedent(
    """
    import signal, sys, time
    from descentlab.study.jobs import JobRunner

    ignore_term = (signal.SIGTERM, signal.SIG_IGN)
    with JobRunner(time.sleep, workers=2, initializer=signal.signal, initargs=ignore_term) as jobs:
        futures = [jobs.submit(f"sleep{i}", 600.0) for i in range(2)]
        while len(jobs._pool._processes) < 2:
            time.sleep(0.05)
        print(" ".join(str(pid) for pid in jobs._pool._processes), flush=True)
        for f in futures:
            f.result()
    """
)


def _ignores_sigterm(pid: int) -> bool:
    """Whether ``pid`` has run the pool's initializer (SIGTERM in its ignored set)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
    return bool(ignored & (1 << (signal.SIGTERM - 1)))


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_workers_end_within_2_s_of_their_parents_sigkill() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    workers: list[int] = []
    try:
        workers = [int(pid) for pid in proc.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(workers) == 2
        deadline = time.monotonic() + 120
        while not all(_ignores_sigterm(pid) for pid in workers):  # both inside their jobs
            assert time.monotonic() < deadline, "the workers never finished starting"
            time.sleep(0.05)
        time.sleep(0.5)
        proc.kill()
        proc.wait(timeout=30)
        dead_at = time.monotonic()
        while any(process_alive(pid, None) for pid in workers) and time.monotonic() - dead_at < 30:
            time.sleep(0.02)
        took = time.monotonic() - dead_at
        alive = [pid for pid in workers if process_alive(pid, None)]
        assert alive == [] and took < GONE_WITHIN, f"workers {alive} still ran {took:.1f} s after the kill"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in workers:
            if process_alive(pid, None):
                os.kill(pid, signal.SIGKILL)
