"""Worker of test_rank_mean.py (a script, not collected): ``rank_mean`` on 2 gloo ranks holding unequal batches.

Usage: python rank_mean_worker.py OUT_DIR. Rank r holds ``ROWS[r]`` sequences of a padded token batch; each
rank computes its per-layer mean loss over its own non-padding tokens and averages it over ranks weighted by
its token count (a tensor, as a training step would have it), and unweighted. Each saves
``OUT_DIR/rank{r}.pt``; the test compares with the mean over all tokens in one process.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
ROWS = (2, 7)  # sequences per rank: deliberately unequal
LAYERS, LENGTH = 3, 5


def token_losses() -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token losses [rows, layers, length] and a padding mask [rows, length] for every rank's rows."""
    g = torch.Generator().manual_seed(11)
    losses = torch.rand(sum(ROWS), LAYERS, LENGTH, generator=g, dtype=torch.float64) * 4
    lengths = torch.randint(1, LENGTH + 1, (sum(ROWS),), generator=g)
    mask = torch.arange(LENGTH) < lengths[:, None]
    return losses, mask


def local_mean(losses: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-layer mean over the non-padding tokens, and the token count."""
    tokens = mask.sum()
    return (losses * mask[:, None, :]).sum(dim=(0, 2)) / tokens, tokens


def dual_step(f: torch.Tensor, tokens: int | None) -> torch.Tensor:
    """λ after one dual step of a LayerwiseDescent fed ``f`` with the readout's record of ``tokens`` targets
    (an exact read), as a training step feeds it."""
    from types import SimpleNamespace

    import descentlab as dl

    constraint = dl.LayerwiseDescent(num_layers=LAYERS - 1, alpha=0.1, dual_lr=1.0)
    estimate = None if tokens is None else SimpleNamespace(n=tokens, sampled=False)
    f = f.clone().requires_grad_(True)
    constraint.lagrangian(f, estimate=estimate).backward()
    constraint.dual_step_()
    return constraint.multipliers.detach().clone()


def worker(rank: int, out_dir: str) -> None:
    from descentlab.distributed import rank_mean

    dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=WORLD)
    try:
        losses, mask = token_losses()
        start = sum(ROWS[:rank])
        mine = slice(start, start + ROWS[rank])
        mean, tokens = local_mean(losses[mine], mask[mine])
        result = {"weighted": rank_mean(mean, tokens), "unweighted": rank_mean(mean), "tokens": tokens}
        result["lambda"] = dual_step(mean, int(tokens))
        torch.save(result, f"{out_dir}/rank{rank}.pt")
        dist.barrier()  # leave together: tearing gloo down under a connected peer can abort the process
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1],), nprocs=WORLD, join=True)
