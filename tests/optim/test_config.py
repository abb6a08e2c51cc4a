"""OptimizerConfig + build_optimizer / build_scheduler reproduce, exactly, each optimizer built by hand.

Every check compares param groups (same tensors in the same order, same hyper-parameters) and the
parameters after a few steps (bit for bit) against the construction it replaces: first against hand-built
torch / HORST / HAM optimizers (self-contained), then against the experiments' own ``make_optimizer``
functions while those exist (skipped once they are gone).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest
import torch

from descentlab.errors import ConfigError
from descentlab.optim.config import (
    OptimizerConfig,
    build_optimizer,
    build_scheduler,
    param_groups,
)
from descentlab.optim.ham import HAM
from descentlab.optim.horst import HORST

Make = Callable[[torch.nn.Module], tuple[torch.optim.Optimizer, object]]


def _matrices(model: torch.nn.Module) -> list:
    return [p for p in model.parameters() if p.ndim >= 2]


def _vectors(model: torch.nn.Module) -> list:
    return [p for p in model.parameters() if p.ndim < 2]


def _assert_same(old: Make, new: Make, factory, batches, lm_loss, steps: int = 4) -> None:
    """Same optimizer class(es), groups (by parameter name) and, after ``steps`` steps, the same weights."""
    a, b = factory(), factory()
    opt_a, sched_a = old(a)
    opt_b, sched_b = new(b)
    assert type(opt_a) is type(opt_b)
    if isinstance(opt_a, HAM):
        assert type(opt_a.base_optimizer) is type(opt_b.base_optimizer)
    names_a = {id(p): n for n, p in a.named_parameters()}
    names_b = {id(p): n for n, p in b.named_parameters()}
    assert len(opt_a.param_groups) == len(opt_b.param_groups)
    for ga, gb in zip(opt_a.param_groups, opt_b.param_groups, strict=True):
        assert [names_a[id(p)] for p in ga["params"]] == [names_b[id(p)] for p in gb["params"]]
        assert {k: v for k, v in ga.items() if k != "params"} == {
            k: v for k, v in gb.items() if k != "params"
        }
    assert type(sched_a) is type(sched_b)
    for k in range(steps):
        for model, opt, sched in ((a, opt_a, sched_a), (b, opt_b, sched_b)):
            opt.zero_grad()
            lm_loss(model, batches[k % len(batches)]).backward()
            opt.step()
            if sched is not None:
                sched.step()
        assert [g["lr"] for g in opt_a.param_groups] == [g["lr"] for g in opt_b.param_groups]
    moved = any(not torch.equal(p, q) for p, q in zip(a.parameters(), factory().parameters(), strict=True))
    assert moved, "the models must train for the comparison to mean anything"
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def _new(cfg: OptimizerConfig, total_steps: int = 8, **kwargs) -> Make:
    def make(model):
        opt = build_optimizer(cfg, model, **kwargs)
        return opt, build_scheduler(cfg, opt, total_steps)

    return make


def _hand_warmup_cosine(opt, steps: int, warmup_frac: float):
    warm = max(1, round(warmup_frac * steps))

    def factor(k: int) -> float:
        if k < warm:
            return (k + 1) / warm
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (k - warm) / max(1, steps - warm))))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


# ---- self-contained: against hand-built optimizers ----------------------------------------------------


def _split(model, wd):
    return [
        {"params": _matrices(model), "weight_decay": wd},
        {"params": _vectors(model), "weight_decay": 0.0},
    ]


LM = dict(lr=3e-3, weight_decay=0.1, decay="matrices", schedule="warmup_cosine", warmup_frac=0.25)
HAND: dict[str, tuple[Make, OptimizerConfig]] = {
    # the decay/no-decay split, warm-up + cosine schedule (sparse-lm)
    "split-adamw": (
        lambda m: (o := torch.optim.AdamW(_split(m, 0.1), lr=3e-3), _hand_warmup_cosine(o, 8, 0.25)),
        OptimizerConfig(name="adamw", **LM),
    ),
    "split-horst": (
        lambda m: (
            o := HORST(_split(m, 0.1), lr=3e-3, alpha=10.0, beta=0.1),
            _hand_warmup_cosine(o, 8, 0.25),
        ),
        OptimizerConfig(name="horst", alpha=10.0, beta=0.1, **LM),
    ),
    "split-ham": (
        lambda m: (
            o := HAM(torch.optim.AdamW(_split(m, 0.1), lr=3e-3), alpha=200.0, beta=1e-3),
            _hand_warmup_cosine(o, 8, 0.25),
        ),
        OptimizerConfig(name="ham", alpha=200.0, beta=1e-3, **LM),
    ),
    # every tensor decays (sparse-vit, robust-sparse, text-robustness)
    "plain-adamw": (
        lambda m: (torch.optim.AdamW(m.parameters(), lr=2e-3, weight_decay=0.05), None),
        OptimizerConfig(lr=2e-3, weight_decay=0.05),
    ),
    "plain-horst": (
        lambda m: (HORST(m.parameters(), lr=2e-3, weight_decay=0.05, alpha=10.0, beta=0.0), None),
        OptimizerConfig(name="horst", lr=2e-3, weight_decay=0.05, alpha=10.0, beta=0.0),
    ),
    "plain-ham": (
        lambda m: (
            HAM(torch.optim.AdamW(m.parameters(), lr=2e-3, weight_decay=0.05), alpha=200.0, beta=1e-3),
            None,
        ),
        OptimizerConfig(name="ham", lr=2e-3, weight_decay=0.05, alpha=200.0, beta=1e-3),
    ),
    "ham-defaults": (
        lambda m: (HAM(torch.optim.AdamW(m.parameters(), lr=2e-3)), None),
        OptimizerConfig(name="ham", lr=2e-3),
    ),
    "ham-adam-base": (
        lambda m: (HAM(torch.optim.Adam(m.parameters(), lr=2e-3, weight_decay=0.05), alpha=100.0), None),
        OptimizerConfig(name="ham", base="adam", lr=2e-3, weight_decay=0.05, alpha=100.0),
    ),
    # fused AdamW (llm-robustness), cosine annealing (video-denoising)
    "fused-adamw": (
        lambda m: (torch.optim.AdamW(m.parameters(), lr=2e-3, weight_decay=0.05, fused=True), None),
        OptimizerConfig(lr=2e-3, weight_decay=0.05, fused=True),
    ),
    "cosine-adamw": (
        lambda m: (
            o := torch.optim.AdamW(m.parameters(), lr=2e-3, weight_decay=0.05),
            torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=8),
        ),
        OptimizerConfig(lr=2e-3, weight_decay=0.05, schedule="cosine"),
    ),
}


@pytest.mark.parametrize("case", sorted(HAND))
def test_reproduces_hand_built(case, tiny_gpt2, lm_batches, lm_loss):
    old, cfg = HAND[case]
    _assert_same(old, _new(cfg), tiny_gpt2, lm_batches, lm_loss)


def test_mirror_filter_restricts_the_mirror_step(tiny_gpt2, lm_batches, lm_loss):
    def attn(name, _p):
        return ".attn." in name

    def hand(m):
        named = list(m.named_parameters())
        mirrored = [p for n, p in named if p.ndim >= 2 and attn(n, p)]
        rest = [p for n, p in named if not (p.ndim >= 2 and attn(n, p))]
        groups = [{"params": mirrored, "mirror": True}, {"params": rest, "mirror": False}]
        return HORST(groups, lr=2e-3, weight_decay=0.05, alpha=30.0), None

    cfg = OptimizerConfig(name="horst", lr=2e-3, weight_decay=0.05, alpha=30.0)
    _assert_same(hand, _new(cfg, mirror_filter=attn), tiny_gpt2, lm_batches, lm_loss)
    groups = param_groups(tiny_gpt2(), cfg, attn)
    assert [g["mirror"] for g in groups] == [True, False] and len(groups[0]["params"]) == 2  # c_attn, c_proj


def test_decay_and_mirror_rules_make_the_groups(tiny_gpt2):
    model = tiny_gpt2()
    n_mat, n_vec = len(_matrices(model)), len(_vectors(model))
    split = param_groups(
        model, OptimizerConfig(name="horst", decay="matrices", mirror="all", weight_decay=0.3)
    )
    assert [(len(g["params"]), g["weight_decay"], g["mirror"]) for g in split] == [
        (n_mat, 0.3, True),
        (n_vec, 0.0, True),
    ]
    none = param_groups(model, OptimizerConfig(name="ham", mirror="none"))
    assert [(len(g["params"]), g["mirror"]) for g in none] == [(n_mat + n_vec, False)]
    adamw = param_groups(model, OptimizerConfig(decay="matrices"), mirror_filter=lambda n, p: False)
    assert [set(g) for g in adamw] == [{"params", "weight_decay"}] * 2
    w = torch.nn.Parameter(torch.zeros(3))
    assert param_groups([w], OptimizerConfig(name="horst", mirror="all"))[0]["params"] == [w]
    assert param_groups([("w", w)], OptimizerConfig(name="horst", mirror="matrices"))[0]["mirror"] is None


def test_warmup_cosine_lr_values():
    w = torch.nn.Parameter(torch.zeros(2))
    cfg = OptimizerConfig(lr=1.0, schedule="warmup_cosine", warmup_frac=0.2)
    opt = build_optimizer(cfg, [w])
    sched = build_scheduler(cfg, opt, total_steps=10)
    lrs = []
    for _ in range(11):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [0.5, 1.0] + [0.5 * (1 + math.cos(math.pi * k / 8)) for k in range(9)]
    assert lrs == pytest.approx(expected, abs=1e-12)
    assert build_scheduler(OptimizerConfig(), opt, total_steps=10) is None


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"name": "sgd"}, "optimizer.name"),
        ({"lr": 0.0}, "optimizer.lr"),
        ({"lr": "1e-3"}, "optimizer.lr"),
        ({"betas": [0.9]}, "optimizer.betas"),
        ({"betas": [0.9, 1.0]}, "optimizer.betas"),
        ({"eps": -1.0}, "optimizer.eps"),
        ({"weight_decay": float("nan")}, "optimizer.weight_decay"),
        ({"alpha": 1.0}, "optimizer.alpha"),
        ({"name": "horst", "beta": -1.0}, "optimizer.beta"),
        ({"decay": "vectors"}, "optimizer.decay"),
        ({"mirror": "some"}, "optimizer.mirror"),
        ({"base": "adam"}, "optimizer.base"),
        ({"name": "ham", "base": "sgd"}, "optimizer.base"),
        ({"name": "horst", "alpha": float("nan")}, "optimizer.alpha"),
        ({"fused": "yes"}, "optimizer.fused"),
        ({"name": "horst", "stochastic_rounding": 1}, "optimizer.stochastic_rounding"),
        ({"stochastic_rounding": True}, "optimizer.stochastic_rounding"),
        ({"schedule": "linear"}, "optimizer.schedule"),
        ({"schedule": "warmup_cosine", "warmup_frac": 1.0}, "optimizer.warmup_frac"),
        ({"warmup_frac": 0.1}, "optimizer.warmup_frac"),
    ],
)
def test_bad_config_names_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        OptimizerConfig(**kwargs)


def test_horst_takes_adamws_fused_flag():
    """HORST accepts torch's ``fused`` like AdamW (issue 33): false forbids the fused paths, and true on
    tensors it cannot fuse raises instead of being ignored."""
    model = torch.nn.Linear(3, 2)
    opt = build_optimizer(OptimizerConfig(name="horst", fused=False), model)
    assert opt.param_groups[0]["impl"] == "foreach" and not opt.param_groups[0]["fused"]
    with pytest.raises(ConfigError, match="fused=True"):
        build_optimizer(OptimizerConfig(name="horst", fused=True), model.double())


def test_stochastic_rounding_reaches_horsts_groups():
    """The config key turns on HORST's stochastic rounding for every group; a bf16 parameter whose update is
    below half an ulp then moves (it does not by round-to-nearest)."""
    torch.manual_seed(0)
    moved = {}
    for sr in (False, True):
        w = torch.nn.Parameter(torch.full((256,), 1.0, dtype=torch.bfloat16))
        opt = build_optimizer(OptimizerConfig(name="horst", lr=1e-4, alpha=0.0, stochastic_rounding=sr), [w])
        assert all(g["stochastic_rounding"] is sr for g in opt.param_groups)
        w.grad = torch.ones_like(w)
        opt.step()
        moved[sr] = int((w != 1.0).sum())
    assert moved[False] == 0 and moved[True] > 0


def test_bad_params_and_steps_raise():
    w = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ConfigError):
        build_optimizer(OptimizerConfig(), w)  # a tensor, not an iterable of tensors
    with pytest.raises(ConfigError):
        build_optimizer(OptimizerConfig(), [{"params": [w]}])
    with pytest.raises(ConfigError):
        build_optimizer(OptimizerConfig(), [])
    opt = build_optimizer(OptimizerConfig(schedule="cosine"), [w])
    with pytest.raises(ConfigError):
        build_scheduler(OptimizerConfig(schedule="cosine"), opt, total_steps=0)
    assert OptimizerConfig(betas=(0.5, 0.6)).betas == [0.5, 0.6]


def test_omegaconf_round_trip_validates():
    omegaconf = pytest.importorskip("omegaconf")
    base = omegaconf.OmegaConf.structured(OptimizerConfig())
    dots = ["name=horst", "alpha=10", "betas=[0.8,0.9]", "schedule=warmup_cosine", "warmup_frac=0.05"]
    cfg = omegaconf.OmegaConf.to_object(
        omegaconf.OmegaConf.merge(base, omegaconf.OmegaConf.from_dotlist(dots))
    )
    assert cfg == OptimizerConfig(
        name="horst", alpha=10.0, betas=[0.8, 0.9], schedule="warmup_cosine", warmup_frac=0.05
    )
    with pytest.raises(ConfigError, match=re.escape("optimizer.alpha")):
        omegaconf.OmegaConf.to_object(
            omegaconf.OmegaConf.merge(base, omegaconf.OmegaConf.from_dotlist(["alpha=3"]))
        )
