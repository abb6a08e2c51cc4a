"""How a constraint enters the loss, and how its multipliers move: pure functions, no state.

A constraint is a tensor of values c(θ): inequality g(θ) <= 0 or equality h(θ) = 0. Its contribution to
the loss the primal optimizer descends, with multipliers λ (held constant: no gradient to λ) and a
penalty coefficient ρ > 0, is one of three formulations:

* Lagrangian::

      ψ(θ) = Σ_i λ_i c_i(θ)

* quadratic penalty (no multipliers)::

      inequality   ψ(θ) = ½ Σ_i ρ_i max(0, g_i(θ))²
      equality     ψ(θ) = ½ Σ_i ρ_i h_i(θ)²

* augmented Lagrangian (Nocedal & Wright, Numerical Optimization, eqs. 17.36 and 17.65)::

      inequality   ψ(θ) = Σ_i (max(0, λ_i + ρ_i g_i(θ))² - λ_i²) / (2 ρ_i)
      equality     ψ(θ) = Σ_i λ_i h_i(θ) + ½ ρ_i h_i(θ)²

  Its gradient in θ is Σ_i max(0, λ_i + ρ_i g_i) ∇g_i: the multiplier the next ascent step with step ρ would
  give. Where λ_i + ρ_i g_i <= 0 the constraint is far from active and contributes nothing.

The dual step ascends the Lagrangian in λ; its gradient is the (strict) violation c(θ_t), so projected
gradient ascent with step η is::

      inequality   λ_{t+1} = max(0, λ_t + η g_t)        (multipliers of g <= 0 stay >= 0)
      equality     λ_{t+1} = λ_t + η h_t

The method of multipliers is the augmented Lagrangian with η = ρ. Any ``torch.optim`` optimizer can take
the dual step instead (the gradient of the *maximised* dual objective is c(θ_t), so the optimizer runs with
``maximize=True``), followed by the projection :func:`project_multipliers`.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

ConstraintKind = Literal["inequality", "equality"]
Formulation = Literal["lagrangian", "augmented_lagrangian", "quadratic_penalty"]

KINDS: tuple[str, ...] = ("inequality", "equality")
FORMULATIONS: tuple[str, ...] = ("lagrangian", "augmented_lagrangian", "quadratic_penalty")


def lagrangian_term(lam: Tensor, c: Tensor) -> Tensor:
    """ψ = Σ_i λ_i c_i, with λ held constant (no gradient flows to λ).

    Args:
        lam: multipliers λ, the shape of ``c``.
        c: constraint values g or h (differentiable in θ).
    """
    return (lam.detach().to(c.dtype) * c).sum()


def quadratic_penalty_term(rho: Tensor | float, c: Tensor, kind: ConstraintKind) -> Tensor:
    """ψ = ½ Σ_i ρ_i max(0, g_i)² (inequality) or ½ Σ_i ρ_i h_i² (equality).

    Args:
        rho: penalty coefficients ρ > 0, a scalar or the shape of ``c``.
        c: constraint values.
        kind: "inequality" or "equality".
    """
    r = rho.to(c.dtype) if isinstance(rho, Tensor) else rho
    v = torch.relu(c) if kind == "inequality" else c
    return 0.5 * (r * v * v).sum()


def augmented_lagrangian_term(lam: Tensor, rho: Tensor | float, c: Tensor, kind: ConstraintKind) -> Tensor:
    """The augmented-Lagrangian term (module docstring), λ held constant.

    inequality:  Σ_i (max(0, λ_i + ρ_i g_i)² - λ_i²) / (2 ρ_i)
    equality:    Σ_i λ_i h_i + ½ ρ_i h_i²

    Args:
        lam: multipliers λ, the shape of ``c`` (>= 0 for inequalities).
        rho: penalty coefficients ρ > 0, a scalar or the shape of ``c``.
        c: constraint values.
        kind: "inequality" or "equality".
    """
    lam = lam.detach().to(c.dtype)
    r = rho.to(c.dtype) if isinstance(rho, Tensor) else rho
    if kind == "inequality":
        return ((torch.relu(lam + r * c) ** 2 - lam * lam) / (2 * r)).sum()
    return (lam * c).sum() + 0.5 * (r * c * c).sum()


def project_multipliers(lam: Tensor, kind: ConstraintKind) -> Tensor:
    """The projection onto the dual feasible set: max(0, λ) for inequalities, λ itself for equalities."""
    return torch.clamp(lam, min=0.0) if kind == "inequality" else lam


def projected_ascent(lam: Tensor, c: Tensor, lr: float | Tensor, kind: ConstraintKind) -> Tensor:
    """One projected dual ascent step: λ_{t+1} = max(0, λ_t + η g_t) or λ_t + η h_t.

    For inequalities this is :func:`~descentlab.constrained.dual.dual_ascent`, bit for bit.
    """
    return project_multipliers(lam + lr * c, kind)
