"""DescentConfig builds the LayerwiseDescent its fields describe: α schedule, mask, resilience, dual steps."""

from __future__ import annotations

import pytest
import torch

from descentlab.constrained import DescentConfig, LayerwiseDescent, Resilience
from descentlab.errors import ConfigError


def trace(c: LayerwiseDescent, steps: int = 12, seed: int = 0) -> list[torch.Tensor]:
    """λ (and u) after each dual step on a fixed sequence of loss vectors f."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        f = (torch.rand(c.num_layers + 1, generator=gen, dtype=torch.float64) + 0.5).requires_grad_()
        c.lagrangian(f)
        c.dual_step_()
        out.append(c.multipliers.clone())
        if c.slacks is not None:
            out.append(c.slacks.clone())
    return out


def assert_same(a: LayerwiseDescent, b: LayerwiseDescent) -> None:
    assert torch.equal(a.alpha, b.alpha)
    assert torch.equal(a.mask, b.mask)
    assert a.resilience == b.resilience
    assert (a.form, a.detach_prev, a.dual_lr, a.dual_every, a.dual_cadence) == (
        b.form,
        b.detach_prev,
        b.dual_lr,
        b.dual_every,
        b.dual_cadence,
    )
    assert a.duals.max_multiplier == b.duals.max_multiplier
    for x, y in zip(trace(a), trace(b), strict=True):
        assert torch.equal(x, y)


def test_build_self_contained() -> None:
    cfg = DescentConfig(alpha=0.2, early_alpha=0.05, early_layers=2, resilient=True, penalty=2.0, dual_lr=0.1)
    built = cfg.build(4)
    assert built.alpha.tolist() == pytest.approx([0.05, 0.05, 0.2, 0.2])
    direct = LayerwiseDescent(4, [0.05, 0.05, 0.2, 0.2], 0.1, Resilience(penalty=2.0))
    assert_same(built, direct)
    hard = DescentConfig(layers=[2, 4], constrain_first=False).build(4)
    assert hard.mask.tolist() == [False, True, False, True] and hard.resilience is None


def test_with_overrides_types_and_errors() -> None:
    cfg = DescentConfig().with_overrides("alpha=0.05 detach_prev=true layers=[1,2] max_multiplier=null")
    assert (cfg.alpha, cfg.detach_prev, cfg.layers, cfg.max_multiplier) == (0.05, True, [1, 2], None)
    assert DescentConfig().with_overrides("") == DescentConfig()
    with pytest.raises(ConfigError, match=r"bad constraint overrides.*alpah"):
        DescentConfig().with_overrides("alpah=0.1")
    with pytest.raises(ConfigError, match="dual_lr"):
        DescentConfig().with_overrides("dual_lr=abc")


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"alpha": 1.0}, "alpha"),
        ({"early_alpha": -0.1}, "early_alpha"),
        ({"dual_lr": 0.0}, "dual_lr"),
        ({"form": "log"}, "form"),
        ({"layers": [0, 1]}, "layers"),
        ({"penalty": 0.0}, "penalty"),
        ({"resilience_form": "x"}, "resilience_form"),
        ({"dual_every": 0}, "dual_every"),
        ({"dual_cadence": "batch"}, "dual_cadence"),
        ({"max_multiplier": -1.0}, "max_multiplier"),
    ],
)
def test_validation_names_the_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=f"constraint.{key}"):
        DescentConfig(**kwargs)
