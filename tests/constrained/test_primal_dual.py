"""PrimalDual as a torch optimizer: shared param groups, schedulers, Accelerate, exact checkpoint resume."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from descentlab.constrained import LayerwiseDescent, PrimalDual, Resilience
from descentlab.errors import CheckpointError, ConfigError
from descentlab.readout import layer_losses


class Stack(nn.Module):
    """Residual MLP blocks with one shared head; returns every block's state (HF-style hidden_states)."""

    def __init__(self, depth: int = 3, width: int = 16, d_in: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor, output_hidden_states: bool = True):
        h = self.embed(x)
        states = [h]
        for block in self.blocks:
            h = h + block(h)
            states.append(h)
        return type("Out", (), {"hidden_states": tuple(states)})()


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    model = Stack()
    constraint = LayerwiseDescent(3, 0.1, dual_lr=0.5, resilience=Resilience(2.0, lr=0.3), dual_every=2)
    opt = PrimalDual(torch.optim.AdamW(model.parameters(), lr=1e-2), constraint)
    return model, constraint, opt


def _batches(n: int):
    g = torch.Generator().manual_seed(1)
    return [
        {"x": torch.randn(32, 8, generator=g), "labels": torch.randint(0, 3, (32,), generator=g)}
        for _ in range(n)
    ]


def _train(model, constraint, opt, batches, sched=None) -> None:
    for batch in batches:
        f = layer_losses(
            model, batch, readout=lambda h, b: nn.functional.cross_entropy(model.head(h), b["labels"])
        )
        opt.zero_grad()
        constraint.lagrangian(f).backward()
        opt.step()
        if sched is not None:
            sched.step()


def test_param_groups_are_the_wrapped_optimizers_and_schedulers_drive_them() -> None:
    model, constraint, opt = _setup()
    assert opt.param_groups is opt.optimizer.param_groups and opt.state is opt.optimizer.state
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)
    _train(model, constraint, opt, _batches(3), sched)
    assert opt.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.5**3)
    extra = nn.Parameter(torch.zeros(2))
    opt.add_param_group({"params": [extra], "lr": 0.1})
    assert opt.optimizer.param_groups[-1]["params"][0] is extra and len(opt.param_groups) == 2
    with pytest.raises(ConfigError, match=r"torch\.optim\.Optimizer"):
        PrimalDual(object(), constraint)  # type: ignore[arg-type]


def test_zero_grad_delegates_and_step_takes_primal_then_dual() -> None:
    model, constraint, opt = _setup()
    _train(model, constraint, opt, _batches(2))
    assert constraint.duals.updates == 1  # dual_every=2
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_state_dict_round_trip_resumes_identically() -> None:
    batches = _batches(9)
    model, constraint, opt = _setup()
    _train(model, constraint, opt, batches[:5])  # stop in the middle of a dual window (5 % 2 == 1)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    reference = copy.deepcopy((model.state_dict(), constraint.state_dict()))

    _train(model, constraint, opt, batches[5:])  # the uninterrupted run

    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    model2, constraint2, opt2 = _setup(seed=123)  # different init: everything must come from the checkpoint
    model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    assert torch.equal(constraint2.multipliers, reference[1]["duals"]["lambda"])
    assert constraint2.state_dict()["g_count"] == 1 and constraint2.state_dict()["steps"] == 5
    _train(model2, constraint2, opt2, batches[5:])

    for (name, a), b in zip(model.state_dict().items(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(constraint.multipliers, constraint2.multipliers)
    assert torch.equal(constraint.slacks, constraint2.slacks)
    assert float(constraint.multipliers.abs().sum()) > 0
    with pytest.raises(CheckpointError, match="descent"):
        opt2.load_state_dict(opt2.optimizer.state_dict())


def test_accelerate_prepare_keeps_it_working() -> None:
    accelerate = pytest.importorskip("accelerate")
    model, constraint, opt = _setup()
    accelerator = accelerate.Accelerator(cpu=True)
    model, prepared = accelerator.prepare(model, opt)
    _train(model, constraint, prepared, _batches(4))
    assert constraint.duals.updates == 2
    assert "descent" in prepared.state_dict()


def test_the_missing_lagrangian_warning_looks_after_a_closure_has_run() -> None:
    """A closure that builds the Lagrangian is not warned about (it runs inside the step); one that never
    calls it, or a plain step without it, is warned about once."""
    import warnings

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))

    def make() -> tuple[LayerwiseDescent, PrimalDual]:
        constraint = LayerwiseDescent(num_layers=1, alpha=0.1, dual_lr=0.1)
        return constraint, PrimalDual(torch.optim.SGD(model.parameters(), lr=0.1), constraint)

    constraint, opt = make()

    def with_lagrangian() -> torch.Tensor:
        opt.zero_grad()
        task = nn.functional.cross_entropy(model(x), y)
        loss = constraint.lagrangian(torch.stack([task * 1.1, task]))
        loss.backward()
        return loss

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step(with_lagrangian)
    constraint, opt = make()

    def without() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    with pytest.warns(RuntimeWarning, match="never was"):
        opt.step(without)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step(without)  # once
