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
