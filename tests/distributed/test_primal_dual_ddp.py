"""PrimalDual under DDP: two gloo processes hold identical λ, equal to a single-process run on the same global batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("primal_dual_worker.py")


@pytest.mark.distributed
def test_two_gloo_ranks_match_each_other_and_the_single_process_run(tmp_path: Path, spawn_ranks) -> None:
    ranks, worker = spawn_ranks(WORKER, tmp_path, timeout=120)
    assert torch.equal(ranks[0]["lambda"], ranks[1]["lambda"])  # bit-identical on both ranks

    model, constraint, opt = worker.build()
    single = worker.train(model, constraint, opt, worker.global_batches())
    assert float(single[-1].abs().sum()) > 0.05  # the duals did move
    torch.testing.assert_close(ranks[0]["lambda"], single, rtol=0, atol=1e-12)
    for a, b in zip(ranks[0]["params"], model.parameters(), strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=1e-12)
