"""ConstraintSet under DDP: two gloo processes hold identical multipliers (dense, equality and indexed; projected
ascent and an Adam dual optimizer), equal to one process on the concatenated global batches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("constraint_set_worker.py")


@pytest.mark.distributed
def test_two_gloo_ranks_hold_the_multipliers_of_one_process_on_the_whole_batch(
    tmp_path: Path, spawn_ranks
) -> None:
    ranks, worker = spawn_ranks(WORKER, tmp_path, timeout=180)

    for setting in worker.SETTINGS:
        lam0, lam1 = ranks[0][setting]["lambda"], ranks[1][setting]["lambda"]
        assert lam0.shape == (worker.STEPS, 2 + 1 + worker.EXAMPLES)
        assert torch.equal(lam0, lam1), f"{setting}: the ranks' multipliers differ"  # bit-identical

        model, cs, opt = worker.build(setting)
        single = worker.train(model, cs, opt, worker.global_batches(), model)
        rate, norm, per_example = single[-1, :2], single[-1, 2], single[-1, 3:]
        assert float(rate.min()) > 0 and float(norm.abs()) > 0, f"{setting}: the dense duals must move"
        assert int((per_example > 0).sum()) >= 4, f"{setting}: the per-example duals must move"
        torch.testing.assert_close(lam0, single, rtol=0, atol=1e-12, msg=setting)
        for a, b in zip(ranks[0][setting]["params"], model.parameters(), strict=True):
            torch.testing.assert_close(a, b.detach(), rtol=0, atol=1e-12, msg=setting)
