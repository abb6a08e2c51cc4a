"""A study's figures: panels drawn into one saved PNG with its caption, and the seed band every curve uses.

A figure record is the ``{"path", "caption"}`` dict :func:`descentlab.report.build` places in the report
(``path`` relative to the run directory). :func:`panel_figure` makes one: it lays out one panel per item,
lets the study draw each, and saves the file with :func:`descentlab.report.figures.save_figure`.
Multiplier traces are :func:`descentlab.report.figures.plot_multipliers`, re-exported here.

The band of :func:`plot_band` is ``mean ± k·sd`` at every x, with ``sd`` the spread the study states in
the caption (over seeds, or over (seed, draw) pairs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from descentlab.report.figures import new_figure, plot_multipliers, save_figure

__all__ = ["figure_record", "panel_figure", "plot_band", "plot_multipliers"]

P = TypeVar("P")


def figure_record(path: str, caption: str) -> dict[str, str]:
    """The record report/build.py reads: ``{"path": path relative to the run directory, "caption": ...}``."""
    return {"path": path, "caption": caption}


def panel_figure(
    run_dir: Path | str,
    path: str,
    panels: Sequence[P],
    draw: Callable[[Any, P], None],
    caption: str,
    *,
    legend: str | None = "",
    sharey: bool = False,
    suptitle: str = "",
) -> list[dict[str, str]]:
    """One panel per item of ``panels`` in a row, drawn by ``draw(ax, item)``, saved as ``run_dir/path``.

    Each panel gets a light grid; the first panel gets the legend (titled ``legend``; None: no legend).
    Returns ``[figure_record(path, caption)]``, or ``[]`` when there are no panels (nothing is written).
    """
    if not panels:
        return []
    fig, axes = new_figure(1, len(panels), sharey=sharey)
    for ax, item in zip(axes[0], panels, strict=True):
        draw(ax, item)
        ax.grid(alpha=0.3)
    if legend is not None and axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(title=legend or None, fontsize=8)
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    save_figure(fig, Path(run_dir) / path)
    return [figure_record(path, caption)]


def plot_band(
    ax: Any,
    x: Sequence[float],
    mean: Sequence[float],
    sd: Sequence[float] | None,
    *,
    label: str,
    k: float = 1.0,
    alpha: float = 0.15,
    marker: str | None = "o",
) -> None:
    """``mean`` against ``x`` as a line with markers and, when ``sd`` is given, a band ``mean ± k·sd`` in
    the line's colour."""
    mean_a = np.asarray(mean, dtype=np.float64)
    (line,) = ax.plot(x, mean_a, marker=marker, label=label)
    if sd is not None:
        sd_a = np.asarray(sd, dtype=np.float64)
        ax.fill_between(x, mean_a - k * sd_a, mean_a + k * sd_a, alpha=alpha, color=line.get_color())
