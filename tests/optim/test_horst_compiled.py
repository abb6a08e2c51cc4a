"""HORST's torch.compile path, compiled here on CPU by Inductor (C++), against horst_reference and AdamW.

The same code compiles to Triton on CUDA, where ``impl="auto"`` selects it; no test here needs a GPU.
"""

from __future__ import annotations

import math

import pytest
import torch

from descentlab.optim import _horst_compiled
from descentlab.optim.horst import HORST

CAN_COMPILE = _horst_compiled.can_compile(torch.device("cpu"))
pytestmark = pytest.mark.skipif(
    not CAN_COMPILE, reason="Inductor cannot compile for CPU here (no C++ compiler)"
)


def _setup(impl: str, seed: int = 3):
    torch.manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s) * 0.1) for s in [(37, 29), (300,), (16, 16)]]
    groups = [
        {"params": params[:2], "alpha": 30.0, "beta": 0.5},  # mirror=None: the matrix mirrors, the vector not
        {"params": params[2:], "mirror": True, "alpha": 2e4, "lr": 3e-3},  # hits the exponent clamp
    ]
    return params, HORST(groups, lr=1e-3, weight_decay=0.01, impl=impl)


def test_compiled_matches_reference_without_recompiling_over_a_schedule():
    from torch._dynamo.utils import counters

    fast_params, fast = _setup("compiled")
    ref_params, ref = _setup("reference")
    schedules = [
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=8, eta_min=1e-5) for opt in (fast, ref)
    ]
    gen = torch.Generator().manual_seed(0)
    graphs = None
    for step in range(8):
        for i, (p, q) in enumerate(zip(fast_params, ref_params, strict=True)):
            g = torch.randn(p.shape, generator=gen) * (0.1 if i % 2 else 10.0)
            if step == 5 and i == 0:
                g[0, 0] = float("nan")  # the NaN guard reverts one element
            p.grad, q.grad = g.clone(), g.clone()
        for opt in (fast, ref):
            opt.param_groups[0]["alpha"] = 30.0 + step  # alpha changes too: a tensor, no recompile
            opt.step()
        for sched in schedules:
            sched.step()
        assert fast.reverted == ref.reverted == (1 if step == 5 else 0)
        if step == 0:
            graphs = counters["stats"]["unique_graphs"]
        for p, q in zip(fast_params, ref_params, strict=True):
            # Inductor's own lerp / addcmul rounding: ulps of u, times |x| <= 5 through exp(x)
            torch.testing.assert_close(p, q, rtol=5e-6, atol=5e-8)
            for key in ("exp_avg", "exp_avg_sq"):
                # where m0 and (1 - beta1)(g - m0) ~ 1 cancel, an ulp of the terms (6e-8) is all that is left
                torch.testing.assert_close(fast.state[p][key], ref.state[q][key], rtol=1e-6, atol=1e-7)
                fast.state[p][key].copy_(ref.state[q][key])
            assert torch.equal(fast.state[p]["step"], ref.state[q]["step"])
            with torch.no_grad():
                p.copy_(q)  # rounding is compared step by step, not its growth
    assert graphs is not None and graphs >= 1
    assert counters["stats"]["unique_graphs"] == graphs, "a learning-rate / alpha schedule recompiled"


def test_compiled_alpha_beta_zero_is_adamw():
    """With maximize=True on both sides (one graph: the compiled maximize path at no extra compile; the
    other compiled tests run maximize=False)."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s) * 0.1) for s in [(37, 29), (300,), (16, 16)]]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    start = [p.detach().clone() for p in params]
    horst = HORST(
        params, lr=1e-3, weight_decay=0.01, alpha=0.0, beta=0.0, mirror=True, impl="compiled", maximize=True
    )
    adamw = torch.optim.AdamW(twins, lr=1e-3, weight_decay=0.01, maximize=True)
    gen = torch.Generator().manual_seed(1)
    for _ in range(30):
        for p, q in zip(params, twins, strict=True):
            g = torch.randn(p.shape, generator=gen)
            p.grad, q.grad = g.clone(), g.clone()
        horst.step()
        adamw.step()

    def rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
        num = sum(float((x.detach() - y.detach()).double().norm() ** 2) for x, y in zip(a, b, strict=True))
        return math.sqrt(num / sum(float(y.detach().double().norm() ** 2) for y in b))

    assert rel(twins, start) > 1e-2, "the parameters must move for the comparison to mean anything"
    assert rel(params, twins) <= 1e-6


def test_auto_on_cpu_keeps_the_kernel_and_dtensor_rule():
    p = torch.nn.Parameter(torch.randn(8, 8))
    opt = HORST([p], impl="auto")
    m = torch.zeros(8, 8)
    from descentlab.optim._horst_kernel import load_kernel

    kernel = load_kernel()
    assert opt._path("auto", kernel, p, m, m, m)[0] == ("kernel" if kernel is not None else "foreach")
    assert opt._path("compiled", None, p, m, m, m) == ("compiled", "")
    assert opt._path("compiled", None, p.double(), m.double(), m.double(), m.double()) == ("foreach", "")


def _bf16_step(opt, params, n=3):
    for _ in range(n):
        for q in params:
            q.grad = torch.randn_like(q)
        opt.step()


def test_auto_compile_failure_warns_once_and_is_recorded(monkeypatch):
    """At dynamo's recompile limit the fullgraph compile raises: auto (as on CUDA) falls back to foreach with
    one warning and a record, and gives the reference's result."""
    from torch._dynamo.exc import FailOnRecompileLimitHit

    from descentlab.optim import horst

    monkeypatch.setattr(horst, "_is_cuda", lambda p: True)  # CPU tensors follow the CUDA rules

    def boom(*args, **kwargs):
        raise FailOnRecompileLimitHit("recompile_limit reached with fullgraph=True")

    monkeypatch.setattr(_horst_compiled, "horst_compiled_", boom)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(8, 8).bfloat16()), torch.nn.Parameter(torch.randn(5).bfloat16())]
    ref_params = [torch.nn.Parameter(q.detach().clone()) for q in params]
    opt = HORST(params, lr=1e-2, impl="auto")
    ref = HORST(ref_params, lr=1e-2, impl="foreach")
    with pytest.warns(RuntimeWarning, match="FailOnRecompileLimitHit") as record:
        for _ in range(3):
            torch.manual_seed(1)
            _bf16_step(opt, params, 1)
            torch.manual_seed(1)
            _bf16_step(ref, ref_params, 1)
    assert sum("compiled step could not be used" in str(w.message) for w in record) == 1
    assert opt.fallbacks == {"compile": 6}  # 2 tensors x 3 steps
    assert opt.fallbacks_total == 6
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params, strict=True))
    saved = opt.state_dict()
    assert saved["param_groups"][0]["fallbacks"] == 6
    again = HORST([torch.nn.Parameter(q.detach().clone()) for q in params], lr=1e-2)
    again.load_state_dict(saved)
    assert again.fallbacks_total == 6


def test_impl_fused_on_cuda_takes_the_compiled_step(monkeypatch):
    from descentlab.optim import horst

    monkeypatch.setattr(horst, "_is_cuda", lambda p: True)
    p = torch.nn.Parameter(torch.randn(4, 4).bfloat16())  # the CPU kernel is float32 only
    m = torch.zeros(4, 4)
    opt = HORST([p], impl="auto")
    assert opt._path("fused", None, p, m, m, p) == ("compiled", "")
    assert opt._path("auto", None, p, m, m, p) == ("compiled", "")
    opt._compile_failed = True
    assert opt._path("fused", None, p, m, m, p) == ("foreach", "compile")


def test_real_recompile_limit_raises_under_fullgraph():
    """The torch behaviour the fallback guards against (checked on CPU Inductor)."""
    from torch._dynamo.exc import FailOnRecompileLimitHit

    torch._dynamo.reset()
    _horst_compiled.compiled_step.cache_clear()
    params = [torch.nn.Parameter(torch.randn(3, 3)), torch.nn.Parameter(torch.randn(4, 4))]
    opt = HORST(params, lr=1e-2, impl="compiled", nan_guard=False)
    try:
        with torch._dynamo.config.patch(recompile_limit=1, automatic_dynamic_shapes=False):
            params[0].grad = torch.randn(3, 3)
            opt.step()  # graph 1: one (3, 3) tensor
            params[1].grad = torch.randn(4, 4)
            with pytest.raises(FailOnRecompileLimitHit):
                opt.step()  # graph 2: another bucket signature, past the limit of 1
    finally:
        torch._dynamo.reset()
        _horst_compiled.compiled_step.cache_clear()
