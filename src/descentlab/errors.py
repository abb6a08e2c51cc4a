"""Errors a user can act on.

Every class here is a :class:`DescentlabError`: the command line prints its message on one line and exits
with code 2. Anything else that escapes a run is a bug or an environment failure and exits with code 1.
Messages say what went wrong *and* what to do about it.
"""

from __future__ import annotations


class DescentlabError(Exception):
    """Base class of errors caused by input the user can fix (config, data, assets, model choice)."""


class ConfigError(DescentlabError, ValueError):
    """An unknown, ill-typed or out-of-range configuration key or argument."""


class AssetMissingError(DescentlabError, FileNotFoundError):
    """An offline asset (dataset or weights) is not installed; the message names the install command."""


class DataError(DescentlabError, ValueError):
    """Unusable data: an empty dataset, NaN/Inf in a batch, a sequence longer than the model allows."""


class ModelError(DescentlabError, TypeError):
    """A model the requested operation cannot handle (no hidden states, unsupported family, wrong depth)."""


class NumericalError(DescentlabError, FloatingPointError):
    """Training cannot go on: too many non-finite losses, or diverging Lagrange multipliers."""


class InfeasibleConstraintError(NumericalError):
    """A layer's multiplier keeps growing: its descent constraint looks infeasible."""


class CheckpointError(DescentlabError):
    """A checkpoint is missing, truncated or fails its checksum, and no earlier good one exists."""


__all__ = [
    "AssetMissingError",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "DescentlabError",
    "InfeasibleConstraintError",
    "ModelError",
    "NumericalError",
]
