"""The fused CPU kernel: its own exponential (ulp bound), and the step against horst_reference and AdamW."""

from __future__ import annotations

import ctypes
import math
import mmap

import numpy as np
import pytest
import torch

from descentlab.optim._horst_kernel import load_kernel
from descentlab.optim.functional import Bucket, HorstHyper
from descentlab.optim.horst import HORST, horst_reference

KERNEL = load_kernel()
pytestmark = pytest.mark.skipif(
    KERNEL is None, reason="fused C kernel unavailable (no C compiler, or DESCENTLAB_HORST_KERNEL=0)"
)
MAX_ULP = 1.05  # measured: 1.037 over [-104, 89], 0.992 over [-80, 80], 0.505 over [-1e-2, 1e-2]


def _ulp_error(y: torch.Tensor, x: torch.Tensor) -> np.ndarray:
    """|y - exp(x)| in units of the float32 spacing at exp(x), exp computed in float64 (exact to ~1e-16)."""
    exact = np.exp(x.double().numpy())
    with np.errstate(over="ignore"):
        exact32 = exact.astype(np.float32)
    spacing = np.spacing(np.abs(exact32)).astype(np.float64)
    spacing = np.where(exact32 == 0, float(np.float32(2.0**-149)), spacing)  # the smallest denormal
    finite = np.isfinite(exact32)
    yd = y.double().numpy()
    with np.errstate(invalid="ignore"):
        return np.where(finite, np.abs(yd - exact) / spacing, np.where(yd == exact32, 0.0, np.inf))


def _inputs() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (2_000_000,), generator=gen, dtype=torch.int64)
    random = bits.to(torch.int32).view(torch.float32)
    edges = [0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1e-38, 1e-30, -1e-30, 1e-10, -1e-10, 5.0, -5.0]
    edges += [
        math.nextafter(5.0, 0),
        math.nextafter(-5.0, 0),
        88.72,
        88.73,
        -87.33,
        -103.9,
        -103.97,
        -200.0,
        200.0,
    ]
    return torch.cat([
        torch.linspace(-104.0, 89.0, 1_000_001),  # the whole range: overflow, denormal results, 0
        torch.linspace(-5.0, 5.0, 1_000_001),  # the default exponent clamp
        torch.linspace(-1e-2, 1e-2, 200_001),  # the exponents of normal training, |alpha lr| ~ 1e-3
        random[random.abs() < 120],  # every binade, denormal inputs included
        torch.tensor(edges),
    ])  # fmt: skip


def test_kernel_exp_is_within_an_ulp_of_exp():
    x = _inputs()
    err = _ulp_error(KERNEL.expf(x), x)
    assert err.max() <= MAX_ULP, f"max {err.max():.3f} ulp at x = {x[int(err.argmax())].item()!r}"
    assert err.mean() < 0.3
    bounded = x[x.abs() <= 80]
    assert _ulp_error(KERNEL.expf(bounded, bounded=True), bounded).max() <= MAX_ULP
    # against torch.exp (<= ~0.57 ulp here): within the sum of the two bounds
    ref = torch.exp(x)
    finite = torch.isfinite(ref) & (ref > 1e-37)
    rel = ((KERNEL.expf(x) - ref).abs() / ref)[finite]
    assert float(rel.max()) <= (MAX_ULP + 0.6) * 2.0**-23


def test_kernel_exp_special_values():
    x = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 89.0, -104.0, 1e-45])
    y = KERNEL.expf(x)
    assert y[0] == 1 and y[1] == 1 and y[7] == 1  # exp(0) exactly 1: alpha = beta = 0 is AdamW bit for bit
    assert y[2] == float("inf") and y[3] == 0 and torch.isnan(y[4])
    assert y[5] == float("inf") and y[6] == 0
    with pytest.raises(ValueError):
        KERNEL.expf(torch.tensor([81.0]), bounded=True)


def _state(n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(n, generator=gen) * 0.05
    p[::97] = 0.0  # sign(0) = 0
    g = torch.randn(n, generator=gen) * torch.logspace(-4, 1, n)
    m, v = torch.randn(n, generator=gen) * 1e-2, torch.rand(n, generator=gen) * 1e-3
    return p, g, m, v


@pytest.mark.parametrize("alpha", [0.0, 1.0, 10.0, 30.0])
@pytest.mark.parametrize("exp_clamp", [5.0, None])
def test_kernel_step_matches_reference(alpha, exp_clamp):
    n = 9 * 512 + 77  # several blocks and a tail
    p, g, m, v = _state(n, seed=int(alpha))
    opts = dict(lr=3e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, alpha=alpha, beta=0.5)
    ref = horst_reference(p, g, m, v, step=5, mirror=True, exp_clamp=exp_clamp, nan_guard=True, **opts)
    pk, mk, vk = p.clone(), m.clone(), v.clone()
    ss, bc2 = [opts["lr"] / (1 - 0.9**5)], [math.sqrt(1 - 0.999**5)]
    hp = HorstHyper(**opts, exp_clamp=exp_clamp, nan_guard=True)
    assert hp.bias_corrections([5]) == (ss, bc2)
    assert KERNEL.horst_step_(Bucket([pk], [g], [mk], [vk], [5]), hp, mirror=True) == 0
    # moments: the fused-AdamW rounding (fma lerp, correctly rounded sqrt) against the default's
    torch.testing.assert_close(mk, ref.exp_avg, rtol=2.5e-7, atol=0)
    torch.testing.assert_close(vk, ref.exp_avg_sq, rtol=2.5e-7, atol=0)
    # p: <= 1.05 ulp of exp plus the reference's own exp (<= 0.57 ulp) plus one ulp of u times |x| <= 5
    torch.testing.assert_close(pk, ref.param, rtol=8e-7, atol=1e-9)
    if alpha == 30.0:  # many exponents beyond the old cubic's range |x| < 1e-2
        p_half = p * (1 - opts["lr"] * 0.01) - (mk * ss[0]) / (vk.sqrt() / bc2[0] + 1e-8)
        x = -alpha * torch.sign(p_half) * (mk * ss[0]) / (vk.sqrt() / bc2[0] + 1e-8)
        assert float((x.abs() > 1e-2).float().mean()) > 0.3 and float(x.abs().max()) > 0.5


def test_kernel_alpha_beta_zero_is_fused_adamw_bit_for_bit():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s) * 0.1) for s in [(64, 33), (1000,), (7, 5, 3)]]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    horst = HORST(params, lr=1e-3, weight_decay=0.01, alpha=0.0, beta=0.0, mirror=True, impl="fused")
    adamw = torch.optim.AdamW(twins, lr=1e-3, weight_decay=0.01, fused=True)
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        for p, q in zip(params, twins, strict=True):
            g = torch.randn(p.shape, generator=gen)
            p.grad, q.grad = g.clone(), g.clone()
        horst.step()
        adamw.step()
    for p, q in zip(params, twins, strict=True):
        assert torch.equal(p, q)  # the parameters bit for bit (exp(0) = 1 exactly)
        assert torch.equal(horst.state[p]["exp_avg"], adamw.state[q]["exp_avg"])
        torch.testing.assert_close(
            horst.state[p]["exp_avg_sq"], adamw.state[q]["exp_avg_sq"], rtol=2.5e-7, atol=0
        )


def test_kernel_nan_guard_and_unclamped_overflow():
    n = 600
    p, g, m, v = _state(n, seed=3)
    g[5], g[300] = float("nan"), float("inf")
    opts = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, alpha=1e5, beta=0.0)
    ref = horst_reference(p, g, m, v, step=1, mirror=True, exp_clamp=None, nan_guard=True, **opts)
    pk, mk, vk = p.clone(), m.clone(), v.clone()
    hp = HorstHyper(**opts, exp_clamp=None, nan_guard=True)
    reverted = KERNEL.horst_step_(Bucket([pk], [g], [mk], [vk], [1]), hp, mirror=True)
    assert reverted == ref.reverted and reverted >= 2  # overflowing exp(x) too, not only the bad gradients
    assert torch.equal(pk[5], p[5]) and torch.equal(mk[300], m[300])
    # |x| up to 89 here: one ulp of u becomes ~89 ulps of exp(x), hence the looser tolerance
    torch.testing.assert_close(pk, ref.param, rtol=2e-4, atol=0)


PORTABLE = load_kernel(portable=True)
needs_both = pytest.mark.skipif(
    KERNEL is None or KERNEL.simd_width == 0 or PORTABLE is None or PORTABLE.simd_width != 0,
    reason="this CPU / compiler runs the portable loop only: there is no second path to compare",
)


@needs_both
def test_avx512_exp_matches_the_portable_loop_bit_for_bit():
    x = _inputs()
    x = torch.cat([x, torch.tensor([float("inf"), -float("inf"), float("nan"), -float("nan")])])
    for n in (1, 15, 16, 17, x.numel()):  # tails of every kind
        assert torch.equal(KERNEL.expf(x[:n]).view(torch.int32), PORTABLE.expf(x[:n]).view(torch.int32))
    bounded = x[x.abs() <= 80]
    assert torch.equal(
        KERNEL.expf(bounded, bounded=True).view(torch.int32),
        PORTABLE.expf(bounded, bounded=True).view(torch.int32),
    )


def _hostile_state(n: int, seed: int):
    """A step's inputs with what the guard and the exponent's edges must survive."""
    p, g, m, v = _state(n, seed)
    gen = torch.Generator().manual_seed(seed + 100)
    bad = torch.randint(0, n, (max(1, n // 50),), generator=gen)
    g[bad[::3]] = float("nan")
    g[bad[1::3]] = float("inf")
    p[bad[2::3]] = -float("inf")
    p[torch.randint(0, n, (max(1, n // 40),), generator=gen)] = 1e4  # p exp(x) overflows at large x
    p[:: max(1, n // 7)] = -0.0
    return p, g, m, v


@needs_both
@pytest.mark.parametrize("mirror", [True, False])
@pytest.mark.parametrize("exp_clamp", [5.0, 80.0, None])
@pytest.mark.parametrize("nan_guard", [True, False])
def test_avx512_step_matches_the_portable_loop_bit_for_bit(mirror, exp_clamp, nan_guard):
    sizes = [1, 15, 16, 17, 511, 512, 513, 3 * 512 + 77]  # one bucket: block tails and vector tails
    states = [_hostile_state(n, seed=k) for k, n in enumerate(sizes)]
    opts = dict(lr=5e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, alpha=-3e3, beta=0.5)
    hp = HorstHyper(**opts, exp_clamp=exp_clamp, nan_guard=nan_guard)  # alpha < 0: copysign uses |alpha|
    counts, results = [], []
    for kernel in (KERNEL, PORTABLE):
        ps, ms, vs = ([s[i].clone() for s in states] for i in (0, 2, 3))
        grads = [s[1] for s in states]
        bucket = Bucket(ps, grads, ms, vs, list(range(1, len(sizes) + 1)))
        counts.append(kernel.horst_step_(bucket, hp, mirror=mirror))
        results.append([t.view(torch.int32) for t in (*ps, *ms, *vs)])
    assert counts[0] == counts[1]
    if nan_guard:
        assert counts[0] > 0  # the hostile entries did reach the guard
    for fast, twin in zip(*results, strict=True):
        assert torch.equal(fast, twin)


_GUARD_PAGES = []  # the mappings stay alive as long as the tensors on them


def _at_page_end(values: torch.Tensor) -> torch.Tensor:
    """A copy of ``values`` whose last element ends a page followed by an unreadable one (PROT_NONE), so
    that a read or write past the end segfaults instead of passing unnoticed."""
    page = mmap.PAGESIZE
    nbytes = values.numel() * 4
    pages = -(-nbytes // page)
    buf = mmap.mmap(-1, (pages + 1) * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.mprotect(base + pages * page, page, 0) != 0:  # PROT_NONE
        pytest.skip("mprotect unavailable")
    _GUARD_PAGES.append(buf)
    out = torch.frombuffer(buf, dtype=torch.float32, count=values.numel(), offset=pages * page - nbytes)
    out.copy_(values)
    return out


@pytest.mark.parametrize("n", [1, 15, 17, 513])
def test_kernel_reads_and_writes_nothing_past_a_tensor(n):
    x = _at_page_end(torch.linspace(-3.0, 3.0, n))
    assert torch.equal(KERNEL.expf(x), PORTABLE.expf(x.clone()))
    p, g, m, v = (_at_page_end(t) for t in _state(n, seed=n))
    hp = HorstHyper(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, alpha=3.0, beta=0.0,
                    exp_clamp=5.0, nan_guard=True)  # fmt: skip
    twin = [t.clone() for t in (p, g, m, v)]
    assert KERNEL.horst_step_(Bucket([p], [g], [m], [v], [1]), hp, mirror=True) == 0
    PORTABLE.horst_step_(Bucket([twin[0]], [twin[1]], [twin[2]], [twin[3]], [1]), hp, mirror=True)
    assert torch.equal(p, twin[0]) and torch.equal(m, twin[2]) and torch.equal(v, twin[3])
