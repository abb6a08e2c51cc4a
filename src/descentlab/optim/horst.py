r"""HORST: AdamW followed by a hyperbolic-entropy mirror step (Jacobs, Jain, Burkholz 2026).

With step k (starting at 1), gradient :math:`g`, learning rate :math:`\eta`, weight decay :math:`\lambda`::

    m_k = beta1 m_{k-1} + (1 - beta1) g                 v_k = beta2 v_{k-1} + (1 - beta2) g^2
    u_k = eta / (1 - beta1^k) * m_k / (sqrt(v_k) / sqrt(1 - beta2^k) + eps)
    theta_{k+1/2} = theta_k (1 - eta lambda) - u_k                                   (exactly AdamW)
    theta_{k+1}   = theta_{k+1/2} * exp(clamp(-alpha sign(theta_{k+1/2}) u_k - eta beta, -c, c))

The same :math:`u_k` feeds both lines. :math:`\alpha` sets the strength of the L1 (sparsity) bias,
:math:`\beta` is an extra multiplicative decay, :math:`c` the exponent clamp (``exp_clamp``; ``None`` = no
clamp). :math:`\alpha = \beta = 0` is AdamW exactly. Only tensors of groups with ``mirror=True`` get the second
line; ``mirror=None`` (default) means "tensors with ndim >= 2", so biases and norms get plain AdamW.

Four implementations share these equations: :func:`horst_reference` (one tensor, plain torch ops, the slow
twin used by the tests), a multi-tensor ``torch._foreach_*`` path (any device and dtype, tensor subclasses), a
fused CPU kernel (:mod:`descentlab.optim._horst_kernel`, float32 only) and a ``torch.compile`` path
(:mod:`descentlab.optim._horst_compiled`, plain float32 / bf16 / fp16 tensors on CUDA or CPU; the default
on CUDA). Low-precision parameters (bf16 / fp16) are updated in
float32 and their moments are kept in float32.

Writing the float32 result back into a bf16 / fp16 parameter rounds it. Round-to-nearest (the default)
loses every change below half an ulp of the parameter, at every step: bf16 weights near 1 (ulp 2^-7) do not
move under an Adam step of lr = 1e-3, nor under the mirror step's shrink theta * exp(-alpha |u|). The group
key ``stochastic_rounding=True`` rounds stochastically instead: with lo <= x <= hi the neighbours of the
float32 result x in the parameter's dtype::

    SR(x) = hi with probability (x - lo) / (hi - lo), lo otherwise;     E[SR(x)] = x,

so sub-ulp updates accumulate in expectation (:mod:`descentlab.optim._horst_rounding`). Its random bits are
a hash of (``sr_seed``, the tensor's index in the optimizer, the step, the element's index): no generator
state, the same bits on every path (tested on CPU; the CUDA path has not run on a GPU yet), and a resumed
run continues bit for bit.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.utils.weak import WeakIdKeyDictionary

from descentlab.errors import ConfigError
from descentlab.optim import _horst_compiled, _horst_kernel
from descentlab.optim._horst_kernel import load_kernel
from descentlab.optim._horst_rounding import can_round, rounding_key, stochastic_round, stochastic_round_any
from descentlab.optim.functional import (
    Bucket,
    HorstHyper,
    adam_update_,
    check_hyper,
    evaluate_closure,
    hyperbolic_mirror,
)

logger = logging.getLogger(__name__)

IMPLS = ("auto", "fused", "compiled", "foreach", "reference")
_COMPILED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_LOW_PRECISION = (torch.bfloat16, torch.float16)


class HorstFallbackWarning(RuntimeWarning):
    """A tensor took HORST's foreach path instead of a faster one (warned once per reason; the reasons are
    the keys of :data:`FALLBACK_REASONS`, counted in ``HORST.fallbacks``)."""


class HorstStep(NamedTuple):
    """Result of :func:`horst_reference`."""

    param: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    reverted: int


def horst_reference(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    alpha: float,
    beta: float,
    mirror: bool,
    exp_clamp: float | None = 5.0,
    nan_guard: bool = True,
    sr_key: int | None = None,
    maximize: bool = False,
) -> HorstStep:
    """One HORST step of one tensor, as a pure function (see the module docstring for the equations).

    Arithmetic follows ``torch.optim.AdamW``'s single-tensor path op for op, so that with alpha = beta = 0 the
    result is AdamW's. Low-precision inputs are computed in float32.

    Args:
        param, grad: the parameter and its gradient (same shape).
        exp_avg, exp_avg_sq: first and second moments after step ``step - 1``.
        step: the step number k >= 1 of this update.
        nan_guard: elements whose new value is not finite keep their old parameter and moments.
        sr_key: for a bf16 / fp16 ``param``, round the float32 result stochastically with this key (see
            :func:`~descentlab.optim._horst_rounding.stochastic_round`); None rounds to nearest.
        maximize: step with -grad (ascend), as ``torch.optim.AdamW(maximize=True)``.

    Returns:
        The new parameter (in ``param.dtype``), the new moments (in their input dtype) and the number of
        elements the NaN guard reverted. The inputs are not modified.
    """
    compute = torch.float32 if param.dtype in _LOW_PRECISION else param.dtype
    p = param.to(compute)
    g = -grad.to(compute) if maximize else grad.to(compute)
    m0, v0 = exp_avg.to(compute), exp_avg_sq.to(compute)
    m, v = m0.clone(), v0.clone()  # ``.to`` may return the input itself; the inputs stay untouched

    p = p * (1 - lr * weight_decay)
    u = adam_update_(g, m, v, step=step, lr=lr, betas=(beta1, beta2), eps=eps)
    p = p - u
    if mirror:
        p = hyperbolic_mirror(p, u, alpha=alpha, lr_beta=lr * beta, clamp=exp_clamp)
    reverted = 0
    if nan_guard:
        ok = torch.isfinite(p)
        reverted = 0 if p.is_meta else int((~ok).sum())  # meta tensors hold no values to count
        p = torch.where(ok, p, param.to(compute))
        m, v = torch.where(ok, m, m0), torch.where(ok, v, v0)
    if sr_key is not None and param.dtype in _LOW_PRECISION:
        p = stochastic_round_any(p, param.dtype, sr_key)
    return HorstStep(p.to(param.dtype), m.to(exp_avg.dtype), v.to(exp_avg_sq.dtype), reverted)


# The foreach path steps its tensors in chunks of at most this many elements (a share of the bucket, within
# these bounds), splitting a large contiguous tensor into flat slices, so that its transient buffers (about
# five float32 values per element of a chunk with the NaN guard, two without) are a bounded fraction of
# the parameters instead of five times them.
_CHUNK_SHARE = 8  # a chunk holds at most 1/8 of the bucket's elements ...
_CHUNK_MIN = 1 << 16  # ... but no fewer than this (tiny models: one chunk, the foreach ops' batching kept)
_CHUNK_MAX = 1 << 24  # ... and no more than this (64 MiB per float32 buffer, whatever the model's size)


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    return DTensor


def _locals(p: Tensor, g: Tensor, m: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The local shards of DTensor parameters, gradients and moments (plain tensors pass through).

    The update is elementwise, so stepping each rank's shard is the step of the whole tensor, provided the
    four tensors are laid out alike; a gradient laid out otherwise is redistributed first (a collective,
    as DTensor's own ops would do)."""
    dtensor = _dtensor_type()
    if dtensor is None or not isinstance(p, dtensor):
        return p, g, m, v
    if isinstance(g, dtensor) and (g.placements != p.placements or g.device_mesh != p.device_mesh):
        g = g.redistribute(p.device_mesh, p.placements)
    for name, t in (("gradient", g), ("exp_avg", m), ("exp_avg_sq", v)):
        if not isinstance(t, dtensor) or t.placements != p.placements or t.device_mesh != p.device_mesh:
            raise ConfigError(
                f"HORST: a DTensor parameter's {name} is not a DTensor laid out like it "
                f"({p.placements} on {p.device_mesh}); load the optimizer state with the model's sharding"
            )
    return p.to_local(), g.to_local(), m.to_local(), v.to_local()


class _Segment(NamedTuple):
    """A piece of one tensor that the foreach path steps: its parameter, gradient, moments (flat slices or
    whole tensors), the step number and the rounding key of its first element (None: round to nearest)."""

    p: Tensor
    g: Tensor
    m: Tensor
    v: Tensor
    step: int
    key: int | None


def _segments(bucket: Bucket, sr_keys: list[int] | None, limit: int) -> list[list[_Segment]]:
    """The bucket's tensors (local shards of DTensors) as chunks of at most ``limit`` elements: a tensor
    larger than ``limit`` is cut into flat slices when it and its gradient and moments are contiguous."""
    chunks: list[list[_Segment]] = [[]]
    size = 0
    for i, (p, g, m, v, k) in enumerate(zip(*bucket, strict=True)):
        p, g, m, v = _locals(p, g, m, v)
        n = p.numel()
        if n == 0:
            continue
        key = None if sr_keys is None else sr_keys[i]
        flat = n > limit and all(t.is_contiguous() for t in (p, g, m, v))
        pieces = [(a, min(a + limit, n)) for a in range(0, n, limit)] if flat else [(0, n)]
        for a, b in pieces:
            if flat:
                seg = _Segment(
                    p.view(-1)[a:b], g.view(-1)[a:b], m.view(-1)[a:b], v.view(-1)[a:b], k,
                    None if key is None else key + a,  # random_bits(x, key) hashes index + key
                )  # fmt: skip
            else:
                seg = _Segment(p, g, m, v, k, key)
            if size and size + (b - a) > limit:
                chunks.append([])
                size = 0
            chunks[-1].append(seg)
            size += b - a
    return [c for c in chunks if c]


def _local_numel(p: Tensor) -> int:
    dtensor = _dtensor_type()
    return p.to_local().numel() if dtensor is not None and isinstance(p, dtensor) else p.numel()


def _chunk_limit(bucket: Bucket) -> int:
    total = sum(_local_numel(p) for p in bucket.params)
    return max(_CHUNK_MIN, min(_CHUNK_MAX, -(-total // _CHUNK_SHARE)))


def _horst_foreach_(
    bucket: Bucket,
    hp: HorstHyper,
    *,
    mirror: bool,
    sr_keys: list[int] | None = None,
    maximize: bool = False,
) -> Tensor | None:
    """In-place HORST step of tensors sharing device and dtype, with ``torch._foreach_*`` ops, chunk by chunk.

    Tensor subclasses (FSDP2's DTensor) are stepped through their local shards. Each chunk (at most
    ``max(2^16, min(2^24, numel / 8))`` elements; large contiguous tensors are cut into flat slices) computes
    its new moments and parameters into fresh buffers and commits them with ``torch.where`` (the NaN guard:
    an element whose new parameter is not finite keeps its old parameter and moments), so the transient
    memory is about five float32 buffers of one chunk, not of the whole bucket; without the guard the
    moments and float32 parameters are updated in place (two buffers). Nothing is read back to the host.

    ``sr_keys``: one key per tensor to round bf16 / fp16 results stochastically (None: to nearest).
    ``maximize``: step with -g (the chunk's gradients are negated into a copy; the inputs stay untouched).

    Returns:
        The number of elements the NaN guard reverted, as a 0-dim int64 tensor on the bucket's device (None
        without the guard, or when nothing was stepped).
    """
    lr, beta1, beta2, eps, weight_decay, alpha, beta, exp_clamp, nan_guard = hp
    low = bucket.params[0].dtype in _LOW_PRECISION if bucket.params else False
    bad: Tensor | None = None
    for chunk in _segments(bucket, sr_keys, _chunk_limit(bucket)):
        params = [s.p for s in chunk]
        grads = [s.g.float() for s in chunk] if low else [s.g for s in chunk]
        if maximize and low:
            torch._foreach_neg_(grads)  # the float32 copies are this step's own
        elif maximize:
            grads = torch._foreach_neg(grads)  # never the user's gradients
        step_sizes, bc2_sqrts = hp.bias_corrections([s.step for s in chunk])
        if nan_guard:
            ms = torch._foreach_lerp([s.m for s in chunk], grads, 1 - beta1)
            vs = torch._foreach_mul([s.v for s in chunk], beta2)
        else:
            ms, vs = [s.m for s in chunk], [s.v for s in chunk]
            torch._foreach_lerp_(ms, grads, 1 - beta1)
            torch._foreach_mul_(vs, beta2)
        torch._foreach_addcmul_(vs, grads, grads, value=1 - beta2)
        del grads  # the float32 copies of low-precision gradients
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, bc2_sqrts)
        torch._foreach_add_(denom, eps)
        u = torch._foreach_mul(ms, step_sizes)
        torch._foreach_div_(u, denom)
        if nan_guard or low:
            work = torch._foreach_mul([p.float() for p in params] if low else params, 1 - lr * weight_decay)
        else:
            work = params
            torch._foreach_mul_(work, 1 - lr * weight_decay)
        torch._foreach_sub_(work, u)
        if mirror:  # hyperbolic_mirror_foreach_, its exponent written into the denominator's buffers
            x = denom
            torch._foreach_copy_(x, work)
            torch._foreach_sign_(x)
            torch._foreach_mul_(x, u)
            torch._foreach_mul_(x, -alpha)
            torch._foreach_add_(x, -(lr * beta))
            if exp_clamp is not None:
                torch._foreach_clamp_min_(x, -exp_clamp)
                torch._foreach_clamp_max_(x, exp_clamp)
            torch._foreach_exp_(x)
            torch._foreach_mul_(work, x)
            del x
        del denom, u
        for s, w, m, v in zip(chunk, work, ms, vs, strict=True):
            if nan_guard:
                ok = torch.isfinite(w)
                n_bad = ok.numel() - ok.sum()
                bad = n_bad if bad is None else bad + n_bad
                torch.where(ok, m, s.m, out=s.m)
                torch.where(ok, v, s.v, out=s.v)
                torch.where(ok, w, s.p.float() if low else s.p, out=w)
            if not low:
                if w is not s.p:
                    s.p.copy_(w)
            elif s.key is not None:
                s.p.copy_(stochastic_round(w, s.p.dtype, s.key))
            else:
                s.p.copy_(w)
        del work, ms, vs, w, m, v  # this chunk's buffers go before the next chunk's are made
    return bad


_PLAIN = (Tensor, nn.Parameter)  # not subclasses such as DTensor


_TENSOR_HYPERS = ("lr", "eps", "weight_decay", "alpha", "beta")


def _check_tensor_hypers(groups: list[dict[str, Any]]) -> None:
    """Check tensor hyper-parameters (an ``lr`` tensor set after construction, e.g. by a scheduler) at each
    step, as :func:`check_hyper` checks them at construction: finite and >= 0, betas in [0, 1).

    A CPU tensor is read directly (no device sync); tensors on a device are checked together, with one
    host read per step (keep such values on the CPU, as torch's schedulers do, to avoid it).
    """
    on_device: list[tuple[str, Tensor, Tensor]] = []
    for group in groups:
        values = [(k, group.get(k)) for k in _TENSOR_HYPERS]
        betas = group.get("betas")
        if isinstance(betas, list | tuple):
            values += [(f"betas[{i}]", b) for i, b in enumerate(betas)]
        for key, value in values:
            if not isinstance(value, Tensor):
                continue
            if value.numel() != 1 or value.is_complex():
                raise ConfigError(f"HORST: invalid {key}={value!r}; it must be a one-element real tensor")
            if value.device.type == "cpu":
                check_hyper("HORST", {key: value} if not key.startswith("betas") else {"betas": betas})
                continue
            x = value.detach().reshape(()).float()
            high = 1.0 if key.startswith("betas") else math.inf
            on_device.append((key, value, torch.isfinite(x) & (x >= 0) & (x < high)))
    if on_device:
        ok = torch.stack([c for _, _, c in on_device]).cpu().tolist()
        for (key, value, _), good in zip(on_device, ok, strict=True):
            if not good:
                raise ConfigError(f"HORST: invalid {key}={value!r}; it must be a finite number >= 0")


def _compiled_ok(p: Tensor, m: Tensor, v: Tensor, g: Tensor) -> bool:
    # Plain tensors only (DTensor takes the foreach path); float64 too: the compiled scalars are float32.
    return (
        all(type(t) in _PLAIN for t in (p, m, v, g))
        and p.dtype in _COMPILED_DTYPES
        and m.dtype == v.dtype == torch.float32
    )


@functools.cache
def _can_compile(device: torch.device) -> bool:
    return _horst_compiled.can_compile(device)


def _read_steps(counters: list[Tensor]) -> list[int]:
    """The values of step counters (0-dim tensors), with one read-back for the lot."""
    if not counters:
        return []
    return [int(k) for k in torch.stack([c.detach().to("cpu", torch.float64) for c in counters]).tolist()]


def _is_cuda(p: Tensor) -> bool:
    # A function so that the CPU tests can route CPU tensors through the CUDA rules.
    return p.device.type == "cuda"


def _kernel_ok(p: Tensor, m: Tensor, v: Tensor, g: Tensor) -> bool:
    # Plain tensors only: subclasses such as FSDP2's DTensor take the foreach path, which dispatches them.
    # A loop, not all(<generator>): this runs for every tensor at every step.
    for t in (p, m, v, g):
        if type(t) not in _PLAIN or t.dtype != torch.float32 or not t.is_cpu or not t.is_contiguous():
            return False
    return True


def _impl_of(impl: str, fused: bool | None, foreach: bool | None) -> str:
    """The ``impl`` that ``torch.optim.AdamW``'s ``fused`` / ``foreach`` keywords ask for."""
    if fused and foreach:
        raise ConfigError("HORST: `fused` and `foreach` cannot be `True` together.")  # torch's words
    if foreach is None and fused is None:
        return impl
    wanted = "foreach" if foreach else "reference" if foreach is False else None
    if fused:
        wanted = None  # every tensor must take the kernel or the compiled step: checked per tensor
    elif fused is False and wanted is None:
        wanted = "foreach"
    if wanted is None:
        if impl not in ("auto", "fused", "compiled"):
            raise ConfigError(f"HORST: fused=True contradicts impl={impl!r}; drop one of them")
        return impl
    if impl not in ("auto", wanted):
        raise ConfigError(
            f"HORST: fused={fused}, foreach={foreach} means impl={wanted!r}, which contradicts impl={impl!r}; "
            "drop one of them"
        )
    return wanted


# Why a tensor that ``impl="auto"`` (or ``"fused"``) would step with a faster path takes the foreach path:
# reason -> what its one warning says. The reason is the key of ``HORST.fallbacks`` and of the group key
# ``fallback_reasons``.
FALLBACK_REASONS = {
    "compile": "the compiled step failed to compile",
    "fused_impl": "impl='fused', but neither the fused CPU kernel nor the compiled CUDA step could take it",
    "stochastic_rounding": "a bf16 / fp16 tensor subclass that stochastic rounding cannot write",
    "tensor_subclass": "a tensor subclass (e.g. FSDP2's DTensor) takes the foreach path by design",
    "cpu_dtype": "the fused CPU kernel is float32 only (CPU bf16 / fp16 / float64 take foreach by design)",
    "non_contiguous": "the fused CPU kernel needs contiguous tensors",
    "kernel_build": "the fused CPU kernel did not build (no C compiler, or DESCENTLAB_HORST_KERNEL=0)",
    "no_triton": "torch.compile cannot compile for this CUDA device here (no Triton)",
    "cuda_dtype": "the compiled CUDA step takes float32, bf16 and fp16 only (float64 takes foreach)",
    "device": "no fused path for this device type",
}


def _auto_reason(p: Tensor, m: Tensor, v: Tensor, g: Tensor, kernel: Any) -> str:
    """Why ``impl="auto"`` steps this tensor with the foreach path (a key of :data:`FALLBACK_REASONS`)."""
    if any(type(t) not in _PLAIN for t in (p, m, v, g)):
        return "tensor_subclass"
    if _is_cuda(p):
        if p.dtype not in _COMPILED_DTYPES or m.dtype != torch.float32 or v.dtype != torch.float32:
            return "cuda_dtype"
        return "no_triton"
    if p.is_cpu:
        if p.dtype != torch.float32 or any(t.dtype != torch.float32 for t in (m, v, g)):
            return "cpu_dtype"
        if kernel is None:
            return "kernel_build"
        return "non_contiguous"
    return "device"


def _unfusable(p: Tensor) -> str:
    """Why a parameter cannot take a fused path (the C kernel or the compiled step); "" when it can."""
    if type(p) not in _PLAIN:
        return "tensor subclasses (e.g. DTensor) take the foreach path"
    if p.is_cpu:
        if p.dtype != torch.float32:
            return "the fused CPU kernel is float32 only"
        if load_kernel() is None:
            return "the fused CPU kernel did not build (no C compiler, or DESCENTLAB_HORST_KERNEL=0)"
        return ""
    if p.device.type == "cuda":
        if p.dtype not in _COMPILED_DTYPES:
            return "the compiled step takes float32, bf16 and fp16 tensors only"
        if not _can_compile(p.device):
            return "torch.compile cannot compile for this device here (no Triton)"
        return ""
    return f"no fused path for {p.device.type} tensors"


def _check_rounding(group: dict[str, Any]) -> None:
    """The stochastic-rounding keys of a group: a bool, and None, a ``torch.Generator`` or an int seed."""
    if not isinstance(group.get("stochastic_rounding", False), bool):
        raise ConfigError(
            f"HORST: stochastic_rounding must be True or False, got {group['stochastic_rounding']!r}"
        )
    seed = group.get("sr_seed")
    if seed is None or isinstance(seed, torch.Generator):
        return
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ConfigError(
            f"HORST: sr_seed must be None, a torch.Generator or an int in [0, 2^64), got {seed!r}"
        )


def _check_torch_flags(group: dict[str, Any]) -> None:
    """torch.optim.AdamW's ``maximize``, ``capturable`` and ``differentiable`` keys of a group.

    ``maximize`` is supported on every path. ``differentiable`` and ``capturable`` are refused, in torch's
    words for what its own optimizers refuse ("`fused` does not support `differentiable`"): every path writes
    the parameters in place under ``torch.no_grad``, and the bias corrections come from host copies of the
    step counters, which a CUDA graph cannot capture.
    """
    if not isinstance(group.get("maximize", False), bool):
        raise ConfigError(f"HORST: maximize must be True or False, got {group['maximize']!r}")
    if group.get("differentiable"):
        raise ConfigError(
            "HORST does not support `differentiable`: its step updates the parameters in place under "
            'torch.no_grad (as torch\'s fused optimizers, which say "`fused` does not support `differentiable`")'
        )
    if group.get("capturable"):
        raise ConfigError(
            "HORST does not support `capturable`: its bias corrections are computed on the host from CPU step "
            "counters, so a step cannot be captured in a CUDA graph; use capturable=False"
        )


def _resolve_seed(group: dict[str, Any]) -> None:
    """Store the group's rounding seed as an int (saved with the state dict)."""
    _check_rounding(group)
    seed = group.get("sr_seed")
    if seed is None:
        group["sr_seed"] = torch.initial_seed()  # reads the default generator; draws nothing from it
    elif isinstance(seed, torch.Generator):
        group["sr_seed"] = seed.initial_seed()


class HORST(Optimizer):
    """HORST as a :class:`torch.optim.Optimizer`; the update is in the module docstring.

    Args:
        params: parameters or param groups. Group keys: ``lr``, ``betas``, ``eps``, ``weight_decay``,
            ``alpha``, ``beta``, ``mirror`` (``True``/``False``/``None`` = ndim >= 2), ``exp_clamp``,
            ``nan_guard``, ``impl``, ``stochastic_rounding``, ``sr_seed``, ``maximize``.
        alpha: strength of the mirror (L1) step; 0 turns it off.
        beta: multiplicative decay exp(-lr * beta) of mirrored tensors.
        exp_clamp: clamp of the mirror exponent (``None``: none).
        nan_guard: revert elements whose update is not finite (their moments too); the count of the last step
            is ``self.reverted``.
        impl: ``"auto"`` (fused CPU kernel for float32 CPU tensors when it builds; the compiled path for plain
            CUDA tensors when Triton is there; foreach otherwise), ``"fused"`` (the CPU kernel is required;
            CUDA tensors take the compiled step; a tensor neither takes warns once and is counted in
            ``fallbacks["fused_impl"]``),
            ``"compiled"`` (``torch.compile`` of the step for plain tensors on any device Inductor compiles
            for, CPU included; tensor subclasses such as DTensor and float64 take the foreach path),
            ``"foreach"`` or ``"reference"``.
        fused, foreach: ``torch.optim.AdamW``'s keywords, so HORST is a drop-in. ``foreach=True`` is
            ``impl="foreach"``, ``foreach=False`` the single-tensor ``impl="reference"``, ``fused=False``
            never takes the fused kernel or the compiled step. ``fused=True`` requires every tensor to take a
            fused path (the C kernel for float32 CPU tensors, the compiled step for CUDA tensors): a tensor
            that cannot raises ``ConfigError`` here, as AdamW does; one that falls back at a step (e.g. a
            non-contiguous tensor, a failed compile) warns once and is counted in ``fused_fallbacks``.
            ``fused=True`` with ``foreach=True`` is an error, as in AdamW.
        maximize: ascend the objective (step with -g), as AdamW's keyword; every path takes it (the C kernel
            and the compiled step negate g in their one pass, foreach and reference a copy of it), so it
            adds no fallback.
        capturable, differentiable: AdamW's keywords; False (the default) is accepted, True raises
            :class:`~descentlab.errors.ConfigError` ("HORST does not support `capturable`" / "...
            `differentiable`"): the step is in place under ``torch.no_grad`` and its bias corrections come from
            host copies of the step counters.
        stochastic_rounding: write the float32 result into bf16 / fp16 parameters by stochastic rounding,
            SR(x) = hi with probability (x - lo) / (hi - lo) (lo <= x <= hi the neighbours of x in the
            parameter's dtype), instead of to the nearest value, so that updates below half an ulp (small
            Adam steps, the mirror step's small shrinks) are kept in expectation. float32 / float64
            parameters are unaffected. Every path takes it (reference, foreach, compiled; the fused CPU
            kernel steps float32 only) and draws the same bits. There is no fp32 master copy: a master
            copy would undo in-place edits of the parameters such as AC/DC's and pruning's masks.
        sr_seed: the seed of the rounding bits (an int, or a ``torch.Generator``, whose ``initial_seed()``
            is taken); None takes ``torch.initial_seed()`` when the group is added, so ``torch.manual_seed``
            makes a run reproducible. The resolved int is stored in the group and saved with the state
            dict. Under DDP every rank must hold the same seed (seed torch alike on every rank, or pass
            one), or the replicas drift apart. If the compiled step fails to compile under ``impl="auto"``/``"fused"`` (for
    instance past dynamo's ``recompile_limit``: all graphs share one code object compiled with
    ``fullgraph=True``, so dynamo raises there rather than running eagerly), HORST warns once and steps those
    tensors with the foreach path from then on; ``impl="compiled"`` raises instead. Every fallback is counted
    by reason in ``fallbacks`` (a dict, this process) and per group in the group key ``fallbacks`` (saved with
    the state dict; ``fallbacks_total`` sums them).

    Hyper-parameters are checked as ``torch.optim.AdamW`` checks its own, NaN and Inf included, in every
    group (at construction, in :meth:`add_param_group` and again before each step, before any tensor is
    touched): a bad value raises :class:`~descentlab.errors.ConfigError`, a ``ValueError``.

    State per parameter (names as in AdamW): ``step`` (float32 scalar tensor), ``exp_avg``, ``exp_avg_sq``.
    Each group counts the elements its NaN guard has reverted in ``nan_reverted`` (saved with the state
    dict); ``reverted_total`` sums them, ``reverted`` is the last step's count, and the first step with a
    revert warns once (``RuntimeWarning``).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        alpha: float = 1.0,
        beta: float = 0.0,
        *,
        mirror: bool | None = None,
        exp_clamp: float | None = 5.0,
        nan_guard: bool = True,
        impl: str = "auto",
        fused: bool | None = None,
        foreach: bool | None = None,
        stochastic_rounding: bool = False,
        sr_seed: int | torch.Generator | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        defaults = dict(
            lr=lr,
            betas=tuple(betas) if isinstance(betas, list | tuple) else betas,
            eps=eps,
            weight_decay=weight_decay,
            alpha=alpha,
            beta=beta,
            mirror=mirror,
            exp_clamp=exp_clamp,
            nan_guard=nan_guard,
            impl=_impl_of(impl, fused, foreach),
            fused=bool(fused),
            stochastic_rounding=stochastic_rounding,
            sr_seed=sr_seed,
            maximize=maximize,
            capturable=capturable,
            differentiable=differentiable,
            nan_reverted=0,
            fallbacks=0,
        )
        check_hyper("HORST", defaults)
        _check_rounding(defaults)
        _check_torch_flags(defaults)
        self._reverted_last: list[int | Tensor] = []  # the last step's counts (device tensors until read)
        self._unread: list[tuple[dict[str, Any], Tensor]] = []  # device counts not yet added to the groups
        self._steps_since_read = 0
        #: Read the NaN guard's device counts (one host read for all tensors) every this many steps, so that
        #: the first revert warns within that many steps; None: only when ``reverted``,
        #: ``reverted_total`` or ``state_dict()`` is read (no host read in the step at all). Only the
        #: foreach and compiled paths count on the device; the fused CPU kernel counts on the host.
        self.nan_check_every: int | None = 1
        # step counter -> its value, so that a step reads no counter back (see _steps_of)
        self._host_steps: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.fused_fallbacks = 0
        #: reason -> tensor-steps that took the foreach path instead of the path asked for or chosen:
        #: "compile" (the compiled step failed to compile, e.g. dynamo's recompile limit; from then on every
        #: tensor that would take it is stepped by foreach), "fused_impl" (``impl="fused"``, a tensor neither
        #: the CPU kernel nor, on CUDA, the compiled step could take), "stochastic_rounding" (a bf16 / fp16
        #: tensor subclass other than DTensor in a ``stochastic_rounding`` group: rounded to nearest
        #: instead), and under ``impl="auto"`` each tensor that takes the foreach path where other tensors
        #: would take a faster one: "tensor_subclass" (DTensor, by design), "cpu_dtype" (CPU bf16 / fp16 /
        #: float64, by design), "non_contiguous", "kernel_build" (the C kernel did not build), "no_triton"
        #: (CUDA without Triton), "cuda_dtype" (CUDA float64), "device" (:data:`FALLBACK_REASONS`). Each
        #: reason warns once. The per-group sums are saved with the state dict (group keys ``fallbacks``
        #: and, by reason, ``fallback_reasons``); see :attr:`fallbacks_total` and
        #: :attr:`fallback_messages`.
        self.fallbacks: dict[str, int] = {}
        self._compile_failed = False
        self._compile_error = ""
        self._warned: set[str] = set()
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (as torch's optimizers do), then check its hyper-parameters and its ``fused`` demand."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        check_hyper("HORST", group)
        _check_torch_flags(group)
        _resolve_seed(group)
        group["fallback_reasons"] = dict(group.get("fallback_reasons") or {})  # never a shared default
        impl = group["impl"]
        if impl not in IMPLS:
            raise ConfigError(f"HORST: impl must be one of {IMPLS}, got {impl!r}")
        if impl == "fused" and load_kernel() is None:
            raise ConfigError(
                "HORST: impl='fused' needs the C++ kernel, which did not build; use impl='auto'"
            )
        if group["fused"]:
            for p in group["params"]:
                why = _unfusable(p)
                if why:
                    raise ConfigError(
                        f"HORST: fused=True cannot be honoured for a {p.dtype} tensor on {p.device}: {why}; "
                        "drop fused=True (HORST then picks the fastest path itself)"
                    )

    @property
    def reverted(self) -> int:
        """Elements the NaN guard reverted at the last step (reads pending device counts: one host read)."""
        self._read_counts()
        return sum(int(n) for n in self._reverted_last)

    @reverted.setter
    def reverted(self, value: int) -> None:
        self._reverted_last = [int(value)]

    @property
    def reverted_total(self) -> int:
        """Elements reverted by the NaN guard since the optimizer was made (or its state saved); reads
        pending device counts (one host read)."""
        self._read_counts()
        return sum(int(g.get("nan_reverted", 0)) for g in self.param_groups)

    @property
    def fallback_messages(self) -> dict[str, str]:
        """Every fallback recorded in the groups (this process, and as saved with the state dict): reason ->
        one line saying how many tensor-steps took the foreach path and why, for a run's log."""
        counts: dict[str, int] = {}
        for group in self.param_groups:
            for why, n in (group.get("fallback_reasons") or {}).items():
                counts[why] = counts.get(why, 0) + int(n)
        return {
            why: f"HORST: {n} tensor-step(s) took the foreach path: {FALLBACK_REASONS.get(why, why)}"
            for why, n in counts.items()
        }

    def _read_counts(self, stacklevel: int = 5) -> None:
        """Add the NaN guard's pending device counts to the groups, with one host read for all of them."""
        self._steps_since_read = 0
        if not self._unread:
            return
        pending, self._unread = self._unread, []
        # stacked where the counts live, then one device-to-host copy for all of them
        counts = torch.stack([c.detach().to(torch.int64) for _, c in pending]).tolist()
        by_tensor = {id(c): int(n) for (_, c), n in zip(pending, counts, strict=True)}
        for (group, _), n in zip(pending, counts, strict=True):
            group["nan_reverted"] = int(group.get("nan_reverted", 0)) + int(n)
        self._reverted_last = [n if isinstance(n, int) else by_tensor[id(n)] for n in self._reverted_last]
        if any(counts):
            self._warn_nan(sum(counts), stacklevel)

    def _warn_nan(self, n: int, stacklevel: int = 4) -> None:
        self._warn_once(
            "nan_guard",
            f"HORST: the NaN guard reverted {n} element(s) whose update was not finite (their "
            "weights and moments keep the previous step's values); this warning is shown once, the count "
            "is optimizer.reverted_total (per group: 'nan_reverted'). Check the data, lower the lr or "
            "clip gradients",
            stacklevel=stacklevel,
        )

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict, after the NaN guard's pending device counts are read into the groups."""
        self._read_counts()
        return super().state_dict()

    @property
    def fallbacks_total(self) -> int:
        """Tensor-steps that fell back to the foreach path (any reason) since the optimizer was made, or as
        saved with its state dict."""
        return sum(int(g.get("fallbacks", 0)) for g in self.param_groups)

    def _warn_once(
        self, key: str, message: str, stacklevel: int = 5, category: type[Warning] = RuntimeWarning
    ) -> None:
        # stacklevel 5: _warn_once <- step <- torch.no_grad's wrapper <- Optimizer's step hook <- the caller
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, category, stacklevel=stacklevel)

    def _advance_steps(self, states: list[dict[str, Any]]) -> list[int]:
        """Add 1 to each step counter (0-dim float32 CPU tensors, as AdamW keeps them) and return the new
        values, from host copies of the counters: a step reads no counter back. A counter the optimizer has
        not seen (replaced in the state, e.g. by hand) is read once, all such counters together."""
        for state in states:
            if not isinstance(state["step"], Tensor):
                state["step"] = torch.tensor(float(state["step"]), dtype=torch.float32)
        counters = [state["step"] for state in states]
        if not counters:
            return []
        unseen = [c for c in counters if c not in self._host_steps]
        for c, k in zip(unseen, _read_steps(unseen), strict=True):
            self._host_steps[c] = k
        torch._foreach_add_(counters, 1.0)
        steps = [self._host_steps[c] + 1 for c in counters]
        for c, k in zip(counters, steps, strict=True):
            self._host_steps[c] = k
        return steps

    def _init_state(self, p: Tensor) -> dict[str, Any]:
        state = self.state[p]
        if not state:
            moment_dtype = torch.float32 if p.dtype in _LOW_PRECISION else p.dtype
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            self._host_steps[state["step"]] = 0
            state["exp_avg"] = torch.zeros_like(p, dtype=moment_dtype, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=moment_dtype, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """Perform one HORST step on every parameter that has a gradient."""
        loss = evaluate_closure(closure)
        for group in self.param_groups:  # python numbers first: no device read-back; nothing touched yet
            check_hyper("HORST", group, tensors=False)
            _check_rounding(group)
            _check_torch_flags(group)
        _check_tensor_hypers(self.param_groups)
        self._reverted_last = []
        pending: list[tuple[dict[str, Any], Tensor]] = []  # device counts (foreach and compiled paths)
        first = 0  # the flat index of the group's first parameter (as in the state dict): the rounding key's
        host = 0
        for group in self.param_groups:
            host += self._step_group(group, pending, first)
            first += len(group["params"])
        self._reverted_last = [host, *(c for _, c in pending)]
        self._unread.extend(pending)
        self._steps_since_read += 1
        if host:
            self._warn_nan(host, stacklevel=6)
        every = self.nan_check_every
        if self._unread and every is not None and self._steps_since_read >= every:
            self._read_counts(
                stacklevel=7
            )  # the one host read of this step (none when no device count is pending)
        return loss

    def _path(self, impl: str, kernel: Any, p: Tensor, m: Tensor, v: Tensor, g: Tensor) -> tuple[str, str]:
        """Which fast path steps this tensor: ``"kernel"``, ``"compiled"`` or ``"foreach"``, and why a tensor
        that should have taken a faster path takes foreach (``""``, ``"compile"`` or ``"fused_impl"``)."""
        if kernel is not None and _kernel_ok(p, m, v, g):
            return "kernel", ""
        # impl="fused" on CUDA: the compiled step is CUDA's fused path (as for AdamW's fused=True)
        fast_cuda = impl in ("auto", "fused") and _is_cuda(p)
        if (impl == "compiled" or fast_cuda) and _compiled_ok(p, m, v, g):
            if self._compile_failed and impl != "compiled":
                return "foreach", "compile"
            if _can_compile(p.device):
                return "compiled", ""
            if impl == "compiled":
                raise ConfigError(
                    f"HORST: impl='compiled' cannot compile for {p.device} here (no Triton / C++ compiler); "
                    "use impl='auto'"
                )
        if impl == "fused":
            return "foreach", "fused_impl"
        if impl == "auto":
            return "foreach", _auto_reason(p, m, v, g, kernel)
        return "foreach", ""

    def _step_group(
        self, group: dict[str, Any], pending: list[tuple[dict[str, Any], Tensor]], first: int
    ) -> int:
        """Step one group (its parameters have flat indices ``first, first + 1, ...``); returns the elements
        its NaN guard reverted (the compiled path's go to pending)."""
        hp = HorstHyper.of_group(group)
        reverted = 0
        impl = group["impl"]
        kernel = load_kernel() if impl in ("auto", "fused") else None
        buckets: dict[tuple, tuple[list, ...]] = {}
        indexed = [(first + j, p) for j, p in enumerate(group["params"]) if p.grad is not None]
        params = [p for _, p in indexed]
        if any(p.grad.is_sparse for p in params):
            raise ConfigError("HORST does not support sparse gradients; use dense embeddings")
        states = [self._init_state(p) for p in params]
        stochastic, seed = group["stochastic_rounding"], group["sr_seed"]
        maximize = group.get("maximize", False)
        unroundable = 0
        steps = self._advance_steps(states)
        for (index, p), state, step in zip(indexed, states, steps, strict=True):
            mirror = p.ndim >= 2 if group["mirror"] is None else bool(group["mirror"])
            key = None
            if stochastic and p.dtype in _LOW_PRECISION:
                if can_round(p):
                    key = rounding_key(seed, index, step)
                else:
                    unroundable += 1
            if impl == "reference":
                new = horst_reference(
                    p, p.grad, state["exp_avg"], state["exp_avg_sq"], step=step, mirror=mirror, sr_key=key,
                    maximize=maximize, **hp._asdict(),
                )  # fmt: skip
                reverted += new.reverted
                for dst, src in zip((p, state["exp_avg"], state["exp_avg_sq"]), new[:3], strict=True):
                    dst.copy_(src)
                continue
            path, why = self._path(impl, kernel, p, state["exp_avg"], state["exp_avg_sq"], p.grad)
            bucket_key = (path, why, mirror, p.device, p.dtype, key is not None)
            lists = buckets.setdefault(bucket_key, ([], [], [], [], [], []))
            for lst, item in zip(
                lists, (p, p.grad, state["exp_avg"], state["exp_avg_sq"], step, key), strict=True
            ):
                lst.append(item)
        if unroundable:
            self._record_fallback(group, "stochastic_rounding", unroundable)
        for (path, why, mirror, _, _, rounds), lists in buckets.items():
            bucket, sr_keys = Bucket(*lists[:5]), lists[5] if rounds else None
            if path == "compiled":
                if self._step_compiled(group, bucket, hp, mirror, pending, sr_keys, maximize):
                    continue
                why = "compile"
            if path == "kernel":  # _path has checked the tensors (float32: nothing to round)
                reverted += kernel.horst_step_(bucket, hp, mirror=mirror, check=False, maximize=maximize)
            else:
                if why:
                    self._record_fallback(group, why, len(lists[0]))
                if group.get("fused"):
                    self._fell_back(len(lists[0]))
                bad = _horst_foreach_(bucket, hp, mirror=mirror, sr_keys=sr_keys, maximize=maximize)
                if bad is not None and not bad.is_meta:  # a device count: read with the step's one read
                    pending.append((group, bad))
        if group.get("fused") and impl == "reference" and params:
            self._fell_back(len(params))
        group["nan_reverted"] = int(group.get("nan_reverted", 0)) + reverted
        return reverted

    def _record_fallback(self, group: dict[str, Any], why: str, n: int) -> None:
        self.fallbacks[why] = self.fallbacks.get(why, 0) + n
        group["fallbacks"] = int(group.get("fallbacks", 0)) + n
        reasons = group.setdefault("fallback_reasons", {})
        reasons[why] = int(reasons.get(why, 0)) + n
        if why == "compile":
            message = (
                f"HORST: the compiled step could not be used ({self._compile_error}); {n} tensor(s) took the "
                "foreach path at this step, and every tensor that would take the compiled path takes foreach "
                "from now on (slower, same result up to rounding). Shown once, counted in "
                "optimizer.fallbacks['compile'] and optimizer.fallbacks_total"
            )
        elif why == "stochastic_rounding":
            message = (
                f"HORST: stochastic_rounding=True, but {n} bf16 / fp16 tensor(s) are tensor subclasses it cannot "
                "round (only plain tensors and DTensors); they were rounded to nearest at this step. Shown once, "
                "counted in optimizer.fallbacks['stochastic_rounding'] and optimizer.fallbacks_total"
            )
        elif why == "fused_impl":
            message = (
                f"HORST: impl='fused', but {n} tensor(s) could take neither the fused CPU kernel (float32 "
                "contiguous CPU tensors) nor the compiled CUDA step, and took the foreach path. Shown once, "
                "counted in optimizer.fallbacks['fused_impl'] and optimizer.fallbacks_total"
            )
        else:
            reason = FALLBACK_REASONS[why]
            if why == "kernel_build":
                reason += f" ({_horst_kernel.build_error or 'no detail'})"
            message = (
                f"HORST: impl='auto' stepped {n} tensor(s) with the foreach path: {reason}. "
                f"Shown once, counted in optimizer.fallbacks[{why!r}] (per group: 'fallback_reasons'); "
                "optimizer.fallback_messages has a line per reason for a run's log"
            )
        self._warn_once(f"fallback:{why}", message, stacklevel=7, category=HorstFallbackWarning)

    def _fell_back(self, n: int) -> None:
        self.fused_fallbacks += n
        self._warn_once(
            "fused",
            f"HORST: fused=True, but {n} tensor(s) took the foreach path at this step (not contiguous, a "
            "tensor subclass, or the compile failed); shown once, counted in optimizer.fused_fallbacks",
            stacklevel=7,  # + _fell_back and _step_group
        )

    def _step_compiled(
        self,
        group: dict[str, Any],
        bucket: Bucket,
        hp: HorstHyper,
        mirror: bool,
        pending: list[tuple[dict[str, Any], Tensor]],
        sr_keys: list[int] | None,
        maximize: bool = False,
    ) -> bool:
        """Step one bucket with the compiled path; False (nothing modified) if ``auto`` could not compile it."""
        try:
            bad = _horst_compiled.horst_compiled_(
                bucket, hp, mirror=mirror, sr_keys=sr_keys, maximize=maximize
            )
            if hp.nan_guard:  # without the guard the count is 0: no read-back, no host sync
                pending.append((group, bad))
        except Exception as exc:  # compilation fails before the graph runs: the tensors are untouched
            if group["impl"] == "compiled":
                raise
            # e.g. FailOnRecompileLimitHit: every graph shares one code object compiled with fullgraph=True,
            # so past dynamo's recompile_limit compiling raises instead of running eagerly
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self._compile_error = f"{type(exc).__name__}: {first}"[:300]
            logger.debug("HORST: torch.compile of the step failed", exc_info=True)
            self._compile_failed = True
            return False
        return True

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict exactly, keeping float32 moments of low-precision parameters in float32.

        AdamW state dicts load too (same state keys); group keys they lack take this optimizer's defaults
        (``sr_seed`` None is resolved as at construction). The saved ``stochastic_rounding`` and ``sr_seed``
        are restored with the other group keys, so a resumed run draws the same rounding bits.

        ``Optimizer.load_state_dict`` casts every state tensor to its parameter's dtype, which would round
        the float32 moments of bf16 parameters; they are restored from ``state_dict`` afterwards.
        """
        super().load_state_dict(state_dict)
        for group in self.param_groups:  # e.g. a torch.optim.AdamW state dict: take HORST's defaults
            for key, value in self.defaults.items():
                group.setdefault(key, value)
            _check_torch_flags(group)
            _resolve_seed(group)
        # torch moves `step` onto the parameter's device when a group has fused=True (as for its own fused
        # optimizers), and a device counter would be read back at every step: HORST keeps its counters as
        # float32 CPU scalars, and their values on the host (read here, once)
        counters = []
        for group in self.param_groups:
            group["fallback_reasons"] = dict(group.get("fallback_reasons") or {})
            for p in group["params"]:
                state = self.state.get(p)
                if state and "step" in state:
                    step = state["step"]
                    if not isinstance(step, Tensor):
                        step = torch.tensor(float(step))
                    state["step"] = step.detach().to("cpu", torch.float32, copy=True)
                    counters.append(state["step"])
        for c, k in zip(counters, _read_steps(counters), strict=True):
            self._host_steps[c] = k
        self._unread, self._reverted_last, self._steps_since_read = [], [], 0
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for saved_id, p in zip(saved_ids, params, strict=True):
            saved = state_dict["state"].get(saved_id)
            if saved is None or p.dtype not in _LOW_PRECISION:
                continue
            for key in ("exp_avg", "exp_avg_sq"):
                self.state[p][key] = saved[key].to(device=p.device, dtype=saved[key].dtype, copy=True)


__all__ = ["FALLBACK_REASONS", "HORST", "HorstFallbackWarning", "HorstStep", "horst_reference"]
