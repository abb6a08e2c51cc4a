"""PrimalDual: a torch optimizer that takes the primal step of any optimizer, then the dual step.

Per optimizer step (Algorithm 1 of the paper)::

    θ_{t+1} = optimizer step on ∇_θ L̂(θ_t, λ_t)          (λ held constant; AdamW, HORST, ...)
    λ_{t+1} = max(0, λ_t + η_λ ĝ_t)                       (or a resilient form; ĝ remembered by lagrangian)

It is a :class:`torch.optim.Optimizer` whose ``param_groups`` and ``state`` *are* the wrapped optimizer's
(the same objects), so LR schedulers, gradient clipping, Accelerate and the Hugging Face Trainer see an
ordinary optimizer, and its ``state_dict`` is the wrapped one's plus a ``"descent"`` entry with λ, u and the
counters.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from descentlab.distributed import gather_objects, rank_bad_flags
from descentlab.errors import CheckpointError, ConfigError, NumericalError

DESCENT_KEY = "descent"


class PrimalDual(Optimizer):
    """Wrap a primal optimizer and a constraint (e.g. :class:`LayerwiseDescent`) into one optimizer.

    Args:
        optimizer: any ``torch.optim.Optimizer``; it owns the parameters and their state.
        constraint: a :class:`~descentlab.constrained.LayerwiseDescent`, a
            :class:`~descentlab.constrained.ConstraintSet`, or any object with ``dual_step_()``,
            ``state_dict()`` and ``load_state_dict()``; the optional members it may have are those of
            :class:`~descentlab.constrained.protocol.DualProblem`, the one declaration of what is called.

        check_finite: before the wrapped step, check that every gradient and the ĝ remembered by
            ``lagrangian`` are finite, and raise :class:`~descentlab.errors.NumericalError` (saying what was
            non-finite) with the parameters, the optimizer state and λ untouched. The check is one fused
            ``torch._foreach_norm`` per device and **one host read-back per step** (a device sync on GPU;
            nothing extra on CPU); ``False`` skips it (a NaN gradient then reaches the wrapped optimizer).
            The constraint's own guards (λ above ``max_multiplier``, λ rising too long, a non-finite ĝ in the
            dual step) are deferred: its dual step records them on the device, and they are read with this
            read-back of the *next* step (or, with ``check_finite=False``, when logs are read), so the dual
            step itself never syncs.

    ``step(closure)`` runs the wrapped step, then ``constraint.dual_step_()``; the constraint decides from
    its cadence whether λ moves. When ``torch.distributed`` is initialised, ĝ is averaged over ranks inside
    the dual step, so every rank holds the same λ. A step taken while ``constraint.lagrangian`` has never
    been called warns once (``RuntimeWarning``): λ would never enter the loss.

    Extra-gradient (when ``constraint.extragradient`` is True; ``step(closure)`` is then required)::

        evaluate at (θ_t, λ_t);        θ_{t+½} = θ_t - η ∇_θ L̂,   λ_{t+½} = P(λ_t + η_λ c(θ_t))
        evaluate at (θ_{t+½}, λ_{t+½}); θ_{t+1} = optimizer step from θ_t with ∇_θ L̂(θ_{t+½}, λ_{t+½}),
                                        λ_{t+1} = P(λ_t + η_λ c(θ_{t+½}))

    The primal extrapolation is the wrapped optimizer's own ``extrapolation()`` when it has one (Cooper's
    ExtraSGD / ExtraAdam), else an SGD step with each group's ``lr``; with ``torch.optim.SGD`` (no momentum)
    the whole step is the classic extra-gradient method.
    """

    def __init__(self, optimizer: Optimizer, constraint: Any, *, check_finite: bool = True) -> None:
        if not isinstance(optimizer, Optimizer):
            raise ConfigError(
                f"PrimalDual wraps a torch.optim.Optimizer, got {type(optimizer).__name__}; pass e.g. "
                "torch.optim.AdamW(model.parameters())"
            )
        for name in ("dual_step_", "state_dict", "load_state_dict"):
            if not callable(getattr(constraint, name, None)):
                raise ConfigError(
                    f"constraint {type(constraint).__name__} has no {name}(); pass a LayerwiseDescent or a "
                    "ConstraintSet"
                )
        self.optimizer = optimizer
        self.constraint = constraint
        self.check_finite = check_finite
        if hasattr(constraint, "defer_checks") and callable(getattr(constraint, "health_flag", None)):
            constraint.defer_checks = True  # its guards ride on this optimizer's one read-back per step
        self._warned_no_lagrangian = False
        # The base initialiser installs the hook dictionaries and the profiled step; the groups it would
        # build are replaced by the wrapped optimizer's own list, so edits through either are shared.
        self._adopting = True
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self._adopting = False
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Adds the group to the wrapped optimizer (the groups are shared)."""
        if self._adopting:
            return
        self.optimizer.add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        """Primal step of the wrapped optimizer, then the dual step.

        Args:
            closure: re-evaluates the Lagrangian and returns it (for L-BFGS-style optimizers); it must call
                ``constraint.lagrangian`` so that ĝ is current.
        """
        if getattr(self.constraint, "extragradient", False):
            return self._extragradient_step(closure)  # its closure builds the Lagrangian first
        if closure is None:
            self._warn_if_no_lagrangian()
        if self.check_finite and closure is None:  # a closure makes its gradients inside the wrapped step
            self._check_finite()
        loss = self.optimizer.step() if closure is None else self.optimizer.step(torch.enable_grad()(closure))
        if closure is not None:  # the closure ran inside the wrapped step: only now can it have called it
            self._warn_if_no_lagrangian()
        self.constraint.dual_step_()
        return loss

    def _warn_if_no_lagrangian(self) -> None:
        if getattr(self.constraint, "lagrangian_calls", None) == 0 and not self._warned_no_lagrangian:
            self._warned_no_lagrangian = True
            warnings.warn(
                "PrimalDual.step() was called but constraint.lagrangian(f) never was: λ stays out of the loss "
                "and the dual step has no ĝ. Back-propagate loss = constraint.lagrangian(layer_losses(...)); "
                "this warning is shown once",
                RuntimeWarning,
                stacklevel=5,  # here <- step <- torch.no_grad's wrapper <- Optimizer's step hook <- the caller
            )

    def _extragradient_step(self, closure: Callable[[], float] | None) -> Any:
        if closure is None:
            raise ConfigError(
                "an extra-gradient step evaluates the problem twice: call opt.step(closure) with a closure that "
                "zeroes the gradients, builds loss = constraint.lagrangian(...), calls loss.backward() and "
                "returns the loss"
            )
        with torch.enable_grad():
            loss = closure()
        if self.check_finite:
            self._check_finite()
        extrapolation = getattr(self.optimizer, "extrapolation", None)
        backup: list[tuple[Tensor, Tensor]] = []
        if callable(extrapolation):
            extrapolation()
        else:
            for group in self.param_groups:
                sign = 1.0 if group.get("maximize", False) else -1.0
                for p in group["params"]:
                    if p.grad is not None:
                        backup.append((p, p.detach().clone()))
                        p.add_(p.grad, alpha=sign * group["lr"])
        self.constraint.extrapolate_()
        with torch.enable_grad():
            closure()
        if self.check_finite:
            self._check_finite()
        for p, saved in backup:
            p.copy_(saved)
        self.optimizer.step()
        self.constraint.dual_step_()
        return loss

    def _check_finite(self) -> None:
        """Raise NumericalError, before anything moves, when a gradient or the pending ĝ is not finite.

        One ``torch._foreach_norm(ord=inf)`` per device (a max-abs: NaN and Inf propagate, large finite
        values do not overflow) and one read-back of the combined flag: the only host sync of the step.

        Under ``torch.distributed`` the decision is collective: each rank writes its own "bad" flag into
        slot ``rank`` of a ``[world]`` vector, one all-reduce sums it, and the one read-back reads the
        vector. ĝ is rank-local until the dual step averages it, so a rank-local check would let one rank
        raise while the others wait in that all-reduce; here every rank raises together, with the same
        message naming the rank(s) and what each saw, and a loop that catches the error and skips the
        batch stays in step on every rank.
        """
        grads: list[Tensor] = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    grads.append(p.grad._values() if p.grad.is_sparse else p.grad)
        pending = getattr(self.constraint, "pending_violations", None)
        g_hat = pending() if callable(pending) else None
        flags: list[Tensor] = []
        by_device: dict[torch.device, list[Tensor]] = {}
        for g in grads:
            by_device.setdefault(g.device, []).append(g)
        for tensors in by_device.values():
            flags.append(torch.isfinite(torch.stack(torch._foreach_norm(tensors, float("inf")))).all())
        if g_hat is not None:
            flags.append(torch.isfinite(g_hat).all())
        health = getattr(self.constraint, "health_flag", None)
        alarm = health() if callable(health) else None
        if alarm is not None:
            flags.append(~alarm)
        ranks = rank_bad_flags(flags)
        if ranks is None:
            if not flags:
                return
            home = flags[0].device
            if bool(torch.stack([f.to(home) for f in flags]).all()):  # the one host read-back
                return
            bad_ranks: list[int] = []
        else:
            bad_ranks = [r for r, bad in enumerate(ranks.tolist()) if bad]  # the one host read-back
            if not bad_ranks:
                return
        if alarm is not None and bool(alarm):
            # λ and the ĝ of the dual step are rank-averaged, so the alarm is the same on every rank
            self.constraint.check_health()  # raises: the last dual step's λ diverged or saw a non-finite ĝ
        problems = self._problems(grads, g_hat)
        if ranks is not None:  # every rank sends what it saw: all raise one and the same message
            seen = gather_objects(problems)
            problems = [f"rank {r}: {p}" for r in bad_ranks for p in seen[r]] or [
                f"rank(s) {bad_ranks} of {len(seen)} reported a non-finite value"
            ]
        elif not problems:
            return
        raise NumericalError(
            f"PrimalDual.step: {'; '.join(problems)}; the parameters, the optimizer state and λ were not "
            "updated. A NaN/Inf gradient comes from the loss or the data of this batch: zero the gradients "
            "and skip it, or find where the losses stop being finite"
            + (" (every rank raised this error together)" if ranks is not None else "")
        )

    def _problems(self, grads: list[Tensor], g_hat: Tensor | None) -> list[str]:
        """What was non-finite on this rank, one phrase each (read only once a problem is known)."""
        problems = []
        where = [
            (i, j, tuple(p.grad.shape))
            for i, group in enumerate(self.param_groups)
            for j, p in enumerate(group["params"])
            if p.grad is not None
        ]
        bad = [w for w, g in zip(where, grads, strict=True) if not bool(torch.isfinite(g).all())]
        if bad:
            i, j, shape = bad[0]
            problems.append(
                f"non-finite gradient in {len(bad)} of {len(grads)} parameter tensors (first: param_groups[{i}] "
                f"tensor {j}, shape {shape})"
            )
        if g_hat is not None and not bool(torch.isfinite(g_hat).all()):
            labels_of = getattr(self.constraint, "violation_labels", None)
            labels = labels_of() if callable(labels_of) else list(range(g_hat.numel()))
            bad_at = torch.nonzero(~torch.isfinite(g_hat)).flatten().tolist()
            at = [labels[k] for k in bad_at]
            what = "layer(s)" if all(isinstance(w, int) for w in at) else "entries"
            problems.append(f"non-finite constraint violation ĝ at {what} {at} (remembered by lagrangian)")
        return problems

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict plus ``"descent"``: the constraint's λ, u and counters."""
        state = self.optimizer.state_dict()
        state[DESCENT_KEY] = self.constraint.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore both the wrapped optimizer and the constraint; exact round trip with :meth:`state_dict`."""
        if DESCENT_KEY not in state_dict:
            raise CheckpointError(
                "optimizer state has no 'descent' entry (λ, u): it was saved from a plain optimizer; load it "
                "into the wrapped optimizer with opt.optimizer.load_state_dict(...) and restart the duals"
            )
        inner = {k: v for k, v in state_dict.items() if k != DESCENT_KEY}
        self.optimizer.load_state_dict(inner)
        # The wrapped optimizer may rebuild its state mapping on load; keep sharing it.
        self.param_groups = self.optimizer.param_groups
        self.state = self.optimizer.state
        self.constraint.load_state_dict(state_dict[DESCENT_KEY])

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"PrimalDual(\n  optimizer={self.optimizer!r},\n  constraint={self.constraint!r}\n)"
