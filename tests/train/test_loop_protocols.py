"""TrainConfig.total_steps is the one step count; the loop's hooks are protocols, called when present."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from descentlab.sparsity import ACDC
from descentlab.train.loop import (
    EpochEndHook,
    MasksGradients,
    Objective,
    SparsityController,
    Stateful,
    TrainConfig,
    fit,
)
from descentlab.train.objectives import ERM, Constrained
from descentlab.train.protocols import ReportsSparsity
from descentlab.train.rundir import RunDir


@pytest.mark.parametrize(
    ("epochs", "max_steps", "batch", "n"), [(3, None, 32, 100), (2, None, 5, 10), (1, 7, 4, 100)]
)
def test_total_steps_is_the_experiments_formula(
    epochs: int, max_steps: int | None, batch: int, n: int
) -> None:
    cfg = TrainConfig(epochs=epochs, max_steps=max_steps, batch_size=batch)
    # the copies in sparse_vit / video_denoising / robust_sparse: max_steps or epochs * ceil(n / batch)
    assert cfg.total_steps(n) == (max_steps or epochs * math.ceil(n / batch))


def _data(n: int = 10) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, generator=gen), "y": torch.tensor(i % 2)} for i in range(n)]


def _loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch["x"]), batch["y"])


class _Counting:
    """An objective with an epoch hook and state, and a controller with a gradient mask: calls counted."""

    def __init__(self) -> None:
        self.epochs = 0
        self.masked = 0
        self.steps = 0
        self.loaded: dict[str, Any] | None = None

    def __call__(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return ERM(_loss)(model, batch)

    def end_epoch(self) -> None:
        self.epochs += 1

    def before_optimizer_step(self) -> None:
        self.masked += 1

    def step(self) -> None:
        self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = state


class _StepOnly:
    def __init__(self) -> None:
        self.steps = 0

    def step(self) -> None:
        self.steps += 1


def _fit(cfg: TrainConfig, run: RunDir | None = None, **kwargs: Any) -> Any:
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs.setdefault("objective", ERM(_loss))
    return fit(model, _data(), optimizer=opt, cfg=cfg, run=run, tag="t", **kwargs)


def test_fit_takes_total_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = TrainConfig(epochs=2, batch_size=4, progress=False)
    assert _fit(cfg).steps == cfg.total_steps(10) == 6
    monkeypatch.setattr(TrainConfig, "total_steps", lambda self, n: 5)
    assert _fit(cfg).steps == 5


def test_hooks_are_called_when_the_protocol_is_met(tmp_path: Any) -> None:
    hooks = _Counting()
    assert isinstance(hooks, Objective | EpochEndHook | MasksGradients | SparsityController | Stateful)
    cfg = TrainConfig(epochs=3, batch_size=4, progress=False)
    run = RunDir.create(tmp_path, "p")
    _fit(cfg, run, objective=hooks, sparsity=hooks)
    assert (hooks.epochs, hooks.masked, hooks.steps) == (3, 9, 9)
    resumed = _Counting()
    _fit(TrainConfig(epochs=4, batch_size=4, progress=False), run, objective=resumed, sparsity=resumed)
    assert resumed.loaded == {"epochs": 3}  # saved through Stateful, loaded on resume
    plain = _StepOnly()  # no mask, no state: only step() is called
    _fit(cfg, sparsity=plain)
    assert plain.steps == 9 and not isinstance(plain, MasksGradients | Stateful)


def test_library_objects_satisfy_the_protocols() -> None:
    assert issubclass(ACDC, SparsityController) and issubclass(ACDC, MasksGradients)
    assert issubclass(ACDC, ReportsSparsity) and issubclass(ACDC, Stateful)
    assert issubclass(torch.optim.lr_scheduler.StepLR, Stateful)
    assert isinstance(ERM(_loss), Objective) and not isinstance(ERM(_loss), EpochEndHook)
    assert issubclass(Constrained, EpochEndHook)
