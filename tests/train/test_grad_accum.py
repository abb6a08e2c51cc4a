"""``fit`` with ``grad_accum_steps`` (issue 31, item 6b): k micro-batches of B equal one step at k·B.

ERM: the parameters agree to float64 rounding. Constrained (PrimalDual): one dual step per optimizer step,
from the mean ĝ of the micro-batches (LayerwiseDescent records every ``lagrangian`` call since the last dual
step), which in the difference form equals ĝ of the whole step's batch: λ agrees too.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from descentlab.constrained import LayerwiseDescent, PrimalDual
from descentlab.errors import ConfigError
from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import ERM, Constrained


def _data(n: int = 52) -> list[dict[str, torch.Tensor]]:  # 52 = 3 steps of 16 and a short one of 4
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, 6, generator=gen, dtype=torch.float64)
    y = (x[:, :2].sum(1) > 0).long() + (x[:, 2] > 1).long()
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


class LayerLogits(nn.Module):
    """Residual tanh blocks with a shared head: ``hidden_states`` are per-layer logits."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(6, 12)
        self.blocks = nn.ModuleList(nn.Linear(12, 12) for _ in range(3))
        self.head = nn.Linear(12, 3)
        self.double()

    def forward(self, x: torch.Tensor, output_hidden_states: bool = True, **_: object):
        h = self.embed(x)
        logits = [self.head(h)]
        for block in self.blocks:
            h = h + torch.tanh(block(h))
            logits.append(self.head(h))
        return type("Out", (), {"hidden_states": tuple(logits)})()


def _ce(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(logits, batch["labels"])


def _erm(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return _ce(model(batch["x"]).hidden_states[-1], batch)


def _cfg(batch_size: int, accum: int) -> TrainConfig:
    return TrainConfig(epochs=2, batch_size=batch_size, grad_accum_steps=accum, grad_clip=1.0, progress=False)


def test_erm_accumulation_2_equals_accumulation_1_at_twice_the_batch() -> None:
    params = []
    for batch_size, accum in ((16, 1), (8, 2), (4, 4)):
        model = LayerLogits()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        result = fit(model, _data(), objective=ERM(_erm), optimizer=opt, cfg=_cfg(batch_size, accum))
        assert result.steps == 8  # ⌈52 / 16⌉ optimizer steps per epoch, whatever the split
        params.append([p.detach().clone() for p in model.parameters()])
    moved = sum(
        float((a - b.detach()).abs().sum())
        for a, b in zip(params[0], LayerLogits().parameters(), strict=True)
    )
    assert moved > 0.1
    for other in params[1:]:
        for a, b in zip(params[0], other, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_constrained_accumulation_gives_the_same_lambda_with_one_dual_step_per_optimizer_step() -> None:
    runs = []
    for batch_size, accum in ((16, 1), (8, 2)):
        model = LayerLogits()
        constraint = LayerwiseDescent(3, alpha=0.2, dual_lr=0.5)
        opt = PrimalDual(torch.optim.SGD(model.parameters(), lr=0.1), constraint)
        fit(
            model,
            _data(),
            objective=Constrained(constraint, readout=_ce),
            optimizer=opt,
            cfg=_cfg(batch_size, accum),
        )
        assert constraint._steps == 8  # one dual step per optimizer step, not per micro-batch
        runs.append((constraint.multipliers.clone(), [p.detach().clone() for p in model.parameters()]))
    (lam1, p1), (lam2, p2) = runs
    assert float(lam1.abs().sum()) > 0.05  # the duals moved
    torch.testing.assert_close(lam2, lam1, rtol=0, atol=1e-10)
    for a, b in zip(p1, p2, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_grad_accum_steps_is_validated() -> None:
    with pytest.raises(ConfigError, match="grad_accum_steps"):
        TrainConfig(grad_accum_steps=0)
    assert TrainConfig(batch_size=8, grad_accum_steps=3).total_steps(50) == 3  # ⌈50 / 24⌉


@pytest.mark.parametrize("accum", [1, 2])
def test_a_skipped_constrained_step_drops_its_violations(accum: int) -> None:
    """A non-finite loss skips the step and its ĝ with it: λ as a plain loop that leaves that batch out
    (before, the NaN ĝ stayed pending and the next PrimalDual.step raised NumericalError)."""
    from descentlab.readout import layer_losses
    from descentlab.train.loop import global_batches

    data, bad_step = _data(), 3
    calls = {"n": 0}

    def readout(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        calls["n"] += 1  # 4 readouts (f_0..f_3) per micro-batch
        per_step = 4 * accum
        return _ce(logits, batch) * (float("nan") if (calls["n"] - 1) // per_step == bad_step - 1 else 1.0)

    model = LayerLogits()
    constraint = LayerwiseDescent(3, alpha=0.2, dual_lr=0.5)
    opt = PrimalDual(torch.optim.SGD(model.parameters(), lr=0.1), constraint)
    cfg = TrainConfig(
        max_steps=6, batch_size=16 // accum, grad_accum_steps=accum, grad_clip=None, progress=False
    )
    result = fit(model, data, objective=Constrained(constraint, readout=readout), optimizer=opt, cfg=cfg)
    assert result.steps == 6 and result.skipped_steps == 1

    ref_model = LayerLogits()
    ref = LayerwiseDescent(3, alpha=0.2, dual_lr=0.5)
    ref_opt = PrimalDual(torch.optim.SGD(ref_model.parameters(), lr=0.1), ref)
    steps = [*global_batches(len(data), 16, 0, 0), *global_batches(len(data), 16, 0, 1)][:6]
    for k, indices in enumerate(steps, start=1):
        if k == bad_step:
            continue
        batch = {
            "x": torch.stack([data[int(i)]["x"] for i in indices]),
            "labels": torch.stack([data[int(i)]["labels"] for i in indices]),
        }
        ref.lagrangian(layer_losses(ref_model, batch, readout=_ce)).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    assert float(ref.multipliers.abs().sum()) > 0.05
    torch.testing.assert_close(constraint.multipliers, ref.multipliers, rtol=0, atol=1e-10)
