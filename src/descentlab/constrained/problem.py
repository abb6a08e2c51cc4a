"""User-defined constraints solved primal-dual: :class:`Constraint`, :class:`ConstraintValue`, :class:`ConstraintSet`.

Any constrained problem

    min_θ  f(θ)    s.t.   g_j(θ) <= 0   (inequality constraints)      h_k(θ) = 0   (equality constraints)

is written as a loss and a few named tensors of constraint values. Per step::

    loss = constraints.lagrangian(f, rate=g, budget=h)     # f + Σ ψ_c (formulation of each constraint c)
    loss.backward(); opt.step(); opt.zero_grad()           # opt = PrimalDual(any_optimizer, constraints)

``PrimalDual.step`` takes the primal step, then :meth:`ConstraintSet.dual_step_`::

    λ_{t+1} = max(0, λ_t + η c̄_t)          (inequality; equality without the max)

with c̄_t the strict violations recorded by the ``lagrangian`` calls since the last dual step (their mean
over calls: under gradient accumulation, the violation of the accumulated batch). The formulas of each
formulation are in :mod:`descentlab.constrained.formulation`; the resilient (slack) forms are in
:mod:`descentlab.constrained.dual`. The defaults reproduce :class:`~descentlab.constrained.LayerwiseDescent`'s
projected ascent bit for bit (``tests/constrained/test_problem.py``).

Options per constraint (:class:`Constraint`): equality or inequality; Lagrangian, augmented Lagrangian or
quadratic penalty; a resilient slack (:class:`~descentlab.constrained.dual.Resilience`); a strict,
non-differentiable twin of a differentiable proxy (:class:`ConstraintValue`); dense multipliers, or indexed
ones (one per example or group, updated only where sampled). Options of the whole set (:class:`ConstraintSet`):
the dual optimizer (None: projected ascent; or any ``torch.optim`` optimizer over
:meth:`ConstraintSet.dual_parameters`, with ``maximize=True``, followed by the projection) and extra-gradient.

Under ``torch.distributed`` the dual step averages dense violations over ranks (as ``LayerwiseDescent`` does)
and sums indexed ones (each example is seen by one rank), so every rank holds the same multipliers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from descentlab.constrained.dual import Resilience, decay_dual_step, rank_mean, slack_dual_step
from descentlab.constrained.formulation import (
    FORMULATIONS,
    KINDS,
    ConstraintKind,
    Formulation,
    augmented_lagrangian_term,
    lagrangian_term,
    project_multipliers,
    projected_ascent,
    quadratic_penalty_term,
)
from descentlab.errors import CheckpointError, ConfigError, ModelError, NumericalError
from descentlab.logs import LazyLogs

DualOptimizerSpec = torch.optim.Optimizer | Callable[[list[Tensor]], torch.optim.Optimizer] | None


@dataclass(frozen=True)
class ConstraintValue:
    """One observation of a constraint, handed to :meth:`ConstraintSet.lagrangian`.

    Args:
        value: the constraint values c(θ), differentiable in θ (a proxy when ``strict`` is given): the
            shape [size] of a dense constraint (a scalar for size 1), or [n] beside ``index``.
        strict: the values the dual step uses (e.g. a 0-1 rate whose ``value`` is a sigmoid surrogate);
            None: ``value`` itself. Never differentiated.
        index: long [n], which multipliers of an indexed constraint these values belong to (repeats add up).
    """

    value: Tensor
    strict: Tensor | None = None
    index: Tensor | None = None


class Constraint:
    """A named constraint c(θ) <= 0 (``kind="inequality"``) or c(θ) = 0 (``"equality"``) and its multipliers.

    Args:
        name: the key of its values in :meth:`ConstraintSet.lagrangian`.
        size: how many scalar constraints (and multipliers); for ``indexed`` the number of examples/groups.
        kind: "inequality" (g <= 0, λ >= 0) or "equality" (h = 0, μ free).
        formulation: "lagrangian", "augmented_lagrangian" or "quadratic_penalty" (no multipliers).
        penalty: ρ > 0 of the augmented Lagrangian and the quadratic penalty, a scalar or [size].
        dual_lr: η of the default projected ascent (ignored when the set has a dual optimizer); with the
            augmented Lagrangian, η = ρ is the method of multipliers.
        resilience: a :class:`~descentlab.constrained.dual.Resilience` (slack u >= 0 costing (a/2)||u||², its
            own step η_u): the dual step ascends c - u instead of c. Inequality, Lagrangian only.
        indexed: one multiplier per example or group; a step updates only the sampled entries.
        init: initial multipliers [size] (default 0).
        dtype: the multipliers' dtype (float64: they are few and accumulate many small steps).
    """

    def __init__(
        self,
        name: str,
        size: int = 1,
        *,
        kind: ConstraintKind = "inequality",
        formulation: Formulation = "lagrangian",
        penalty: float | Tensor | None = None,
        dual_lr: float = 1e-2,
        resilience: Resilience | None = None,
        indexed: bool = False,
        init: Tensor | None = None,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"constraint name must be a Python identifier (got {name!r}), e.g. 'rate'")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"constraint {name!r}: size must be a positive int (got {size!r})")
        if kind not in KINDS:
            raise ConfigError(f"constraint {name!r}: kind must be 'inequality' or 'equality' (got {kind!r})")
        if formulation not in FORMULATIONS:
            raise ConfigError(
                f"constraint {name!r}: formulation must be one of {FORMULATIONS} (got {formulation!r})"
            )
        if isinstance(dual_lr, (str, bytes)) or not float(dual_lr) > 0:
            raise ConfigError(f"constraint {name!r}: dual_lr must be a number > 0 (got {dual_lr!r})")
        needs_penalty = formulation != "lagrangian"
        if needs_penalty and penalty is None:
            raise ConfigError(f"constraint {name!r}: the {formulation} formulation needs penalty=ρ > 0")
        if not needs_penalty and penalty is not None:
            raise ConfigError(
                f"constraint {name!r}: penalty is for the augmented_lagrangian and quadratic_penalty formulations; "
                "for a resilient slack cost use resilience=Resilience(penalty=...)"
            )
        if resilience is not None:
            if not isinstance(resilience, Resilience):
                raise ConfigError(f"constraint {name!r}: resilience must be a Resilience or None")
            if kind != "inequality" or formulation != "lagrangian":
                raise ConfigError(
                    f"constraint {name!r}: resilience relaxes inequality constraints of the lagrangian formulation"
                )
        self.name, self.size, self.kind, self.formulation = name, size, kind, formulation
        self.dual_lr = float(dual_lr)
        self.resilience = resilience
        self.indexed = bool(indexed)
        self.penalty: Tensor | None = None
        if penalty is not None:
            rho = torch.as_tensor(penalty, dtype=torch.float64).reshape(-1)
            if rho.numel() not in (1, size) or not bool((rho > 0).all()):
                raise ConfigError(f"constraint {name!r}: penalty must be > 0, a scalar or {size} values")
            self.penalty = rho if rho.numel() == size else rho.expand(size).clone()
        self.multiplier: torch.nn.Parameter | None = None
        self.slack: Tensor | None = None
        self.slack_penalty: Tensor | None = None
        if formulation != "quadratic_penalty":
            start = (
                torch.zeros(size, dtype=dtype)
                if init is None
                else init.detach().to(dtype).reshape(-1).clone()
            )
            if start.numel() != size or (kind == "inequality" and bool((start < 0).any())):
                raise ConfigError(
                    f"constraint {name!r}: init must hold {size} values, >= 0 for an inequality"
                )
            self.multiplier = torch.nn.Parameter(start, requires_grad=False)
        if resilience is not None:
            self.slack_penalty = resilience.penalty_tensor(size)
            if resilience.form == "slack":
                self.slack = torch.zeros(size, dtype=torch.float64)
        # the violations recorded since the last dual step (float64, on the multipliers' device)
        self.g_sum = torch.zeros(size, dtype=torch.float64)
        self.seen = torch.zeros(size, dtype=torch.float64)  # indexed: observations per entry
        self.calls = 0
        self.last: Tensor | None = None  # the last strict violations (detached)

    # -- values ------------------------------------------------------------------------------------------
    @property
    def multipliers(self) -> Tensor | None:
        """λ (inequality) or μ (equality), [size]; None for the quadratic penalty."""
        return None if self.multiplier is None else self.multiplier.detach()

    @property
    def slacks(self) -> Tensor | None:
        """u of the resilient relaxation (slack form), λ/a (decay form), or None."""
        if self.resilience is None or self.multiplier is None:
            return None
        if self.slack is not None:
            return self.slack
        return self.multiplier.detach().to(torch.float64) / self.slack_penalty

    def _to(self, device: torch.device) -> None:
        if self.g_sum.device == device:
            return
        if self.multiplier is not None:
            self.multiplier.data = self.multiplier.data.to(device)
        self.g_sum, self.seen = self.g_sum.to(device), self.seen.to(device)
        for attr in ("penalty", "slack", "slack_penalty"):
            value = getattr(self, attr)
            if value is not None:
                setattr(self, attr, value.to(device))

    def term(self, value: Tensor, index: Tensor | None) -> Tensor:
        """ψ of this observation (see :mod:`~descentlab.constrained.formulation`), λ held constant."""
        lam = None if self.multiplier is None else self.multiplier.detach()
        rho = self.penalty
        if index is not None:
            lam = None if lam is None else lam.index_select(0, index)
            rho = None if rho is None else rho.index_select(0, index)
        if self.formulation == "lagrangian":
            return lagrangian_term(lam, value)
        if self.formulation == "quadratic_penalty":
            return quadratic_penalty_term(rho, value, self.kind)
        return augmented_lagrangian_term(lam, rho, value, self.kind)

    def __repr__(self) -> str:
        extra = ", indexed" if self.indexed else ""
        extra += f", resilience={self.resilience}" if self.resilience is not None else ""
        return (
            f"Constraint({self.name!r}, size={self.size}, kind={self.kind!r}, formulation={self.formulation!r}"
            f"{extra})"
        )


def rank_sum(x: Tensor) -> Tensor:
    """Σ over the ranks of the default process group (identity when none is initialised)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    y = x.clone()
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y


def ascent_direction(c: Constraint, g: Tensor) -> tuple[Tensor, Tensor | None]:
    """The dual ascent direction of ``c`` given its mean violation ``g``, and the next slack (slack form).

    hard:              d = g
    resilient, slack:  u' = max(0, u + η_u (λ - a u)),   d = g - u'
    resilient, decay:  d = g - λ / a
    """
    res = c.resilience
    if res is None:
        return g, None
    lam = c.multiplier.detach().to(torch.float64)
    if res.form == "decay":
        return g - lam / c.slack_penalty, None
    slack_lr = res.lr if res.lr is not None else 1.0 / c.slack_penalty
    u = torch.clamp(c.slack + slack_lr * (lam - c.slack_penalty * c.slack), min=0.0)
    return g - u, u


def default_dual_update(c: Constraint, g: Tensor) -> tuple[Tensor, Tensor | None]:
    """The default dual step of ``c`` (projected ascent with ``c.dual_lr``) with the same pure functions as
    ``LayerwiseDescent``: (λ_{t+1}, u_{t+1} or None)."""
    lam = c.multiplier.detach()
    res = c.resilience
    if res is None:
        return projected_ascent(lam, g.to(lam.dtype), c.dual_lr, c.kind), None
    if res.form == "decay":
        return decay_dual_step(lam, g, c.dual_lr, c.slack_penalty), None
    slack_lr = res.lr if res.lr is not None else 1.0 / c.slack_penalty
    return slack_dual_step(lam, c.slack, g, c.dual_lr, slack_lr, c.slack_penalty)


class ConstraintSet:
    """Named constraints and their dual step: the object :class:`~descentlab.constrained.PrimalDual` wraps.

    Usage::

        rate = dl.Constraint("rate", size=2, dual_lr=0.05)            # two rate constraints g <= 0
        cs = dl.ConstraintSet([rate])                                  # projected ascent on λ
        opt = dl.PrimalDual(torch.optim.Adam(model.parameters()), cs)
        loss = cs.lagrangian(task_loss, rate=dl.ConstraintValue(proxy, strict=exact))
        loss.backward(); opt.step(); opt.zero_grad()

    Args:
        constraints: the :class:`Constraint` objects (unique names).
        dual_optimizer: None for projected ascent with each constraint's ``dual_lr``; a ``torch.optim``
            optimizer over :meth:`dual_parameters` (built with ``maximize=True``); or a factory
            ``params -> optimizer``. After its step, inequality multipliers are projected onto λ >= 0 and the
            entries of indexed multipliers that were not sampled are put back.
        extragradient: take extra-gradient steps (``PrimalDual.step(closure)`` evaluates twice per step): the
            dual half is λ_{t+½} = P(λ_t + η c(θ_t)), λ_{t+1} = P(λ_t + η c(θ_{t+½})), with the dual optimizer's
            own ``extrapolation()`` when it has one (Cooper's ExtraSGD / ExtraAdam), else an SGD step with
            its learning rate.
    """

    def __init__(
        self,
        constraints: Iterable[Constraint],
        dual_optimizer: DualOptimizerSpec = None,
        *,
        extragradient: bool = False,
    ) -> None:
        items = list(constraints)
        if not items or not all(isinstance(c, Constraint) for c in items):
            raise ConfigError("ConstraintSet takes a non-empty list of dl.Constraint objects")
        names = [c.name for c in items]
        if len(set(names)) != len(names):
            raise ConfigError(f"constraint names must be unique (got {names})")
        self.constraints: dict[str, Constraint] = {c.name: c for c in items}
        self.extragradient = bool(extragradient)
        if dual_optimizer is not None and not isinstance(dual_optimizer, torch.optim.Optimizer):
            if not callable(dual_optimizer):
                raise ConfigError(
                    "dual_optimizer must be None, a torch.optim.Optimizer or a factory params -> optimizer"
                )
            dual_optimizer = dual_optimizer(self.dual_parameters())
        self.dual_optimizer: torch.optim.Optimizer | None = dual_optimizer
        if dual_optimizer is not None:
            self._check_dual_optimizer(dual_optimizer)
        self.lagrangian_calls = 0
        self.defer_checks = False
        self._alarm: dict[str, Tensor] = {}
        self._base: dict[str, tuple[Tensor, Tensor | None]] | None = None  # (λ_t, u_t) while extrapolated
        self._base_pending: dict[str, tuple[Tensor, Tensor | None]] = {}

    def _check_dual_optimizer(self, opt: torch.optim.Optimizer) -> None:
        ours = {id(p) for p in self.dual_parameters()}
        for group in opt.param_groups:
            if group.get("maximize") is False:
                raise ConfigError(
                    f"the dual optimizer {type(opt).__name__} must ascend: build it with maximize=True"
                )
            if any(id(p) not in ours for p in group["params"]):
                raise ConfigError("the dual optimizer holds tensors that are not this set's multipliers")

    # -- access --------------------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Constraint:
        return self.constraints[name]

    def __iter__(self):
        return iter(self.constraints.values())

    def dual_parameters(self) -> list[torch.nn.Parameter]:
        """The multipliers, one ``Parameter`` per constraint with multipliers, for a dual optimizer."""
        return [c.multiplier for c in self.constraints.values() if c.multiplier is not None]

    # -- primal side ---------------------------------------------------------------------------------------
    def lagrangian(
        self,
        loss: Tensor,
        values: Mapping[str, Tensor | ConstraintValue] | None = None,
        *,
        record: bool | None = None,
        **named: Tensor | ConstraintValue,
    ) -> Tensor:
        """loss + Σ_c ψ_c(values of c): the loss the primal optimizer descends; remembers the strict violations.

        Args:
            loss: the objective f(θ), a scalar.
            values: ``name -> tensor or ConstraintValue`` (or give them as keyword arguments). A constraint
                left out this step adds nothing and its multipliers stay put.
            record: add these violations to the next dual step. None: only when gradients are on and the
                loss has a graph, so evaluation passes under ``torch.no_grad()`` never move λ.
        """
        observed = {**(values or {}), **named}
        unknown = sorted(set(observed) - set(self.constraints))
        if unknown:
            raise ConfigError(f"unknown constraint(s) {unknown}; this set has {sorted(self.constraints)}")
        if record is None:
            record = torch.is_grad_enabled() and loss.requires_grad
        total = loss.to(torch.promote_types(loss.dtype, torch.float32))
        for name, raw in observed.items():
            c = self.constraints[name]
            obs = raw if isinstance(raw, ConstraintValue) else ConstraintValue(raw)
            value, strict, index = self._check(c, obs)
            c._to(value.device)
            total = total + c.term(value, index)
            strict = strict.detach().to(torch.float64)
            c.last = strict
            if record and c.multiplier is not None:
                if index is None:
                    c.g_sum = c.g_sum + strict
                else:
                    c.g_sum = c.g_sum.index_add(0, index, strict)
                    c.seen = c.seen.index_add(0, index, torch.ones_like(strict))
                c.calls += 1
        self.lagrangian_calls += 1
        return total

    @staticmethod
    def _check(c: Constraint, obs: ConstraintValue) -> tuple[Tensor, Tensor, Tensor | None]:
        value = obs.value
        if not isinstance(value, Tensor):
            raise ModelError(f"constraint {c.name!r}: values must be a tensor (got {type(value).__name__})")
        value = value.reshape(-1)
        strict = value if obs.strict is None else obs.strict.reshape(-1)
        index = obs.index
        if c.indexed:
            if index is None or index.dtype != torch.long:
                raise ModelError(
                    f"constraint {c.name!r} is indexed: give ConstraintValue(values, index=long tensor)"
                )
            index = index.reshape(-1).to(value.device)
            if index.numel() != value.numel():
                raise ModelError(f"constraint {c.name!r}: {value.numel()} values for {index.numel()} indices")
        elif index is not None:
            raise ModelError(f"constraint {c.name!r} is dense: drop index=, or build it with indexed=True")
        elif value.numel() != c.size:
            raise ModelError(f"constraint {c.name!r} has size {c.size}, got {value.numel()} values")
        if strict.numel() != value.numel():
            raise ModelError(
                f"constraint {c.name!r}: strict has {strict.numel()} values, value has {value.numel()}"
            )
        return value, strict, index

    # -- dual side -----------------------------------------------------------------------------------------
    def _mean_violations(self, c: Constraint) -> tuple[Tensor, Tensor | None]:
        """c̄ (mean over the recorded calls; dense: averaged over ranks, indexed: summed) and the sampled mask."""
        if c.indexed:
            both = rank_sum(torch.stack([c.g_sum, c.seen]))
            return both[0] / c.calls, both[1] > 0
        return rank_mean(c.g_sum / c.calls), None

    @torch.no_grad()
    def _dual_update(self, extrapolating: bool) -> bool:
        active = [c for c in self.constraints.values() if c.multiplier is not None and c.calls > 0]
        if not active:
            return False
        base = self._base if not extrapolating else None
        opt = self.dual_optimizer
        plan: list[tuple[Constraint, Tensor, Tensor]] = []
        for c in active:
            g, sampled = self._mean_violations(c)
            finite = torch.isfinite(g).all()
            keep = finite if sampled is None else sampled & finite
            g = torch.where(finite, g, torch.zeros_like(g))
            if base is not None:  # the update step of extra-gradient starts from λ_t (and u_t)
                c.multiplier.data.copy_(base[c.name][0])
                if c.slack is not None:
                    c.slack = base[c.name][1]
            if extrapolating:
                slack = None if c.slack is None else c.slack.clone()
                self._base_pending[c.name] = (c.multiplier.detach().clone(), slack)
            plan.append((c, g, keep))
            flag = ~finite
            self._alarm[c.name] = flag if c.name not in self._alarm else self._alarm[c.name] | flag
        if opt is None:
            for c, g, keep in plan:
                lam, u = default_dual_update(c, g)
                self._commit(c, lam, u, keep, c.multiplier.detach())
        else:
            slacks: dict[str, Tensor | None] = {}
            starts: dict[str, Tensor] = {}
            for c, g, keep in plan:
                d, u = ascent_direction(c, g)
                slacks[c.name] = u
                starts[c.name] = c.multiplier.detach().clone()
                c.multiplier.grad = torch.where(keep, d, torch.zeros_like(d)).to(c.multiplier.dtype)
            extrapolation = getattr(opt, "extrapolation", None)
            if extrapolating and callable(extrapolation):
                extrapolation()
            elif extrapolating:  # an SGD extrapolation with the optimizer's learning rate
                for group in opt.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            p.add_(p.grad, alpha=group["lr"])
            else:
                opt.step()
            for c, _, keep in plan:
                lam = project_multipliers(c.multiplier.detach(), c.kind)
                self._commit(c, lam, slacks[c.name], keep, starts[c.name])
                c.multiplier.grad = None
        for c in active:
            c.g_sum = torch.zeros_like(c.g_sum)
            c.seen = torch.zeros_like(c.seen)
            c.calls = 0
        if not self.defer_checks:
            self.check_health()
        return True

    @staticmethod
    def _commit(c: Constraint, lam: Tensor, u: Tensor | None, keep: Tensor, start: Tensor) -> None:
        """λ <- lam where ``keep`` (finite and, if indexed, sampled), else ``start`` (λ before the step; λ_t in
        the update half of an extra-gradient step)."""
        c.multiplier.data = torch.where(keep, lam.to(c.multiplier.dtype), start)
        if u is not None and c.slack is not None:
            c.slack = torch.where(keep, u, c.slack)

    def dual_step_(self) -> bool:
        """The dual step (called by ``PrimalDual.step`` after the primal step). Returns whether λ moved.

        From the mean strict violation c̄ of the ``lagrangian`` calls since the last dual step: projected
        ascent (or the dual optimizer's step) per constraint; a non-finite c̄ leaves that constraint's λ as it
        was and raises a deferred :class:`~descentlab.errors.NumericalError`.
        """
        moved = self._dual_update(extrapolating=False)
        self._base = None
        return moved

    def extrapolate_(self) -> None:
        """The dual half of the extrapolation of an extra-gradient step: λ_{t+½} from c(θ_t); keeps λ_t."""
        self._base_pending = {}
        self._dual_update(extrapolating=True)
        self._base = self._base_pending

    # -- guards ----------------------------------------------------------------------------------------------
    def pending_violations(self) -> Tensor | None:
        """The violations recorded since the last dual step (sums), concatenated; None when none."""
        parts = [c.g_sum for c in self.constraints.values() if c.multiplier is not None and c.calls > 0]
        return torch.cat(parts) if parts else None

    def violation_labels(self) -> list[str]:
        """``name[i]`` for each entry of :meth:`pending_violations`."""
        return [
            f"{c.name}[{i}]"
            for c in self.constraints.values()
            if c.multiplier is not None and c.calls > 0
            for i in range(c.size)
        ]

    def health_flag(self) -> Tensor | None:
        """A device bool, True when a dual step saw a non-finite violation since the last check."""
        if not self._alarm:
            return None
        flags = list(self._alarm.values())
        return torch.stack([f.to(flags[0].device) for f in flags]).any()

    def check_health(self) -> None:
        """Read the guards (one host read) and raise ``NumericalError`` naming the constraints that fired."""
        if not self._alarm:
            return
        names, flags = list(self._alarm), list(self._alarm.values())
        self._alarm = {}
        fired = torch.stack([f.to(flags[0].device) for f in flags]).tolist()
        bad = [n for n, f in zip(names, fired, strict=True) if f]
        if bad:
            raise NumericalError(
                f"non-finite violation of constraint(s) {bad} reached a dual step (their multipliers were left "
                "unchanged); the constraint values overflowed: lower the learning rate or clip gradients"
            )

    # -- inspection ------------------------------------------------------------------------------------------
    @property
    def multipliers(self) -> dict[str, Tensor]:
        """``name -> λ`` for every constraint with multipliers."""
        return {c.name: c.multipliers for c in self.constraints.values() if c.multiplier is not None}

    @property
    def violations(self) -> dict[str, Tensor]:
        """``name -> the last strict violations`` (detached), for the constraints observed so far."""
        return {c.name: c.last for c in self.constraints.values() if c.last is not None}

    def log_values(self) -> LazyLogs:
        """``lambda/name/i``, ``g/name/i`` (last strict violations) and ``u/name/i``, kept on the device until
        read (dense constraints only; an indexed one logs its mean and max λ)."""
        vectors: dict[str, tuple[Tensor, int]] = {}
        scalars: dict[str, Tensor] = {}
        for c in self.constraints.values():
            lam = c.multipliers
            if c.indexed:
                if lam is not None:
                    scalars[f"lambda/{c.name}/mean"] = lam.mean()
                    scalars[f"lambda/{c.name}/max"] = lam.max()
                continue
            if lam is not None:
                vectors[f"lambda/{c.name}"] = (lam, 0)
            if c.last is not None:
                vectors[f"g/{c.name}"] = (c.last, 0)
            if c.slacks is not None:
                vectors[f"u/{c.name}"] = (c.slacks, 0)
        flag = self.health_flag()
        return LazyLogs(
            scalars=scalars, vectors=vectors, alarm=None if flag is None else (flag, self.check_health)
        )

    def log_dict(self) -> dict[str, float]:
        """:meth:`log_values`, read (one host read)."""
        return dict(self.log_values())

    # -- checkpointing ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Multipliers, slacks, the recorded violations and the dual optimizer's state (tensors on CPU)."""
        cons = {}
        for c in self.constraints.values():
            cons[c.name] = {
                "size": c.size,
                "multiplier": None if c.multiplier is None else c.multiplier.detach().cpu().clone(),
                "slack": None if c.slack is None else c.slack.cpu().clone(),
                "g_sum": c.g_sum.cpu().clone(),
                "seen": c.seen.cpu().clone(),
                "calls": c.calls,
            }
        return {
            "constraints": cons,
            "dual_optimizer": None if self.dual_optimizer is None else self.dual_optimizer.state_dict(),
            "lagrangian_calls": self.lagrangian_calls,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; the next dual step is the one the saved run would take."""
        saved = state.get("constraints", {})
        if set(saved) != set(self.constraints):
            raise CheckpointError(
                f"constraint state holds {sorted(saved)}, this set has {sorted(self.constraints)}; build the "
                "ConstraintSet with the checkpoint's constraints"
            )
        for name, s in saved.items():
            c = self.constraints[name]
            if int(s["size"]) != c.size:
                raise CheckpointError(
                    f"constraint {name!r} was saved with size {s['size']}, this one has {c.size}"
                )
            device = c.g_sum.device
            if c.multiplier is not None and s["multiplier"] is not None:
                c.multiplier.data = s["multiplier"].to(device=device, dtype=c.multiplier.dtype).clone()
            if c.slack is not None and s["slack"] is not None:
                c.slack = s["slack"].to(device=device, dtype=torch.float64).clone()
            c.g_sum = s["g_sum"].to(device=device, dtype=torch.float64).clone()
            c.seen = s["seen"].to(device=device, dtype=torch.float64).clone()
            c.calls = int(s["calls"])
        if self.dual_optimizer is not None and state.get("dual_optimizer") is not None:
            self.dual_optimizer.load_state_dict(state["dual_optimizer"])
        self.lagrangian_calls = int(state.get("lagrangian_calls", 0))

    def __repr__(self) -> str:
        inner = ",\n  ".join(repr(c) for c in self.constraints.values())
        dual = "projected ascent" if self.dual_optimizer is None else type(self.dual_optimizer).__name__
        return f"ConstraintSet(\n  {inner},\n  dual={dual}, extragradient={self.extragradient}\n)"
