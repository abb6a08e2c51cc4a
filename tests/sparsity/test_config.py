"""ACDCConfig builds the controller the experiments built by hand: same phases, same masks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from descentlab.errors import ConfigError
from descentlab.sparsity import ACDC, ACDCConfig, ACDCSchedule


def _run(acdc: ACDC, model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> list[dict]:
    """Masks after each step of a fixed update sequence."""
    torch.manual_seed(1)
    out = []
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        acdc.mask_grads_()
        optimizer.step()
        acdc.step()
        out.append({k: v.clone() for k, v in (acdc.masks or {}).items()})
    return out


def _pair(make_vit: Callable[..., nn.Module]) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = make_vit()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.mark.parametrize(
    "lengths", [{}, {"warmup": 0.5, "phase": 0.25, "last_decompressed": 0.5, "final": 0.75}]
)
def test_sparse_vit_epochs_schedule(make_vit: Callable[..., nn.Module], lengths: dict) -> None:
    """Old sparse_vit code: lengths in epochs times steps_per_epoch, schedule total = total steps."""
    spe, total, sparsity = 4, 20, 0.7
    model, opt = _pair(make_vit)

    def steps(epochs: float | None) -> float | None:
        return None if epochs is None else epochs * spe

    names = ("warmup", "phase", "last_decompressed", "final")
    schedule = ACDCSchedule(total=total, **{n: steps(lengths.get(n)) for n in names})
    old = ACDC(model, opt, sparsity=sparsity, schedule=schedule, reset_moments=True)
    old_masks = _run(old, model, opt, total)

    model, opt = _pair(make_vit)
    new = ACDCConfig(sparsity=sparsity, unit="epochs", reset_moments=True, **lengths).build(
        model, opt, total, steps_per_epoch=spe
    )
    assert [(p.kind, p.start, p.end) for p in new.phases] == [(p.kind, p.start, p.end) for p in old.phases]
    for a, b in zip(old_masks, _run(new, model, opt, total), strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_robust_sparse_reference_schedule(make_vit: Callable[..., nn.Module]) -> None:
    """Old robust_sparse code: the default schedule scaled to total_steps."""
    model, opt = _pair(make_vit)
    old = ACDC(model, opt, sparsity=0.5, total_steps=30, reset_moments=False)
    old_masks = _run(old, model, opt, 30)
    model, opt = _pair(make_vit)
    new = ACDCConfig(sparsity=0.5).build(model, opt, 30)
    assert [(p.kind, p.start, p.end) for p in new.phases] == [(p.kind, p.start, p.end) for p in old.phases]
    assert any(old_masks)
    for a, b in zip(old_masks, _run(new, model, opt, 30), strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"sparsity": 1.0}, "acdc.sparsity"),
        ({"scope": "row"}, "acdc.scope"),
        ({"nm": [4, 2]}, "acdc.nm"),
        ({"unit": "hours"}, "acdc.unit"),
        ({"warmup": -1.0}, "acdc.warmup"),
        ({"prune": "heads"}, "acdc.prune"),
    ],
)
def test_validation_names_the_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        ACDCConfig(**kwargs)


def test_epochs_need_steps_per_epoch(make_vit: Callable[..., nn.Module]) -> None:
    model, opt = _pair(make_vit)
    with pytest.raises(ConfigError, match="steps_per_epoch"):
        ACDCConfig(unit="epochs").build(model, opt, 10)
