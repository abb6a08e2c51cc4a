"""Worker of test_fsdp2.py (a script, not collected): FSDP2 (``fully_shard``) through ``fit`` with checkpoints.

    python -m torch.distributed.run --standalone --nproc_per_node=2 fsdp2_worker.py OUT_DIR

A tiny GPT-2 built from a config, its blocks and root ``fully_shard``-ed, trains under layer-wise descent
constraints with PrimalDual(HORST) and AC/DC through ``descentlab.train.loop.fit``: 4 steps, a checkpoint,
then a fresh model, optimizer and controller resume from it for 4 more. Then one-shot global and per-matrix
magnitude pruning. Each rank saves ``OUT_DIR/rank{r}.pt``; the test runs the same function in its own
process, unsharded, for the single-process reference on the same global batches.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

LAYERS = 2
N_TRAIN = 32
LENGTH = 12
GLOBAL_BATCH = 8
HALF = 4
TOTAL = 8


def data() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (N_TRAIN, LENGTH), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def build(sharded: bool) -> tuple[Any, ...]:
    import descentlab as dl
    from tiny_models import tiny_gpt2

    model = tiny_gpt2(layers=LAYERS, hidden=16, vocab=50, positions=32, seed=0)
    if sharded:
        from torch.distributed.fsdp import fully_shard

        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
    constraint = dl.LayerwiseDescent(num_layers=LAYERS, alpha=0.05, dual_lr=0.5)
    optimizer = dl.PrimalDual(dl.HORST(model.parameters(), lr=1e-2, alpha=1.0), constraint)
    acdc = dl.ACDC(
        model,
        optimizer,
        sparsity=0.5,
        schedule=dl.ACDCSchedule(total=TOTAL, warmup=1, phase=2, last_decompressed=1, final=2),
    )
    return model, constraint, optimizer, acdc


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().clone()


def train(out: Path, sharded: bool) -> dict[str, Any]:
    """fit for HALF steps, checkpoint; fresh objects resume to TOTAL; then prune (global, then per matrix)."""
    import descentlab as dl
    from descentlab.distributed import rank
    from descentlab.readout import CausalLMReadout
    from descentlab.train.loop import TrainConfig, fit
    from descentlab.train.objectives import Constrained
    from descentlab.train.rundir import RunDir

    run = RunDir(out, writer=rank() == 0)
    result: dict[str, Any] = {}
    for steps in (HALF, TOTAL):
        model, constraint, optimizer, acdc = build(sharded)
        fitted = fit(
            model,
            data(),
            # the exact readout: the default's token subsample is drawn per rank, so the shards would not
            # read the rows one process reads
            objective=Constrained(constraint, CausalLMReadout(sample_tokens=None)),
            optimizer=optimizer,
            cfg=TrainConfig(max_steps=steps, batch_size=GLOBAL_BATCH, grad_clip=1.0, progress=False),
            sparsity=acdc,
            run=run,
        )
        result[f"resumed_from_{steps}"] = fitted.resumed_from
        result[f"lambda_{steps}"] = constraint.multipliers.detach().cpu().clone()
    state = acdc.state_dict()  # whole masks, gathered
    result["masks"] = state["masks"]
    result["local_masks"] = {k: v.clone() for k, v in (acdc.masks or {}).items()}
    result["params"] = {k: _full(v) for k, v in model.named_parameters()}
    result["local_shapes"] = {
        k: tuple(getattr(v, "to_local", lambda v=v: v)().shape) for k, v in model.named_parameters()
    }
    result["acdc_report"] = acdc.report().to_dict()
    result["global"] = dl.prune_magnitude(model, 0.6, scope="global").to_dict()
    result["global_params"] = {k: _full(v) for k, v in model.named_parameters()}
    result["layer"] = dl.prune_magnitude(model, 0.8, scope="layer").to_dict()
    result["layer_params"] = {k: _full(v) for k, v in model.named_parameters()}
    return result


def tie_masks(sharded: bool) -> dict[str, dict[str, torch.Tensor]]:
    """Masks of weights full of ties (few distinct values), some rows uneven across ranks, in fp32 and bf16,
    with one replicated tensor in the global group: the exact selection must still equal one process's."""
    from torch import nn

    from descentlab.sparsity.masks import PrunableTensor, compute_masks
    from descentlab.sparsity.sharded import full_mask

    g = torch.Generator().manual_seed(1)
    shapes = {"a": (7, 5), "b": (10, 3), "c": (4, 6), "d": (3, 4)}
    out: dict[str, dict[str, torch.Tensor]] = {}
    for dtype in (torch.float32, torch.bfloat16):
        weights = {k: (torch.randint(-4, 5, s, generator=g).to(dtype) / 4) for k, s in shapes.items()}
        params = {}
        for k, w in weights.items():
            if sharded and k != "d":  # "d" stays a plain (replicated) tensor
                from torch.distributed.device_mesh import init_device_mesh
                from torch.distributed.tensor import Shard, distribute_tensor

                mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
                w = distribute_tensor(w, mesh, [Shard(0)])
            params[k] = nn.Parameter(w)
        tensors = [PrunableTensor(k, p, 0, 1) for k, p in params.items()]
        for scope, sparsity in (("global", 0.55), ("layer", 0.4)):
            masks = compute_masks(tensors, sparsity, scope)
            out[f"{scope}-{dtype}"] = {k: full_mask(m, params[k]).clone() for k, m in masks.items()}
    return out


def main(out_dir: Path) -> None:
    import torch.distributed as dist

    from descentlab.distributed import rank, world_size

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    result = train(out_dir / "run", sharded=True)
    result["ties"] = tie_masks(sharded=True)
    result["world"] = world_size()
    torch.save(result, out_dir / f"rank{rank()}.pt")
    dist.barrier()  # leave together: tearing gloo down under a connected peer can abort the process
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tiny_models
    main(Path(sys.argv[1]))
