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
    # perturbations
    "perturb_embeddings": "descentlab.perturbations.hooks",
    "perturb_inputs": "descentlab.perturbations.hooks",
    "robustness_curve": "descentlab.evaluation.curves",
    # training and studies: run a registered study, or write your own on the same toolkit
    "fit": "descentlab.train.loop",
    "TrainConfig": "descentlab.train.loop",
    "MethodConfig": "descentlab.train.recipe",
    "run_experiment": "descentlab.experiments",
    "ClaimSpec": "descentlab.report.claims",
    "Cells": "descentlab.report.claims",
    "CellStore": "descentlab.study.cells",
    "Design": "descentlab.study.cells",
    "TuningConfig": "descentlab.study.tuning",
    "tune_then_replicate": "descentlab.study.tuning",
    "Table": "descentlab.study.tables",
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
        "perturbations",
        "evaluation",
        "study",
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
