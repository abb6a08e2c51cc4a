"""Figures of the video-denoising experiment: RMSE relative to ERM, per-layer MSE profiles, sample frames."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from torch import Tensor


def plot_relative(
    methods: dict, architectures: list[str], objectives: list[str], gammas: list[float], path: Path
) -> dict:
    """RMSE / RMSE of ERM against gamma, one panel per architecture."""
    fig, axes = plt.subplots(1, len(architectures), figsize=(4.4 * len(architectures), 3.4), squeeze=False)
    for ax, arch in zip(axes[0], architectures, strict=True):
        base = methods.get(f"{arch}-erm")
        for objective in objectives:
            block = methods.get(f"{arch}-{objective}")
            if base is None or block is None:
                continue
            b, c = base["curves"]["gaussian"]["mean"], block["curves"]["gaussian"]
            ratio = [m / r for m, r in zip(c["mean"], b, strict=True)]
            band = [s / r for s, r in zip(c["std"], b, strict=True)]
            ax.plot(gammas, ratio, marker="o", ms=3, label=objective)
            ax.fill_between(
                gammas,
                [r - s for r, s in zip(ratio, band, strict=True)],
                [r + s for r, s in zip(ratio, band, strict=True)],
                alpha=0.2,
            )
        ax.axvline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("gamma (test sigma / sigma_train)")
        ax.set_ylabel("RMSE / RMSE of ERM")
        ax.set_title(arch.upper())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return {
        "path": f"figures/{path.name}",
        "caption": "Test RMSE relative to ERM of the same architecture "
        "(mean over seeds, band: std of the method's RMSE / ERM mean); below 1 = better than ERM",
    }


def plot_layer_profiles(methods: dict, architectures: Sequence[str], path: Path) -> dict:
    """Per-layer test MSE on a log scale, one panel per architecture."""
    archs = sorted({m.split("-")[0] for m in methods}, key=list(architectures).index)
    fig, axes = plt.subplots(1, len(archs), figsize=(4.4 * len(archs), 3.4), squeeze=False)
    for ax, arch in zip(axes[0], archs, strict=True):
        for k, (method, block) in enumerate(m for m in methods.items() if m[0].startswith(arch + "-")):
            for j, (condition, values) in enumerate(block["layer_loss"].items()):
                ax.semilogy(
                    range(len(values)),
                    values,
                    marker="o",
                    ms=3,
                    color=f"C{k}",
                    ls=["-", "--"][j % 2],
                    label=f"{method.split('-', 1)[1]} {condition}",
                )
        ax.set_xlabel("layer")
        ax.set_ylabel("test MSE (log)")
        ax.set_title(arch.upper())
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return {
        "path": f"figures/{path.name}",
        "caption": "Test MSE of every layer's estimate (log scale), "
        "in distribution (solid) and at the largest gamma (dashed)",
    }


def plot_samples(
    samples: dict,
    clean: Tensor,
    noisy: list[Tensor],
    gammas: list[float],
    architectures: list[str],
    objectives: list[str],
    seed: int,
    path: Path,
) -> dict:
    """Clean, noisy and denoised middle frame: one row per (architecture, gamma)."""
    t = clean.shape[0] // 2
    h, w = samples[next(iter(samples))].shape[-2:]
    shown = [o for o in ("erm", "constrained", "resilient") if o in objectives]  # the control is left out
    rows = [(arch, i) for arch in architectures for i in range(len(gammas))]
    cols = 2 + len(shown)
    fig, axes = plt.subplots(len(rows), cols, figsize=(2.2 * cols * w / h, 2.3 * len(rows)), squeeze=False)

    def show(ax, img: Tensor, title: str) -> None:
        ax.imshow(img.clamp(0, 1).numpy(), cmap="gray", vmin=0, vmax=1)
        ax.set_title(title, fontsize=7)
        ax.axis("off")

    def rmse(img: Tensor) -> float:
        return float((img - clean[t, :h, :w]).pow(2).mean().sqrt())

    for r, (arch, i) in enumerate(rows):
        show(axes[r][0], clean[t, :h, :w], "clean")
        show(axes[r][1], noisy[i][t, :h, :w], f"noisy gamma={gammas[i]:g} ({rmse(noisy[i][t, :h, :w]):.3f})")
        for c, objective in enumerate(shown):
            img = samples[f"{arch}-{objective}"][i][t]
            show(axes[r][2 + c], img, f"{arch} {objective} ({rmse(img):.3f})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return {
        "path": f"figures/{path.name}",
        "caption": f"Middle frame of a test clip (seed {seed}), "
        "denoised tile by tile; frame RMSE in brackets",
    }
