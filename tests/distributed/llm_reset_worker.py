"""Worker of test_llm_fsdp2_reset.py (a script, not collected): llm-robustness's ``model_for`` resets a model
that FSDP2 sharded in place (as ``accelerate launch`` with examples/accelerate/fsdp2.yaml does at the first
fine-tune) to the pretrained weights, on every rank.

    python -m torch.distributed.run --standalone --nproc_per_node=2 llm_reset_worker.py OUT_DIR

OUT_DIR holds the tiny Llama folder (written by the test). Each rank saves ``OUT_DIR/rank{r}.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch


def main(out_dir: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from descentlab.experiments.llm_robustness.jobs import model_for
    from descentlab.sparsity.sharded import is_sharded

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    cfg = SimpleNamespace(
        model=SimpleNamespace(
            name=str(out_dir / "llama"),
            dtype="float32",
            torch_dtype=torch.float32,
            gradient_checkpointing=False,
        )
    )
    model, _ = model_for(cfg)
    pretrained = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for layer in model.model.layers:  # a fine-tune shards the model in place ...
        fully_shard(layer)
    fully_shard(model)
    with torch.no_grad():  # ... and moves its weights
        for p in model.parameters():
            p.add_(1.0)
    reset, _ = model_for(cfg)
    full = {
        k: (v.full_tensor() if is_sharded(v) else v).detach().clone() for k, v in reset.state_dict().items()
    }
    torch.save(
        {
            "same_object": reset is model,
            "sharded": all(is_sharded(p) for p in reset.parameters()),
            "max_error": max(float((full[k] - pretrained[k]).abs().max()) for k in pretrained),
            "keys_equal": sorted(full) == sorted(pretrained),
        },
        out_dir / f"rank{dist.get_rank()}.pt",
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
