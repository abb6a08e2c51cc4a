"""The one contract between :class:`~descentlab.constrained.primal_dual.PrimalDual` and a constraint.

Every method and attribute ``PrimalDual`` (and the Lightning / Hugging Face callbacks) use on a constraint
is declared here. :class:`~descentlab.constrained.descent.LayerwiseDescent` and
:class:`~descentlab.constrained.problem.ConstraintSet` both satisfy it; so can a user's own class.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class DualProblem(Protocol):
    """What ``PrimalDual`` calls on the constraint it wraps.

    Attributes:
        lagrangian_calls: how many times the Lagrangian was built (``PrimalDual`` warns once when a step
            comes while it is still 0).
        defer_checks: set True by ``PrimalDual``: the dual step records its guards on the device instead of
            reading them, and ``PrimalDual`` reads them with its one read-back per step.
        extragradient: when True, ``PrimalDual.step(closure)`` takes an extra-gradient step (evaluate,
            extrapolate primal and dual, evaluate again, update from the first point).
    """

    lagrangian_calls: int
    defer_checks: bool
    extragradient: bool

    def dual_step_(self) -> bool:
        """The dual step after each primal step, from the violations recorded since the last one."""
        ...

    def extrapolate_(self) -> None:
        """The dual half of an extra-gradient step (only called when ``extragradient`` is True)."""
        ...

    def pending_violations(self) -> Tensor | None:
        """The recorded violations the next dual step will use (None: none), checked finite before a step."""
        ...

    def violation_labels(self) -> list[Any]:
        """One label per entry of :meth:`pending_violations`, for error messages (may read the host)."""
        ...

    def health_flag(self) -> Tensor | None:
        """A device bool, True when a deferred guard fired (None: nothing pending)."""
        ...

    def check_health(self) -> None:
        """Read the deferred guards and raise as an eager check would."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
