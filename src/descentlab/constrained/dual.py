"""Dual variables of the layer-wise descent constraints: projected ascent, resilient slacks, rank sync.

The update equations live in the pure functions :func:`dual_ascent`, :func:`slack_dual_step` and
:func:`decay_dual_step`; :class:`DualVariables` only keeps λ (and u), applies the mask of constrained layers
and checks for divergence. :class:`Resilience` configures the resilient relaxation below.

Resilient relaxation (Hounie, Ribeiro, Chamon, NeurIPS 2023). Each constraint ĝ_l <= 0 is relaxed to
ĝ_l <= u_l with a slack u_l >= 0 that costs h(u) = (a/2)||u||². The two forms and how they convert:

* slack form, a Gauss-Seidel sweep (slack first, then dual, both from the iterate at step t)::

      u_{t+1} = max(0, u_t + η_u (λ_t - a u_t))
      λ_{t+1} = max(0, λ_t + η_λ (ĝ_t - u_{t+1}))

* decay form, u eliminated::

      λ_{t+1} = max(0, (1 - η_λ / a) λ_t + η_λ ĝ_t)        and u := λ / a

Conversion: the slack step with η_u = 1/a sets u_{t+1} = λ_t / a exactly (for λ_t >= 0), and substituting
it into the dual step gives the decay form, so ``Resilience(a, lr=1/a, form="slack")`` and
``Resilience(a, form="decay")`` produce the same λ step for step. With any other η_u in (0, 2/a) the slack
form has the same fixed points, u* = λ*/a with ĝ = u* on active layers, and differs only in the transient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch import Tensor

from descentlab.distributed import rank_mean as weighted_rank_mean
from descentlab.errors import CheckpointError, ConfigError, InfeasibleConstraintError, NumericalError

ResilienceForm = Literal["slack", "decay"]


def dual_ascent(lam: Tensor, g: Tensor, lr: float | Tensor) -> Tensor:
    """Projected dual ascent on the Lagrangian (Algorithm 1 of the paper).

    λ_{t+1} = max(0, λ_t + η_λ ĝ_t)

    Args:
        lam: multipliers λ_t, shape [L].
        g: constraint violations ĝ_t (detached), shape [L].
        lr: dual step η_λ (scalar or per layer).

    Returns:
        λ_{t+1}.
    """
    return torch.clamp(lam + lr * g, min=0.0)


def slack_dual_step(
    lam: Tensor, u: Tensor, g: Tensor, lr: float | Tensor, slack_lr: float | Tensor, penalty: float | Tensor
) -> tuple[Tensor, Tensor]:
    """Resilient step, slack form: a slack step, then a dual step against the relaxed constraint.

    u_{t+1} = max(0, u_t + η_u (λ_t - a u_t))
    λ_{t+1} = max(0, λ_t + η_λ (ĝ_t - u_{t+1}))

    Args:
        lam: multipliers λ_t, shape [L].
        u: slacks u_t, shape [L].
        g: constraint violations ĝ_t, shape [L].
        lr: dual step η_λ.
        slack_lr: slack step η_u; 1/a reproduces :func:`decay_dual_step` exactly.
        penalty: slack cost a of h(u) = (a/2)||u||².

    Returns:
        (λ_{t+1}, u_{t+1}).
    """
    u_next = torch.clamp(u + slack_lr * (lam - penalty * u), min=0.0)
    lam_next = torch.clamp(lam + lr * (g - u_next), min=0.0)
    return lam_next, u_next


def decay_dual_step(lam: Tensor, g: Tensor, lr: float | Tensor, penalty: float | Tensor) -> Tensor:
    """Resilient step, decay form: the slack form with u = λ/a substituted.

    λ_{t+1} = max(0, (1 - η_λ / a) λ_t + η_λ ĝ_t)

    Args:
        lam: multipliers λ_t, shape [L].
        g: constraint violations ĝ_t, shape [L].
        lr: dual step η_λ.
        penalty: slack cost a.

    Returns:
        λ_{t+1}; the implied slack is λ_{t+1}/a.
    """
    return torch.clamp((1.0 - lr / penalty) * lam + lr * g, min=0.0)


def rank_mean(x: Tensor) -> Tensor:
    """Average ``x`` over the ranks of the default process group (identity when none is initialised).

    Every rank must end with the same λ; averaging ĝ, which is linear in the batch-mean losses, makes the
    dual step equal to the single-process step on the global batch when ranks hold equal-sized batches.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    y = x.clone()
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y / dist.get_world_size()


@dataclass(frozen=True)
class Resilience:
    """Resilient relaxation of the descent constraints (Hounie, Ribeiro, Chamon, NeurIPS 2023).

    Args:
        penalty: slack cost a in h(u) = (a/2)||u||², a scalar or one value per layer; large a = nearly hard.
        lr: slack step η_u of the slack form. None means 1/a, under which the slack form equals the decay
            form step for step. Ignored by the decay form.
        form: "slack" keeps u as a state; "decay" eliminates it (λ decays by η_λ/a per step).
    """

    penalty: float | Sequence[float] = 1.0
    lr: float | None = None
    form: ResilienceForm = "slack"

    def __post_init__(self) -> None:
        penalties = [self.penalty] if isinstance(self.penalty, (int, float)) else list(self.penalty)
        if not penalties or any(not float(a) > 0 for a in penalties):
            raise ConfigError(f"Resilience penalty must be > 0 (got {self.penalty}); use e.g. penalty=1.0")
        if self.lr is not None and not float(self.lr) > 0:
            raise ConfigError(f"Resilience lr must be > 0 or None for 1/penalty (got {self.lr})")
        if self.form not in ("slack", "decay"):
            raise ConfigError(f"Resilience form must be 'slack' or 'decay' (got {self.form!r})")

    def penalty_tensor(self, num_layers: int) -> Tensor:
        """The penalty a as a float64 tensor [L]."""
        if isinstance(self.penalty, (int, float)):
            return torch.full((num_layers,), float(self.penalty), dtype=torch.float64)
        if len(self.penalty) != num_layers:
            raise ConfigError(
                f"Resilience penalty has {len(self.penalty)} values for {num_layers} layers; give one per layer "
                "or a scalar"
            )
        return torch.tensor([float(a) for a in self.penalty], dtype=torch.float64)


class DualVariables:
    """λ (and u for the slack form) of L constraints, updated in float64 from a violation vector ĝ.

    Args:
        num_layers: L.
        lr: dual step η_λ.
        resilience: None for hard constraints.
        mask: bool [L], the constrained layers; λ and u of the others stay 0.
        max_multiplier: raise :class:`InfeasibleConstraintError` when a λ_l exceeds it (None: never).
        divergence_patience: raise when a λ_l has grown for this many dual updates in a row (None: never).
    """

    def __init__(
        self,
        num_layers: int,
        lr: float,
        resilience: Resilience | None,
        mask: Tensor,
        max_multiplier: float | None = None,
        divergence_patience: int | None = None,
    ) -> None:
        self.lr = float(lr)
        self.resilience = resilience
        self.mask = mask.to(torch.bool)
        self.max_multiplier = max_multiplier
        self.divergence_patience = divergence_patience
        self.penalty = resilience.penalty_tensor(num_layers) if resilience is not None else None
        self.lam = torch.zeros(num_layers, dtype=torch.float64)
        self.u = (
            torch.zeros(num_layers, dtype=torch.float64)
            if resilience is not None and resilience.form == "slack"
            else None
        )
        self.rising = torch.zeros(num_layers, dtype=torch.int64)
        self.updates = 0
        # Deferred guards (see :meth:`health_flag`): the dual step then never reads the device.
        self.defer_checks = False
        self._alarm: Tensor | None = None  # bool [3]: non-finite ĝ, λ above max, λ rising too long
        self._bad_g: Tensor | None = None  # the first non-finite ĝ seen while deferring

    @property
    def slacks(self) -> Tensor | None:
        """u: the slack state (slack form), λ/a (decay form), or None for hard constraints."""
        if self.resilience is None:
            return None
        if self.u is not None:
            return self.u
        return self.lam / self.penalty.to(self.lam.device)

    def to_(self, device: torch.device) -> None:
        """Move the state next to the losses, so the Lagrangian needs no host round trip."""
        if self.lam.device != device:
            self.lam = self.lam.to(device)
            self.mask = self.mask.to(device)
            self.rising = self.rising.to(device)
            self.u = self.u.to(device) if self.u is not None else None
            self.penalty = self.penalty.to(device) if self.penalty is not None else None
            self._alarm = self._alarm.to(device) if self._alarm is not None else None
            self._bad_g = self._bad_g.to(device) if self._bad_g is not None else None

    @torch.no_grad()
    def update_(self, g: Tensor, weight: int | float | Tensor | None = None) -> None:
        """One dual step from the violations ĝ [L], averaged over ranks first: weighted by ``weight`` (this
        rank's target count behind its ĝ; :func:`descentlab.distributed.rank_mean`), so ranks holding
        unequal batches give the global batch's ĝ; equally when None.

        By default the guards (ĝ finite on the constrained layers, λ below ``max_multiplier``, λ not rising
        for ``divergence_patience`` updates) are read at once: at most two host reads. With
        ``defer_checks`` they are only recorded on the device, λ is left unchanged by a non-finite ĝ, and
        :meth:`health_flag` / :meth:`check_` read them later (``PrimalDual`` folds the flag into its one
        read-back of the next step; a log read checks it too).
        """
        g = g.detach().to(device=self.lam.device, dtype=torch.float64)
        g = rank_mean(g) if weight is None else weighted_rank_mean(g, weight)
        mask = self.mask
        finite = torch.isfinite(torch.where(mask, g, torch.zeros_like(g))).all()
        if not self.defer_checks and not bool(finite):
            raise NumericalError(self._non_finite_message(g))
        g = torch.where(mask, g, torch.zeros_like(g))
        old = self.lam
        if self.resilience is None:
            lam = dual_ascent(old, g, self.lr)
        elif self.resilience.form == "decay":
            lam = decay_dual_step(old, g, self.lr, self.penalty)
        else:
            slack_lr = self.resilience.lr if self.resilience.lr is not None else 1.0 / self.penalty
            lam, u = slack_dual_step(old, self.u, g, self.lr, slack_lr, self.penalty)
            u = torch.where(mask, u, torch.zeros_like(u))
            self.u = torch.where(finite, u, self.u) if self.defer_checks else u
        lam = torch.where(mask, lam, torch.zeros_like(lam))
        self.lam = torch.where(finite, lam, old) if self.defer_checks else lam
        self.rising = torch.where(self.lam > old, self.rising + 1, torch.zeros_like(self.rising))
        self.updates += 1
        if not self.defer_checks:
            self._check_divergence()
            return
        flags = torch.stack([~finite, *self._divergence_flags()])
        if self._alarm is None:
            self._alarm, self._bad_g = flags, g
        else:
            self._bad_g = torch.where(self._alarm[0], self._bad_g, g)  # keep the first bad ĝ
            self._alarm = self._alarm | flags

    def _non_finite_message(self, g: Tensor) -> str:
        bad = [i + 1 for i in torch.nonzero(~torch.isfinite(g) & self.mask).flatten().tolist()]
        return (
            f"non-finite constraint violation at layer(s) {bad}; the per-layer losses overflowed: lower the "
            "learning rate or enable gradient clipping"
        )

    def _divergence_flags(self) -> list[Tensor]:
        no = torch.zeros((), dtype=torch.bool, device=self.lam.device)
        too_big = (self.lam > self.max_multiplier).any() if self.max_multiplier is not None else no
        patience = self.divergence_patience
        too_long = (self.rising >= patience).any() if patience is not None else no
        return [too_big, too_long]

    def health_flag(self) -> Tensor | None:
        """A device bool, True when a deferred guard fired since the last check (None: nothing pending).

        Reading it is the caller's business (one host read); :meth:`check_` reads it and raises.
        """
        return None if self._alarm is None else self._alarm.any()

    def check_(self) -> None:
        """Read the deferred guards (one host read when any are pending) and raise as the eager check would.

        Raises:
            NumericalError: a non-finite ĝ reached a dual step (λ was left unchanged by it).
            InfeasibleConstraintError: λ exceeded ``max_multiplier`` or rose ``divergence_patience`` times.
        """
        if self._alarm is None:
            return
        alarm, bad_g = self._alarm, self._bad_g
        self._alarm = self._bad_g = None
        nonfinite, too_big, too_long = alarm.tolist()
        if nonfinite:
            raise NumericalError(self._non_finite_message(bad_g))
        if too_big or too_long:
            self._check_divergence()

    def _check_divergence(self) -> None:
        too_big, too_long = torch.stack(self._divergence_flags()).tolist()  # one host read
        if not (too_big or too_long):
            return
        if too_big:
            layer = int(torch.argmax(self.lam)) + 1
            why = f"λ_{layer} = {float(self.lam[layer - 1]):.4g} exceeds max_multiplier={self.max_multiplier}"
        else:
            layer = int(torch.argmax(self.rising)) + 1
            why = f"λ_{layer} has grown for {int(self.rising[layer - 1])} dual updates in a row"
        raise InfeasibleConstraintError(
            f"the descent constraint of layer {layer} looks infeasible ({why}); relax it with "
            "resilience=Resilience(penalty=1.0), use a smaller alpha for this layer, or leave it out with layers=[...]"
        )

    def state_dict(self) -> dict[str, object]:
        return {
            "lambda": self.lam.detach().cpu().clone(),
            "u": None if self.u is None else self.u.detach().cpu().clone(),
            "rising": self.rising.cpu().clone(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        lam = state["lambda"]
        if not isinstance(lam, Tensor) or lam.shape != self.lam.shape:
            got = tuple(lam.shape) if isinstance(lam, Tensor) else type(lam).__name__
            raise CheckpointError(
                f"dual state has λ of shape {got}, this constraint has {self.lam.numel()} layers; load the "
                "checkpoint into a LayerwiseDescent built with the same num_layers"
            )
        device = self.lam.device
        self.lam = lam.to(device=device, dtype=torch.float64).clone()
        u = state.get("u")
        if self.u is not None:
            self.u = (
                torch.zeros_like(self.lam) if u is None else u.to(device=device, dtype=torch.float64).clone()
            )
        self.rising = state["rising"].to(device).clone()
        self.updates = int(state["updates"])
