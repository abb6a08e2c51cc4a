r"""Composable optimizer geometries: steepest-descent operators x the hyperbolic-entropy mirror map.

A steepest operator S maps a gradient g (and its own state) to an update u that already includes the
learning rate eta:

    gd             u = eta g                               (steepest descent, L2)
    normalized_gd  u = eta g / ||g||_2                     (normalized steepest descent, L2)
    sign           u = eta sign(g)                         (normalized steepest descent, L_inf)
    linf           u = eta ||g||_1 sign(g)                 (unnormalized steepest descent, L_inf)
    coordinate     u = eta g_i e_i, i = argmax |g_i|       (greedy coordinate descent, steepest in L1)
    adam           u = eta m_hat / (sqrt(v_hat) + eps)     (AdamW's update, torch's arithmetic)

The hyperbolic-entropy mirror map M, with potential phi(w) = sum_i [w_i asinh(w_i/gamma) -
sqrt(w_i^2 + gamma^2)] / alpha, so grad phi(w) = asinh(w/gamma) / alpha and (hess phi)^-1 = alpha sqrt(w^2 +
gamma^2), composes with S in either order (lam = weight decay, applied first):

    mirror_after  (M o S, HORST):  w' = w - u,  u = S(g) ;   w <- w' exp(clamp(-alpha sign(w') u - eta beta))
    mirror_before (S o M):         w <- w - S(alpha sqrt(w^2 + gamma^2) g) ;   w <- w exp(-eta beta)
    dual          (mirror descent): w <- gamma sinh(asinh(w / gamma) - alpha S(g)) exp(-eta beta)

mirror_after takes the steepest step and then a multiplicative mirror step driven by the same u (the form of
gamma sinh(asinh(w/gamma) - alpha u) for |w| >> gamma; the additive part lets weights leave 0).
mirror_before first maps the gradient into the mirror geometry, then applies the steepest operator: with
S = gd it is (first-order) hyperbolic mirror descent, but sign and Adam normalise the factor sqrt(w^2+gamma^2)
away, so S o M loses the L1 bias that M o S keeps: the two do not commute. ``dual`` takes the steepest step in
the mirror's dual coordinates; with S = gd it is exact hyperbolic mirror descent.
compose(params, "adam", HyperbolicMirror(alpha, beta), "mirror_after") is HORST.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from descentlab.errors import ConfigError
from descentlab.optim.functional import adam_update_, check_hyper, evaluate_closure, hyperbolic_mirror

ORDERS = ("mirror_after", "mirror_before", "dual")


def _positive(value: Any) -> bool:
    """A finite real number > 0 (a one-element real tensor counts)."""
    if isinstance(value, Tensor):
        return value.numel() == 1 and not value.is_complex() and bool(torch.isfinite(value) & (value > 0))
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


def refuse_meta(owner: str, what: str, p: Tensor) -> None:
    """One clear error for a meta tensor where the step reads a value back (a norm, an argmax, a max)."""
    if p.is_meta:
        raise ConfigError(
            f"{owner}: {what} reads values back, and a tensor on the meta device holds none; materialise the "
            "parameters first (e.g. model.to_empty(device='cpu'))"
        )


def check_group(owner: str, group: dict[str, Any], *, tensors: bool = True) -> None:
    """Raise ``ConfigError`` (a ``ValueError``, one line) unless a group's hyper-parameters are in range:
    :func:`~descentlab.optim.functional.check_hyper`'s keys (finite, >= 0; betas in [0, 1)), ``gamma`` finite
    and > 0, ``p`` > 1 (inf allowed), ``maximize`` a bool. NaN never passes; a 0-dim tensor is read as its
    value (``tensors=False`` skips tensors: the per-step check reads nothing back)."""
    check_hyper(owner, group, tensors=tensors)
    if (
        "gamma" in group
        and (tensors or not isinstance(group["gamma"], Tensor))
        and not _positive(group["gamma"])
    ):
        raise ConfigError(f"{owner}: invalid gamma={group['gamma']!r}; it must be a finite number > 0")
    if "p" in group:
        p = group["p"]
        if isinstance(p, bool) or not isinstance(p, int | float) or math.isnan(p) or not p > 1:
            raise ConfigError(f"{owner}: invalid p={p!r}; it must be a number > 1 (inf allowed)")
    if not isinstance(group.get("maximize", False), bool):
        raise ConfigError(f"{owner}: maximize must be True or False, got {group['maximize']!r}")


def gd_update(grad: Tensor, lr: float) -> Tensor:
    """u = lr g."""
    return grad * lr


def normalized_gd_update(grad: Tensor, lr: float) -> Tensor:
    """u = lr g / ||g||_2 (0 where g = 0)."""
    norm = torch.linalg.vector_norm(grad)
    return grad * (lr / norm) if norm > 0 else torch.zeros_like(grad)


def sign_update(grad: Tensor, lr: float) -> Tensor:
    """u = lr sign(g)."""
    return torch.sign(grad) * lr


def linf_update(grad: Tensor, lr: float) -> Tensor:
    """u = lr ||g||_1 sign(g): steepest descent w.r.t. L_inf scaled by the dual norm, so it settles."""
    return torch.sign(grad) * (lr * grad.abs().sum())


def coordinate_update(grad: Tensor, lr: float) -> Tensor:
    """u = lr g_i e_i with i = argmax |g_i| (greedy Gauss-Southwell coordinate descent)."""
    flat = grad.reshape(-1)
    i = int(flat.abs().argmax())
    u = torch.zeros_like(flat)
    u[i] = flat[i] * lr
    return u.view_as(grad)


def adam_update(
    grad: Tensor,
    lr: float,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    *,
    step: int,
    beta1: float,
    beta2: float,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """u = lr m_hat / (sqrt(v_hat) + eps): :func:`descentlab.optim.functional.adam_update_` on copies.

    Returns:
        ``(u, new_exp_avg, new_exp_avg_sq)``; the inputs are not modified.
    """
    m, v = exp_avg.clone(), exp_avg_sq.clone()
    u = adam_update_(grad, m, v, step=step, lr=lr, betas=(beta1, beta2), eps=eps)
    return u, m, v


STATELESS: dict[str, Callable[[Tensor, float], Tensor]] = {
    "gd": gd_update,
    "normalized_gd": normalized_gd_update,
    "sign": sign_update,
    "linf": linf_update,
    "coordinate": coordinate_update,
}
STEEPEST = (*STATELESS, "adam")


@dataclass(frozen=True)
class HyperbolicMirror:
    """The hyperbolic-entropy mirror map as an operator (see the module docstring).

    Attributes:
        alpha: inverse scale of the potential: the strength of the L1 bias.
        beta: extra multiplicative decay exp(-lr beta) per step.
        gamma: the potential's width; small gamma -> stronger L1 bias (used by ``mirror_before``).
        exp_clamp: clamp of the multiplicative exponent (``mirror_after``); ``None``: none.
    """

    alpha: float = 1.0
    beta: float = 0.0
    gamma: float = 1e-3
    exp_clamp: float | None = 5.0

    def __post_init__(self) -> None:
        check_hyper("HyperbolicMirror", {"alpha": self.alpha, "beta": self.beta, "exp_clamp": self.exp_clamp})
        if not _positive(self.gamma):
            raise ConfigError(
                f"HyperbolicMirror: invalid gamma={self.gamma!r}; it must be a finite number > 0"
            )

    def after(self, w_half: Tensor, u: Tensor, lr: float) -> Tensor:
        """w <- w_half exp(clamp(-alpha sign(w_half) u - lr beta)): the functional ``hyperbolic_mirror``."""
        return hyperbolic_mirror(w_half, u, alpha=self.alpha, lr_beta=lr * self.beta, clamp=self.exp_clamp)

    def precondition(self, w: Tensor, grad: Tensor) -> Tensor:
        """alpha sqrt(w^2 + gamma^2) g: the gradient in the mirror geometry (inverse Hessian of phi times g)."""
        return grad * torch.sqrt(w * w + self.gamma**2) * self.alpha

    def dual(self, w: Tensor, u: Tensor, lr: float) -> Tensor:
        """w <- gamma sinh(asinh(w / gamma) - alpha u) exp(-lr beta): the step u taken in dual coordinates."""
        dual = torch.asinh(w / self.gamma) - self.alpha * u
        return self.gamma * torch.sinh(dual) * math.exp(-lr * self.beta)


def composed_step(
    w: Tensor,
    u: Tensor,
    mirror: HyperbolicMirror | None,
    order: str,
    *,
    lr: float,
    weight_decay: float,
) -> Tensor:
    """One composed step of one tensor given the steepest operator's update ``u`` (module docstring).

    For ``mirror_before``, ``u`` must already be the steepest operator applied to the preconditioned
    gradient (:meth:`HyperbolicMirror.precondition`).
    """
    w = w * (1 - lr * weight_decay)
    if mirror is None:
        return w - u
    if order == "mirror_after":
        return mirror.after(w - u, u, lr)
    if order == "mirror_before":
        return (w - u) * math.exp(-lr * mirror.beta)
    return mirror.dual(w, u, lr)


class Composed(Optimizer):
    """An optimizer made of a steepest operator and an optional mirror map, composed in a given order.

    Group keys: ``lr``, ``weight_decay``, ``steepest``, ``order``, ``mirror_map`` (bool: use the mirror map),
    its fields ``alpha``, ``beta``, ``gamma``, ``exp_clamp`` (plain numbers, so state dicts load with
    ``weights_only=True``), ``mirror`` (``True``/``False``/``None`` = ndim >= 2: which tensors get the
    mirror map), ``maximize`` (step with -g, as torch's keyword), and ``betas``, ``eps`` for ``adam``.
    Every group is checked by :func:`check_group` when added and before each step (NaN, negative values). State (``adam`` only): ``step``, ``exp_avg``,
    ``exp_avg_sq``. Reference quality, per tensor: meant for studying geometries, not for speed.
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], **defaults: Any) -> None:
        defaults.setdefault("maximize", False)
        check_group("Composed", defaults)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group`` (its checks and wording), then this group's keys are checked."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if group["steepest"] not in STEEPEST:
            raise ConfigError(f"unknown steepest operator {group['steepest']!r}; choose from {STEEPEST}")
        if group["order"] not in ORDERS:
            raise ConfigError(f"order must be one of {ORDERS}, got {group['order']!r}")
        check_group("Composed", group)

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        for group in self.param_groups:  # before the closure and any update: a bad value touches nothing
            check_group("Composed", group, tensors=False)
        loss = evaluate_closure(closure)
        for group in self.param_groups:
            lr = group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                use_mirror = p.ndim >= 2 if group["mirror"] is None else bool(group["mirror"])
                mirror = None
                if group["mirror_map"] and use_mirror:
                    mirror = HyperbolicMirror(
                        group["alpha"], group["beta"], group["gamma"], group["exp_clamp"]
                    )
                if group["steepest"] in ("normalized_gd", "coordinate"):
                    refuse_meta("Composed", f"steepest={group['steepest']!r}", p)
                grad = -p.grad if group["maximize"] else p.grad
                if mirror is not None and group["order"] == "mirror_before":
                    grad = mirror.precondition(p, grad)
                if group["steepest"] == "adam":
                    state = self.state[p]
                    if not state:
                        state["step"] = torch.tensor(0.0, dtype=torch.float32)
                        state["exp_avg"] = torch.zeros_like(p)
                        state["exp_avg_sq"] = torch.zeros_like(p)
                    state["step"] += 1
                    u = adam_update_(
                        grad,
                        state["exp_avg"],
                        state["exp_avg_sq"],
                        step=int(state["step"].item()),
                        lr=lr,
                        betas=tuple(group["betas"]),
                        eps=group["eps"],
                    )
                else:
                    u = STATELESS[group["steepest"]](grad, lr)
                p.copy_(
                    composed_step(p, u, mirror, group["order"], lr=lr, weight_decay=group["weight_decay"])
                )
        return loss


def compose(
    params: Iterable[Tensor] | Iterable[dict[str, Any]],
    steepest: str = "adam",
    mirror: HyperbolicMirror | None = None,
    order: str = "mirror_after",
    *,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    mirror_tensors: bool | None = None,
    maximize: bool = False,
) -> Composed:
    """Build the optimizer ``mirror o steepest`` (``order="mirror_after"``) or ``steepest o mirror``.

    Args:
        params: parameters or param groups.
        steepest: one of ``gd``, ``normalized_gd``, ``sign``, ``linf``, ``coordinate``, ``adam``.
        mirror: the mirror map; ``None`` gives the plain steepest-descent optimizer.
        order: ``"mirror_after"`` (HORST's order), ``"mirror_before"`` or ``"dual"``.
        mirror_tensors: which tensors get the mirror map (``None``: ndim >= 2).
        maximize: ascend the objective (step with -g).

    Example:
        >>> opt = compose(model.parameters(), "adam", HyperbolicMirror(alpha=1.0), "mirror_after", lr=1e-3)
    """
    fields = HyperbolicMirror() if mirror is None else mirror
    return Composed(
        params,
        lr=lr,
        weight_decay=weight_decay,
        steepest=steepest,
        order=order,
        mirror_map=mirror is not None,
        alpha=fields.alpha,
        beta=fields.beta,
        gamma=fields.gamma,
        exp_clamp=fields.exp_clamp,
        mirror=mirror_tensors,
        betas=tuple(betas),
        eps=eps,
        maximize=maximize,
    )


def lp_direction(grad: Tensor, p: float) -> Tensor:
    r"""The L_p steepest-descent direction: the unit-L_p vector most aligned with ``grad``.

    .. math::

        d_p(g) = \arg\max_{\|d\|_p \le 1} \langle g, d \rangle, \qquad
        d_i = \operatorname{sign}(g_i) \, |g_i|^{q-1} / \|g\|_q^{q-1}, \qquad q = p / (p - 1),

    the equality case of Hölder's inequality, so :math:`\langle g, d_p \rangle = \|g\|_q` (the dual norm)
    and :math:`\|d_p\|_p = 1`. ``p = 2`` gives g / ||g||_2; ``p = inf`` gives sign(g) (q = 1), also the limit
    of finite p. ``p`` must exceed 1 (at p = 1 the maximiser is not unique). A zero gradient gives zeros.
    """
    if not p > 1:
        raise ConfigError(f"lp_direction needs p > 1 (p = inf allowed), got {p}")
    if math.isinf(p):
        return torch.sign(grad)
    a = grad.abs()
    scale = float(a.max()) if a.numel() else 0.0
    if scale == 0.0:
        return torch.zeros_like(grad)
    q = p / (p - 1)
    # |g| / max|g| first: the direction is scale-free, and |g_i|^(q-1) of a raw gradient can under- or
    # overflow when |g| spans many decades. a^q is summed as a^(q-1) . a to spend one pow, not two (the
    # theorem run takes 10^5 steps of a 100-vector, where each op's overhead is the cost).
    a = a.mul_(1.0 / scale)
    d = a.pow(q - 1)
    norm = float(torch.dot(d.reshape(-1), a.reshape(-1))) ** ((q - 1) / q)
    return d.copysign_(grad).mul_(1.0 / norm)


def lp_update(grad: Tensor, lr: float, p: float, *, dual_scaled: bool = False) -> Tensor:
    r"""L_p steepest descent: u = lr d_p(g) (:func:`lp_direction`), or u = lr ||g||_q d_p(g) with
    ``dual_scaled``.

    The two scalings continue the operators above to every p > 1, so both ends agree with them:

        u = lr d_p(g)          p = 2: ``normalized_gd``, lr g / ||g||_2;  p = inf: ``sign``, lr sign(g)
        u = lr ||g||_q d_p(g)  p = 2: ``gd``, lr g;                      p = inf: ``linf``, lr ||g||_1 sign(g)

    The dual-scaled w' = w - u minimises <g, w' - w> + ||w' - w||_p^2 / (2 lr) (unnormalised steepest
    descent in L_p); the plain form takes a step of L_p length lr whatever ||g||.
    """
    d = lp_direction(grad, p)
    if not dual_scaled:
        return d.mul_(lr)
    q = 1.0 if math.isinf(p) else p / (p - 1)
    return d * (lr * float(torch.linalg.vector_norm(grad, ord=q)))


class LpMirrorAfter(Optimizer):
    r"""M∘S with S = L_p steepest descent (:func:`lp_update`), per tensor w with gradient g:

    .. math::

        u = \eta\, d_p(g), \quad d_i = \operatorname{sign}(g_i) |g_i|^{q-1} / \|g\|_q^{q-1}, \quad
        q = p/(p-1); \qquad
        w \leftarrow (w - u) \odot \exp(\operatorname{clamp}_{\pm c}(-\alpha \operatorname{sign}(w - u) \odot u
        - \eta \beta))

    (``dual_scaled``: u = eta ||g||_q d_p(g)); alpha, beta and the clamp c are ``mirror``'s. The step is
    :func:`composed_step` with order ``mirror_after``, the function :class:`Composed` calls for
    ``normalized_gd`` and ``sign`` composed ``mirror_after``, with the mirror step on every tensor and no
    weight decay, so p = 2 is normalised GD + mirror and p = inf is sign + mirror. ``Composed`` names its
    operators by string with no parameter; this class carries p (a group key, checked by
    :func:`check_group`: p > 1, lr finite and >= 0). ``maximize=True`` steps with -g.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        *,
        lr: float,
        p: float,
        mirror: HyperbolicMirror,
        dual_scaled: bool = False,
        maximize: bool = False,
    ) -> None:
        if not isinstance(mirror, HyperbolicMirror):
            raise ConfigError(
                f"LpMirrorAfter: mirror must be a HyperbolicMirror, got {type(mirror).__name__}"
            )
        defaults = {"lr": lr, "p": p, "dual_scaled": dual_scaled, "maximize": maximize}
        check_group("LpMirrorAfter", defaults)
        super().__init__(params, defaults)
        self.mirror = mirror

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group`` (its checks and wording), then this group's keys are checked."""
        super().add_param_group(param_group)
        check_group("LpMirrorAfter", self.param_groups[-1])

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        for group in self.param_groups:
            check_group("LpMirrorAfter", group, tensors=False)
        loss = evaluate_closure(closure)
        for group in self.param_groups:
            lr = group["lr"]
            for w in group["params"]:
                if w.grad is None:
                    continue
                refuse_meta("LpMirrorAfter", "the L_p direction", w)
                grad = -w.grad if group["maximize"] else w.grad
                u = lp_update(grad, lr, group["p"], dual_scaled=group["dual_scaled"])
                w.copy_(composed_step(w, u, self.mirror, "mirror_after", lr=lr, weight_decay=0.0))
        return loss


__all__ = [
    "ORDERS",
    "STEEPEST",
    "Composed",
    "HyperbolicMirror",
    "LpMirrorAfter",
    "adam_update",
    "check_group",
    "compose",
    "composed_step",
    "coordinate_update",
    "gd_update",
    "linf_update",
    "lp_direction",
    "lp_update",
    "normalized_gd_update",
    "sign_update",
]
