"""descentlab.distributed alone (no process group): shares match the loop's split, means are whole-set means."""

from __future__ import annotations

import pytest
import torch

from descentlab import distributed as D
from descentlab.errors import ConfigError
from descentlab.train.loop import rank_share


@pytest.mark.parametrize("n", [0, 1, 5, 16, 17])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shards_are_the_loops_contiguous_shares_and_cover_everything(n: int, world: int) -> None:
    items = list(range(n))
    shares = [D.shard(items, r, world) for r in range(world)]
    assert [x for share in shares for x in share] == items
    for r in range(world):
        assert shares[r] == rank_share(torch.arange(n), r, world).tolist()
    with pytest.raises(ConfigError):
        D.shard_bounds(n, world, world)


def test_alone_every_helper_is_the_single_process_answer() -> None:
    assert not D.is_distributed() and D.rank() == 0 and D.world_size() == 1 and D.is_main_process()
    x = torch.arange(4.0)
    assert torch.equal(D.all_reduce_sum(x), x) and D.all_reduce_sum(x) is not x
    assert torch.equal(D.all_reduce_mean(x), x)
    assert D.gather_objects({"a": 1}) == [{"a": 1}] and D.broadcast_object("p") == "p"
    D.barrier()


def test_sharded_means_are_example_weighted_over_unequal_batches() -> None:
    g = torch.Generator().manual_seed(0)
    batches = [{"x": torch.randn(n, generator=g)} for n in (5, 3, 8)]
    means = D.sharded_means(batches, lambda b: {"x": b["x"], "sq": b["x"].double() ** 2})
    allx = torch.cat([b["x"] for b in batches]).double()
    assert means["n"] == 16
    assert means["x"] == pytest.approx(float(allx.mean()), rel=1e-12)
    assert means["sq"] == pytest.approx(float((allx**2).mean()), rel=1e-12)
    with pytest.raises(ConfigError):
        D.sharded_means([], lambda b: {})


def test_sharded_curve_rejects_metrics_that_do_not_combine_by_count() -> None:
    with pytest.raises(ConfigError):
        D.sharded_curve(torch.nn.Linear(1, 1), [], metric="perplexity")
