"""Run by tests/integrations/test_lightning_callbacks_ddp.py: ConstraintCallback and ACDCCallback on a plain
LightningModule with a plain optimizer (the callback takes the dual step), strategy="ddp", 2 gloo CPU processes.

Lightning's launcher starts rank 1 by running this script again; each rank saves to OUT/rank{r}.pt the
multipliers after every optimizer step, its final weights and its AC/DC masks. The one-process reference
(:func:`one_process`) trains the same network on the same global batches in a plain PyTorch loop.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
from torch import nn

import descentlab as dl
from descentlab.sparsity import Selection

sys.path.insert(0, str(Path(__file__).parent))
from lightning_ddp_script import RankSampler  # rank r reads examples r, r + 2, ...: the one-process batches

BATCH = 4  # per rank; the global batch is 2 * BATCH
STEPS = 8
CAP = -0.2  # the rate of positive predictions <= 0.3 (the fit pushes it up)
NORM = 0.02  # the first layer's mean squared weight = NORM


def rows(n: int = 2 * BATCH * STEPS) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g, dtype=torch.float64)
    y = torch.sin(x).sum(-1) + 2.0
    return [{"x": x[i], "y": y[i]} for i in range(n)]


def net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1)).double()


def constraints() -> dl.ConstraintSet:
    return dl.ConstraintSet(
        [
            dl.Constraint("rate", dual_lr=0.5),
            dl.Constraint(
                "norm", kind="equality", formulation="augmented_lagrangian", penalty=2.0, dual_lr=2.0
            ),
        ]
    )


def step_outputs(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict:
    """The loss and the constraint values, all batch means (so the mean over two equal halves of a batch is
    the whole batch's): a sigmoid proxy of the positive rate with its strict twin, and a weight equality."""
    pred = model(batch["x"]).squeeze(-1)
    loss = nn.functional.mse_loss(pred, batch["y"])
    rate = dl.ConstraintValue(
        torch.sigmoid(pred).mean() - 0.5 - CAP, strict=(pred > 0).double().mean() - 0.5 - CAP
    )
    return {"loss": loss, "rate": rate, "norm": model[0].weight.pow(2).mean() - NORM}


def acdc(model: nn.Module, optimizer: torch.optim.Optimizer) -> dl.ACDC:
    # dense [0, 2), compressed [2, 5), decompressed [5, 6), compressed [6, 8)
    schedule = dl.ACDCSchedule(total=STEPS, warmup=2, phase=3, last_decompressed=1, final=2)
    select = Selection(module_types=(nn.Linear,), blocks_only=False)
    return dl.ACDC(model, optimizer, sparsity=0.5, schedule=schedule, select=select)


def one_process() -> tuple[nn.Module, list[torch.Tensor], dict[str, torch.Tensor]]:
    """The same training in one process on the global batches: weights, λ after each step, masks."""
    model, cs = net(), constraints()
    optimizer = dl.PrimalDual(torch.optim.AdamW(model.parameters(), lr=1e-2), cs)
    controller = acdc(model, optimizer)
    lambdas = []
    for batch in torch.utils.data.DataLoader(rows(), batch_size=2 * BATCH, shuffle=False):
        out = step_outputs(model, batch)
        cs.lagrangian(out.pop("loss"), out).backward()
        controller.before_optimizer_step()
        optimizer.step()
        optimizer.zero_grad()
        controller.step()
        lambdas.append(torch.cat(list(cs.multipliers.values())).clone())
    return model, lambdas, controller.masks


def main(out: Path) -> None:
    import lightning as L

    from descentlab.integrations.lightning import ACDCCallback, ConstraintCallback

    class Regressor(L.LightningModule):  # nothing of descentlab in it
        def __init__(self) -> None:
            super().__init__()
            self.net = net()

        def training_step(self, batch, batch_idx):
            return step_outputs(self.net, batch)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    cs = constraints()

    class Record(L.Callback):
        def __init__(self) -> None:
            self.lambdas: list[torch.Tensor] = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            self.lambdas.append(torch.cat(list(cs.multipliers.values())).clone())

    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    torch.set_num_threads(1)
    record, sparsity = Record(), ACDCCallback(lambda module, optimizer: acdc(module.net, optimizer))
    module = Regressor()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=STEPS,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        callbacks=[ConstraintCallback(cs), sparsity, record],
        use_distributed_sampler=False,
    )
    examples = rows()
    loader = torch.utils.data.DataLoader(examples, batch_size=BATCH, sampler=RankSampler(len(examples)))
    trainer.fit(module, loader)
    torch.save(
        {
            "lambdas": torch.stack(record.lambdas),
            "weights": [p.detach().clone() for p in module.net.parameters()],
            "masks": {k: v.clone() for k, v in sparsity.controller.masks.items()},
            "world_size": trainer.world_size,
        },
        out / f"rank{trainer.global_rank}.pt",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
