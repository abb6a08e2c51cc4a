r"""HORST's compiled path: one ``torch.compile`` (Inductor) graph per bucket of tensors, for CUDA and CPU.

The step is written once over a list of tensors (the equations of :mod:`descentlab.optim.horst`, op for op as
:func:`~descentlab.optim.horst.horst_reference`); Inductor fuses each tensor's whole update (moments, Adam
update, mirror step, NaN guard, the in-place writes) into one kernel that reads p, g, m, v once and writes
p, m, v once: on CUDA it emits Triton, on CPU vectorised C++.

Everything that changes during training is a tensor, so a schedule never recompiles: the learning-rate
dependent scalars (decay 1 - lr wd, alpha, lr beta) and each tensor's bias corrections (computed on the host
in double, exactly as the reference does, then rounded to float32 like a Python scalar in a torch op)
travel in one float32 vector, copied to the device once per step. What stays a compile-time constant:
beta1, beta2, eps, the exponent clamp, ``mirror``, ``nan_guard``, and the bucket's shapes and dtypes; changing
one of those (or which parameters have gradients) compiles a new graph, at most
``torch._dynamo.config.recompile_limit`` of them (all graphs share this one code object). Past the limit,
``fullgraph=True`` makes dynamo raise ``FailOnRecompileLimitHit`` (it does not run the function eagerly):
:class:`~descentlab.optim.horst.HORST` then warns once, records the fallback and steps those tensors with its
foreach path (``impl="compiled"`` raises).

With stochastic rounding (bf16 / fp16 parameters in a ``stochastic_rounding`` group) each tensor's 32-bit
key travels in one int64 vector, and the rounding (:func:`~descentlab.optim._horst_rounding.stochastic_round`:
an integer hash of the element index, a few bit operations) is part of the same graph, for Inductor to
fuse into the step's kernel (its cost is not measured yet); whether a bucket rounds stochastically is a
compile-time constant.

With ``nan_guard`` the reverted count is summed on the device and read back once per step (one host sync);
without it HORST reads nothing back.
Tensor subclasses (FSDP2's DTensor) do not come here: HORST steps them with its foreach path.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import Tensor

from descentlab.optim._horst_rounding import stochastic_round
from descentlab.optim.functional import Bucket, HorstHyper

logger = logging.getLogger(__name__)

_LOW_PRECISION = (torch.bfloat16, torch.float16)


def _step_lists(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    scalars: Tensor,
    beta1: float,
    beta2: float,
    eps: float,
    clamp: float | None,
    mirror: bool,
    guard: bool,
    sr_keys: Tensor | None = None,
    maximize: bool = False,
) -> Tensor:
    """The HORST step of a list of tensors, in place; ``scalars`` = [decay, alpha, lr beta, ss_i..., bc2_i...];
    ``sr_keys`` (int64, one per tensor): round bf16 / fp16 results stochastically with these keys;
    ``maximize`` (a compile-time constant): step with -g.

    Returns:
        The number of elements the NaN guard reverted (a 0-dim int64 tensor; 0 without the guard).
    """
    n = len(params)
    decay, alpha, lr_beta = scalars[0], scalars[1], scalars[2]
    bad = scalars.new_zeros((), dtype=torch.int64)
    for i in range(n):
        p_in, grad = params[i], grads[i]
        low = p_in.dtype in _LOW_PRECISION
        p0 = p_in.float() if low else p_in
        g = grad.float() if low else grad
        if maximize:
            g = -g
        m0, v0 = exp_avgs[i], exp_avg_sqs[i]
        step_size, bc2_sqrt = scalars[3 + i], scalars[3 + n + i]
        p = p0 * decay
        m = torch.lerp(m0, g, 1 - beta1)
        v = torch.addcmul(v0 * beta2, g, g, value=1 - beta2)
        u = (m * step_size) / ((v.sqrt() / bc2_sqrt) + eps)
        p = p - u
        if mirror:
            x = (torch.sign(p) * u) * (-alpha) + (-lr_beta)
            if clamp is not None:
                x = x.clamp(-clamp, clamp)
            p = p * torch.exp(x)
        if guard:
            ok = torch.isfinite(p)
            bad = bad + (~ok).sum()
            p = torch.where(ok, p, p0)
            m = torch.where(ok, m, m0)
            v = torch.where(ok, v, v0)
        if sr_keys is not None and low:
            p_in.copy_(stochastic_round(p, p_in.dtype, sr_keys[i]))
        else:
            p_in.copy_(p)
        m0.copy_(m)
        v0.copy_(v)
    return bad


@functools.lru_cache(maxsize=1)
def compiled_step():
    """The compiled list step (compiled lazily on first call; one graph per bucket signature)."""
    return torch.compile(_step_lists, fullgraph=True, dynamic=False)


def can_compile(device: torch.device) -> bool:
    """Whether Inductor has a backend for ``device`` here (Triton for CUDA, a C++ compiler for CPU)."""
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        return has_triton()
    if device.type == "cpu":
        from torch._inductor.cpp_builder import get_cpp_compiler

        try:
            return bool(get_cpp_compiler())
        except Exception:
            return False
    return False


def horst_compiled_(
    bucket: Bucket, hp: HorstHyper, *, mirror: bool, sr_keys: list[int] | None = None, maximize: bool = False
) -> Tensor:
    """In-place compiled HORST step of plain tensors sharing one device (float32 moments); ``sr_keys``: one
    rounding key per tensor to round bf16 / fp16 results stochastically (None: to nearest); ``maximize``:
    step with -g (negated inside the graph).

    Returns:
        The reverted count as a 0-dim tensor on the device (read it with ``int(...)``).
    """
    params, grads, exp_avgs, exp_avg_sqs, steps = bucket
    step_sizes, bc2_sqrts = hp.bias_corrections(steps)
    lr, beta1, beta2, eps, weight_decay, alpha, beta, exp_clamp, nan_guard = hp
    host = [1 - lr * weight_decay, alpha, lr * beta, *step_sizes, *bc2_sqrts]
    scalars = torch.tensor(host, dtype=torch.float32).to(params[0].device, non_blocking=True)
    clamp = None if exp_clamp is None else float(exp_clamp)
    keys = None
    if sr_keys is not None:
        keys = torch.tensor(sr_keys, dtype=torch.int64).to(params[0].device, non_blocking=True)
    return compiled_step()(
        params, grads, exp_avgs, exp_avg_sqs, scalars, float(beta1), float(beta2), float(eps), clamp,
        bool(mirror), bool(nan_guard), keys, bool(maximize),
    )  # fmt: skip


__all__ = ["can_compile", "compiled_step", "horst_compiled_"]
