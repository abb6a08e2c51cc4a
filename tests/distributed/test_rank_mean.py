"""``rank_mean`` weighted by each rank's token count equals the one-process mean over every token, with
unequal batches on 2 gloo ranks (issue 46, item 4); the unweighted mean does not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from descentlab.distributed import rank_mean

WORKER = Path(__file__).with_name("rank_mean_worker.py")


@pytest.mark.distributed
def test_a_token_weighted_rank_mean_is_the_mean_over_all_tokens(tmp_path: Path, spawn_ranks) -> None:
    ranks, worker = spawn_ranks(WORKER, tmp_path, timeout=120)
    losses, mask = worker.token_losses()
    whole, tokens = worker.local_mean(losses, mask)  # one process, every token
    assert int(ranks[0]["tokens"]) != int(ranks[1]["tokens"])  # the ranks hold unequal token counts
    assert int(ranks[0]["tokens"] + ranks[1]["tokens"]) == int(tokens)
    for r in ranks:
        torch.testing.assert_close(r["weighted"], whole, rtol=1e-14, atol=0)
        assert r["weighted"].shape == whole.shape and r["weighted"].dtype == whole.dtype
    assert torch.equal(ranks[0]["weighted"], ranks[1]["weighted"])
    # the plain mean of the ranks' means is off whenever the counts differ: the weighting matters here
    assert (ranks[0]["unweighted"] - whole).abs().max() > 1e-3
    # the dual step weights the ranks by the targets behind each ĝ: λ equals one process on every token
    alone = worker.dual_step(whole, int(tokens))
    assert alone.abs().max() > 0  # the constraints are violated here, so λ moved
    assert not torch.allclose(worker.dual_step(ranks[0]["unweighted"], None), alone)  # equal weights: off
    for r in ranks:
        torch.testing.assert_close(r["lambda"], alone, rtol=1e-12, atol=1e-15)


def test_rank_mean_alone_is_the_identity() -> None:
    x = torch.randn(4, dtype=torch.float64)
    assert rank_mean(x) is x and rank_mean(x, torch.tensor(7)) is x
