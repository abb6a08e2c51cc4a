"""Layer-wise descent constraints solved primal-dual (arXiv 2601.17257; docs/methods.md).

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
from descentlab.constrained.primal_dual import PrimalDual


def __getattr__(name: str) -> Any:
    if name == "DescentConfig":
        from descentlab.constrained.config import DescentConfig

        return DescentConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
