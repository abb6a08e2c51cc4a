r"""The functional core of HORST and HAM: the Adam update and the hyperbolic mirror step, each written once.

HORST (:mod:`descentlab.optim.horst`), the composable geometries (:mod:`descentlab.optim.compose`) and HAM
(:mod:`descentlab.optim.ham`) are bookkeeping around these pure functions. With step k >= 1, gradient g,
learning rate :math:`\eta`::

    Adam          m_k = beta1 m_{k-1} + (1 - beta1) g          v_k = beta2 v_{k-1} + (1 - beta2) g^2
                  u_k = eta / (1 - beta1^k) * m_k / (sqrt(v_k) / sqrt(1 - beta2^k) + eps)
    mirror        x   = clamp(-alpha sign(theta) * d - eta beta, -c, c)
                  theta <- theta * exp(x)

The mirror step is driven by a direction d: HORST and ``mirror_after`` pass the steepest update u (so
alpha is dimensionless), HAM passes the raw gradient with alpha -> eta alpha. The arithmetic follows
``torch.optim.AdamW``'s single-tensor path op for op, so ``theta (1 - eta lambda) - u`` is AdamW's step
bit for bit; the ``*_foreach_`` twins do the same ops on lists of tensors with ``torch._foreach_*``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from descentlab.errors import ConfigError

_NON_NEGATIVE = ("lr", "eps", "weight_decay", "alpha", "beta")


def _number(value: Any) -> float | None:
    """``value`` as a float, or None when it is not a real number (a one-element tensor counts)."""
    if isinstance(value, Tensor) and value.numel() == 1 and not value.is_complex():
        return float(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def check_hyper(owner: str, values: Mapping[str, Any], *, tensors: bool = True) -> None:
    """Raise :class:`~descentlab.errors.ConfigError` (a ``ValueError``) unless the HORST / HAM hyper-parameters
    in ``values`` are in range, as ``torch.optim.AdamW`` checks its own, and finite (AdamW lets some NaN
    through; here a NaN or Inf never is).

    Checked when present: ``lr``, ``eps``, ``weight_decay``, ``alpha``, ``beta`` (finite, >= 0), ``betas``
    (two finite numbers in [0, 1)) and ``exp_clamp`` (None or finite > 0). With ``tensors=False`` tensor
    values are skipped: the per-step check then never reads a device tensor back.
    """
    for key in _NON_NEGATIVE:
        if key not in values:
            continue
        raw = values[key]
        if not tensors and isinstance(raw, Tensor):
            continue
        value = _number(raw)
        if value is None or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{owner}: invalid {key}={raw!r}; it must be a finite number >= 0")
    if "betas" in values:
        betas = values["betas"]
        pair = list(betas) if isinstance(betas, list | tuple) else None
        ok = pair is not None and len(pair) == 2
        if ok and (tensors or not any(isinstance(b, Tensor) for b in pair)):
            nums = [_number(b) for b in pair]
            ok = all(b is not None and math.isfinite(b) and 0.0 <= b < 1.0 for b in nums)
        if not ok:
            raise ConfigError(f"{owner}: invalid betas={betas!r}; they must be two finite numbers in [0, 1)")
    if values.get("exp_clamp") is not None:
        clamp = _number(values["exp_clamp"])
        if clamp is None or not math.isfinite(clamp) or clamp <= 0:
            raise ConfigError(
                f"{owner}: invalid exp_clamp={values['exp_clamp']!r}; it must be a finite number > 0 or None"
            )


class HorstHyper(NamedTuple):
    """One param group's HORST hyper-parameters, as every implementation of the step takes them.

    ``exp_clamp`` bounds the mirror exponent (None: unbounded); ``nan_guard`` keeps the old parameter and
    moments of every element whose new value is not finite.
    """

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    alpha: float
    beta: float
    exp_clamp: float | None
    nan_guard: bool

    @classmethod
    def of_group(cls, group: Mapping[str, Any]) -> HorstHyper:
        beta1, beta2 = group["betas"]
        keys = ("lr", "eps", "weight_decay", "alpha", "beta", "exp_clamp", "nan_guard")
        return cls(beta1=beta1, beta2=beta2, **{k: group[k] for k in keys})

    def bias_corrections(self, steps: list[int]) -> tuple[list[float], list[float]]:
        """Per-tensor ``(step_sizes, bc2_sqrts)`` of the steps k (see :func:`bias_correction`)."""
        pairs = [bias_correction(k, lr=self.lr, betas=(self.beta1, self.beta2)) for k in steps]
        return [a for a, _ in pairs], [b for _, b in pairs]


class Bucket(NamedTuple):
    """Tensors that one fast-path call steps together (same device, dtype and mirror rule), with the step
    number k of each."""

    params: list[Tensor]
    grads: list[Tensor]
    exp_avgs: list[Tensor]
    exp_avg_sqs: list[Tensor]
    steps: list[int]


def evaluate_closure(closure: Callable[[], Tensor] | None) -> Tensor | None:
    """``closure()`` with gradients enabled (inside an optimizer's no-grad ``step``), or None."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def bias_correction(step: int, *, lr: float, betas: tuple[float, float]) -> tuple[float, float]:
    r"""Adam's bias corrections at step k: :math:`(\eta / (1 - \beta_1^k), \sqrt{1 - \beta_2^k})`.

    Returns:
        ``(step_size, bc2_sqrt)``, as ``torch.optim.AdamW`` computes them (Python floats).
    """
    beta1, beta2 = betas
    return lr / (1 - beta1**step), (1 - beta2**step) ** 0.5


def adam_update_(
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    *,
    step: int,
    lr: float,
    betas: tuple[float, float],
    eps: float,
) -> Tensor:
    r"""Advance the Adam moments in place and return the bias-corrected, lr-scaled update.

    .. math::
        m \leftarrow \beta_1 m + (1 - \beta_1) g, \quad v \leftarrow \beta_2 v + (1 - \beta_2) g^2, \quad
        u = \frac{\eta}{1 - \beta_1^k} \, \frac{m}{\sqrt{v} / \sqrt{1 - \beta_2^k} + \epsilon}

    Args:
        grad: the gradient g (in the moments' dtype).
        exp_avg, exp_avg_sq: the moments m, v after step ``step - 1``; updated in place.
        step: the step number k >= 1 of this update.
        lr: the learning rate eta.
        betas: (beta1, beta2).
        eps: added to the bias-corrected sqrt(v).

    Returns:
        The update u (a new tensor): AdamW's step is ``theta * (1 - lr * weight_decay) - u``.
    """
    beta1, beta2 = betas
    step_size, bc2_sqrt = bias_correction(step, lr=lr, betas=betas)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    return (exp_avg * step_size) / ((exp_avg_sq.sqrt() / bc2_sqrt) + eps)


def adam_update_foreach_(
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    *,
    steps: list[int],
    lr: float,
    betas: tuple[float, float],
    eps: float,
) -> list[Tensor]:
    """:func:`adam_update_` on lists of tensors sharing device and dtype, with ``torch._foreach_*`` ops.

    Args:
        steps: the step number of each tensor (tensors may have started at different steps).

    Returns:
        The updates u, one new tensor per input.
    """
    beta1, beta2 = betas
    corrections = [bias_correction(k, lr=lr, betas=betas) for k in steps]
    step_sizes, bc2_sqrts = [c[0] for c in corrections], [c[1] for c in corrections]
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, bc2_sqrts)
    torch._foreach_add_(denom, eps)
    u = torch._foreach_mul(exp_avgs, step_sizes)
    torch._foreach_div_(u, denom)
    return u


def mirror_exponent(
    theta: Tensor, direction: Tensor, *, alpha: float, lr_beta: float, clamp: float | None
) -> Tensor:
    r"""The exponent of the hyperbolic mirror step.

    .. math::
        x = \mathrm{clamp}(-\alpha\,\mathrm{sign}(\theta) \odot d - \eta\beta, -c, c)

    Args:
        theta: the weights the step multiplies (their sign matters, not their size).
        direction: d, the update driving the step (HORST: the Adam update u; HAM: the raw gradient).
        alpha: the strength of the step (HAM passes eta * alpha).
        lr_beta: eta * beta, the extra multiplicative decay.
        clamp: c; ``None``: no clamp.
    """
    x = (torch.sign(theta) * direction) * (-alpha) + (-lr_beta)
    if clamp is not None:
        x = x.clamp(-clamp, clamp)
    return x


def hyperbolic_mirror(
    theta: Tensor, direction: Tensor, *, alpha: float, lr_beta: float, clamp: float | None
) -> Tensor:
    r"""The hyperbolic mirror step :math:`\theta \odot \exp(x)`, x from :func:`mirror_exponent`.

    Returns:
        A new tensor; ``theta`` is not modified.
    """
    return theta * torch.exp(mirror_exponent(theta, direction, alpha=alpha, lr_beta=lr_beta, clamp=clamp))


def hyperbolic_mirror_foreach_(
    thetas: list[Tensor], directions: list[Tensor], *, alpha: float, lr_beta: float, clamp: float | None
) -> None:
    """:func:`hyperbolic_mirror` in place on lists of tensors, with ``torch._foreach_*`` ops."""
    x = torch._foreach_sign(thetas)
    torch._foreach_mul_(x, directions)
    torch._foreach_mul_(x, -alpha)
    torch._foreach_add_(x, -lr_beta)
    if clamp is not None:
        torch._foreach_clamp_min_(x, -clamp)
        torch._foreach_clamp_max_(x, clamp)
    torch._foreach_exp_(x)
    torch._foreach_mul_(thetas, x)


__all__ = [
    "adam_update_",
    "adam_update_foreach_",
    "bias_correction",
    "check_hyper",
    "hyperbolic_mirror",
    "hyperbolic_mirror_foreach_",
    "mirror_exponent",
]
