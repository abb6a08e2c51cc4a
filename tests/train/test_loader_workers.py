"""``fit`` with ``loader_workers`` > 0 (a DataLoader collating in worker processes) trains exactly as the
in-loop collation (its slow twin): same micro-batches, same order, with accumulation, across a resume."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from descentlab.errors import ConfigError
from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import ERM
from descentlab.train.rundir import RunDir


class Rows(torch.utils.data.Dataset):
    """Variable-length rows (a collate pads them), as tokenized text is."""

    def __init__(self, n: int = 37) -> None:
        gen = torch.Generator().manual_seed(3)
        self.rows = [torch.randn(2 + i % 5, 4, generator=gen, dtype=torch.float64) for i in range(n)]
        self.labels = [int(r.sum() > 0) for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.rows[i], "labels": torch.tensor(self.labels[i])}


def pad_collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    x = nn.utils.rnn.pad_sequence([it["x"] for it in items], batch_first=True)
    mask = nn.utils.rnn.pad_sequence([torch.ones(len(it["x"])) for it in items], batch_first=True)
    return {"x": x, "mask": mask.double(), "labels": torch.stack([it["labels"] for it in items])}


class MeanPool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(4, 8).double()
        self.head = nn.Linear(8, 2).double()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.proj(x)) * mask[..., None]
        return self.head(h.sum(1) / mask.sum(1, keepdim=True))


def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch["x"], batch["mask"]), batch["labels"])


def train(workers: int, *, max_steps: int, run: RunDir | None = None) -> list[torch.Tensor]:
    model = MeanPool()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    cfg = TrainConfig(
        max_steps=max_steps, batch_size=4, grad_accum_steps=2, loader_workers=workers, progress=False
    )
    fit(model, Rows(), objective=ERM(loss), optimizer=opt, cfg=cfg, collate_fn=pad_collate, run=run)
    return [p.detach().clone() for p in model.parameters()]


def test_loader_workers_train_exactly_as_in_loop_collation(tmp_path) -> None:
    # 37 rows, 8 per step: 5 steps per epoch, so 12 steps cross two epoch boundaries
    slow, fast = train(0, max_steps=12), train(2, max_steps=12)
    start = [p.detach() for p in MeanPool().parameters()]
    assert sum(float((a - b).abs().sum()) for a, b in zip(slow, start, strict=True)) > 0.1
    for a, b in zip(slow, fast, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # a resumed run (checkpoint at 7, mid-epoch) continues with the loader from its position
    run = RunDir.create(tmp_path, "loader")
    train(2, max_steps=7, run=run)
    resumed = train(2, max_steps=12, run=run)
    for a, b in zip(slow, resumed, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_loader_workers_is_validated() -> None:
    with pytest.raises(ConfigError, match="loader_workers"):
        TrainConfig(loader_workers=-1)
