"""The chunked linear cross-entropy against its slow twin (plain autograd, all logits at once)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from descentlab.linear_cross_entropy import linear_cross_entropy, linear_cross_entropy_reference

N, H, V = 23, 12, 37


def _case(dtype: torch.dtype, *, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, H, generator=g).to(dtype).requires_grad_(True)
    w = (torch.randn(V, H, generator=g) / H**0.5).to(dtype).requires_grad_(True)
    b = (torch.randn(V, generator=g) * 0.1).to(dtype).requires_grad_(True) if bias else None
    y = torch.randint(0, V, (N,), generator=g)
    y[[2, 5, 17]] = -100
    return x, w, b, y


def _grads(fn, x, w, b, y, reduction: str, weights: torch.Tensor | None, **kw):
    for t in (x, w, b):
        if t is not None:
            t.grad = None
    loss = fn(x, w, y, b, reduction=reduction, **kw)
    (loss * weights).sum().backward() if reduction == "none" else (2.5 * loss).backward()
    grads = [t.grad.clone() for t in (x, w, b) if t is not None]
    return loss.detach(), grads


TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-6}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


def _close(a: torch.Tensor, r: torch.Tensor, dtype: torch.dtype) -> None:
    """fp32: elementwise; bf16: both round differently (each sums bf16 products), so compare the tensors'
    relative distance, which a wrong formula would put near 1."""
    if dtype == torch.float32:
        torch.testing.assert_close(a, r, **TOL[dtype])
    else:
        assert float((a.float() - r.float()).norm() / r.float().norm()) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", [1, 4, 7, 64])
def test_values_and_gradients_match_plain_autograd(dtype, reduction, chunk) -> None:
    x, w, b, y = _case(dtype, bias=chunk == 7)
    weights = torch.rand(N, generator=torch.Generator().manual_seed(3))
    ref, g_ref = _grads(linear_cross_entropy_reference, x, w, b, y, reduction, weights)
    got, g_got = _grads(linear_cross_entropy, x, w, b, y, reduction, weights, chunk_size=chunk)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref.float(), **TOL[dtype])
    for a, r in zip(g_got, g_ref, strict=True):
        assert a.dtype == r.dtype
        _close(a, r, dtype)
    if reduction == "none":
        assert (got[[2, 5, 17]] == 0).all()


class _Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, H))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_rows_transform_scale_and_softcap(reduction) -> None:
    """Scored rows picked by index from a [B, T, H] state, a norm before the head, Gemma-style capping."""
    g = torch.Generator().manual_seed(1)
    state = torch.randn(3, 9, H, generator=g, requires_grad=True)
    rows = torch.tensor([0, 4, 5, 8, 10, 11, 20, 25, 26, 13])
    w = torch.randn(V, H, generator=g, requires_grad=True)
    y = torch.randint(0, V, (len(rows),), generator=g)
    y[3] = -100
    weights = torch.rand(len(rows), generator=g)
    results = []
    for fn, extra in ((linear_cross_entropy_reference, {}), (linear_cross_entropy, {"chunk_size": 3})):
        norm = _Norm()
        if fn is linear_cross_entropy:
            extra = {**extra, "transform_params": list(norm.parameters())}
        state.grad = w.grad = None
        loss = fn(
            state, w, y, rows=rows, transform=norm, reduction=reduction, scale=0.7, softcap=4.0, **extra
        )
        (loss * weights).sum().backward() if reduction == "none" else loss.backward()
        results.append((loss.detach(), state.grad.clone(), w.grad.clone(), norm.weight.grad.clone()))
    for a, r in zip(*results, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-6)
    assert (results[1][1].view(-1, H)[[1, 2, 3]] == 0).all()  # unscored rows get no gradient


def test_no_grad_path_and_frozen_head() -> None:
    x, w, b, y = _case(torch.float32, bias=True)
    with torch.no_grad():
        got = linear_cross_entropy(x, w, y, b, chunk_size=5)
    torch.testing.assert_close(got, linear_cross_entropy_reference(x, w, y, b).detach())
    w_frozen = w.detach()
    x.grad = None
    linear_cross_entropy(x, w_frozen, y, chunk_size=5).backward()
    ref = x.detach().clone().requires_grad_(True)
    linear_cross_entropy_reference(ref, w_frozen, y).backward()
    torch.testing.assert_close(x.grad, ref.grad)


def test_all_targets_ignored_gives_zero_and_bad_arguments_raise() -> None:
    x, w, _, y = _case(torch.float32, bias=False)
    loss = linear_cross_entropy(x, w, torch.full_like(y, -100), chunk_size=4)
    loss.backward()
    assert float(loss.detach()) == 0.0 and (x.grad == 0).all()
    with pytest.raises(ValueError):
        linear_cross_entropy(x, w, y, reduction="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        linear_cross_entropy(x, w, y, chunk_size=0)
    with pytest.raises(ValueError):
        linear_cross_entropy(x, w, y[:-1])


class _HeadMatmuls(TorchDispatchMode):
    """Records the dtypes of every matmul that has a vocabulary-sized operand (the head's)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.dtypes = vocab, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _MATMULS:
            mats = [a for a in args if isinstance(a, torch.Tensor) and a.dim() == 2]
            if any(self.vocab in a.shape for a in mats):
                self.dtypes.append(tuple(a.dtype for a in mats))
        return func(*args, **(kwargs or {}))


_MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.addmm_.default)
VH = 257  # a vocabulary no other dimension shares


def _autocast_case():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(64, 32, generator=g, requires_grad=True)
    w = (torch.randn(VH, 32, generator=g) / 32**0.5).requires_grad_(True)
    y = torch.randint(0, VH, (64,), generator=g)
    y[[3, 9]] = -100
    return x, w, y


def _run(fn, x, w, y, reduction, autocast: bool, **kw):
    x.grad = w.grad = None
    with _HeadMatmuls(VH) as rec:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = fn(x, w, y, reduction=reduction, **kw)
        (loss.sum() if reduction == "none" else loss).backward()  # backward outside autocast, as in fit
    return loss.detach(), x.grad.clone(), w.grad.clone(), rec.dtypes


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_under_autocast_the_head_runs_in_bf16_and_matches_fp32(reduction) -> None:
    """fp32 weights under bf16 autocast (as ``fit`` runs with mixed_precision="bf16"): every head matmul,
    forward and backward, runs in bf16 as the model's own nn.Linear head would; the logsumexp is float32.
    Stated tolerance against the fp32 computation: loss 2e-3 relative (measured 1.8e-5 for the mean, 4.7e-4
    for the per-row losses), gradients 1e-2 relative (measured 2.7e-3, the same as plain autograd under
    autocast: 2.5e-3 / 2.7e-3)."""
    x, w, y = _autocast_case()
    ref, gx_ref, gw_ref, fp32_dtypes = _run(linear_cross_entropy, x, w, y, reduction, False, chunk_size=16)
    assert fp32_dtypes and all(set(d) == {torch.float32} for d in fp32_dtypes)  # the recorder sees dtypes
    got, gx, gw, dtypes = _run(linear_cross_entropy, x, w, y, reduction, True, chunk_size=16)
    # 4 chunks: mean, 3 matmuls each (logits, ∂W, ∂x) in the forward; none, 1 + 3 (recomputed logits)
    assert len(dtypes) == (12 if reduction == "mean" else 16)
    assert all(set(d) == {torch.bfloat16} for d in dtypes), dtypes
    assert got.dtype == torch.float32 and gw.dtype == torch.float32 and gx.dtype == torch.float32

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / b.norm())

    assert rel(got, ref) < 2e-3
    assert rel(gw, gw_ref) < 1e-2 and rel(gx, gx_ref) < 1e-2
    # and as close to plain autograd under the same autocast as bf16 rounding allows
    twin, gx_twin, gw_twin, twin_dtypes = _run(linear_cross_entropy_reference, x, w, y, reduction, True)
    assert twin_dtypes and all(set(d) == {torch.bfloat16} for d in twin_dtypes)
    assert rel(got, twin) < 1e-3 and rel(gw, gw_twin) < 1e-2 and rel(gx, gx_twin) < 1e-2


class _Outputs(TorchDispatchMode):
    """Records the dtype of every op output shaped like ``shape``."""

    def __init__(self, shape: torch.Size) -> None:
        super().__init__()
        self.shape, self.dtypes = tuple(shape), set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and tuple(t.shape) == self.shape:
                self.dtypes.add(t.dtype)
        return out


def test_under_fp16_autocast_the_head_keeps_its_weight_dtype() -> None:
    """fp16 would underflow the forward-formed gradients softmax / N before a loss scale reaches them."""
    x, w, y = _autocast_case()
    x.grad = w.grad = None
    with _HeadMatmuls(VH) as rec:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = linear_cross_entropy(x, w, y, chunk_size=16)
        loss.backward()
    assert rec.dtypes and all(set(d) == {torch.float32} for d in rec.dtypes)
    torch.testing.assert_close(loss.detach(), linear_cross_entropy_reference(x, w, y).detach())


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_no_float32_head_gradient_buffer_beside_bf16_weights_unless_asked(reduction) -> None:
    """The W gradient is summed over chunks in W's own dtype: beside a bf16 head no float32 [V, H] tensor
    is ever made (2.1 GB at Llama-3 8B's head), and with grad_dtype=torch.float32 it is."""
    x, w, b, y = _case(torch.bfloat16, bias=True)
    weights = torch.rand(N, generator=torch.Generator().manual_seed(3))
    for grad_dtype, made in ((None, {torch.bfloat16}), (torch.float32, {torch.bfloat16, torch.float32})):
        w.grad = None
        with _Outputs(w.shape) as rec:
            loss = linear_cross_entropy(x, w, y, b, chunk_size=4, reduction=reduction, grad_dtype=grad_dtype)
            (loss * weights).sum().backward() if reduction == "none" else loss.backward()
        assert rec.dtypes == made, (grad_dtype, rec.dtypes)
        assert w.grad.dtype == torch.bfloat16
