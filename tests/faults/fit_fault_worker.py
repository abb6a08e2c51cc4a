"""Worker of test_ddp_faults.py (a script, not collected): ``fit`` on 2 ranks with a fault on rank 1.

    python -m torch.distributed.run --standalone --nproc_per_node=2 fit_fault_worker.py OUT_DIR MODE

MODE "raise": rank 1's objective raises ``RuntimeError`` at step ``FAULT_STEP`` while rank 0 goes on into
the step's collectives. MODE "nonfinite": rank 1's loss is NaN from step ``FAULT_STEP`` on, with
``max_bad_steps=1``; every rank must stop together with a ``NumericalError`` naming rank 1, which each
rank writes to ``OUT_DIR/rank{r}.txt``. MODE "nandata": rank 1's batches hold NaN inputs from the start;
every rank must stop at the first step with a ``DataError`` (rank 1's names the field, rank 0's the rank).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from fit_nan_worker import data, model

FAULT_STEP = 3  # 1-based objective call
FAULTY_RANK = 1
MESSAGE = "injected fault"


def main(out_dir: Path, mode: str) -> None:
    import torch.distributed as dist

    from descentlab.distributed import rank
    from descentlab.errors import DataError, NumericalError
    from descentlab.train.loop import TrainConfig, fit
    from descentlab.train.objectives import ERM

    torch.set_num_threads(1)
    calls = {"n": 0}

    def loss_fn(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        calls["n"] += 1
        loss = nn.functional.cross_entropy(m(batch["x"]), batch["y"])
        if rank() == FAULTY_RANK and calls["n"] >= FAULT_STEP:
            if mode == "raise":
                (out_dir / "fault_time").write_text(repr(time.time()))
                raise RuntimeError(f"{MESSAGE} on rank {rank()} at step {calls['n']}")
            return loss * float("nan")
        return loss

    net = model()
    examples = data()
    # this rank's copy only (its shares of every batch); the launcher's RANK, as fit starts the process group
    if mode == "nandata" and int(os.environ["RANK"]) == FAULTY_RANK:
        examples = [{**e, "x": torch.full_like(e["x"], float("nan"))} for e in examples]
    cfg = TrainConfig(max_steps=8, batch_size=16, grad_clip=None, progress=False, max_bad_steps=1)
    try:
        fit(
            net,
            examples,
            objective=ERM(loss_fn),
            optimizer=torch.optim.SGD(net.parameters(), lr=0.5),
            cfg=cfg,
        )
    except (NumericalError, DataError) as exc:
        (out_dir / f"rank{rank()}.txt").write_text(str(exc))
    dist.barrier()  # leave together: tearing gloo down under a connected peer can abort the process
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
