"""The chunked linear cross-entropy against its slow twin (plain autograd, all logits at once)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

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
