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
import warnings
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from descentlab.errors import ConfigError
from descentlab.optim import _horst_compiled
from descentlab.optim._horst_kernel import load_kernel
from descentlab.optim._horst_rounding import can_round, rounding_key, stochastic_round_any
from descentlab.optim.functional import (
    Bucket,
    HorstHyper,
    adam_update_,
    adam_update_foreach_,
    check_hyper,
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
    sr_key: int | None = None,
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
    if sr_key is not None and param.dtype in _LOW_PRECISION:
        p = stochastic_round_any(p, param.dtype, sr_key)
    return HorstStep(p.to(param.dtype), m.to(exp_avg.dtype), v.to(exp_avg_sq.dtype), reverted)


def _horst_foreach_(bucket: Bucket, hp: HorstHyper, *, mirror: bool, sr_keys: list[int] | None = None) -> int:
    """In-place HORST step of tensors sharing device and dtype, with ``torch._foreach_*`` ops.

    ``sr_keys``: one key per tensor to round bf16 / fp16 results stochastically (None: to nearest).

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
    if low and sr_keys is not None:
        for p, w, key in zip(params, work, sr_keys, strict=True):
            p.copy_(stochastic_round_any(w, p.dtype, key))
    elif low:
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
        raise ConfigError(
            "HORST: fused=True and foreach=True cannot be set together (as in torch.optim.AdamW)"
        )
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
            ``nan_guard``, ``impl``, ``stochastic_rounding``, ``sr_seed``.
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
            nan_reverted=0,
            fallbacks=0,
        )
        check_hyper("HORST", defaults)
        _check_rounding(defaults)
        self.reverted = 0
        self.fused_fallbacks = 0
        #: reason -> tensor-steps that took the foreach path instead of the path asked for or chosen:
        #: "compile" (the compiled step failed to compile, e.g. dynamo's recompile limit; from then on every
        #: tensor that would take it is stepped by foreach), "fused_impl" (``impl="fused"``, a tensor neither
        #: the CPU kernel nor, on CUDA, the compiled step could take), "stochastic_rounding" (a bf16 / fp16
        #: tensor subclass other than DTensor in a ``stochastic_rounding`` group: rounded to nearest
        #: instead). Each reason warns once. The per-group
        #: sums are saved with the state dict (group key ``fallbacks``); see :attr:`fallbacks_total`.
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
        _resolve_seed(group)
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
    def reverted_total(self) -> int:
        """Elements reverted by the NaN guard since the optimizer was made (or its state saved)."""
        return sum(int(g.get("nan_reverted", 0)) for g in self.param_groups)

    @property
    def fallbacks_total(self) -> int:
        """Tensor-steps that fell back to the foreach path (any reason) since the optimizer was made, or as
        saved with its state dict."""
        return sum(int(g.get("fallbacks", 0)) for g in self.param_groups)

    def _warn_once(self, key: str, message: str, stacklevel: int = 5) -> None:
        # stacklevel 5: _warn_once <- step <- torch.no_grad's wrapper <- Optimizer's step hook <- the caller
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)

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
        for group in self.param_groups:  # python numbers only: no device read-back; nothing touched yet
            check_hyper("HORST", group, tensors=False)
            _check_rounding(group)
        self.reverted = 0
        pending: list[tuple[dict[str, Any], Tensor]] = []  # the compiled path's device counts
        first = 0  # the flat index of the group's first parameter (as in the state dict): the rounding key's
        for group in self.param_groups:
            self.reverted += self._step_group(group, pending, first)
            first += len(group["params"])
        if pending:  # read back once per step
            counts = torch.stack([c.cpu() for _, c in pending]).tolist()
            for (group, _), n in zip(pending, counts, strict=True):
                group["nan_reverted"] = int(group.get("nan_reverted", 0)) + int(n)
                self.reverted += int(n)
        if self.reverted:
            self._warn_once(
                "nan_guard",
                f"HORST: the NaN guard reverted {self.reverted} element(s) whose update was not finite (their "
                "weights and moments keep the previous step's values); this warning is shown once, the count "
                "is optimizer.reverted_total (per group: 'nan_reverted'). Check the data, lower the lr or "
                "clip gradients",
            )
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
        return "foreach", "fused_impl" if impl == "fused" else ""

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
        unroundable = 0
        steps = _advance_steps([s["step"] for s in states])
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
                    **hp._asdict(),
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
                if self._step_compiled(group, bucket, hp, mirror, pending, sr_keys):
                    continue
                why = "compile"
            if path == "kernel":  # _path has checked the tensors (float32: nothing to round)
                reverted += kernel.horst_step_(bucket, hp, mirror=mirror, check=False)
            else:
                if why:
                    self._record_fallback(group, why, len(lists[0]))
                if group.get("fused"):
                    self._fell_back(len(lists[0]))
                reverted += _horst_foreach_(bucket, hp, mirror=mirror, sr_keys=sr_keys)
        if group.get("fused") and impl == "reference" and params:
            self._fell_back(len(params))
        group["nan_reverted"] = int(group.get("nan_reverted", 0)) + reverted
        return reverted

    def _record_fallback(self, group: dict[str, Any], why: str, n: int) -> None:
        self.fallbacks[why] = self.fallbacks.get(why, 0) + n
        group["fallbacks"] = int(group.get("fallbacks", 0)) + n
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
        else:
            message = (
                f"HORST: impl='fused', but {n} tensor(s) could take neither the fused CPU kernel (float32 "
                "contiguous CPU tensors) nor the compiled CUDA step, and took the foreach path. Shown once, "
                "counted in optimizer.fallbacks['fused_impl'] and optimizer.fallbacks_total"
            )
        self._warn_once(f"fallback:{why}", message, stacklevel=7)

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
    ) -> bool:
        """Step one bucket with the compiled path; False (nothing modified) if ``auto`` could not compile it."""
        try:
            bad = _horst_compiled.horst_compiled_(bucket, hp, mirror=mirror, sr_keys=sr_keys)
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
            _check_rounding(group)
            _resolve_seed(group)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for saved_id, p in zip(saved_ids, params, strict=True):
            saved = state_dict["state"].get(saved_id)
            if saved is None or p.dtype not in _LOW_PRECISION:
                continue
            for key in ("exp_avg", "exp_avg_sq"):
                self.state[p][key] = saved[key].to(device=p.device, dtype=saved[key].dtype, copy=True)


__all__ = ["HORST", "HorstStep", "horst_reference"]
