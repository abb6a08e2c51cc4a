"""bf16 autocast through the loop (Accelerate) on CPUs that support it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import ERM


def _bf16_supported() -> bool:
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = nn.Linear(4, 4)(torch.ones(2, 4))
        return out.dtype == torch.bfloat16
    except RuntimeError:
        return False


@pytest.mark.skipif(not _bf16_supported(), reason="this CPU has no bf16 autocast")
def test_bf16_autocast_trains_and_matches_fp32_loosely() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=gen)
    data = [{"x": x[i], "y": (x[i, 0] > 0).long()} for i in range(64)]
    seen: list[torch.dtype] = []

    def loss(model: nn.Module, batch: dict) -> torch.Tensor:
        logits = model(batch["x"])
        return nn.functional.cross_entropy(logits.float(), batch["y"])

    finals = {}
    for precision in ("no", "bf16"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        # Accelerate casts the model's outputs back to fp32, so look at an inner activation
        model[0].register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
        fit(
            model,
            data,
            objective=ERM(loss),
            optimizer=torch.optim.AdamW(model.parameters(), lr=3e-2),
            cfg=TrainConfig(epochs=15, batch_size=16, mixed_precision=precision, progress=False),
        )
        assert all(p.dtype == torch.float32 for p in model.parameters()), "master weights stay fp32"
        with torch.no_grad():
            finals[precision] = float(loss(model, {"x": x, "y": (x[:, 0] > 0).long()}))
    assert torch.bfloat16 in seen and torch.float32 in seen
    assert finals["bf16"] < 0.5 and abs(finals["bf16"] - finals["no"]) < 0.1


@pytest.mark.skipif(not _bf16_supported(), reason="this CPU has no bf16 autocast")
@pytest.mark.parametrize("fails", [False, True])
def test_fit_hands_the_model_back_without_the_autocast_forward(fails: bool) -> None:
    """Accelerate patches model.forward with autocast; after fit (finished or raising) it runs in fp32 again."""
    from descentlab.errors import NumericalError

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2))
    data = [{"x": torch.randn(8), "y": torch.tensor(i % 2)} for i in range(32)]
    dtypes: list[torch.dtype] = []
    model[0].register_forward_hook(lambda mod, args, out: dtypes.append(out.dtype))

    def loss(m: nn.Module, batch: dict) -> torch.Tensor:
        out = nn.functional.cross_entropy(m(batch["x"]).float(), batch["y"])
        return out * float("nan") if fails else out

    cfg = TrainConfig(epochs=1, batch_size=8, mixed_precision="bf16", progress=False, max_bad_steps=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if fails:
        with pytest.raises(NumericalError):
            fit(model, data, objective=ERM(loss), optimizer=opt, cfg=cfg)
    else:
        fit(model, data, objective=ERM(loss), optimizer=opt, cfg=cfg)
    assert torch.bfloat16 in dtypes  # it did train under autocast
    dtypes.clear()
    x = torch.randn(4, 8)
    with torch.no_grad():
        out = model(x)
        expected = model[2](model[1](model[0](x)))  # the plain fp32 forward, layer by layer
    assert dtypes == [torch.float32, torch.float32] and torch.equal(out, expected)
