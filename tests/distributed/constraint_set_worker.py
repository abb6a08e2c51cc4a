"""Worker of test_constraint_set_ddp.py: DDP (gloo) training with a user ConstraintSet; run as a script.

Usage: python constraint_set_worker.py OUT_DIR. Each of 2 ranks trains on its half of every global batch and
saves, per dual setting, its multiplier trajectory and final parameters to OUT_DIR/rank{r}.pt. The ranks meet
through a file in OUT_DIR (no TCP port to race for on a shared machine).

The set has one constraint of each kind the dual step reduces differently over ranks:

    rate         dense inequality, Lagrangian:   mean_b σ(out_b)_{0,1} - 0.4 <= 0         (averaged over ranks)
    norm         equality, augmented Lagrangian: mean(W_0²) - 0.05 = 0                     (the same on every rank)
    per_example  indexed inequality:             ℓ_i - 0.5 <= 0, one multiplier per example (summed over ranks)

The per-example proxy is (ℓ_i - 0.5) / n with n the batch a process sees (its strict twin is ℓ_i - 0.5), so the
gradient DDP averages over two halves equals the gradient of one process on the whole batch.
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
EXAMPLES = 2 * GLOBAL_BATCH  # the batches cycle over 32 examples: each per-example λ moves several times
SETTINGS = ("ascent", "adam")  # projected ascent; torch.optim.Adam(maximize=True) as the dual optimizer


def build(setting: str):
    """The model, constraint set and optimizer, identical on every rank and in the one-process reference."""
    import descentlab as dl

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)).double()
    constraints = [
        dl.Constraint("rate", size=2, dual_lr=0.5),
        dl.Constraint("norm", kind="equality", formulation="augmented_lagrangian", penalty=1.0, dual_lr=1.0),
        dl.Constraint("per_example", size=EXAMPLES, indexed=True, dual_lr=0.5),
    ]
    dual = None if setting == "ascent" else (lambda params: torch.optim.Adam(params, lr=0.05, maximize=True))
    cs = dl.ConstraintSet(constraints, dual_optimizer=dual)
    opt = dl.PrimalDual(torch.optim.SGD(model.parameters(), lr=0.2), cs)
    return model, cs, opt


def global_batches():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(EXAMPLES, 6, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 3, (EXAMPLES,), generator=g)
    ids = torch.arange(EXAMPLES)
    out = []
    for step in range(STEPS):
        rows = slice((step % 2) * GLOBAL_BATCH, (step % 2 + 1) * GLOBAL_BATCH)
        out.append({"x": x[rows], "labels": labels[rows], "ids": ids[rows]})
    return out


def train(model, cs, opt, batches, weights):
    """``weights`` is ``model`` itself, or the module inside DDP (whose first layer ``norm`` reads)."""
    import descentlab as dl

    lams = []
    for batch in batches:
        logits = model(batch["x"])
        per_example = nn.functional.cross_entropy(logits, batch["labels"], reduction="none")
        slack = per_example - 0.5
        values = {
            "rate": torch.sigmoid(logits[:, :2]).mean(0) - 0.4,
            "norm": weights[0].weight.pow(2).mean() - 0.05,
            "per_example": dl.ConstraintValue(slack / len(slack), strict=slack, index=batch["ids"]),
        }
        opt.zero_grad()
        cs.lagrangian(per_example.mean(), values).backward()
        opt.step()
        lams.append(torch.cat([cs.multipliers[n] for n in ("rate", "norm", "per_example")]).clone())
    return torch.stack(lams)


def worker(rank: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=WORLD)
    try:
        half = GLOBAL_BATCH // WORLD
        local = [{k: v[rank * half : (rank + 1) * half] for k, v in b.items()} for b in global_batches()]
        saved = {}
        for setting in SETTINGS:
            model, cs, opt = build(setting)
            lams = train(nn.parallel.DistributedDataParallel(model), cs, opt, local, model)
            saved[setting] = {"lambda": lams, "params": [p.detach() for p in model.parameters()]}
        torch.save(saved, f"{out_dir}/rank{rank}.pt")
        # leave together: a rank tearing gloo down while its peer is still connected can abort the process
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1],), nprocs=WORLD, join=True)
