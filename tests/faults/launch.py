"""Launchers shared by the fault tests: the 2-rank gloo launcher of tests/distributed, and a bounded run of a
command whose every process must end (no hang) within a deadline."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parents[1]


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# tests/distributed/conftest.py's launcher (one retry after a gloo teardown SIGABRT), not a copy of it
_distributed = _load(TESTS / "distributed" / "conftest.py", "descentlab_distributed_conftest")
spawn_ranks, load_worker = _distributed._spawn_ranks, _distributed.load_worker


def run_bounded(cmd: list[str], *, deadline: float) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``cmd`` (OMP_NUM_THREADS=1), fail the test if it is still running after ``deadline`` seconds
    (a hang), and return the finished process and its wall time."""
    import pytest

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=deadline)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{' '.join(cmd[-2:])} still ran after {deadline:.0f} s: a rank hung ({exc.stderr!r:.2000})"
        )
    return proc, time.monotonic() - start


PYTHON = sys.executable
