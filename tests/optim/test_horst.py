"""HORST against torch.optim.AdamW, against its own reference twin, and across state_dict round-trips."""

from __future__ import annotations

import io
import math

import pytest
import torch

from descentlab.errors import ConfigError
from descentlab.optim._horst_kernel import load_kernel
from descentlab.optim.compose import HyperbolicMirror, compose
from descentlab.optim.config import horst_param_groups
from descentlab.optim.functional import Bucket, HorstHyper
from descentlab.optim.horst import HORST, horst_reference

KERNEL = load_kernel()
FAST_IMPLS = ["foreach", *(["fused"] if KERNEL is not None else [])]
# The fused kernel rounds like AdamW(fused=True) (correctly rounded sqrt); the foreach path like the default
# AdamW, whose CPU sqrt is not correctly rounded. Each is compared with its own torch twin.
ADAMW_TWIN = {"foreach": {}, "fused": {"fused": True}}


def _rel_err(a: torch.nn.Module, b: torch.nn.Module) -> float:
    pairs = list(zip(a.parameters(), b.parameters(), strict=True))
    num = sum(float((p.detach() - q.detach()).double().norm() ** 2) for p, q in pairs)
    den = sum(float(p.detach().double().norm() ** 2) for p, _ in pairs)
    return math.sqrt(num / den)


def _train(model, opt, batches, lm_loss, steps, after_step=None):
    for k in range(steps):
        opt.zero_grad()
        lm_loss(model, batches[k % len(batches)]).backward()
        opt.step()
        if after_step is not None:
            after_step()


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_alpha_beta_zero_is_adamw(impl, tiny_gpt2, lm_batches, lm_loss):
    ref, model = tiny_gpt2(), tiny_gpt2()
    adamw = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01, **ADAMW_TWIN[impl])
    horst = HORST(model.parameters(), lr=1e-3, weight_decay=0.01, alpha=0.0, beta=0.0, impl=impl)
    _train(ref, adamw, lm_batches, lm_loss, 100)
    _train(model, horst, lm_batches, lm_loss, 100)
    moved = _rel_err(ref, tiny_gpt2())
    assert moved > 1e-2, "the models must actually train for the comparison to mean anything"
    assert _rel_err(ref, model) <= 1e-6
    for p, q in zip(ref.parameters(), model.parameters(), strict=True):
        assert torch.equal(adamw.state[p]["step"], horst.state[q]["step"])
        torch.testing.assert_close(horst.state[q]["exp_avg_sq"], adamw.state[p]["exp_avg_sq"])


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_alpha_zero_beta_is_adamw_then_decay(impl, tiny_gpt2, lm_batches, lm_loss):
    lr, beta = 1e-3, 5.0
    ref, model = tiny_gpt2(), tiny_gpt2()
    adamw = torch.optim.AdamW(ref.parameters(), lr=lr, weight_decay=0.01, **ADAMW_TWIN[impl])
    horst = HORST(model.parameters(), lr=lr, weight_decay=0.01, alpha=0.0, beta=beta, impl=impl)

    def decay() -> None:
        with torch.no_grad():
            for p in ref.parameters():
                if p.ndim >= 2:
                    p.mul_(math.exp(-lr * beta))

    _train(ref, adamw, lm_batches, lm_loss, 30, decay)
    _train(model, horst, lm_batches, lm_loss, 30)
    assert _rel_err(ref, model) <= 1e-6  # without the decay the gap would be ~ 30 lr beta = 0.15


def _mixed_setup(impl: str):
    torch.manual_seed(3)
    shapes = [(37, 129), (2049,), (5, 7, 11), (64, 64), (3,), (4100,)]
    params = [torch.nn.Parameter(torch.randn(s) * 0.1) for s in shapes]
    groups = [
        {"params": params[:2], "alpha": 50.0},  # mirror=None: the matrix mirrors, the vector does not
        {"params": params[2:4], "mirror": True, "alpha": 2e4, "lr": 3e-3, "beta": 0.5},  # hits the clamp
        {"params": [], "alpha": 1.0},
        {"params": params[4:], "mirror": True, "exp_clamp": None, "weight_decay": 0.0},
    ]
    return params, HORST(groups, lr=1e-3, alpha=1.0, impl=impl)


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_fast_path_matches_reference_step_for_step(impl):
    fast_params, fast = _mixed_setup(impl)
    ref_params, ref = _mixed_setup("reference")
    gen = torch.Generator().manual_seed(0)
    for step in range(12):
        for i, (p, q) in enumerate(zip(fast_params, ref_params, strict=True)):
            if i == 5 and step % 3 == 0:
                p.grad = q.grad = None  # a parameter without a gradient on some steps
                continue
            g = torch.randn(p.shape, generator=gen) * (0.1 if i % 2 else 10.0)
            p.grad, q.grad = g.clone(), g.clone()
        fast.step()
        ref.step()
        for p, q in zip(fast_params, ref_params, strict=True):
            # Conditioning, not slack: one ulp of u becomes |x| ulps of exp(x) (|x| <= exp_clamp = 5 here),
            # and where p - u cancels, one ulp of u (u <= 3e-3: 2.3e-10) is scaled by exp(x) <= e^5.
            torch.testing.assert_close(p, q, rtol=5e-6, atol=5e-8)
            if p in fast.state:
                assert torch.equal(fast.state[p]["step"], ref.state[q]["step"])
                for key in ("exp_avg", "exp_avg_sq"):
                    torch.testing.assert_close(fast.state[p][key], ref.state[q][key], rtol=1e-6, atol=0)
                    fast.state[p][key].copy_(ref.state[q][key])
            with torch.no_grad():
                p.copy_(q)  # each step starts from the same state: rounding is compared, not its growth
    assert int(fast.state[fast_params[5]]["step"]) == 8


@pytest.mark.skipif(
    KERNEL is None, reason="fused C kernel unavailable (no C compiler, or DESCENTLAB_HORST_KERNEL=0)"
)
def test_kernel_matches_reference_on_large_tensor():
    """Small and large exponents and a block tail, against the reference to float32 rounding."""
    gen = torch.Generator().manual_seed(0)
    n = 7 * 512 + 77
    p = torch.randn(n, generator=gen)
    g = torch.randn(n, generator=gen) * torch.logspace(-3, 1, n)
    m, v = torch.randn(n, generator=gen) * 1e-2, torch.rand(n, generator=gen) * 1e-3
    opts = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, alpha=30.0, beta=0.1)
    ref = horst_reference(p, g, m, v, step=7, mirror=True, exp_clamp=5.0, nan_guard=True, **opts)
    x = -opts["alpha"] * torch.sign(ref.param) * (p - ref.param)
    assert (x.abs() < 1e-2).any() and (x.abs() > 1e-2).any(), "both exponent paths must be exercised"
    pk, mk, vk = p.clone(), m.clone(), v.clone()
    ss = [opts["lr"] / (1 - 0.9**7)]
    bc2 = [math.sqrt(1 - 0.999**7)]
    hp = HorstHyper(**opts, exp_clamp=5.0, nan_guard=True)
    assert hp.bias_corrections([7]) == (ss, bc2)
    assert KERNEL.horst_step_(Bucket([pk], [g], [mk], [vk], [7]), hp, mirror=True) == 0
    torch.testing.assert_close(pk, ref.param, rtol=4e-7, atol=0)  # the kernel exp: <= 1.04 ulp
    torch.testing.assert_close(mk, ref.exp_avg, rtol=2.5e-7, atol=0)
    torch.testing.assert_close(vk, ref.exp_avg_sq, rtol=2.5e-7, atol=0)


@pytest.mark.parametrize("impl", [*FAST_IMPLS, "reference"])
def test_nan_guard_reverts_only_bad_elements(impl):
    p = torch.nn.Parameter(torch.randn(8, 8))
    opt = HORST([p], lr=1e-2, impl=impl)
    p.grad = torch.randn(8, 8)
    opt.step()
    before = p.detach().clone()
    m_before = opt.state[p]["exp_avg"].clone()
    p.grad = torch.randn(8, 8)
    p.grad[2, 3] = float("nan")
    p.grad[5, 1] = float("inf")
    opt.step()
    assert opt.reverted == 2
    assert torch.isfinite(p).all()
    assert p[2, 3] == before[2, 3] and opt.state[p]["exp_avg"][5, 1] == m_before[5, 1]
    assert (p != before).sum() == 62


def test_bf16_params_update_in_float32():
    torch.manual_seed(0)
    w32 = torch.randn(16, 32)
    p = torch.nn.Parameter(w32.to(torch.bfloat16))
    opt = HORST([p], lr=1e-2, alpha=5.0)
    g = torch.randn(16, 32)
    p.grad = g.to(torch.bfloat16)
    opt.step()
    assert opt.state[p]["exp_avg"].dtype == torch.float32
    zeros = torch.zeros(16, 32)
    ref = horst_reference(
        w32.to(torch.bfloat16), g.to(torch.bfloat16), zeros, zeros, step=1, lr=1e-2, beta1=0.9,
        beta2=0.999, eps=1e-8, weight_decay=0.01, alpha=5.0, beta=0.0, mirror=True,
    )  # fmt: skip
    assert p.dtype == torch.bfloat16 and torch.equal(p.detach(), ref.param)
    assert torch.equal(opt.state[p]["exp_avg_sq"], ref.exp_avg_sq)


def _roundtrip(sd: dict) -> dict:
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_round_trip_is_exact(dtype, tiny_gpt2, lm_batches, lm_loss):
    a = tiny_gpt2().to(dtype)
    opt_a = HORST(horst_param_groups(a, verbose=False, alpha=3.0), lr=1e-3)
    _train(a, opt_a, lm_batches, lm_loss, 3)
    b = tiny_gpt2().to(dtype)
    b.load_state_dict(a.state_dict())
    opt_b = HORST(horst_param_groups(b, verbose=False), lr=5.0)
    opt_b.load_state_dict(_roundtrip(opt_a.state_dict()))
    assert opt_b.param_groups[0]["alpha"] == 3.0 and opt_b.param_groups[0]["lr"] == 1e-3
    _train(a, opt_a, lm_batches[3:], lm_loss, 3)
    _train(b, opt_b, lm_batches[3:], lm_loss, 3)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt_a.state[p][key], opt_b.state[q][key])


def test_adamw_state_dict_loads_into_horst(tiny_gpt2, lm_batches, lm_loss):
    a, b = tiny_gpt2(), tiny_gpt2()
    adamw = torch.optim.AdamW(a.parameters(), lr=1e-3, weight_decay=0.01)
    _train(a, adamw, lm_batches, lm_loss, 3)
    b.load_state_dict(a.state_dict())
    horst = HORST(b.parameters(), alpha=0.0, impl="foreach")
    horst.load_state_dict(_roundtrip(adamw.state_dict()))
    assert horst.param_groups[0]["alpha"] == 0.0 and horst.param_groups[0]["mirror"] is None
    _train(a, adamw, lm_batches[3:], lm_loss, 3)
    _train(b, horst, lm_batches[3:], lm_loss, 3)
    assert _rel_err(a, b) <= 1e-6


def test_compose_adam_mirror_after_is_horst(tiny_gpt2, lm_batches, lm_loss):
    a, b = tiny_gpt2(), tiny_gpt2()
    horst = HORST(a.parameters(), lr=2e-3, weight_decay=0.05, alpha=20.0, beta=0.3, impl="foreach")
    mirror = HyperbolicMirror(alpha=20.0, beta=0.3, exp_clamp=5.0)
    composed = compose(b.parameters(), "adam", mirror, "mirror_after", lr=2e-3, weight_decay=0.05)
    _train(a, horst, lm_batches, lm_loss, 10)
    _train(b, composed, lm_batches, lm_loss, 10)
    assert _rel_err(a, b) <= 1e-6
    assert _rel_err(a, tiny_gpt2()) > 1e-2


def test_param_groups_and_errors(tiny_gpt2, capsys):
    model = tiny_gpt2()
    groups = horst_param_groups(model, no_mirror_weight_decay=0.0)
    out = capsys.readouterr().out
    assert "'mirror'" in out and "'no_mirror'" in out
    assert all(p.ndim >= 2 for p in groups[0]["params"]) and all(p.ndim < 2 for p in groups[1]["params"])
    assert groups[0]["num_params"] + groups[1]["num_params"] == sum(p.numel() for p in model.parameters())
    assert groups[1]["weight_decay"] == 0.0
    with pytest.raises(ConfigError):
        HORST(model.parameters(), alpha=-1.0)
    with pytest.raises(ConfigError):
        HORST(model.parameters(), impl="numba")


def test_fsdp2_dtensor_params_take_the_foreach_path(tmp_path):
    """FSDP2 turns parameters into DTensors: HORST must step them and match a plain model exactly."""
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
        fully_shard(sharded)
        opts = [
            HORST(sharded.parameters(), lr=1e-2, alpha=5.0),
            HORST(plain.parameters(), lr=1e-2, alpha=5.0, impl="foreach"),
        ]
        x = torch.randn(4, 8)
        for _ in range(3):
            for model, opt in zip((sharded, plain), opts, strict=True):
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
        for a, b in zip(sharded.parameters(), plain.parameters(), strict=True):
            assert type(a).__name__ == "DTensor"
            assert torch.equal(a.full_tensor().detach(), b.detach())
    finally:
        dist.destroy_process_group()
