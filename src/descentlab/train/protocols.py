"""What the training loop (and the HF adapter) may call on the objects it is given.

Structural types, checked with ``isinstance`` at run time: any object with the methods qualifies, no base
class needed. The loop calls an optional hook exactly when the object satisfies its protocol.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Objective(Protocol):
    """``loss, logs = objective(model, batch)``: the scalar to differentiate and floats to log."""

    def __call__(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, float]]: ...


@runtime_checkable
class EpochEndHook(Protocol):
    """Called after the last step of every epoch (e.g. a constrained objective's per-epoch dual update)."""

    def end_epoch(self) -> None: ...


@runtime_checkable
class SparsityController(Protocol):
    """Stepped once per loop step, taken or skipped (its schedule counts loop steps)."""

    def step(self) -> None: ...


@runtime_checkable
class MasksGradients(Protocol):
    """A sparsity controller that masks gradients between ``backward`` and the optimizer step."""

    def before_optimizer_step(self) -> None: ...


@runtime_checkable
class ReportsSparsity(Protocol):
    """A controller that reads back its sparsity (``report().global_sparsity``)."""

    def report(self) -> Any: ...


@runtime_checkable
class Stateful(Protocol):
    """Checkpointed with the run: ``state_dict()`` is saved, ``load_state_dict`` restores it on resume."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...
