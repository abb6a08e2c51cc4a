"""Figures of the implicit-bias experiment: weight trajectories, margin curves, sorted weight magnitudes."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import Tensor

from descentlab.train.rundir import RunDir


def plot_trajectories(trajectories: dict[str, dict[int, Tensor]], run: RunDir) -> dict | None:
    shown = [m for m in ("gd", "sign", "coordinate", "hyperbolic_md", "adam", "horst") if m in trajectories]
    if not shown:
        return None
    fig, axes = plt.subplots(2, math.ceil(len(shown) / 2), figsize=(4 * math.ceil(len(shown) / 2), 6.5))
    for ax, name in zip(np.ravel(axes), shown, strict=False):
        steps = sorted(k for k in trajectories[name] if k > 0)
        ax.plot(steps, torch.stack([trajectories[name][k] for k in steps]).numpy(), lw=0.8)
        ax.set_xscale("log")
        ax.set_title(name)
        ax.set_xlabel("step")
    fig.suptitle("Regression: every coordinate of w against the step (first seed)")
    fig.tight_layout()
    path = run.figure("regression-trajectories")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {"path": f"figures/{path.name}", "caption": "Weight trajectories on under-determined regression."}


def plot_margins(steps: list[int], paths: dict[str, list[float]], run: RunDir) -> dict | None:
    if not paths:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
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
    path = run.figure("classification-margins")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {
        "path": f"figures/{path.name}",
        "caption": "L1 margin relative to the linprog optimum against the step.",
    }


def plot_weights(final: dict[str, Tensor], run: RunDir) -> dict | None:
    if not final:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, w in final.items():
        mags = (w.abs() / w.abs().max()).sort(descending=True).values.clamp_min(1e-12).numpy()
        ax.plot(np.arange(1, len(mags) + 1), mags, label=name, lw=1.2)
    ax.set_yscale("log")
    ax.set_xlabel("rank")
    ax.set_ylabel("|w_i| / max |w|")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Classification: sorted weight magnitudes (first seed)")
    fig.tight_layout()
    path = run.figure("classification-weights")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {"path": f"figures/{path.name}", "caption": "Sorted |w| at the end of classification training."}
