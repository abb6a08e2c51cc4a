"""Next-token negative log-likelihood, the one implementation every module calls.

    nll_t = -log softmax(z_t)[y_t] = logsumexp(z_t) - z_t[y_t],     0 where y_t = ``ignore_index``

:func:`token_nll` is the kernel; :func:`next_token_nll` shifts a sequence (position t predicts token t+1)
and runs the kernel ``chunk`` positions at a time; :func:`chunked_token_nll` reads rows of representations
through a head ``chunk_size`` rows at a time, so that the logits of many layers never exist at once.

This module imports nothing from descentlab: models/, readout/ and robustness/ all use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint as grad_checkpoint

IGNORE_INDEX = -100
Reduction = Literal["none", "sum"]


def _cast(logits: Tensor, dtype: torch.dtype | None) -> Tensor:
    # None: at least float32 (as transformers does), so half-precision logits never feed a log-softmax
    if dtype is None:
        return logits.to(torch.promote_types(logits.dtype, torch.float32))
    return logits.to(dtype)


def token_nll(
    logits: Tensor,
    targets: Tensor,
    *,
    dtype: torch.dtype | None = None,
    ignore_index: int = IGNORE_INDEX,
    reduction: Reduction = "none",
) -> Tensor:
    """Per-token cross-entropy ``-log softmax(logits)[targets]`` (no shift), 0 where the target is ignored.

    Args:
        logits: ``[N, V]`` rows, or ``[B, T, V]`` sequences.
        targets: ``[N]`` or ``[B, T]`` class ids.
        dtype: the dtype the log-softmax runs in; None: the logits' dtype promoted to at least float32.
        ignore_index: target id that contributes 0.
        reduction: "none" (same shape as ``targets``) or "sum" (a scalar).

    Returns:
        The NLLs in the compute dtype.
    """
    logits = _cast(logits, dtype)
    if logits.dim() == 3:
        # class dimension second, as F.cross_entropy takes sequences; its kernel rounds the last bit
        # differently from the [N, V] one, and both layouts are kept so that results stay bit-identical
        logits = logits.transpose(1, 2)
    return F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction=reduction)


def next_token_nll(
    logits: Tensor,
    labels: Tensor,
    *,
    chunk: int | None = None,
    dtype: torch.dtype | None = None,
    ignore_index: int = IGNORE_INDEX,
    reduction: Reduction = "none",
) -> Tensor:
    """Next-token NLL of a batch of sequences, ``chunk`` positions per log-softmax call, in float64.

    nll[b, t] = -log p(labels[b, t+1] | logits[b, t]),   t = 0..T-2

    Args:
        logits: ``[B, T, V]``, position t predicting token t+1.
        labels: ``[B, T]`` the unshifted targets (``ignore_index`` where not scored).
        chunk: positions per call, so that a ``[B, T, V]`` upcast never exists at once (None: one call).
        dtype: compute dtype of the log-softmax (None: at least float32).
        ignore_index: label id that contributes 0.
        reduction: "none": ``[B, T-1]`` float64; "sum": a float64 scalar, the sum of the chunks' sums,
            each chunk read as ``[B·chunk, V]`` rows and summed in the compute dtype.
    """
    pred, tgt = logits[:, :-1], labels[:, 1:]
    step = pred.shape[1] if chunk is None else chunk
    if reduction == "sum":
        total = torch.zeros((), dtype=torch.float64, device=logits.device)
        for s in range(0, pred.shape[1], step):
            lg, tg = pred[:, s : s + step], tgt[:, s : s + step]
            rows, row_tgt = lg.reshape(-1, lg.shape[-1]), tg.reshape(-1)
            total += token_nll(
                rows, row_tgt, dtype=dtype, ignore_index=ignore_index, reduction="sum"
            ).double()
        return total
    parts = [
        token_nll(
            pred[:, s : s + step], tgt[:, s : s + step], dtype=dtype, ignore_index=ignore_index
        ).double()
        for s in range(0, pred.shape[1], max(1, step))
    ]
    if not parts:
        return torch.zeros(pred.shape[:2], dtype=torch.float64, device=logits.device)
    return torch.cat(parts, dim=1)


def head_token_nll(x: Tensor, targets: Tensor, logits_fn: Callable[[Tensor], Tensor]) -> Tensor:
    """Per-row NLL of ``logits_fn(x)`` against ``targets``, in float32 at least: ``x [n, H] -> [n]``."""
    return token_nll(logits_fn(x), targets)


def chunked_token_nll(
    x: Tensor,
    targets: Tensor,
    logits_fn: Callable[[Tensor], Tensor],
    chunk_size: int | None,
    checkpoint: bool = True,
) -> Tensor:
    """Per-row NLL, ``chunk_size`` rows at a time: nll_i = -log softmax(logits_fn(x_i))[y_i].

    With ``checkpoint`` and gradients on, a chunk's ``[chunk, V]`` logits are freed after its forward and
    recomputed in the backward pass, so peak memory holds one chunk's logits, not (L+1)·N·V.
    ``chunk_size=None`` is the slow reference: all logits at once.

    Args:
        x: representations ``[N, H]``.
        targets: token ids ``[N]``.
        logits_fn: ``[n, H] -> [n, V]``.
        chunk_size: rows per chunk, or None for one chunk.
        checkpoint: recompute each chunk in the backward pass instead of storing its logits.

    Returns:
        nll ``[N]``.
    """
    if chunk_size is None or (x.shape[0] <= chunk_size and not checkpoint):
        return head_token_nll(x, targets, logits_fn)
    use_ckpt = checkpoint and torch.is_grad_enabled()
    pieces = []
    for start in range(0, x.shape[0], chunk_size):
        xs, ys = x[start : start + chunk_size], targets[start : start + chunk_size]
        if use_ckpt:
            pieces.append(grad_checkpoint(head_token_nll, xs, ys, logits_fn, use_reentrant=False))
        else:
            pieces.append(head_token_nll(xs, ys, logits_fn))
    return torch.cat(pieces)


__all__ = [
    "IGNORE_INDEX",
    "chunked_token_nll",
    "head_token_nll",
    "next_token_nll",
    "token_nll",
]
