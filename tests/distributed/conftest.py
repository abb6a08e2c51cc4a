"""Launching a worker script on 2 CPU ranks (torchrun, gloo) and reading back what each rank saved."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

WORLD = 2


def load_worker(path: Path) -> ModuleType:
    """The worker script as a module, for its one-process reference functions."""
    spec = importlib.util.spec_from_file_location(f"descentlab_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _spawn_ranks(worker: Path, out_root: Path, *, timeout: int) -> tuple[list[dict], ModuleType]:
    """Run ``worker out`` (a script that spawns its own 2 gloo ranks) and return each rank's
    ``out/rank{r}.pt`` and the worker module.

    gloo's own threads can abort a rank at teardown on a loaded machine ("terminate called without an
    active exception"; seen once in a fresh-clone CI run, never alone). A fault of the code under test
    aborts again, so one fresh launch after a SIGABRT tells the two apart.
    """
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this build")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def launch(out: Path) -> subprocess.CompletedProcess:
        out.mkdir()
        return subprocess.run(
            [sys.executable, str(worker), str(out)], env=env, capture_output=True, text=True, timeout=timeout
        )

    proc = launch(out := out_root / "try1")
    if proc.returncode != 0 and "terminated with signal SIGABRT" in proc.stderr:
        proc = launch(out := out_root / "try2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    return ranks, load_worker(worker)


@pytest.fixture(scope="module")
def spawn_ranks() -> Callable[..., tuple[list[dict], ModuleType]]:
    """``spawn_ranks(worker, out_root, timeout=...)``: see :func:`_spawn_ranks`."""
    return _spawn_ranks


@pytest.fixture(scope="module")
def torchrun() -> Callable[..., tuple[list[dict], ModuleType]]:
    """``torchrun(worker, out)`` runs ``worker out`` on ``WORLD`` ranks and returns each rank's
    ``out/rank{r}.pt`` and the worker module."""
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this build")

    def run(worker: Path, out: Path, **env: str) -> tuple[list[dict], ModuleType]:
        environ = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **env}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}"]
        proc = subprocess.run(
            [*cmd, str(worker), str(out)], env=environ, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        ranks = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
        return ranks, load_worker(worker)

    return run
