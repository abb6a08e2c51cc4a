"""Worker of test_multiprocess.py (a script, not collected): ``fit`` under DDP, then a FSDP2 loop.

    python -m torch.distributed.run --standalone --nproc_per_node=2 worker.py OUT_DIR [HORST_IMPL]

Both phases train a small BERT (built from a config, dropout off) on real Rotten Tomatoes reviews tokenized
with MiniLM's WordPiece vocabulary, under layer-wise descent constraints with HORST as the primal optimizer.
Each rank saves ``OUT_DIR/rank{r}.pt``. The test calls the same functions in its own process, without a
process group, for the single-process reference on the same global batches.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import default_collate

N_TRAIN = 128
N_EVAL = 48
GLOBAL_BATCH = 16
STEPS = 12  # crosses an epoch boundary (8 steps per epoch)
MAX_LENGTH = 32
EVAL_BATCH = 8
LAYERS = 3
LR = 1e-2


@functools.lru_cache(maxsize=1)
def data() -> tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]]:
    """(train examples, test examples): fixed-length token tensors, so every batching pads alike."""
    from transformers import AutoTokenizer

    from descentlab.data import asset_path, load_text_classification

    tokenizer = AutoTokenizer.from_pretrained(str(asset_path("minilm")), local_files_only=True)
    splits = load_text_classification("rotten_tomatoes", max_train=N_TRAIN, max_eval=N_EVAL)

    def encode(split: Any) -> list[dict[str, torch.Tensor]]:
        enc = tokenizer(
            list(split["text"]),
            truncation=True,
            max_length=MAX_LENGTH,
            padding="max_length",
            return_tensors="pt",
        )
        return [
            {
                "input_ids": enc["input_ids"][i],
                "attention_mask": enc["attention_mask"][i],
                "labels": torch.tensor(y),
            }
            for i, y in enumerate(split["label"])
        ]

    return encode(splits["train"]), encode(splits["test"])


def eval_batches() -> list[dict[str, torch.Tensor]]:
    test = data()[1]
    return [default_collate(test[k : k + EVAL_BATCH]) for k in range(0, len(test), EVAL_BATCH)]


def bert() -> torch.nn.Module:
    from tiny_models import tiny_bert

    # MiniLM's WordPiece vocabulary; dropout off (the default): ranks would draw other masks than one process
    return tiny_bert(layers=LAYERS, hidden=32, vocab=30522, positions=64, num_labels=2, seed=0)


def _per_example(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return {
        "accuracy": (logits.argmax(-1) == batch["labels"]).double(),
        "loss": torch.nn.functional.cross_entropy(logits.double(), batch["labels"], reduction="none"),
    }


def train_fit(horst_impl: str = "auto") -> dict[str, Any]:
    """Constraints + HORST + AC/DC through ``descentlab.train.loop.fit``, then whole-set evaluation."""
    import descentlab as dl
    from descentlab.distributed import sharded_curve, sharded_layer_profile, sharded_means
    from descentlab.train.loop import TrainConfig, fit
    from descentlab.train.objectives import Constrained

    model = bert()
    constraint = dl.LayerwiseDescent(num_layers=LAYERS, alpha=0.05, dual_lr=0.5)
    optimizer = dl.PrimalDual(dl.HORST(model.parameters(), lr=LR, alpha=1.0, impl=horst_impl), constraint)
    acdc = dl.ACDC(
        model,
        optimizer,
        sparsity=0.5,
        total_steps=STEPS,
        schedule=dl.ACDCSchedule(warmup=1, phase=2, last_decompressed=1, final=2),
    )
    fit(
        model,
        data()[0],
        objective=Constrained(constraint),
        optimizer=optimizer,
        cfg=TrainConfig(max_steps=STEPS, batch_size=GLOBAL_BATCH, grad_clip=1.0, progress=False),
        sparsity=acdc,
    )
    model.eval()
    batches = eval_batches()
    curve = sharded_curve(
        model, batches, kinds=["gaussian"], gammas=[0.0, 1.0], draws=2, seed=0, keep_examples=True
    )
    return {
        "lambda": constraint.multipliers.detach().cpu().clone(),
        "masks": {k: v.clone() for k, v in (acdc.masks or {}).items()},
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "metrics": sharded_means(batches, functools.partial(_per_example, model)),
        "curve": torch.from_numpy(curve.values["gaussian"].copy()),
        "examples": torch.from_numpy(curve.examples["gaussian"].copy()),  # [model, draw, γ, example]
        "n_eval_curve": curve.protocol["n_eval"],
        "profile": torch.tensor(sharded_layer_profile(model, batches), dtype=torch.float64),
    }


def _global_batches() -> list[torch.Tensor]:
    from descentlab.train.loop import global_batches

    out: list[torch.Tensor] = []
    epoch = 0
    while len(out) < STEPS:
        out += list(global_batches(N_TRAIN, GLOBAL_BATCH, seed=0, epoch=epoch))
        epoch += 1
    return out[:STEPS]


def train_fsdp2(sharded: bool, horst_impl: str = "auto") -> dict[str, Any]:
    """A plain loop: PrimalDual(HORST) on a model whose blocks and root are ``fully_shard``-ed (or not).

    With the default ``impl="auto"`` the DTensor shards take HORST's foreach path and plain tensors (the
    single-process reference) its fused kernel, so the comparison also covers the two implementations.
    """
    import descentlab as dl
    from descentlab.distributed import rank, world_size
    from descentlab.train.loop import rank_share

    model = bert()
    if sharded:
        from torch.distributed.fsdp import fully_shard

        for layer in model.bert.encoder.layer:
            fully_shard(layer)
        fully_shard(model)
    constraint = dl.LayerwiseDescent(num_layers=LAYERS, alpha=0.05, dual_lr=0.5)
    optimizer = dl.PrimalDual(dl.HORST(model.parameters(), lr=LR, alpha=1.0, impl=horst_impl), constraint)
    train = data()[0]
    lams = []
    for indices in _global_batches():
        own = rank_share(indices, rank(), world_size()) if sharded else indices
        batch = default_collate([train[int(i)] for i in own])
        loss = constraint.lagrangian(dl.layer_losses(model, batch))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        lams.append(constraint.multipliers.detach().cpu().clone())
    params = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        params[name] = full.detach().clone()
    local_shapes = {
        name: tuple(getattr(p, "to_local", lambda p=p: p)().shape) for name, p in model.named_parameters()
    }
    return {"lambda": torch.stack(lams), "params": params, "local_shapes": local_shapes}


def run_smoke(out: Path) -> Path:
    """The smoke experiment through the framework (config -> run dir -> fit -> report), as the CLI runs it."""
    from descentlab.experiments import run_experiment

    overrides = ["n_train=128", "n_test=64", "hidden=32", "train.batch_size=32", "train.progress=false"]
    return run_experiment("smoke", overrides=overrides, out=out)


def main(out_dir: Path, horst_impl: str) -> None:
    import torch.distributed as dist

    from descentlab.distributed import rank, world_size

    torch.set_num_threads(1)
    result: dict[str, Any] = {"fit": train_fit()}  # fit's Accelerator starts the gloo group
    result["fsdp2"] = train_fsdp2(sharded=True, horst_impl=horst_impl)
    result["world"] = world_size()
    result["smoke_run_dir"] = str(run_smoke(out_dir / "runs"))
    torch.save(result, out_dir / f"rank{rank()}.pt")
    dist.barrier()  # leave together: tearing gloo down under a connected peer can abort the process
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tiny_models
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "auto")
