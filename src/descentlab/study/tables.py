"""A study's tables: one typed :class:`Table` and the one set of cell formatters every study uses.

A table serialises to the ``{"title", "columns", "rows"}`` dict that ``results.json`` stores and
:mod:`descentlab.report.build` renders (a ``note``, when set, is kept beside them). The formatters print
the three kinds of cell the studies report:

* ``mean ± sd`` of a quantity over seeds (or (seed, draw) pairs): :func:`pm` from a mean and an sd,
  :func:`mean_sd` from the values themselves, with ``sd = sqrt(Σ (x_i − x̄)² / (n − ddof))``;
* a paired difference with its interval, ``d̂ [lo, hi]``, every number signed: :func:`signed_ci`;
* an interval alone, ``[lo, hi]``: :func:`ci`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Table", "ci", "mean_sd", "pm", "signed_ci"]


@dataclass
class Table:
    """One table of a study's report.

    Attributes:
        title: the caption, saying what a cell is (e.g. "mean ± std over seeds").
        columns: the header; every row has this many cells.
        rows: the cells, already formatted (strings or numbers).
        note: an optional line printed under the table.
    """

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    note: str = ""

    def __post_init__(self) -> None:
        bad = [i for i, row in enumerate(self.rows) if len(row) != len(self.columns)]
        if bad:
            raise ValueError(
                f"table {self.title!r}: row {bad[0]} has {len(self.rows[bad[0]])} cells for "
                f"{len(self.columns)} columns"
            )

    def add(self, *cells: Any) -> None:
        """Append one row (its length must match the columns)."""
        if len(cells) != len(self.columns):
            raise ValueError(f"table {self.title!r}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    def to_dict(self) -> dict[str, Any]:
        """The ``results.json`` form: ``{"title", "columns", "rows"}`` (and ``"note"`` when set)."""
        out: dict[str, Any] = {
            "title": self.title,
            "columns": list(self.columns),
            "rows": [list(r) for r in self.rows],
        }
        if self.note:
            out["note"] = self.note
        return out


def pm(mean: float, sd: float, digits: int = 4, *, signed: bool = False, scale: float = 1.0) -> str:
    """``"m ± s"`` with ``digits`` decimals on both, after multiplying both by ``scale`` (100: percent);
    ``signed`` prints the mean's sign always (a difference)."""
    sign = "+" if signed else ""
    return f"{scale * mean:{sign}.{digits}f} ± {scale * sd:.{digits}f}"


def mean_sd(
    values: Sequence[float] | np.ndarray, digits: int = 3, *, ddof: int = 0, signed: bool = False
) -> str:
    """``"x̄ ± sd"`` of ``values``: the mean and the standard deviation with ``ddof`` (0: population, as the
    tables over (seed, draw) pairs; 1: the sample sd). One value gives sd 0.

    >>> mean_sd([0.602, 0.622])
    '0.612 ± 0.010'
    """
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.size == 0:
        raise ValueError("mean_sd of no values")
    sd = float(x.std(ddof=ddof)) if x.size > ddof else 0.0
    return pm(float(x.mean()), sd, digits, signed=signed)


def ci(low: float, high: float, digits: int = 4, *, signed: bool = False, scale: float = 1.0) -> str:
    """``"[lo, hi]"`` with ``digits`` decimals (``signed``: both signs printed), after ``scale``."""
    sign = "+" if signed else ""
    return f"[{scale * low:{sign}.{digits}f}, {scale * high:{sign}.{digits}f}]"


def signed_ci(estimate: float, low: float, high: float, digits: int = 4, *, scale: float = 1.0) -> str:
    """``"+d [+lo, +hi]"``: a paired difference and its interval, every number signed.

    >>> signed_ci(0.0125, -0.001, 0.026)
    '+0.0125 [-0.0010, +0.0260]'
    """
    return f"{scale * estimate:+.{digits}f} {ci(low, high, digits, signed=True, scale=scale)}"
