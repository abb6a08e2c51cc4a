"""Worker of test_ddp_faults.py (a script, not collected): a user's own PrimalDual loop on 2 gloo ranks in which
rank 1 alone meets a non-finite ĝ at step ``FAULT_STEP``.

    python primal_dual_fault_worker.py OUT_DIR

The fault is one a real loop meets: f_0 (the embedding-layer loss, which carries no gradient) overflows on
one rank. The Lagrangian's gradients stay finite, so DDP's gradient all-reduce spreads nothing, and ĝ is
non-finite on that rank alone until the dual step averages it. Each rank catches the ``NumericalError`` of
``PrimalDual.step``, drops the batch's ĝ and goes on, as the error message advises; it saves the messages,
the λ trajectory and the final parameters to ``OUT_DIR/rank{r}.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from primal_dual_worker import GLOBAL_BATCH, WORLD, build, global_batches

FAULT_STEP = 3  # 0-based index of the step whose ĝ is non-finite on the faulty rank
FAULTY_RANK = 1


def train(model, constraint, opt, batches, *, poison: bool) -> dict:
    """The user's loop; ``poison`` makes f_0 infinite at ``FAULT_STEP`` (on the rank that passes True)."""
    from descentlab.errors import NumericalError
    from descentlab.readout import layer_losses

    errors: dict[int, str] = {}
    lams = []
    for step, batch in enumerate(batches):
        f = layer_losses(
            model, batch, readout=lambda logits, b: nn.functional.cross_entropy(logits, b["labels"])
        )
        f0 = f[:1].detach() * (float("inf") if poison and step == FAULT_STEP else 1.0)
        f = torch.cat([f0, f[1:]])
        pending = constraint.pending_state()
        opt.zero_grad()
        constraint.lagrangian(f).backward()
        try:
            opt.step()
        except NumericalError as exc:  # skip the batch: drop its gradients and its ĝ
            errors[step] = str(exc)
            opt.zero_grad()
            constraint.restore_pending_(pending)
        lams.append(constraint.multipliers.clone())
    return {"errors": errors, "lambda": torch.stack(lams), "params": [p.detach() for p in model.parameters()]}


def worker(rank: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=WORLD)
    try:
        model, constraint, opt = build()
        ddp = nn.parallel.DistributedDataParallel(model)
        half = GLOBAL_BATCH // WORLD
        local = [{k: v[rank * half : (rank + 1) * half] for k, v in b.items()} for b in global_batches()]
        result = train(ddp, constraint, opt, local, poison=rank == FAULTY_RANK)
        torch.save(result, f"{out_dir}/rank{rank}.pt")
        dist.barrier()  # leave together: tearing gloo down under a connected peer can abort the process
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1],), nprocs=WORLD, join=True)
