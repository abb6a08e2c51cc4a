"""Monotone descent on real data: a residual stack on Fashion-MNIST, ERM against layer-wise constraints.

With ERM only the last layer is trained to be read out, and the held-out loss read out through the shared
head rises over the last layers (the representation overfits). With the descent constraints (α = 0.1)
the held-out per-layer loss is non-increasing, at the same accuracy.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from descentlab.constrained import LayerwiseDescent, PrimalDual
from descentlab.errors import AssetMissingError
from descentlab.readout import layer_losses

STEPS, BATCH, DEPTH = 300, 128, 4


class ResidualStack(nn.Module):
    def __init__(self, d_in: int = 784, width: int = 64, depth: int = DEPTH, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))
            for _ in range(depth)
        )
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor, output_hidden_states: bool = True):
        h = self.embed(x)
        states = [h]
        for block in self.blocks:
            h = h + block(h)
            states.append(h)
        return type("Out", (), {"hidden_states": tuple(states)})()


@pytest.fixture(scope="module")
def fashion() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    from descentlab.data import load_image_classification

    try:
        data = load_image_classification("fashion_mnist")
    except AssetMissingError as exc:
        pytest.skip(f"Fashion-MNIST is not installed: {exc}")
    g = torch.Generator().manual_seed(0)
    out = {}
    for split, n in (("train", 3000), ("test", 2000)):
        x, y = data[split]
        idx = torch.randperm(len(y), generator=g)[:n]
        out[split] = (x[idx].float().div(255).flatten(1), y[idx])
    mean, std = out["train"][0].mean(0), out["train"][0].std(0) + 0.1
    return {k: ((x - mean) / std, y) for k, (x, y) in out.items()}


def _train(fashion, constrained: bool) -> tuple[torch.Tensor, float, float]:
    torch.manual_seed(0)
    model = ResidualStack()

    def head(h, b):
        return F.cross_entropy(model.head(h), b["labels"])

    constraint = LayerwiseDescent(DEPTH, alpha=0.1, dual_lr=0.5)
    adam = torch.optim.Adam(model.parameters(), lr=3e-3)
    opt = PrimalDual(adam, constraint) if constrained else adam
    x, y = fashion["train"]
    g = torch.Generator().manual_seed(0)
    lam_max = 0.0
    for _ in range(STEPS):
        idx = torch.randint(0, len(y), (BATCH,), generator=g)
        f = layer_losses(model, {"x": x[idx], "labels": y[idx]}, readout=head)
        loss = constraint.lagrangian(f) if constrained else f[-1]
        opt.zero_grad()
        loss.backward()
        opt.step()
        lam_max = max(lam_max, float(constraint.multipliers.max()))
    xt, yt = fashion["test"]
    with torch.no_grad():
        f_test = layer_losses(model, {"x": xt, "labels": yt}, readout=head)
        accuracy = float((model.head(model(xt).hidden_states[-1]).argmax(1) == yt).float().mean())
    return f_test, accuracy, lam_max


@pytest.mark.slow
def test_constrained_held_out_loss_is_monotone_where_erm_is_not(fashion) -> None:
    f_erm, acc_erm, _ = _train(fashion, constrained=False)
    f_con, acc_con, lam_max = _train(fashion, constrained=True)
    rises_erm = torch.diff(f_erm)
    rises_con = torch.diff(f_con)
    assert rises_erm.max() > 0.01, f"ERM profile is already monotone: {f_erm.tolist()}"
    assert rises_con.max() <= 0.0, f"constrained profile rises: {f_con.tolist()}"
    assert lam_max > 0.0  # the constraints were active during training
    assert acc_erm > 0.75 and acc_con > acc_erm - 0.02  # same accuracy: not bought by a worse model
