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

from collections.abc import Callable
from typing import Any

import torch
from torch.optim import Optimizer

from descentlab.errors import CheckpointError, ConfigError

DESCENT_KEY = "descent"


class PrimalDual(Optimizer):
    """Wrap a primal optimizer and a constraint (e.g. :class:`LayerwiseDescent`) into one optimizer.

    Args:
        optimizer: any ``torch.optim.Optimizer``; it owns the parameters and their state.
        constraint: an object with ``dual_step_()``, ``state_dict()`` and ``load_state_dict()``.

    ``step(closure)`` runs the wrapped step, then ``constraint.dual_step_()``; the constraint decides from
    its cadence whether λ moves. When ``torch.distributed`` is initialised, ĝ is averaged over ranks inside
    the dual step, so every rank holds the same λ.
    """

    def __init__(self, optimizer: Optimizer, constraint: Any) -> None:
        if not isinstance(optimizer, Optimizer):
            raise ConfigError(
                f"PrimalDual wraps a torch.optim.Optimizer, got {type(optimizer).__name__}; pass e.g. "
                "torch.optim.AdamW(model.parameters())"
            )
        for name in ("dual_step_", "state_dict", "load_state_dict"):
            if not callable(getattr(constraint, name, None)):
                raise ConfigError(
                    f"constraint {type(constraint).__name__} has no {name}(); pass a LayerwiseDescent"
                )
        self.optimizer = optimizer
        self.constraint = constraint
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
        loss = self.optimizer.step() if closure is None else self.optimizer.step(torch.enable_grad()(closure))
        self.constraint.dual_step_()
        return loss

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
