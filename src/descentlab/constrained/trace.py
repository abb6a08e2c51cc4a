"""The multipliers' trajectory over training, as a ``fit`` callback: whether a constraint binds, and when,
is read off λ_l(t), not off its final value alone."""

from __future__ import annotations

from typing import Any

import torch


class LambdaTrace:
    """``fit`` callback ``(step, model, logs)``: the constraint's multipliers λ_l (and its violations, when it
    has computed them) at step 1, every ``every`` steps and at ``last`` (when given).

    Each record copies λ to the host, so ``every`` is a logging interval, not a per-step cost.

    Attributes:
        steps: the recorded steps.
        lam: λ at each recorded step, one list of L floats per step.
        violations: the constraint violations g_l at each recorded step ([] before any were computed).
    """

    def __init__(self, constraint: Any, every: int, last: int | None = None) -> None:
        self.constraint, self.every, self.last = constraint, max(1, int(every)), last
        self.steps: list[int] = []
        self.lam: list[list[float]] = []
        self.violations: list[list[float]] = []

    def __call__(self, step: int, model: torch.nn.Module, logs: dict[str, float]) -> None:
        if step % self.every and step != 1 and step != self.last:
            return
        self.steps.append(step)
        self.lam.append(self.constraint.multipliers.tolist())
        g = self.constraint.violations
        self.violations.append([] if g is None else [float(v) for v in g.tolist()])

    def to_dict(self) -> dict[str, list]:
        """``{"steps", "lambda", "violation"}``, JSON-able."""
        return {"steps": self.steps, "lambda": self.lam, "violation": self.violations}
