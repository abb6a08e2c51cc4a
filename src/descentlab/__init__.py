"""descentlab: layer-wise descent constraints and HORST sparse training for transformers.

Public names are re-exported lazily (PEP 562), so ``import descentlab`` stays fast and a command such as
``descentlab list`` does not pay for importing transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # Part 1: layer-wise descent constraints
    "LayerwiseDescent": "descentlab.constrained.descent",
    "Resilience": "descentlab.constrained.dual",
    "PrimalDual": "descentlab.constrained.primal_dual",
    "Constraint": "descentlab.constrained.problem",
    "ConstraintSet": "descentlab.constrained.problem",
    "ConstraintValue": "descentlab.constrained.problem",
    "layer_losses": "descentlab.readout",
    # Part 2: optimizers
    "HORST": "descentlab.optim.horst",
    "horst_reference": "descentlab.optim.horst",
    "horst_param_groups": "descentlab.optim.config",
    "HAM": "descentlab.optim.ham",
    "compose": "descentlab.optim.compose",
    # sparsity
    "prune_magnitude": "descentlab.sparsity.pruning",
    "sparsity_report": "descentlab.sparsity.report",
    "ACDC": "descentlab.sparsity.acdc",
    "ACDCSchedule": "descentlab.sparsity.acdc",
    # robustness
    "perturb_embeddings": "descentlab.robustness.perturb",
    "perturb_inputs": "descentlab.robustness.perturb",
    "robustness_curve": "descentlab.robustness.curves",
    # unrolled models
    "UnrolledTransformer": "descentlab.models.unrolled",
    "UnrolledOutput": "descentlab.models.unrolled",
    "DUST": "descentlab.models.dust",
}

_SUBMODULES = frozenset(
    {
        "constrained",
        "data",
        "errors",
        "experiments",
        "integrations",
        "models",
        "optim",
        "readout",
        "report",
        "robustness",
        "sparsity",
        "train",
    }
)

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:  # `dl.data.load_...` without a separate import
        return importlib.import_module(f"descentlab.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'descentlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | _SUBMODULES)
