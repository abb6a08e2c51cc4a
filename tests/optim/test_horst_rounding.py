"""HORST's stochastic rounding of bf16 / fp16 parameters: the rounding against its float64 twin, its bias,
sub-ulp updates, the three paths drawing the same bits, state-dict resumption and seeding."""

from __future__ import annotations

import io
import math
import warnings

import pytest
import torch

from descentlab.errors import ConfigError
from descentlab.optim import _horst_compiled
from descentlab.optim._horst_rounding import (
    random_bits,
    rounding_key,
    stochastic_round,
    stochastic_round_reference,
    uniform_of,
)
from descentlab.optim.horst import HORST

LOW = [torch.bfloat16, torch.float16]
IMPLS = ["reference", "foreach"]
if _horst_compiled.can_compile(torch.device("cpu")):
    IMPLS.append("compiled")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def _wide_values() -> torch.Tensor:
    """float32 values over the whole range: every binade, both signs, subnormals, overflow, specials."""
    gen = torch.Generator().manual_seed(0)
    scale = 2.0 ** torch.randint(-149, 128, (6000,), generator=gen).double()
    random = (torch.randn(6000, generator=gen, dtype=torch.float64) * scale).float()
    special = [0.0, -0.0, math.inf, -math.inf, math.nan, 3.4028e38, -3.39e38, 65519.0, 65520.0, 7e4, 1e-45]
    special += [1e-40, 6e-8, 3e-8, 1e-9, 2.0**-25, 2.0**-26, 1.0, 1.0 + 2.0**-20, -(1.0 + 2.0**-9)]
    return torch.cat([random, torch.tensor(special)])


@pytest.mark.parametrize("dtype", LOW)
def test_stochastic_round_equals_its_float64_twin_bit_for_bit(dtype):
    x = _wide_values()
    for key in (0, 12345, 2**32 - 1):
        fast = stochastic_round(x, dtype, key)
        slow = stochastic_round_reference(x, dtype, uniform_of(random_bits(x, key), dtype))
        same = (fast.view(torch.int16) == slow.view(torch.int16)) | (fast.isnan() & slow.isnan())
        assert same.all(), (x[~same][:4], fast[~same][:4], slow[~same][:4])
    nearest = x.to(dtype)
    assert _same_bits(stochastic_round(nearest.float(), dtype, 7), nearest)  # representable: unchanged


@pytest.mark.parametrize("dtype", LOW)
def test_stochastic_round_is_unbiased(dtype):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(256, generator=gen) * 2.0 ** torch.randint(-20, 10, (256,), generator=gen).float()
    draws = 2000
    rounded = torch.stack([stochastic_round(x, dtype, rounding_key(3, 0, k)) for k in range(draws)]).double()
    nearest = x.to(dtype).double()
    xd = x.double()
    # each draw is one of the two neighbours lo <= x <= hi
    spacing = (rounded.max(0).values - rounded.min(0).values).clamp(min=0)
    assert ((rounded == rounded.min(0).values) | (rounded == rounded.max(0).values)).all()
    assert (rounded.min(0).values <= xd).all() and (rounded.max(0).values >= xd).all()
    # mean within 5 standard errors: the std of one draw is spacing * sqrt(p (1 - p)) <= spacing / 2
    p = torch.where(spacing > 0, (xd - rounded.min(0).values) / spacing.clamp(min=1e-300), 0.0)
    bound = 5 * spacing * (p * (1 - p)).sqrt() / math.sqrt(draws) + 1e-300
    assert ((rounded.mean(0) - xd).abs() <= bound).all()
    # round-to-nearest is biased by far more than that bound for almost every x: the test can fail
    assert ((nearest - xd).abs() > bound).float().mean() > 0.9


def _sub_ulp_run(dtype, stochastic: bool, *, impl: str = "foreach", steps: int = 200):
    """Weights of magnitude in [1.6, 1.75] (bf16 ulp 2^-7, half an ulp 3.9e-3) pulled towards targets 1 away
    by HORST at lr = 2e-3, alpha = 0.25: each step changes a weight by at most 2e-3 (1 + 0.25 * 1.75) =
    2.9e-3 (the Adam step plus the mirror step's shrink), below half an ulp."""
    gen = torch.Generator().manual_seed(0)
    magnitude = torch.rand(64, 64, generator=gen) * 0.15 + 1.6
    w0 = (magnitude * torch.randn(64, 64, generator=gen).sign()).to(torch.bfloat16).float()
    target = w0 + torch.randn(64, 64, generator=gen).sign()
    p = torch.nn.Parameter(w0.clone().to(dtype))
    opt = HORST([p], lr=2e-3, alpha=0.25, impl=impl, stochastic_rounding=stochastic, sr_seed=1)
    for _ in range(steps):
        p.grad = (p.detach().float() - target).to(dtype)
        opt.step()
    return w0, p.detach().float()


def test_sub_ulp_updates_move_bf16_weights_only_with_stochastic_rounding():
    w0, exact = _sub_ulp_run(torch.float32, False)
    _, nearest = _sub_ulp_run(torch.bfloat16, False)
    _, stochastic = _sub_ulp_run(torch.bfloat16, True)
    assert torch.equal(nearest, w0), "rounded to nearest, updates below half an ulp are all lost"
    assert (exact - w0).abs().mean() > 0.4  # the float32 run moves every weight ~0.5
    assert (stochastic != w0).float().mean() > 0.99
    # measured: 31.5 against 3.16 (ratio 10.0; 9.97-10.07 over rounding seeds 1-3)
    ratio = float((nearest - exact).norm() / (stochastic - exact).norm())
    assert ratio > 6.0, ratio


@pytest.mark.parametrize("dtype", LOW)
def test_every_path_draws_the_same_bits(dtype):
    """reference, foreach and compiled: the same bits at every step, a NaN reverted by the guard included."""

    def run(impl: str):
        gen = torch.Generator().manual_seed(2)
        params = [
            torch.nn.Parameter((torch.randn(s, generator=gen) * 0.5).to(dtype)) for s in [(24, 40), (57,)]
        ]
        opt = HORST(params, lr=1e-3, alpha=2.0, impl=impl, stochastic_rounding=True, sr_seed=5)
        for step in range(4):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen).to(dtype)
            if step == 2:
                params[0].grad[3, 4] = math.nan
            opt.step()
            assert opt.reverted == (1 if step == 2 else 0)
        return [p.detach().clone() for p in params]

    runs = {impl: run(impl) for impl in IMPLS}
    for impl in IMPLS[1:]:
        for a, b in zip(runs["reference"], runs[impl], strict=True):
            assert _same_bits(a, b), impl


def _roundtrip(sd: dict) -> dict:
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _problem() -> tuple[torch.nn.Parameter, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(4)
    p = torch.nn.Parameter(torch.randn(32, 48, generator=gen).to(torch.bfloat16))
    return p, [torch.randn(32, 48, generator=gen).to(torch.bfloat16) for _ in range(10)]


def _steps(p: torch.nn.Parameter, opt: HORST, grads: list[torch.Tensor], ks: range) -> None:
    for k in ks:
        p.grad = grads[k].clone()
        opt.step()


def _rounding_horst(p: torch.nn.Parameter, seed) -> HORST:
    return HORST([p], lr=1e-3, alpha=1.0, impl="foreach", stochastic_rounding=True, sr_seed=seed)


def test_state_dict_round_trip_continues_the_same_rounding_bits():
    p_a, grads = _problem()
    opt_a = _rounding_horst(p_a, 11)
    _steps(p_a, opt_a, grads, range(5))
    saved = _roundtrip(opt_a.state_dict())
    assert (
        saved["param_groups"][0]["stochastic_rounding"] is True and saved["param_groups"][0]["sr_seed"] == 11
    )
    p_b, _ = _problem()
    with torch.no_grad():
        p_b.copy_(p_a)
    opt_b = HORST([p_b], lr=1.0, impl="foreach", sr_seed=999)  # other settings: the state dict's win
    opt_b.load_state_dict(saved)
    assert opt_b.param_groups[0]["stochastic_rounding"] is True and opt_b.param_groups[0]["sr_seed"] == 11
    _steps(p_a, opt_a, grads, range(5, 10))
    _steps(p_b, opt_b, grads, range(5, 10))
    assert _same_bits(p_a.detach(), p_b.detach())
    # an AdamW state dict (no rounding keys) takes the constructor's: stochastic, seeded by sr_seed
    q = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    adamw = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))])
    horst = HORST([q], stochastic_rounding=True, sr_seed=3)
    horst.load_state_dict(adamw.state_dict())
    assert horst.param_groups[0]["stochastic_rounding"] is True and horst.param_groups[0]["sr_seed"] == 3


def test_rounding_is_deterministic_under_a_seed():
    def final(seed) -> torch.Tensor:
        p, grads = _problem()
        _steps(p, _rounding_horst(p, seed), grads, range(6))
        return p.detach().clone()

    assert _same_bits(final(11), final(11))
    assert not _same_bits(final(11), final(12))
    torch.manual_seed(11)
    assert _same_bits(final(None), final(11))  # None: torch.initial_seed(), i.e. torch.manual_seed's
    assert _same_bits(final(torch.Generator().manual_seed(11)), final(11))
    # resolving the seed draws nothing from torch's generator: the user's random stream is unchanged
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    HORST([torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))], stochastic_rounding=True)
    assert torch.equal(torch.rand(3), expected)


def test_float32_params_are_unaffected():
    runs = []
    for stochastic in (False, True):
        gen = torch.Generator().manual_seed(6)
        p = torch.nn.Parameter(torch.randn(16, 16, generator=gen))
        opt = HORST([p], lr=1e-3, stochastic_rounding=stochastic)
        for _ in range(3):
            p.grad = torch.randn(16, 16, generator=gen)
            opt.step()
        runs.append(p.detach().clone())
    assert torch.equal(*runs)


def test_bad_rounding_keys_raise():
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
    for bad in ({"stochastic_rounding": "yes"}, {"sr_seed": -1}, {"sr_seed": 1.5}, {"sr_seed": True}):
        with pytest.raises(ConfigError):
            HORST([p], **bad)
    opt = HORST([p], stochastic_rounding=True)
    opt.param_groups[0]["stochastic_rounding"] = 1
    p.grad = torch.ones(3, dtype=torch.bfloat16)
    with pytest.raises(ConfigError):
        opt.step()
    assert torch.equal(p.detach(), torch.zeros(3, dtype=torch.bfloat16))  # raised before any tensor moved


class _Tagged(torch.nn.Parameter):
    """A parameter subclass (as some wrappers make): stochastic rounding cannot write it."""


def test_an_unroundable_subclass_warns_once_and_is_counted():
    gen = torch.Generator().manual_seed(8)
    data = torch.randn(8, 8, generator=gen).to(torch.bfloat16)
    tagged, plain = _Tagged(data.clone()), torch.nn.Parameter(data.clone())
    opt = HORST([tagged], lr=1e-3, stochastic_rounding=True)
    nearest = HORST([plain], lr=1e-3, impl="foreach")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            g = torch.randn(8, 8, generator=gen).to(torch.bfloat16)
            tagged.grad, plain.grad = g.clone(), g.clone()
            opt.step()
            nearest.step()
    messages = [str(w.message) for w in caught if "stochastic_rounding" in str(w.message)]
    assert len(messages) == 1
    # the subclass also takes the foreach path where a plain tensor would too (bf16 on CPU): both recorded
    assert opt.fallbacks == {"stochastic_rounding": 3, "tensor_subclass": 3} and opt.fallbacks_total == 6
    assert torch.equal(tagged.detach(), plain.detach())  # rounded to nearest, said so


def test_fsdp2_dtensor_params_round_stochastically(tmp_path):
    """FSDP2's DTensors are rounded shard by shard; on one rank that is the plain model's rounding."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        sharded = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        plain = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        plain.load_state_dict(sharded.state_dict())
        sharded, plain = sharded.to(torch.bfloat16), plain.to(torch.bfloat16)
        fully_shard(sharded)
        kw = dict(lr=1e-3, alpha=1.0, stochastic_rounding=True, sr_seed=2)
        opts = [HORST(sharded.parameters(), **kw), HORST(plain.parameters(), impl="foreach", **kw)]
        x = torch.randn(4, 8, dtype=torch.bfloat16)
        for _ in range(3):
            for model, opt in zip((sharded, plain), opts, strict=True):
                opt.zero_grad()
                model(x).float().sum().backward()
                opt.step()
        # DTensors take the foreach path by design (recorded, 4 tensors x 3 steps); none is rounded to nearest
        assert opts[0].fallbacks == {"tensor_subclass": 12}
        for a, b in zip(sharded.parameters(), plain.parameters(), strict=True):
            assert type(a).__name__ == "DTensor"
            assert _same_bits(a.full_tensor().detach(), b.detach())
    finally:
        dist.destroy_process_group()
