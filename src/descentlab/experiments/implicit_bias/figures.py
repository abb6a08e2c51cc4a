"""Figures of implicit-bias: Theorem 4.7's margin against the step, weight trajectories, L1-margin paths,
sorted final weight magnitudes, and the heterogeneous-scale study.

Theorem 4.7's figure is drawn from the claims' cells (``claims.claim_arrays``: the design's theorem steps and
one ``theorem_ratio/<method>`` ``[seeds, steps]`` path of the L1 margin over the optimum per method: mean ±
std over every seed); the others from the first seed's arrays
the run saved under ``arrays/``: ``trajectories.npz`` (``steps`` and one
``[steps, d]`` regression iterate history per method), ``margins.npz`` (``steps`` and one normalised-L1-margin
path per method), ``final-weights.npz`` (the final classification weights per method), and for the
heterogeneous-scale study ``scales-margins.npz`` (``decades`` and one ``[spreads, seeds]`` array of L1 margin
ratios per method) and ``scales-weights.npz`` (``scales``, the LP separator and each method's final weights
at the largest spread, first seed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.implicit_bias.claims import claim_arrays
from descentlab.io import load_arrays
from descentlab.report.figures import new_figure, save_figure
from descentlab.study.cells import CellStore

# the geometries whose every coordinate is worth a panel (the others add nothing a reader needs here)
TRAJECTORY_PANELS = ("gd", "sign", "coordinate", "hyperbolic_md", "adam", "horst")


def _methods(arrays: Mapping[str, np.ndarray], axis: str = "steps") -> dict[str, np.ndarray]:
    return {name: a for name, a in arrays.items() if name != axis}


def plot_trajectories(steps: np.ndarray, trajectories: Mapping[str, np.ndarray], path: Path) -> Path | None:
    """One panel per shown method: every coordinate of w against the step (log scale)."""
    shown = [m for m in TRAJECTORY_PANELS if m in trajectories]
    if not shown:
        return None
    cols = math.ceil(len(shown) / 2)
    fig, axes = new_figure(2, cols, figsize=(4 * cols, 6.5))
    for ax, name in zip(np.ravel(axes), shown, strict=False):
        ax.plot(steps, trajectories[name], lw=0.8)
        ax.set_xscale("log")
        ax.set_title(name)
        ax.set_xlabel("step")
    fig.suptitle("Regression: every coordinate of w against the step (first seed)")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def plot_margins(steps: np.ndarray, paths: Mapping[str, np.ndarray], path: Path) -> Path | None:
    """Normalised L1 margin / optimal L1 margin against the step, one line per method."""
    if not paths:
        return None
    fig, ax = new_figure(figsize=(7, 4.2))
    ax = ax[0][0]
    for name, ratios in paths.items():
        ax.plot(steps, ratios, label=name, lw=1.3, ls="-" if "before" not in name else "--")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_ylim(-0.5, 1.05)
    ax.set_xlabel("step")
    ax.set_ylabel("L1 margin / optimal L1 margin")
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    ax.set_title("Normalised L1 margin (first seed; dashed: mirror before steepest)", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def theorem_paths(store: Mapping[str, Any]) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
    """``(steps, method -> [seeds, steps] ratios)`` of the theorem run in the claims' cells ((None, {})
    without one)."""
    theorem = store.design.extra.get("theorem") if isinstance(store, CellStore) else None
    if not theorem:
        return None, {}
    return np.asarray(theorem["steps"]), {m: store.get("theorem_ratio", m) for m in theorem["methods"]}


def plot_theorem(steps: np.ndarray | None, paths: Mapping[str, np.ndarray], path: Path) -> Path | None:
    """Theorem 4.7's run: L1 margin / optimal against the step, mean ± std over seeds, one line per method."""
    if steps is None or not paths:
        return None
    fig, ax = new_figure(figsize=(7, 4.2))
    ax = ax[0][0]
    for name, ratios in paths.items():
        mean = np.nanmean(ratios, axis=0)
        std = np.nanstd(ratios, axis=0, ddof=1) if ratios.shape[0] > 1 else np.zeros_like(mean)
        ax.plot(steps, mean, label=f"{name} ({ratios.shape[0]} seeds)", lw=1.4)
        ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.9, color="k", lw=0.8, ls=":", label="τ = 0.9")
    ax.set_xscale("log")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("step (lr_k = lr / sqrt(k))")
    ax.set_ylabel("L1 margin / optimal L1 margin")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(
        "Theorem 4.7: L_p steepest descent + hyperbolic mirror step (mean ± std over seeds)", fontsize=9
    )
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def plot_weights(final: Mapping[str, np.ndarray], path: Path) -> Path | None:
    """Sorted |w_i| / max |w| of the final classification weights, log scale."""
    if not final:
        return None
    fig, ax = new_figure(figsize=(6.5, 4))
    ax = ax[0][0]
    for name, w in final.items():
        mags = np.clip(np.sort(np.abs(w) / np.abs(w).max())[::-1], 1e-12, None)
        ax.plot(np.arange(1, len(mags) + 1), mags, label=name, lw=1.2)
    ax.set_yscale("log")
    ax.set_xlabel("rank")
    ax.set_ylabel("|w_i| / max |w|")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Classification: sorted weight magnitudes (first seed)")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def plot_scale_margins(decades: np.ndarray, ratios: Mapping[str, np.ndarray], path: Path) -> Path | None:
    """L1 margin / optimal against the spread of column scales, mean ± std over seeds, one line per method."""
    if not ratios:
        return None
    fig, ax = new_figure(figsize=(6.5, 4.2))
    ax = ax[0][0]
    for name, r in ratios.items():
        mean, std = np.nanmean(r, axis=1), np.nanstd(r, axis=1, ddof=1) if r.shape[1] > 1 else 0 * r[:, 0]
        ax.errorbar(decades, mean, yerr=std, label=name, lw=1.4, marker="o", ms=4, capsize=3)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel("spread of column scales (decades)")
    ax.set_ylabel("L1 margin / optimal L1 margin")
    ax.legend(fontsize=8)
    ax.set_title("Heterogeneous scales: L1 margin at the end of training (mean ± std over seeds)", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def plot_scale_weights(data: Mapping[str, np.ndarray], path: Path) -> Path | None:
    """|w_j| / max |w| against the column scale s_j at the largest spread (first seed), one panel a method."""
    names = [n for n in data if n != "scales"]
    if "scales" not in data or not names:
        return None
    cols = math.ceil(len(names) / 2)
    fig, axes = new_figure(2, cols, figsize=(3.4 * cols, 6.4))
    for ax, name in zip(np.ravel(axes), names, strict=False):
        w = np.abs(data[name])
        ax.scatter(data["scales"], np.clip(w / w.max(), 1e-16, None), s=8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(1e-16, 2)
        ax.set_xlabel("column scale s_j")
        ax.set_title(name, fontsize=9)
    for ax in np.ravel(axes)[len(names) :]:
        ax.set_visible(False)
    for ax in np.ravel(axes)[::cols]:
        ax.set_ylabel("|w_j| / max |w|")
    fig.suptitle("Largest spread, first seed: where each separator puts its weight")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """The three figures, redrawn from the arrays in ``run_dir / "arrays"`` (those that exist)."""
    arrays, folder = Path(run_dir) / "arrays", Path(run_dir) / "figures"
    drawn = []
    if plot_theorem(*theorem_paths(claim_arrays(run_dir)), folder / "theorem-margins.png") is not None:
        caption = "Theorem 4.7's objects at a decaying step: L1 margin relative to the linprog optimum against the step."
        drawn.append({"path": "figures/theorem-margins.png", "caption": caption})
    for source, name, draw, caption in (
        ("trajectories", "regression-trajectories", _stepped(plot_trajectories),
         "Weight trajectories on under-determined regression."),
        ("margins", "classification-margins", _stepped(plot_margins),
         "L1 margin relative to the linprog optimum against the step."),
        ("final-weights", "classification-weights", plot_weights,
         "Sorted |w| at the end of classification training."),
        ("scales-margins", "scales-margins", lambda d, p: plot_scale_margins(d["decades"], _methods(d, "decades"), p),
         "Heterogeneous column scales: L1 margin relative to the linprog optimum against the spread."),
        ("scales-weights", "scales-weights", plot_scale_weights,
         "Heterogeneous column scales: |w_j| against the column scale at the largest spread."),
    ):  # fmt: skip
        path = arrays / f"{source}.npz"
        if path.is_file() and draw(load_arrays(path), folder / f"{name}.png") is not None:
            drawn.append({"path": f"figures/{name}.png", "caption": caption})
    return drawn


def _stepped(plot: Any) -> Any:
    """``plot(steps, per_method, path)`` as ``draw(arrays, path)`` for a file holding ``steps`` + methods."""
    return lambda data, path: plot(data["steps"], _methods(data), path)


__all__ = [
    "figures",
    "plot_margins",
    "plot_scale_margins",
    "plot_scale_weights",
    "plot_theorem",
    "plot_trajectories",
    "plot_weights",
    "theorem_paths",
]  # fmt: skip
