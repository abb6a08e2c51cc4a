"""Training curves of a run, read from its ``metrics.csv`` and drawn as one figure of panels.

``metrics.csv`` (:class:`~descentlab.logs.CurveWriter`) holds one row per logged value: ``time, tag, step,
name, value``. A resumed job writes some steps twice; the last row of each (tag, step, name) is kept. Names
are grouped into panels by their prefix, the part before the first ``/``: ``f/0 .. f/L`` (the loss read out
at each layer) share a panel, as do ``g/l`` (the descent constraints' ĝ_l), ``lambda/l`` (λ_l), ``u/l``
(slacks) and ``lr/i`` (one learning rate per param group); a name without ``/`` (``loss``, ``lagrangian``,
``skipped``, ``lr``) is a panel of its own. In a panel of one name each job (``tag``) is a line of its own
colour; in a panel of several names the colour is the name's index (layer), and each job draws its own set
of lines, fainter the more jobs there are.
"""

from __future__ import annotations

import csv
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps

from descentlab.report.figures import new_figure, save_figure

__all__ = ["Curves", "panel_of", "plot_training_curves", "read_curves"]

FIGURE = "figures/training-curves.png"
MAX_PANELS = 12  # a figure people can read; the rest are named in the caption
MAX_POINTS = 2000  # per line: a long run's curve is thinned evenly, its last point always kept
# panels in this order first (the objective, then the constraint's state, then the optimizer), then A-Z
_ORDER = ("loss", "lagrangian", "mean_layer_loss", "f", "f_sampled", "g", "g_sampled", "lambda", "u", "lr")
_TITLES = {
    "f": "loss read out at layer l (f_l)",
    "f_sampled": "loss at layer l, sampled read-out",
    "g": "descent constraint ĝ_l",
    "g_sampled": "ĝ_l, sampled read-out",
    "g_se": "standard error of ĝ_l",
    "lambda": "multiplier λ_l",
    "u": "slack u_l",
    "lr": "learning rate",
    "skipped": "skipped steps (non-finite loss)",
}


@dataclass
class Curves:
    """``series[tag][name] = (steps, values)``, both sorted by step; ``names`` in first-seen order."""

    series: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)

    @property
    def tags(self) -> list[str]:
        return list(self.series)

    def __bool__(self) -> bool:
        return bool(self.names)


def read_curves(path: Path | str) -> Curves:
    """The curves in ``metrics.csv`` at ``path`` (a run directory or the file); empty when there is none.

    Rows that do not parse (a line cut by a kill mid-write) are skipped; of a (tag, step, name) written
    twice (a resumed job) the later row wins.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.csv"
    last: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    names: dict[str, None] = {}
    if not path.is_file():
        return Curves()
    with open(path, encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            try:
                tag, name, step, value = row["tag"], row["name"], int(row["step"]), float(row["value"])
            except (KeyError, TypeError, ValueError):
                continue
            last[(tag, name)][step] = value
            names.setdefault(name, None)
    series: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for (tag, name), points in last.items():
        steps = np.array(sorted(points), dtype=np.int64)
        series.setdefault(tag, {})[name] = (steps, np.array([points[s] for s in steps], dtype=np.float64))
    return Curves(series=series, names=list(names))


def panel_of(name: str) -> str:
    """The panel a curve belongs to: its prefix before the first ``/`` (``lambda/3`` -> ``lambda``)."""
    return name.split("/", 1)[0]


def _index(name: str) -> float:
    """The number after the prefix (``f/12`` -> 12), for ordering and colouring a panel's curves."""
    match = re.fullmatch(r"[^/]+/(\d+)", name)
    return float(match.group(1)) if match else math.inf


def _panels(names: list[str]) -> list[tuple[str, list[str]]]:
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(panel_of(name), []).append(name)
    rank = {p: i for i, p in enumerate(_ORDER)}
    ordered = sorted(groups, key=lambda p: (rank.get(p, len(_ORDER)), p))
    return [(p, sorted(groups[p], key=lambda n: (_index(n), n))) for p in ordered]


def _thin(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(steps) <= MAX_POINTS:
        return steps, values
    keep = np.unique(np.linspace(0, len(steps) - 1, MAX_POINTS).round().astype(np.int64))
    return steps[keep], values[keep]


def _line(ax: Any, steps: np.ndarray, values: np.ndarray, **style: Any) -> None:
    steps, values = _thin(steps, values)
    ax.plot(steps, values, marker="." if len(steps) < 3 else None, **style)  # a dot: one log step shows


def _draw_panel(ax: Any, panel: str, names: list[str], curves: Curves) -> None:
    """One panel: a line per job (one name), or per name and job, coloured by the name's index."""
    tags = curves.tags
    if len(names) == 1:
        for j, tag in enumerate(tags):
            if names[0] in curves.series[tag]:
                _line(ax, *curves.series[tag][names[0]], color=f"C{j % 10}", lw=1.2, label=tag)
        if 1 < len(tags) <= 10:
            ax.legend(fontsize=6, loc="best")
    else:
        faint = max(0.2, 1.0 / math.sqrt(len(tags)))  # many jobs: overlapping faint lines show the spread
        for i, name in enumerate(names):
            color = colormaps["viridis"](i / (len(names) - 1))
            for j, tag in enumerate(tags):
                if name in curves.series[tag]:
                    label = name if j == 0 and len(names) <= 8 else None
                    _line(ax, *curves.series[tag][name], color=color, lw=1.0, alpha=faint, label=label)
        if len(names) <= 8:
            ax.legend(fontsize=6, loc="best")
        else:
            ax.text(
                0.99,
                0.98,
                f"{names[0]} (dark) … {names[-1]} (yellow)",
                transform=ax.transAxes,
                ha="right",
                va="top",
                fontsize=6,
            )
    ax.set_title(_TITLES.get(panel, panel), fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=7)
    values = np.concatenate([curves.series[t][n][1] for t in tags for n in names if n in curves.series[t]])
    finite = values[np.isfinite(values)]
    if (
        panel in ("lr", "f", "loss")
        and finite.size
        and finite.min() > 0
        and finite.max() > 100 * finite.min()
    ):
        ax.set_yscale("log")  # a decayed learning rate, a loss falling by decades


def plot_training_curves(run_dir: Path | str, *, title: str = "") -> tuple[str, str] | None:
    """Draw ``<run_dir>/figures/training-curves.png`` from the run's ``metrics.csv``.

    Returns:
        ``(path relative to run_dir, caption)``; None when the run logged no curve (no ``metrics.csv``, or
        an empty one), and then no file is written.
    """
    run_dir = Path(run_dir)
    curves = read_curves(run_dir)
    if not curves:
        return None
    panels = _panels(curves.names)
    shown, left_out = panels[:MAX_PANELS], [p for p, _ in panels[MAX_PANELS:]]
    tags = curves.tags
    ncols = min(3, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    fig, axes = new_figure(nrows, ncols, panel_size=(4.4, 3.2))
    for k, (panel, names) in enumerate(shown):
        _draw_panel(axes[k // ncols][k % ncols], panel, names, curves)
    for k in range(len(shown), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    if title:
        fig.suptitle(f"{title}: training curves", fontsize=10)
    fig.tight_layout()
    (run_dir / "figures").mkdir(exist_ok=True)
    save_figure(fig, run_dir / FIGURE)
    jobs = f"{len(tags)} job{'s' if len(tags) != 1 else ''}"
    caption = f"Training curves from metrics.csv ({jobs}, one value per log step): " + ", ".join(
        _TITLES.get(p, p) for p, _ in shown
    )
    if left_out:
        caption += f"; not drawn: {', '.join(left_out)} (in metrics.csv)"
    return FIGURE, caption
