"""``fit``'s loader workers leave the training RNG alone and persist across epochs (issue 31, item 6b).

``tests/train/test_loader_workers.py`` checks the batches (same micro-batches, same order, across a resume)
on a model that draws no random numbers. Here the model has dropout: a DataLoader iterator draws its worker
seed from the global torch RNG unless it has its own generator, which would shift every later dropout mask
against ``loader_workers=0``. And the workers are started once per ``fit``, not once per epoch, and are
gone when it returns.
"""

from __future__ import annotations

import multiprocessing
import os

import torch
from torch import nn

from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import ERM


class Rows(torch.utils.data.Dataset):
    """Rows that carry the id of the process that loaded them."""

    def __init__(self, n: int = 24) -> None:
        gen = torch.Generator().manual_seed(5)
        self.x = torch.randn(n, 6, generator=gen)
        self.y = (self.x[:, :3].sum(1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i], "pid": torch.tensor(os.getpid())}


class Dropped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.5), nn.Linear(16, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _train(workers: int) -> tuple[list[torch.Tensor], set[int]]:
    pids: set[int] = set()

    def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        pids.update(batch["pid"].tolist())
        return nn.functional.cross_entropy(model(batch["x"]), batch["labels"])

    model = Dropped()
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    # 24 rows, 8 per step: 3 steps per epoch, 9 steps = 3 epochs
    cfg = TrainConfig(max_steps=9, batch_size=4, grad_accum_steps=2, loader_workers=workers, progress=False)
    torch.manual_seed(1)  # the training RNG (dropout) starts from the same state in both runs
    fit(model, Rows(), objective=ERM(loss), optimizer=opt, cfg=cfg)
    return [p.detach().clone() for p in model.parameters()], pids


def test_workers_give_the_in_loop_weights_with_dropout_and_persist_across_epochs() -> None:
    slow, main_only = _train(0)
    fast, worker_pids = _train(2)
    assert main_only == {os.getpid()}
    start = [p.detach() for p in Dropped().parameters()]
    assert sum(float((a - b).abs().sum()) for a, b in zip(slow, start, strict=True)) > 0.1
    for a, b in zip(slow, fast, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    assert os.getpid() not in worker_pids
    assert len(worker_pids) == 2, (
        f"workers were restarted between epochs: {len(worker_pids)} worker processes"
    )
    assert not multiprocessing.active_children(), "fit returned with its loader workers still running"
