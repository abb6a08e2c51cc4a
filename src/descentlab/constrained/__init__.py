"""Layer-wise descent constraints solved primal-dual (arXiv 2601.17257; docs/methods.md)."""

from descentlab.constrained.config import DescentConfig
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
from descentlab.constrained.primal_dual import PrimalDual

__all__ = [
    "DescentConfig",
    "DualVariables",
    "LayerwiseDescent",
    "PrimalDual",
    "Resilience",
    "decay_dual_step",
    "descent_violations",
    "dual_ascent",
    "profile_constraints",
    "rank_mean",
    "resolve_alpha",
    "slack_dual_step",
]
