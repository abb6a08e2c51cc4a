"""Constraints solved primal-dual: layer-wise descent (arXiv 2601.17257; docs/methods.md) and any user-defined
constraint (``Constraint`` / ``ConstraintSet``; docs/constrained.md).

``DescentConfig`` (which needs omegaconf) is imported on first use, so the solver itself imports with torch
alone (``benchmarks/gpu_check.py`` runs on an image without omegaconf).
"""

from typing import Any

from descentlab.constrained.descent import (
    LayerwiseDescent,
    descent_violations,
    profile_constraints,
    resolve_alpha,
)
from descentlab.constrained.dual import (
    DualVariables,
    Resilience,
    decay_dual_step,
    dual_ascent,
    rank_mean,
    slack_dual_step,
)
from descentlab.constrained.formulation import (
    augmented_lagrangian_term,
    lagrangian_term,
    project_multipliers,
    projected_ascent,
    quadratic_penalty_term,
)
from descentlab.constrained.primal_dual import PrimalDual
from descentlab.constrained.problem import Constraint, ConstraintSet, ConstraintValue
from descentlab.constrained.protocol import DualProblem


def __getattr__(name: str) -> Any:
    if name == "DescentConfig":
        from descentlab.constrained.config import DescentConfig

        return DescentConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Constraint",
    "ConstraintSet",
    "ConstraintValue",
    "DescentConfig",
    "DualProblem",
    "DualVariables",
    "LayerwiseDescent",
    "PrimalDual",
    "Resilience",
    "augmented_lagrangian_term",
    "decay_dual_step",
    "descent_violations",
    "dual_ascent",
    "lagrangian_term",
    "profile_constraints",
    "project_multipliers",
    "projected_ascent",
    "quadratic_penalty_term",
    "rank_mean",
    "resolve_alpha",
    "slack_dual_step",
]
