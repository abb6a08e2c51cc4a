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
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from descentlab.errors import ConfigError
from descentlab.optim import _horst_compiled
from descentlab.optim._horst_kernel import load_kernel
from descentlab.optim.functional import (
    Bucket,
    HorstHyper,
    adam_update_,
    adam_update_foreach_,
    evaluate_closure,
    hyperbolic_mirror,
    hyperbolic_mirror_foreach_,
)

logger = logging.getLogger(__name__)

IMPLS = ("auto", "fused", "compiled", "foreach", "reference")
_COMPILED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_LOW_PRECISION = (torch.bfloat16, torch.float16)


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
) -> HorstStep:
    """One HORST step of one tensor, as a pure function (see the module docstring for the equations).

    Arithmetic follows ``torch.optim.AdamW``'s single-tensor path op for op, so that with alpha = beta = 0 the
    result is AdamW's. Low-precision inputs are computed in float32.

    Args:
        param, grad: the parameter and its gradient (same shape).
        exp_avg, exp_avg_sq: first and second moments after step ``step - 1``.
        step: the step number k >= 1 of this update.
        nan_guard: elements whose new value is not finite keep their old parameter and moments.

    Returns:
        The new parameter (in ``param.dtype``), the new moments (in their input dtype) and the number of
        elements the NaN guard reverted. The inputs are not modified.
    """
    compute = torch.float32 if param.dtype in _LOW_PRECISION else param.dtype
    p = param.to(compute)
    g = grad.to(compute)
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
        reverted = int((~ok).sum())
        p = torch.where(ok, p, param.to(compute))
        m, v = torch.where(ok, m, m0), torch.where(ok, v, v0)
    return HorstStep(p.to(param.dtype), m.to(exp_avg.dtype), v.to(exp_avg_sq.dtype), reverted)


def _horst_foreach_(bucket: Bucket, hp: HorstHyper, *, mirror: bool) -> int:
    """In-place HORST step of tensors sharing device and dtype, with ``torch._foreach_*`` ops.

    Returns:
        The number of elements the NaN guard reverted.
    """
    params, grads, exp_avgs, exp_avg_sqs, steps = bucket
    lr, beta1, beta2, eps, weight_decay, alpha, beta, exp_clamp, nan_guard = hp
    low = params[0].dtype in _LOW_PRECISION
    work = [p.float() for p in params] if low else params
    grads = [g.float() for g in grads] if low else grads
    if nan_guard:
        old = (
            [p.clone() for p in work],
            [m.clone() for m in exp_avgs],
            [v.clone() for v in exp_avg_sqs],
        )
    torch._foreach_mul_(work, 1 - lr * weight_decay)
    u = adam_update_foreach_(grads, exp_avgs, exp_avg_sqs, steps=steps, lr=lr, betas=(beta1, beta2), eps=eps)
    torch._foreach_sub_(work, u)
    if mirror:
        hyperbolic_mirror_foreach_(work, u, alpha=alpha, lr_beta=lr * beta, clamp=exp_clamp)
    reverted = 0
    if nan_guard:
        for i, p in enumerate(work):
            bad = ~torch.isfinite(p)
            n_bad = int(bad.sum())
            if n_bad:
                reverted += n_bad
                p.copy_(torch.where(bad, old[0][i], p))
                exp_avgs[i].copy_(torch.where(bad, old[1][i], exp_avgs[i]))
                exp_avg_sqs[i].copy_(torch.where(bad, old[2][i], exp_avg_sqs[i]))
    if low:
        torch._foreach_copy_(params, work)
    return reverted


_PLAIN = (Tensor, nn.Parameter)  # not subclasses such as DTensor


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


def _advance_steps(counters: list[Tensor]) -> list[int]:
    """Add 1 to each step counter (0-dim tensors, as AdamW keeps them) and return the new values, with one
    read-back for the lot instead of one ``.item()`` per tensor."""
    if not counters:
        return []
    torch._foreach_add_(counters, 1.0)
    if len({c.device for c in counters}) > 1:
        return [int(c.item()) for c in counters]
    return [int(k) for k in torch.stack(counters).tolist()]


def _kernel_ok(p: Tensor, m: Tensor, v: Tensor, g: Tensor) -> bool:
    # Plain tensors only: subclasses such as FSDP2's DTensor take the foreach path, which dispatches them.
    # A loop, not all(<generator>): this runs for every tensor at every step.
    for t in (p, m, v, g):
        if type(t) not in _PLAIN or t.dtype != torch.float32 or not t.is_cpu or not t.is_contiguous():
            return False
    return True


class HORST(Optimizer):
    """HORST as a :class:`torch.optim.Optimizer`; the update is in the module docstring.

    Args:
        params: parameters or param groups. Group keys: ``lr``, ``betas``, ``eps``, ``weight_decay``,
            ``alpha``, ``beta``, ``mirror`` (``True``/``False``/``None`` = ndim >= 2), ``exp_clamp``,
            ``nan_guard``, ``impl``.
        alpha: strength of the mirror (L1) step; 0 turns it off.
        beta: multiplicative decay exp(-lr * beta) of mirrored tensors.
        exp_clamp: clamp of the mirror exponent (``None``: none).
        nan_guard: revert elements whose update is not finite (their moments too); the count of the last step
            is ``self.reverted``.
        impl: ``"auto"`` (fused CPU kernel for float32 CPU tensors when it builds; the compiled path for plain
            CUDA tensors when Triton is there; foreach otherwise), ``"fused"`` (the CPU kernel is required),
            ``"compiled"`` (``torch.compile`` of the step for plain tensors on any device Inductor compiles
            for, CPU included; tensor subclasses such as DTensor and float64 take the foreach path),
            ``"foreach"`` or ``"reference"``.

    State per parameter (names as in AdamW): ``step`` (float32 scalar tensor), ``exp_avg``, ``exp_avg_sq``.
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
    ) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or alpha < 0 or beta < 0:
            raise ConfigError(
                f"HORST: lr, eps, weight_decay, alpha and beta must be >= 0 (got lr={lr}, eps={eps}, "
                f"weight_decay={weight_decay}, alpha={alpha}, beta={beta})"
            )
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ConfigError(f"HORST: betas must lie in [0, 1), got {betas}")
        if exp_clamp is not None and exp_clamp <= 0:
            raise ConfigError(f"HORST: exp_clamp must be > 0 or None, got {exp_clamp}")
        if impl not in IMPLS:
            raise ConfigError(f"HORST: impl must be one of {IMPLS}, got {impl!r}")
        if impl == "fused" and load_kernel() is None:
            raise ConfigError(
                "HORST: impl='fused' needs the C++ kernel, which did not build; use impl='auto'"
            )
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            alpha=alpha,
            beta=beta,
            mirror=mirror,
            exp_clamp=exp_clamp,
            nan_guard=nan_guard,
            impl=impl,
        )
        super().__init__(params, defaults)
        self.reverted = 0
        self._compile_failed = False

    def _init_state(self, p: Tensor) -> dict[str, Any]:
        state = self.state[p]
        if not state:
            moment_dtype = torch.float32 if p.dtype in _LOW_PRECISION else p.dtype
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, dtype=moment_dtype, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=moment_dtype, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """Perform one HORST step on every parameter that has a gradient."""
        loss = evaluate_closure(closure)
        self.reverted = 0
        pending: list[Tensor] = []  # the compiled path's device counts: read back once per step
        for group in self.param_groups:
            self._step_group(group, pending)
        if pending:
            self.reverted += int(torch.stack([c.cpu() for c in pending]).sum())
        return loss

    def _path(self, impl: str, kernel: Any, p: Tensor, m: Tensor, v: Tensor, g: Tensor) -> str:
        """Which fast path steps this tensor: ``"kernel"``, ``"compiled"`` or ``"foreach"``."""
        if kernel is not None and _kernel_ok(p, m, v, g):
            return "kernel"
        want = impl == "compiled" or (impl == "auto" and p.device.type == "cuda" and not self._compile_failed)
        if want and _compiled_ok(p, m, v, g):
            if _can_compile(p.device):
                return "compiled"
            if impl == "compiled":
                raise ConfigError(
                    f"HORST: impl='compiled' cannot compile for {p.device} here (no Triton / C++ compiler); "
                    "use impl='auto'"
                )
        return "foreach"

    def _step_group(self, group: dict[str, Any], pending: list[Tensor]) -> None:
        hp = HorstHyper.of_group(group)
        impl = group["impl"]
        kernel = load_kernel() if impl in ("auto", "fused") else None
        buckets: dict[tuple, tuple[list, ...]] = {}
        params = [p for p in group["params"] if p.grad is not None]
        if any(p.grad.is_sparse for p in params):
            raise ConfigError("HORST does not support sparse gradients; use dense embeddings")
        states = [self._init_state(p) for p in params]
        for p, state, step in zip(params, states, _advance_steps([s["step"] for s in states]), strict=True):
            mirror = p.ndim >= 2 if group["mirror"] is None else bool(group["mirror"])
            if impl == "reference":
                new = horst_reference(
                    p, p.grad, state["exp_avg"], state["exp_avg_sq"], step=step, mirror=mirror, **hp._asdict()
                )
                self.reverted += new.reverted
                for dst, src in zip((p, state["exp_avg"], state["exp_avg_sq"]), new[:3], strict=True):
                    dst.copy_(src)
                continue
            path = self._path(impl, kernel, p, state["exp_avg"], state["exp_avg_sq"], p.grad)
            key = (path, mirror, p.device, p.dtype)
            lists = buckets.setdefault(key, ([], [], [], [], []))
            for lst, item in zip(
                lists, (p, p.grad, state["exp_avg"], state["exp_avg_sq"], step), strict=True
            ):
                lst.append(item)
        for (path, mirror, _, _), lists in buckets.items():
            if path == "compiled" and self._step_compiled(group, lists, hp, mirror, pending):
                continue
            if path == "kernel":  # _path has checked the tensors
                self.reverted += kernel.horst_step_(Bucket(*lists), hp, mirror=mirror, check=False)
            else:
                self.reverted += _horst_foreach_(Bucket(*lists), hp, mirror=mirror)

    def _step_compiled(
        self,
        group: dict[str, Any],
        lists: tuple[list, ...],
        hp: HorstHyper,
        mirror: bool,
        pending: list[Tensor],
    ) -> bool:
        """Step one bucket with the compiled path; False (nothing modified) if ``auto`` could not compile it."""
        try:
            pending.append(_horst_compiled.horst_compiled_(Bucket(*lists), hp, mirror=mirror))
        except Exception as exc:  # compilation fails before the graph runs: the tensors are untouched
            if group["impl"] == "compiled":
                raise
            logger.warning("HORST: torch.compile of the step failed (%s); using the foreach path", exc)
            self._compile_failed = True
            return False
        return True

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict exactly, keeping float32 moments of low-precision parameters in float32.

        AdamW state dicts load too (same state keys); group keys they lack take this optimizer's defaults.

        ``Optimizer.load_state_dict`` casts every state tensor to its parameter's dtype, which would round
        the float32 moments of bf16 parameters; they are restored from ``state_dict`` afterwards.
        """
        super().load_state_dict(state_dict)
        for group in self.param_groups:  # e.g. a torch.optim.AdamW state dict: take HORST's defaults
            for key, value in self.defaults.items():
                group.setdefault(key, value)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for saved_id, p in zip(saved_ids, params, strict=True):
            saved = state_dict["state"].get(saved_id)
            if saved is None or p.dtype not in _LOW_PRECISION:
                continue
            for key in ("exp_avg", "exp_avg_sq"):
                self.state[p][key] = saved[key].to(device=p.device, dtype=saved[key].dtype, copy=True)


__all__ = ["HORST", "HorstStep", "horst_reference"]
