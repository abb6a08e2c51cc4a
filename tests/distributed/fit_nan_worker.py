"""Worker of test_fit_skip_ddp.py (a script, not collected): ``fit`` under DDP with a NaN loss on one rank.

    python -m torch.distributed.run --standalone --nproc_per_node=2 fit_nan_worker.py OUT_DIR

Phase "nan": rank 1 alone sees a non-finite loss at step ``NAN_STEP``; both ranks must skip that step (the
finite flag is all-reduced) and finish. Phase "accum": ``grad_accum_steps=2`` at half the batch. Each rank
saves ``OUT_DIR/rank{r}.pt``; the test runs the same functions in its own process for the reference.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

STEPS = 6
GLOBAL_BATCH = 16
NAN_STEP = 3  # 1-based: the third objective call (one call per step without accumulation)


def data(n: int = 64) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=gen, dtype=torch.float64)
    y = (x[:, :2].sum(1) > 0).long()
    return [{"x": x[i], "y": y[i]} for i in range(n)]


def model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2)).double()


def train(nan_on_rank: int | None, *, batch_size: int = GLOBAL_BATCH, accum: int = 1) -> dict[str, Any]:
    from descentlab.distributed import rank
    from descentlab.train.loop import TrainConfig, fit
    from descentlab.train.objectives import ERM

    calls = {"n": 0}

    def loss_fn(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        calls["n"] += 1
        loss = nn.functional.cross_entropy(m(batch["x"]), batch["y"])
        poisoned = nan_on_rank in (rank(), -1) and calls["n"] == NAN_STEP
        return loss * float("nan") if poisoned else loss

    net = model()
    cfg = TrainConfig(
        max_steps=STEPS, batch_size=batch_size, grad_accum_steps=accum, grad_clip=None, progress=False
    )
    result = fit(
        net, data(), objective=ERM(loss_fn), optimizer=torch.optim.SGD(net.parameters(), lr=0.5), cfg=cfg
    )
    return {
        "steps": result.steps,
        "skipped": result.skipped_steps,
        "params": {k: v.detach().clone() for k, v in net.state_dict().items()},
    }


def main(out_dir: Path) -> None:
    import torch.distributed as dist

    from descentlab.distributed import rank

    torch.set_num_threads(1)
    result = {"nan": train(nan_on_rank=1), "accum": train(None, batch_size=GLOBAL_BATCH // 2, accum=2)}
    torch.save(result, out_dir / f"rank{rank()}.pt")
    dist.barrier()  # leave together: tearing gloo down under a connected peer can abort the process
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
