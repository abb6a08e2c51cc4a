"""PrimalDual under DDP: two gloo processes hold identical λ, equal to a single-process run on the same global batch."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("primal_dual_worker.py")


def _load_worker():
    spec = importlib.util.spec_from_file_location("descentlab_primal_dual_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.distributed
def test_two_gloo_ranks_match_each_other_and_the_single_process_run(tmp_path: Path) -> None:
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this build")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def launch(out: Path) -> subprocess.CompletedProcess:
        out.mkdir()
        return subprocess.run(
            [sys.executable, str(WORKER), str(out)], env=env, capture_output=True, text=True, timeout=120
        )

    proc = launch(tmp_path := tmp_path / "try1")
    if proc.returncode != 0 and "terminated with signal SIGABRT" in proc.stderr:
        # gloo's own threads can abort a rank at teardown on a loaded machine ("terminate called without an
        # active exception"; seen once in a fresh-clone CI run, never alone). A fault of the code under test
        # aborts again, so one fresh launch tells the two apart.
        proc = launch(tmp_path := tmp_path.parent / "try2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert torch.equal(ranks[0]["lambda"], ranks[1]["lambda"])  # bit-identical on both ranks

    worker = _load_worker()
    model, constraint, opt = worker.build()
    single = worker.train(model, constraint, opt, worker.global_batches())
    assert float(single[-1].abs().sum()) > 0.05  # the duals did move
    torch.testing.assert_close(ranks[0]["lambda"], single, rtol=0, atol=1e-12)
    for a, b in zip(ranks[0]["params"], model.parameters(), strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=1e-12)
