"""Worker of test_primal_dual_ddp.py: DDP (gloo) training with PrimalDual; run as a script, not collected.

Usage: python primal_dual_worker.py OUT_DIR. Each of 2 ranks trains on its half of every global batch and saves
its λ trajectory and final parameters to OUT_DIR/rank{r}.pt. The ranks meet through a file in OUT_DIR
(no TCP port to race for on a shared machine).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2
STEPS = 6
GLOBAL_BATCH = 16


class LayerLogits(nn.Module):
    """Residual tanh blocks with a shared head applied inside forward: ``hidden_states`` are per-layer logits."""

    def __init__(self, depth: int = 3, width: int = 12, d_in: int = 6, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor, output_hidden_states: bool = True):
        h = self.embed(x)
        logits = [self.head(h)]
        for block in self.blocks:
            h = h + torch.tanh(block(h))
            logits.append(self.head(h))
        return type("Out", (), {"hidden_states": tuple(logits)})()


def build():
    """The model, constraint and optimizer, identical on every rank and in the single-process reference."""
    from descentlab.constrained import LayerwiseDescent, PrimalDual

    torch.manual_seed(0)
    model = LayerLogits().double()
    constraint = LayerwiseDescent(3, 0.2, dual_lr=0.5)
    opt = PrimalDual(torch.optim.SGD(model.parameters(), lr=0.1), constraint)
    return model, constraint, opt


def global_batches():
    g = torch.Generator().manual_seed(7)
    return [
        {
            "x": torch.randn(GLOBAL_BATCH, 6, generator=g, dtype=torch.float64),
            "labels": torch.randint(0, 3, (GLOBAL_BATCH,), generator=g),
        }
        for _ in range(STEPS)
    ]


def train(model, constraint, opt, batches):
    from descentlab.readout import layer_losses

    lams = []
    for batch in batches:
        f = layer_losses(
            model, batch, readout=lambda logits, b: nn.functional.cross_entropy(logits, b["labels"])
        )
        opt.zero_grad()
        constraint.lagrangian(f).backward()
        opt.step()
        lams.append(constraint.multipliers.clone())
    return torch.stack(lams)


def worker(rank: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=WORLD)
    try:
        model, constraint, opt = build()
        ddp = nn.parallel.DistributedDataParallel(model)
        half = GLOBAL_BATCH // WORLD
        local = [{k: v[rank * half : (rank + 1) * half] for k, v in b.items()} for b in global_batches()]
        lams = train(ddp, constraint, opt, local)
        torch.save(
            {"lambda": lams, "params": [p.detach() for p in model.parameters()]}, f"{out_dir}/rank{rank}.pt"
        )
        # leave together: a rank tearing gloo down while its peer is still connected can abort the process
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1],), nprocs=WORLD, join=True)
