"""The two AC/DC levers of sparse-vit, through the recipe layer: Adam's moments reset at decompression, and
the mirror step on the prunable weights only; and the schedule's minimum phase length."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from descentlab.errors import ConfigError
from descentlab.optim._horst_kernel import load_kernel
from descentlab.optim.config import OptimizerConfig, param_groups
from descentlab.optim.ham import ham_mirror_step
from descentlab.optim.horst import horst_reference
from descentlab.sparsity import ACDCConfig, select_prunable
from descentlab.train.recipe import MethodConfig, build_recipe

# dense 2, then compressed [2, 5), decompressed [5, 8), compressed [8, 11), decompressed [11, 13), final
ACDC = ACDCConfig(sparsity=0.7, unit="steps", warmup=2, phase=3, last_decompressed=2, final=3)
TOTAL = 16
OPTIMIZERS = {
    "adamw": OptimizerConfig(name="adamw", lr=1e-2, weight_decay=0.05),
    "horst": OptimizerConfig(name="horst", lr=1e-2, weight_decay=0.05, alpha=30.0, beta=0.0),
    "ham": OptimizerConfig(name="ham", lr=1e-2, weight_decay=0.05, alpha=200.0, beta=1e-3),
}


def _batch(step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return {
        "pixel_values": torch.randn(8, 1, 28, 28, generator=gen),
        "labels": torch.randint(0, 10, (8,), generator=gen),
    }


def _moments(opt: torch.optim.Optimizer, params: list[nn.Parameter]) -> list[dict[str, torch.Tensor]]:
    return [{k: opt.state[p][k].clone() for k in ("exp_avg", "exp_avg_sq")} for p in params]


@pytest.mark.parametrize("reset", [True, False])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_reset_moments_zeroes_exactly_the_pruned_entries_at_decompression(
    name: str, reset: bool, make_vit: Callable[..., nn.Module]
) -> None:
    model = make_vit()
    method = MethodConfig(
        optimizer=OPTIMIZERS[name], acdc=ACDCConfig(**{**vars(ACDC), "reset_moments": reset})
    )
    recipe = build_recipe(method, model, total_steps=TOTAL)
    opt, acdc = recipe.optimizer, recipe.sparsity
    params = [t.param for t in select_prunable(model)]
    names = [t.name for t in select_prunable(model)]
    decompressions = 0
    for step in range(TOTAL):
        opt.zero_grad()
        model(**_batch(step)).loss.backward()
        acdc.before_optimizer_step()
        opt.step()
        pruned = None if acdc.masks is None else [~acdc.masks[n] for n in names]
        before = _moments(opt, params)
        acdc.step()  # the only call that may touch the moments
        after = _moments(opt, params)
        if pruned is not None and not acdc.compressed:  # this step ended a compressed phase
            decompressions += 1
            for b, a, m in zip(before, after, pruned, strict=True):
                for key in b:
                    assert torch.equal(a[key][~m], b[key][~m]), key  # the kept entries are untouched
                    if reset:
                        assert torch.any(b[key][m] != 0), key  # there was something to reset...
                        assert torch.all(a[key][m] == 0), key  # ...and it is gone
                    else:
                        assert torch.equal(a[key][m], b[key][m]), key
        else:  # no decompression: the moments are exactly what the optimizer step left
            for b, a in zip(before, after, strict=True):
                assert all(torch.equal(a[k], b[k]) for k in b)
    assert decompressions == 2


def _twin_step(
    name: str, prunable: set[int], twin: nn.Module, twin_opt: torch.optim.Optimizer, state: dict
) -> None:
    """The twin's step: torch.optim.AdamW on every tensor, then the mirror step on the prunable ones only
    (HAM: after AdamW, with the raw gradient; HORST: horst_reference, replacing AdamW's step)."""
    cfg = OPTIMIZERS[name]
    plain = [p for p in twin.parameters() if id(p) not in prunable]
    if name == "ham":
        twin_opt.step()
        with torch.no_grad():
            for p in twin.parameters():
                if id(p) in prunable:
                    p.copy_(ham_mirror_step(p, p.grad, lr=cfg.lr, alpha=cfg.alpha, beta=cfg.beta))
        return
    twin_opt.step()  # over the non-prunable tensors only (the twin optimizer was built on them)
    assert plain
    with torch.no_grad():
        for p in twin.parameters():
            if id(p) not in prunable:
                continue
            s = state.setdefault(id(p), {"m": torch.zeros_like(p), "v": torch.zeros_like(p), "k": 0})
            s["k"] += 1
            new = horst_reference(
                p, p.grad, s["m"], s["v"], step=s["k"], lr=cfg.lr, beta1=0.9, beta2=0.999, eps=1e-8,
                weight_decay=cfg.weight_decay, alpha=cfg.alpha, beta=cfg.beta, mirror=True,
            )  # fmt: skip
            p.copy_(new.param)
            s["m"], s["v"] = new.exp_avg, new.exp_avg_sq


@pytest.mark.parametrize("name", ["horst", "ham"])
def test_mirror_on_prunable_weights_only(name: str, make_vit: Callable[..., nn.Module]) -> None:
    model, twin = make_vit(seed=3), make_vit(seed=3)
    cfg = OptimizerConfig(**{**vars(OPTIMIZERS[name]), "mirror": "prunable"})
    opt = build_recipe(MethodConfig(optimizer=cfg), model, total_steps=TOTAL).optimizer
    prunable_model = {id(t.param) for t in select_prunable(model)}
    prunable = {id(t.param) for t in select_prunable(twin)}
    groups = [g for g in opt.param_groups if g["params"]]
    assert {id(p) for g in groups if g["mirror"] for p in g["params"]} == prunable_model
    assert all(g["mirror"] in (True, False) for g in groups)
    # the twin: torch AdamW (HORST picks its fused CPU kernel, which rounds like AdamW(fused=True))
    fused = {"fused": True} if name == "horst" and load_kernel() is not None else {}
    twin_params = [p for p in twin.parameters() if name == "ham" or id(p) not in prunable]
    twin_opt = torch.optim.AdamW(twin_params, lr=cfg.lr, weight_decay=cfg.weight_decay, **fused)
    state: dict = {}
    for step in range(12):
        for m in (model, twin):
            m.zero_grad()
        model(**_batch(step)).loss.backward()
        for p, q in zip(model.parameters(), twin.parameters(), strict=True):
            q.grad = p.grad.clone()  # the same gradients, so each tensor's trajectory can be compared
        opt.step()
        _twin_step(name, prunable, twin, twin_opt, state)
    start = make_vit(seed=3)
    for (n, p), q, p0 in zip(model.named_parameters(), twin.parameters(), start.parameters(), strict=True):
        assert not torch.equal(p, p0), n  # every tensor trained
        if name == "ham" or id(q) not in prunable:
            assert torch.equal(p, q), n  # non-prunable: AdamW exactly; HAM: AdamW + its mirror, exactly
        else:
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=n)  # fused kernel vs reference


def test_prunable_mirror_differs_from_the_matrices_rule(make_vit: Callable[..., nn.Module]) -> None:
    # "matrices" also mirrors the patch embedding and the classifier; "prunable" must not
    model = make_vit()
    base = dict(vars(OPTIMIZERS["horst"]))
    wide = build_recipe(MethodConfig(optimizer=OptimizerConfig(**base)), model, total_steps=4).optimizer
    narrow_cfg = OptimizerConfig(**{**base, "mirror": "prunable"})
    narrow = build_recipe(MethodConfig(optimizer=narrow_cfg), model, total_steps=4).optimizer
    mirrored_wide = {
        id(p) for g in wide.param_groups for p in g["params"] if g["mirror"] is not False and p.ndim >= 2
    }
    mirrored_narrow = {id(p) for g in narrow.param_groups for p in g["params"] if g["mirror"]}
    assert mirrored_narrow < mirrored_wide
    with pytest.raises(ConfigError, match="mirror=prunable needs"):
        param_groups(model, narrow_cfg)  # no filter outside the recipe: an error, not a silent "all"


def test_min_phase_steps_names_the_short_phases() -> None:
    cfg = ACDCConfig(**{**vars(ACDC), "min_phase_steps": 3})
    with pytest.raises(ConfigError, match=r"min_phase_steps=3.*decompressed \[11, 13\)"):
        cfg.phases(TOTAL)
    ok = ACDCConfig(**{**vars(ACDC), "min_phase_steps": 2})
    assert [p.end - p.start for p in ok.phases(TOTAL)] == [2, 3, 3, 3, 2, 3]
    with pytest.raises(ConfigError, match="min_phase_steps"):
        ACDCConfig(min_phase_steps=-1)


def test_prune_all_masks_the_patch_projection_and_head_too(make_vit: Callable[..., nn.Module]) -> None:
    model = make_vit()
    cfg = OptimizerConfig(**{**vars(OPTIMIZERS["horst"]), "mirror": "prunable"})
    method = MethodConfig(optimizer=cfg, acdc=ACDCConfig(**{**vars(ACDC), "prune": "all"}))
    recipe = build_recipe(method, model, total_steps=TOTAL)
    blocks = {t.name for t in select_prunable(model)}
    masked = {t.name: t.param for t in recipe.sparsity.tensors}
    extra = set(masked) - blocks
    assert blocks < set(masked)
    assert any("patch" in n for n in extra) and any("classifier" in n for n in extra), extra
    for step in range(3):  # into the first compressed phase [2, 5)
        recipe.optimizer.zero_grad()
        model(**_batch(step)).loss.backward()
        recipe.sparsity.before_optimizer_step()
        recipe.optimizer.step()
        recipe.sparsity.step()
    zeros = sum(int((p == 0).sum()) for p in masked.values())
    total = sum(p.numel() for p in masked.values())
    assert zeros == round(0.7 * total)  # one global threshold over the wider set, exactly
    assert any(int((masked[n] == 0).sum()) > 0 for n in extra)
    mirrored = {id(p) for g in recipe.optimizer.param_groups for p in g["params"] if g["mirror"]}
    assert mirrored == {id(p) for p in masked.values()}  # mirror=prunable follows acdc.prune
