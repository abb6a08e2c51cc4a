"""One faulty rank of two (gloo, CPU): every rank ends, or skips, together, with the rank and the reason.

Bounded time here means the launch ends before a deadline far below gloo's 30-minute collective timeout; a
rank left waiting in an all-reduce would run into the deadline and fail the test as a hang.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from faults.launch import PYTHON, load_worker, run_bounded, spawn_ranks

HERE = Path(__file__).parent
PD_WORKER = HERE / "primal_dual_fault_worker.py"
FIT_WORKER = HERE / "fit_fault_worker.py"
ENDS_WITHIN = 30.0  # seconds from a rank's fault to every process gone (gloo's own timeout: 30 minutes)
DEADLINE = 120.0  # seconds for 2 fresh processes importing torch on a loaded 2-core machine; a hang is ∞

pytestmark = pytest.mark.distributed


def _torchrun(out: Path, mode: str):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this build")
    out.mkdir()
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(FIT_WORKER)]
    return run_bounded([*cmd, str(out), mode], deadline=DEADLINE)


def test_a_non_finite_g_hat_on_one_rank_raises_on_every_rank_with_one_message(tmp_path: Path) -> None:
    ranks, worker = spawn_ranks(PD_WORKER, tmp_path, timeout=int(DEADLINE))
    a, b = ranks
    # both ranks raised at the fault step, with one and the same message naming rank 1 and the layer
    assert list(a["errors"]) == list(b["errors"]) == [worker.FAULT_STEP]
    message = a["errors"][worker.FAULT_STEP]
    assert message == b["errors"][worker.FAULT_STEP]
    assert "rank 1: non-finite constraint violation ĝ at layer(s) [1]" in message
    assert "rank 0:" not in message and "\n" not in message
    # both skipped the batch and stayed in step: identical λ and weights, equal to one process that
    # skips the same global batch
    assert torch.equal(a["lambda"], b["lambda"])
    model, constraint, opt = worker.build()
    single = worker.train(model, constraint, opt, worker.global_batches(), poison=True)
    assert list(single["errors"]) == [worker.FAULT_STEP]
    torch.testing.assert_close(a["lambda"], single["lambda"], rtol=0, atol=1e-12)
    for p, q in zip(a["params"], single["params"], strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


def test_a_rank_that_raises_in_fit_ends_every_rank_naming_the_rank_and_the_reason(tmp_path: Path) -> None:
    proc, _ = _torchrun(out := tmp_path / "out", "raise")
    ended = time.time()
    assert proc.returncode != 0
    took = ended - float((out / "fault_time").read_text())
    assert took < ENDS_WITHIN, f"the ranks took {took:.1f} s to end after the fault"
    log = proc.stdout + proc.stderr
    worker = load_worker(FIT_WORKER)
    # the reason, in the faulty rank's own traceback, prefixed with its rank by the launcher
    assert f"[rank1]: RuntimeError: {worker.MESSAGE} on rank 1 at step {worker.FAULT_STEP}" in log
    # the launcher's failure summary names rank 1 (as the root cause or beside rank 0, whichever it saw first)
    assert "rank      : 1 (local_rank: 1)" in log


def test_a_non_finite_loss_on_one_rank_stops_every_rank_naming_it(tmp_path: Path) -> None:
    proc, _ = _torchrun(out := tmp_path / "out", "nonfinite")
    assert proc.returncode == 0, proc.stderr[-3000:]
    messages = [(out / f"rank{r}.txt").read_text() for r in range(2)]
    assert messages[0] == messages[1]
    assert "2 non-finite losses (last at step 3 on rank(s) [1] of 2)" in messages[0]


def test_a_nan_batch_on_one_rank_stops_every_rank_at_once(tmp_path: Path) -> None:
    """The batch check is read with the step's finiteness flag (no read of its own); a failed step asks
    every rank whether its data was bad, so every rank raises instead of one raising and one hanging."""
    proc, _ = _torchrun(out := tmp_path / "out", "nandata")
    assert proc.returncode == 0, proc.stderr[-3000:]
    faulty, other = (out / "rank1.txt").read_text(), (out / "rank0.txt").read_text()
    assert faulty == "batch field 'x' contains NaN or Inf; clean the data before training"
    assert other == "a batch on rank(s) [1] of 2 contains NaN or Inf; clean the data before training"
