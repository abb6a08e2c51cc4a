"""Worker of test_fsdp2_sampled.py (a script, not collected): FSDP2 through ``fit`` with the DEFAULT readout
(``sample_tokens="auto"``: each rank draws its own token subsample under grad), PrimalDual(HORST).

    python -m torch.distributed.run --standalone --nproc_per_node=2 fsdp2_sampled_worker.py OUT_DIR

Each rank saves ``OUT_DIR/rank{r}.pt``: λ, the whole trained weights, the readout's last estimate record and
HORST's recorded fallbacks and NaN-guard count.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

STEPS = 4


def train(out: Path) -> dict[str, Any]:
    from fsdp2_worker import LAYERS, data
    from torch.distributed.fsdp import fully_shard

    import descentlab as dl
    from descentlab.distributed import rank
    from descentlab.readout import CausalLMReadout
    from descentlab.train.loop import TrainConfig, fit
    from descentlab.train.objectives import Constrained
    from descentlab.train.rundir import RunDir
    from tiny_models import tiny_gpt2

    model = tiny_gpt2(layers=LAYERS, hidden=16, vocab=50, positions=32, seed=0)
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    constraint = dl.LayerwiseDescent(num_layers=LAYERS, alpha=0.05, dual_lr=0.5)
    horst = dl.HORST(model.parameters(), lr=1e-2, alpha=1.0)
    optimizer = dl.PrimalDual(horst, constraint)
    readout = CausalLMReadout()  # the default: sampled under grad
    fit(
        model,
        data(),
        objective=Constrained(constraint, readout),
        optimizer=optimizer,
        cfg=TrainConfig(max_steps=STEPS, batch_size=8, grad_clip=1.0, progress=False),
        run=RunDir(out, writer=rank() == 0),
    )
    estimate = readout.last_estimate
    return {
        "lambda": constraint.multipliers.detach().cpu().clone(),
        "params": {k: v.full_tensor().detach().clone() for k, v in model.named_parameters()},
        "sampled": estimate.sampled,
        "k": estimate.k,
        "n": estimate.n,
        "fallbacks": dict(horst.fallbacks),
        "reverted_total": horst.reverted_total,
    }


def main(out_dir: Path) -> None:
    import torch.distributed as dist

    from descentlab.distributed import rank

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    result = train(out_dir / "run")
    torch.save(result, out_dir / f"rank{rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    here = Path(__file__).resolve()
    sys.path.insert(0, str(here.parent))  # fsdp2_worker
    sys.path.insert(0, str(here.parents[1]))  # tiny_models
    main(Path(sys.argv[1]))
