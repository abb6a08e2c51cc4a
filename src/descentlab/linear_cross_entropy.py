"""Cross-entropy of a linear head, chunk by chunk, with its gradients computed in the same pass.

For rows x_i (optionally through a transform T, e.g. a final norm) and a head (W, b):

    t_i = T(x_i),    z_i = s · (W t_i + b),    z_i <- c · tanh(z_i / c)   (soft-cap c, optional)
    loss_i = logsumexp(z_i) - z_i[y_i]                                        (0 where y_i = ignore_index)
    ∂loss_i/∂(W t_i + b) = s · (softmax(z_i) - e_{y_i}) ⊙ (1 - tanh²(·))      (the last factor with a cap)

The rows are taken ``chunk_size`` at a time, so only one ``[chunk, V]`` logit block ever exists; nothing of
it is kept for the backward pass, and no slice of the input is either.

Precision. The head matmuls (W t, and the two gradient matmuls) run in the *compute dtype*: the autocast
dtype of x's device when the call is made under bf16 ``torch.autocast`` (fp32 weights and bf16 matmuls, as
the model's own ``nn.Linear`` head runs there), else the weight's dtype. Under fp16 autocast the head keeps
the weight's dtype: a mean or sum forms its gradients in the forward pass, before a GradScaler's loss
scale multiplies them, and softmax(z) / N would underflow float16. It is fixed at the call, so the
backward pass (which autograd runs outside autocast) uses the same one. The logits are widened to float32
before the scale, cap, logsumexp and softmax, so the normaliser and the loss are accumulated in float32
whatever the matmul dtype. The summed gradients of W and b are accumulated chunk by chunk in the
parameter's own dtype (fp32 weights: fp32, as autograd's ``.grad``; bf16 weights: bf16, one rounding per
chunk), so no float32 ``[V, H]`` buffer exists beside a bf16 weight unless ``grad_dtype=torch.float32``
asks for one.

* ``reduction="mean"`` / ``"sum"`` (a scalar): the forward pass also computes the gradients with respect
  to x, W, b and T's parameters, chunk by chunk, and keeps only those; the backward pass multiplies them
  by ``grad_output``. Three head matmuls per row, as for plain autograd, and no logits held.
* ``reduction="none"`` (a loss per row): every row's weight in the final loss is known only in the
  backward pass, and the gradient of W sums over rows with those weights, so it cannot be formed ahead.
  The forward pass keeps only logsumexp per row; the backward pass recomputes each chunk's logits once
  and writes the gradients in place (four head matmuls per row, against three plus a stored logit block
  with autograd).

:func:`linear_cross_entropy_reference` is the slow twin: the same quantity through plain torch autograd,
all logits at once. This module imports nothing from descentlab.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100
Reduction = Literal["none", "mean", "sum"]
Transform = Callable[[Tensor], Tensor]


@dataclasses.dataclass(frozen=True)
class _Options:
    chunk_size: int
    reduction: Reduction
    ignore_index: int
    scale: float | None
    softcap: float | None
    transform: Transform | None
    compute_dtype: torch.dtype | None = None  # the head matmuls' dtype (None: the weight's)
    grad_dtype: torch.dtype | None = None  # accumulator of the summed W / b gradients (None: the weight's)


def _mm_dtype(weight: Tensor, opt: _Options) -> torch.dtype:
    return opt.compute_dtype if opt.compute_dtype is not None else weight.dtype


def _cast_head(weight: Tensor, bias: Tensor | None, opt: _Options) -> tuple[Tensor, Tensor | None]:
    """W and b in the compute dtype, cast once per pass (as autocast's cast cache does), detached."""
    dt = _mm_dtype(weight, opt)
    return weight.detach().to(dt), None if bias is None else bias.detach().to(dt)


def _rows_of(x: Tensor) -> Tensor:
    return x.reshape(-1, x.shape[-1])


def _take(flat: Tensor, rows: Tensor | None, start: int, stop: int) -> Tensor:
    return flat[start:stop] if rows is None else flat.index_select(0, rows[start:stop])


def _logits(t: Tensor, weight: Tensor, bias: Tensor | None, opt: _Options) -> tuple[Tensor, Tensor | None]:
    """float32 (at least) logits ``[c, V]`` after scale and cap, and tanh of the cap (or None); ``weight``
    and ``bias`` come in the compute dtype (:func:`_cast_head`), so the matmul runs in it."""
    z = F.linear(t.to(weight.dtype), weight, bias)
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    if opt.scale is not None and opt.scale != 1:
        z = z * opt.scale
    if opt.softcap:
        u = torch.tanh(z / opt.softcap)
        return u * opt.softcap, u
    return z, None


def _nll(z: Tensor, y: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    lse = torch.logsumexp(z, dim=-1)
    picked = z.gather(1, y.clamp_min(0)[:, None])[:, 0]
    return torch.where(valid, lse - picked, torch.zeros_like(lse)), lse


def _dlogits(z: Tensor, lse: Tensor, y: Tensor, valid: Tensor, u: Tensor | None, opt: _Options) -> Tensor:
    """∂loss_i/∂(W t_i + b) for each row of the chunk, written over ``z`` (float32 ``[c, V]``)."""
    p = z.sub_(lse[:, None]).exp_()  # softmax
    p.scatter_add_(1, y.clamp_min(0)[:, None], torch.full_like(lse, -1.0)[:, None])
    p.mul_(valid[:, None])
    if u is not None:
        p.mul_(1 - u * u)
    if opt.scale is not None and opt.scale != 1:
        p.mul_(opt.scale)
    return p


class _Grads:
    """Gradient buffers, filled chunk by chunk: W and b in ``grad_dtype`` (default: their own dtype), the
    transform's parameters in float32 (small)."""

    def __init__(
        self,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        params: Sequence[Tensor],
        need_x: bool,
        opt: _Options,
    ) -> None:
        self.x = torch.zeros_like(_rows_of(x)) if need_x else None
        acc = opt.grad_dtype or weight.dtype
        self.weight = torch.zeros_like(weight, dtype=acc) if weight.requires_grad else None
        need_b = bias is not None and bias.requires_grad
        self.bias = torch.zeros_like(bias, dtype=opt.grad_dtype or bias.dtype) if need_b else None
        self.params = [torch.zeros_like(p, dtype=torch.float32) if p.requires_grad else None for p in params]

    def add_chunk(
        self,
        g: Tensor,
        xs: Tensor,
        t: Tensor,
        weight: Tensor,
        params: Sequence[Tensor],
        rows: Tensor | None,
        start: int,
        stop: int,
    ) -> None:
        """Add one chunk's share, given ``g = ∂loss/∂(W t + b)`` (float32 ``[c, V]``)."""
        if self.bias is not None:
            self.bias.add_(g.sum(0).to(self.bias.dtype))  # summed in float32 before it is rounded
        g = g.to(weight.dtype)  # ``weight``: the head cast to the compute dtype
        if self.weight is not None:
            self.weight.add_((g.t() @ t.detach().to(weight.dtype)).to(self.weight.dtype))
        need_t = self.x is not None or any(p is not None for p in self.params)
        if not need_t:
            return
        grad_t = (g @ weight).to(t.dtype)
        if t is xs:  # no transform
            grad_x: Tensor | None = grad_t
        else:
            head = [xs] if xs.requires_grad else []
            wrt = head + [p for p, buf in zip(params, self.params, strict=True) if buf is not None]
            got = torch.autograd.grad(t, wrt, grad_t, allow_unused=True)
            grad_x = got[0] if head else None
            rest = iter(got[len(head) :])
            for buf in self.params:
                if buf is not None:
                    gp = next(rest)
                    if gp is not None:
                        buf.add_(gp)
        if self.x is not None and grad_x is not None:
            if rows is None:
                self.x[start:stop] = grad_x
            else:
                self.x.index_add_(0, rows[start:stop], grad_x.to(self.x.dtype))

    def finish(self, x: Tensor, weight: Tensor, bias: Tensor | None, params: Sequence[Tensor]) -> list:
        grad_x = None if self.x is None else self.x.view(x.shape)
        grad_w = None if self.weight is None else self.weight.to(weight.dtype)
        grad_b = None if self.bias is None else self.bias.to(bias.dtype)  # type: ignore[union-attr]
        grad_p = [None if b is None else b.to(p.dtype) for b, p in zip(self.params, params, strict=True)]
        return [grad_x, grad_w, grad_b, *grad_p]


def _transform(xs: Tensor, opt: _Options, track: bool) -> Tensor:
    if opt.transform is None:
        return xs
    with torch.enable_grad() if track else torch.no_grad():
        return opt.transform(xs)


def _chunk_input(flat: Tensor, rows: Tensor | None, start: int, stop: int, grad: bool) -> Tensor:
    xs = _take(flat, rows, start, stop).detach()
    return xs.requires_grad_(True) if grad else xs


def _forward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    rows: Tensor | None,
    params: Sequence[Tensor],
    opt: _Options,
    grads: _Grads | None,
) -> tuple[Tensor, Tensor]:
    """Per-row losses and logsumexps; with ``grads``, also fills them (for a mean / sum reduction)."""
    flat = _rows_of(x)
    head_w, head_b = _cast_head(weight, bias, opt)
    n = targets.shape[0]
    losses = torch.empty(n, dtype=torch.promote_types(weight.dtype, torch.float32), device=x.device)
    lses = torch.empty_like(losses)
    scale = None
    if grads is not None and opt.reduction == "mean":
        # 1 / (number of scored targets), kept on the device: no host read in the per-step path
        scale = (targets != opt.ignore_index).sum().clamp_min(1).to(losses.dtype).reciprocal()
    for start in range(0, n, opt.chunk_size):
        stop = min(n, start + opt.chunk_size)
        track = grads is not None and opt.transform is not None
        xs = _chunk_input(flat, rows, start, stop, track and grads.x is not None)  # type: ignore[union-attr]
        t = _transform(xs, opt, track)
        y = targets[start:stop]
        valid = y != opt.ignore_index
        with torch.no_grad():
            z, u = _logits(t.detach() if track else t, head_w, head_b, opt)
            losses[start:stop], lses[start:stop] = _nll(z, y, valid)
            if grads is None:
                continue
            g = _dlogits(z, lses[start:stop], y, valid, u, opt)
            if scale is not None:
                g.mul_(scale)
        grads.add_chunk(g, xs, t, head_w, params, rows, start, stop)
    return losses, lses


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, targets, rows, opt: _Options, *params):  # type: ignore[override]
        if opt.reduction == "none":
            losses, lses = _forward(x, weight, bias, targets, rows, params, opt, None)
            ctx.save_for_backward(x, weight, bias, targets, rows, lses, *params)
            ctx.opt = opt
            return losses
        need_x = ctx.needs_input_grad[0]
        grads = _Grads(x, weight, bias, params, need_x, opt)
        losses, _ = _forward(x, weight, bias, targets, rows, params, opt, grads)
        saved = grads.finish(x, weight, bias, params)
        ctx.saved_grads = saved
        ctx.opt = opt
        loss = losses.sum()
        if opt.reduction == "mean":
            loss = loss / (targets != opt.ignore_index).sum().clamp_min(1)
        return loss

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        opt: _Options = ctx.opt
        if opt.reduction != "none":
            out = [None if g is None else g * grad_output.to(g.dtype) for g in ctx.saved_grads]
            ctx.saved_grads = None
            grad_x, grad_w, grad_b, *grad_p = out
            return (grad_x, grad_w, grad_b, None, None, None, *grad_p)
        x, weight, bias, targets, rows, lses, *params = ctx.saved_tensors
        grads = _Grads(x, weight, bias, params, ctx.needs_input_grad[0], opt)
        flat = _rows_of(x)
        head_w, head_b = _cast_head(weight, bias, opt)
        track = opt.transform is not None
        for start in range(0, targets.shape[0], opt.chunk_size):
            stop = min(targets.shape[0], start + opt.chunk_size)
            xs = _chunk_input(flat, rows, start, stop, track and grads.x is not None)
            t = _transform(xs, opt, track)
            y = targets[start:stop]
            valid = y != opt.ignore_index
            with torch.no_grad():
                z, u = _logits(t.detach() if track else t, head_w, head_b, opt)
                g = _dlogits(z, lses[start:stop], y, valid, u, opt)
                g.mul_(grad_output[start:stop, None].to(g.dtype))
            grads.add_chunk(g, xs, t, head_w, params, rows, start, stop)
        grad_x, grad_w, grad_b, *grad_p = grads.finish(x, weight, bias, params)
        return (grad_x, grad_w, grad_b, None, None, None, *grad_p)


def _check(x: Tensor, weight: Tensor, targets: Tensor, rows: Tensor | None, chunk_size: int, reduction: str):
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be [V, H], got shape {tuple(weight.shape)}")
    n = x.numel() // x.shape[-1] if rows is None else rows.shape[0]
    if targets.dim() != 1 or targets.shape[0] != n:
        raise ValueError(f"targets must be [{n}] (one per scored row), got shape {tuple(targets.shape)}")


def linear_cross_entropy(
    x: Tensor,
    weight: Tensor,
    targets: Tensor,
    bias: Tensor | None = None,
    *,
    rows: Tensor | None = None,
    transform: Transform | None = None,
    transform_params: Sequence[Tensor] = (),
    chunk_size: int = 1024,
    reduction: Reduction = "mean",
    ignore_index: int = IGNORE_INDEX,
    scale: float | None = None,
    softcap: float | None = None,
    grad_dtype: torch.dtype | None = None,
) -> Tensor:
    """Cross-entropy of ``softcap(scale · (W T(x_i) + b))`` against ``targets``, one chunk of rows at a time.

    Args:
        x: representations ``[..., H]``, read as rows ``[M, H]``.
        weight: the head ``[V, H]``.
        targets: class ids, one per scored row (``[M]``, or ``[len(rows)]``).
        bias: ``[V]`` or None.
        rows: long ``[N]``: which rows of x are scored, in this order (None: every row). Rows are gathered
            chunk by chunk, so no copy of them is made or kept.
        transform: applied to each chunk of rows before the head (e.g. a final norm); row-wise.
        transform_params: the tensors ``transform`` uses that need gradients (its parameters).
        chunk_size: rows per logit block.
        reduction: "mean" (over rows whose target is not ``ignore_index``), "sum" or "none" (``[N]``).
        ignore_index: target id that contributes 0.
        scale: multiplies the logits (None: 1).
        softcap: ``c · tanh(z / c)`` on the scaled logits (None: no cap).
        grad_dtype: the dtype the gradients of W and b are summed in over the chunks (None: their own
            dtype; ``torch.float32`` beside bf16 weights costs a float32 ``[V, H]`` buffer).

    Returns:
        The loss in float32 (at least): a scalar, or ``[N]`` for ``reduction="none"``. Under
        ``torch.autocast`` on x's device the head matmuls run in the autocast dtype (module docs).
    """
    _check(x, weight, targets, rows, chunk_size, reduction)
    params = tuple(transform_params)
    device = x.device.type
    compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    if compute == torch.float16:
        # a mean / sum forms its gradients in the forward pass, before a GradScaler's loss scale reaches
        # them: p / N in float16 would underflow, so under fp16 autocast the head keeps its weight's dtype
        compute = None
    opt = _Options(chunk_size, reduction, ignore_index, scale, softcap, transform, compute, grad_dtype)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias, *params)
    )
    # the compute dtype is fixed here for the forward and backward alike (autograd runs the backward
    # outside autocast), so autocast itself is off inside
    with torch.autocast(device, enabled=False):
        if needs_grad:
            return _LinearCrossEntropy.apply(x, weight, bias, targets, rows, opt, *params)
        losses, _ = _forward(x, weight, bias, targets, rows, params, opt, None)
    if reduction == "none":
        return losses
    total = losses.sum()
    return total / (targets != ignore_index).sum().clamp_min(1) if reduction == "mean" else total


def linear_cross_entropy_reference(
    x: Tensor,
    weight: Tensor,
    targets: Tensor,
    bias: Tensor | None = None,
    *,
    rows: Tensor | None = None,
    transform: Transform | None = None,
    reduction: Reduction = "mean",
    ignore_index: int = IGNORE_INDEX,
    scale: float | None = None,
    softcap: float | None = None,
) -> Tensor:
    """The slow twin of :func:`linear_cross_entropy`: plain autograd, all logits at once."""
    flat = _rows_of(x)
    if rows is not None:
        flat = flat[rows]
    t = transform(flat) if transform is not None else flat
    z = F.linear(t, weight, bias)
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    if scale is not None and scale != 1:
        z = z * scale
    if softcap:
        z = torch.tanh(z / softcap) * softcap
    return F.cross_entropy(z, targets, ignore_index=ignore_index, reduction=reduction)


__all__ = ["IGNORE_INDEX", "linear_cross_entropy", "linear_cross_entropy_reference"]
