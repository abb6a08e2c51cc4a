"""Run by tests/integrations/test_lightning.py: DescentModule under strategy="ddp" on 2 gloo CPU processes.

Lightning's launcher starts rank 1 by running this script again; each rank saves its λ to OUT/rank{r}.pt.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/, for tiny_models

import descentlab as dl
from tiny_models import tiny_bert

LAYERS = 2
BATCH = 4  # per rank
STEPS = 3


def data(n: int = 2 * BATCH * STEPS, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 97, (n, 12), generator=g)
    labels = torch.randint(0, 2, (n,), generator=g)
    return [
        {"input_ids": ids[i], "attention_mask": torch.ones(12, dtype=torch.long), "labels": labels[i]}
        for i in range(n)
    ]


def make_model() -> torch.nn.Module:
    return tiny_bert(layers=LAYERS, hidden=16, seed=0)


def make_constraint() -> dl.LayerwiseDescent:
    return dl.LayerwiseDescent(num_layers=LAYERS, alpha=0.5, dual_lr=0.5)


class RankSampler(torch.utils.data.Sampler):
    """Rank r reads examples r, r+2, r+4, ...: batch k of the two ranks together is examples 2Bk..2Bk+2B-1,
    batch k of one process with batch size 2B (Lightning's own distributed sampler shuffles)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        import torch.distributed as dist

        return iter(range(dist.get_rank(), self.n, dist.get_world_size()))

    def __len__(self) -> int:
        return self.n // 2


def main(out: Path) -> None:
    import lightning as L

    from descentlab.integrations.lightning import DescentModule

    class Module(DescentModule, L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = make_model()
            self.constraint = make_constraint()

        def configure_optimizers(self):
            return dl.PrimalDual(torch.optim.AdamW(self.parameters(), lr=1e-2), self.constraint)

    class Record(L.Callback):
        def __init__(self) -> None:
            self.lambdas: list[torch.Tensor] = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            self.lambdas.append(module.constraint.multipliers.detach().cpu().clone())

    record = Record()
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    torch.set_num_threads(1)
    module = Module()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=STEPS,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        callbacks=[record],
        use_distributed_sampler=False,
    )
    examples = data()
    loader = torch.utils.data.DataLoader(examples, batch_size=BATCH, sampler=RankSampler(len(examples)))
    trainer.fit(module, loader)
    rank = trainer.global_rank
    torch.save(
        {
            "lambda": module.constraint.multipliers.cpu(),
            "lambdas": torch.stack(record.lambdas),
            "world_size": trainer.world_size,
        },
        out / f"rank{rank}.pt",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
