"""PrimalDual's guards (issue 33): non-finite gradients or ĝ are refused before the wrapped optimizer moves
anything, and a loop that never calls ``lagrangian`` is told so, once."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from descentlab.constrained import LayerwiseDescent, PrimalDual
from descentlab.errors import NumericalError
from descentlab.optim import HORST


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _layer_losses(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = model[1](model[0](x))
    out = model[2](h)
    return torch.stack([h.pow(2).mean(), out.pow(2).mean() * 0.5, out.pow(2).mean()])


def _snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    tensors = [p.detach().clone() for p in model.parameters()]
    for state in opt.state.values():
        tensors += [v.detach().clone() for v in state.values() if isinstance(v, torch.Tensor)]
    return tensors


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("inner", ["adamw", "horst", "sgd"])
def test_non_finite_gradient_raises_before_the_inner_step(inner) -> None:
    model = _model()
    params = model.parameters()
    base = {
        "adamw": lambda: torch.optim.AdamW(params, lr=1e-2),
        "horst": lambda: HORST(params, lr=1e-2),
        "sgd": lambda: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
    }[inner]()
    constraint = LayerwiseDescent(2, alpha=0.1, dual_lr=0.1)
    opt = PrimalDual(base, constraint)
    x = torch.randn(8, 4)
    constraint.lagrangian(_layer_losses(model, x)).backward()
    opt.step()  # one good step, so the optimizer has state to protect
    opt.zero_grad()
    constraint.lagrangian(_layer_losses(model, x)).backward()
    model[2].weight.grad[0, 0] = float("nan")
    model[0].bias.grad[1] = float("inf")
    before, lam = _snapshot(model, opt), constraint.multipliers.clone()
    with pytest.raises(NumericalError) as info:
        opt.step()
    message = str(info.value)
    assert "gradient" in message and "not updated" in message and "\n" not in message
    assert "2 of 4" in message, message  # which tensors: two of the four parameter tensors
    assert _same(_snapshot(model, opt), before), "the parameters and the optimizer state must be untouched"
    assert torch.equal(constraint.multipliers, lam)


def test_non_finite_remembered_violation_raises_before_the_inner_step() -> None:
    model = _model()
    constraint = LayerwiseDescent(2, alpha=0.1, dual_lr=0.1)
    opt = PrimalDual(torch.optim.AdamW(model.parameters(), lr=1e-2), constraint)
    x = torch.randn(8, 4)
    f = _layer_losses(model, x)
    constraint.lagrangian(f).backward()
    # a ĝ that overflowed while the gradients stayed finite (e.g. a readout loss of inf with a detached path)
    constraint.lagrangian(torch.tensor([1.0, float("inf"), 1.0], requires_grad=True))
    before = _snapshot(model, opt)
    with pytest.raises(NumericalError, match="violation"):
        opt.step()
    assert _same(_snapshot(model, opt), before)


def test_finite_steps_take_no_extra_path() -> None:
    """With finite gradients the guard changes nothing: same weights as the unguarded inner optimizer."""
    a, b = _model(), _model()
    ca, cb = LayerwiseDescent(2, alpha=0.1, dual_lr=0.1), LayerwiseDescent(2, alpha=0.1, dual_lr=0.1)
    oa = PrimalDual(torch.optim.AdamW(a.parameters(), lr=1e-2), ca)
    ob = PrimalDual(torch.optim.AdamW(b.parameters(), lr=1e-2), cb, check_finite=False)
    for k in range(3):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(k))
        for model, c, o in ((a, ca, oa), (b, cb, ob)):
            o.zero_grad()
            c.lagrangian(_layer_losses(model, x)).backward()
            o.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert torch.equal(ca.multipliers, cb.multipliers)


def test_step_without_lagrangian_warns_once() -> None:
    model = _model()
    constraint = LayerwiseDescent(2, alpha=0.1, dual_lr=0.1)
    opt = PrimalDual(torch.optim.AdamW(model.parameters(), lr=1e-2), constraint)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            opt.zero_grad()
            _layer_losses(model, torch.randn(8, 4))[-1].backward()  # the plain loss: λ never enters
            opt.step()
    hits = [w for w in caught if "lagrangian" in str(w.message)]
    assert len(hits) == 1, [str(w.message) for w in caught]
    assert torch.count_nonzero(constraint.multipliers) == 0


def test_step_with_lagrangian_does_not_warn() -> None:
    model = _model()
    constraint = LayerwiseDescent(2, alpha=0.1, dual_lr=0.1)
    opt = PrimalDual(torch.optim.AdamW(model.parameters(), lr=1e-2), constraint)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            opt.zero_grad()
            constraint.lagrangian(_layer_losses(model, torch.randn(8, 4))).backward()
            opt.step()
    assert not [w for w in caught if "lagrangian" in str(w.message)]
