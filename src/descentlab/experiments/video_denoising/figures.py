"""The figures of the video-denoising study, drawn from ``results.json`` and saved arrays only.

Method names are ``<architecture>-<label>`` (``ut-erm``, ``dust-constrained``...). Figures (:func:`figures`): RMSE relative to ERM, per-layer test MSE on a log scale, test RMSE with the
classical baselines, validation curves, every constrained method's multipliers over training, and sample frames (clean, noisy, every method and baseline) read
from ``sample-frames.npz`` in the run directory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.video_denoising.summary import Methods, arch_of, label_of
from descentlab.io import load_arrays
from descentlab.report.figures import new_figure, save_figure
from descentlab.study.figures import figure_record, plot_multipliers

SAMPLE_FRAMES = "sample-frames.npz"


def _style(ax: Any, title: str, xlabel: str, ylabel: str, *, legend_size: int, **grid: Any) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, **grid)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=legend_size)


def _save(fig: Any, path: Path, caption: str, *, dpi: int = 120) -> dict[str, str]:
    """Lay out, write the PNG and return its ``{"path", "caption"}`` entry (path relative to the run dir)."""
    fig.tight_layout()
    save_figure(fig, path, dpi=dpi)
    return figure_record(f"figures/{path.name}", caption)


def plot_relative(methods: Methods, architectures: Sequence[str], path: Path) -> dict[str, str]:
    """RMSE / RMSE of ERM against γ, one panel per architecture, one line per method label."""
    fig, axes = new_figure(1, len(architectures), panel_size=(4.4, 3.4))
    for ax, arch in zip(axes[0], architectures, strict=True):
        base = methods.get(f"{arch}-erm")
        for method, block in methods.items():
            if base is None or arch_of(method) != arch:
                continue
            b, c = base["curves"]["gaussian"]["mean"], block["curves"]["gaussian"]
            ratio = [m / r for m, r in zip(c["mean"], b, strict=True)]
            band = [s / r for s, r in zip(c["std"], b, strict=True)]
            ax.plot(c["x"], ratio, marker="o", ms=3, label=label_of(method))
            ax.fill_between(
                c["x"],
                [r - s for r, s in zip(ratio, band, strict=True)],
                [r + s for r, s in zip(ratio, band, strict=True)],
                alpha=0.2,
            )
        ax.axvline(1.0, color="grey", lw=0.8, ls=":")
        _style(ax, arch.upper(), "gamma (test sigma / sigma_train)", "RMSE / RMSE of ERM", legend_size=8)
    return _save(
        fig,
        path,
        "Test RMSE relative to ERM of the same architecture "
        "(mean over seeds, band: std of the method's RMSE / ERM mean); below 1 = better than ERM",
    )


def plot_layer_profiles(methods: Methods, architectures: Sequence[str], path: Path) -> dict[str, str]:
    """Per-layer test MSE on a log scale, one panel per architecture; solid: γ = 1, dashed: the largest γ."""
    fig, axes = new_figure(1, len(architectures), panel_size=(4.4, 3.4))
    for ax, arch in zip(axes[0], architectures, strict=True):
        for k, (method, block) in enumerate(m for m in methods.items() if arch_of(m[0]) == arch):
            for j, (condition, values) in enumerate(block["layer_loss"].items()):
                ax.semilogy(
                    range(len(values)),
                    values,
                    marker="o",
                    ms=3,
                    color=f"C{k}",
                    ls=["-", "--"][j % 2],
                    label=f"{label_of(method)} {condition}",
                )
        _style(ax, arch.upper(), "layer", "test MSE (log)", legend_size=7, which="both")
    return _save(
        fig,
        path,
        "Test MSE of every layer's estimate (log scale), in distribution (solid) and at the largest gamma (dashed)",
    )


def _show(ax: Any, img: np.ndarray, title: str) -> None:
    ax.imshow(np.clip(img, 0, 1), cmap="gray", vmin=0, vmax=1)
    ax.set_title(title, fontsize=6)
    ax.axis("off")


def _frame_rmse(img: np.ndarray, target: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(img - target))))


def plot_samples(
    frames: Mapping[str, np.ndarray], architectures: Sequence[str], path: Path
) -> dict[str, str]:
    """Clean, noisy and denoised middle frame: one row per (architecture, γ).

    Args:
        frames: the arrays of ``sample-frames.npz``: ``clean [T, H, W]``, ``noisy [G, T, H, W]``,
            ``gammas [G]``, ``seed``, ``methods [M]`` and ``denoised [M, G, T, h, w]`` (h, w <= H, W).
        architectures: one block of rows each.
        path: the PNG to write.
    """
    clean, noisy, gammas = frames["clean"], frames["noisy"], frames["gammas"].tolist()
    names = frames["methods"].tolist()
    denoised = dict(zip(names, frames["denoised"], strict=True))
    t = clean.shape[0] // 2
    h, w = frames["denoised"].shape[-2:]
    baselines = [n for n in names if arch_of(n) not in architectures]
    width = max(sum(arch_of(n) == a for n in names) for a in architectures)
    rows = [(arch, i) for arch in architectures for i in range(len(gammas))]
    cols = 2 + len(baselines) + width
    fig, axes = new_figure(len(rows), cols, figsize=(1.9 * cols * w / h, 1.9 * len(rows)))
    target = clean[t, :h, :w]
    for r, (arch, i) in enumerate(rows):
        for ax in axes[r]:
            ax.axis("off")
        _show(axes[r][0], target, "clean")
        noisy_frame = noisy[i][t, :h, :w]
        _show(axes[r][1], noisy_frame, f"noisy gamma={gammas[i]:g} ({_frame_rmse(noisy_frame, target):.3f})")
        shown = baselines + [n for n in names if arch_of(n) == arch]
        for c, name in enumerate(shown):
            img = denoised[name][i][t]
            _show(axes[r][2 + c], img, f"{name.replace('-', ' ', 1)} ({_frame_rmse(img, target):.3f})")
    caption = (
        f"Middle frame of a test clip (seed {int(frames['seed'])}), every method and baseline denoising it tile "
        "by tile; frame RMSE in brackets"
    )
    return _save(fig, path, caption, dpi=90)


def plot_val_curves(
    methods: Methods,
    architectures: Sequence[str],
    path: Path,
    budget: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, str] | None:
    """Validation RMSE at gamma = 1 against the training step (mean over seeds), one panel per architecture;
    ERM's budget check (``results["budget_check"]``: first seed, longer schedule) dashed."""
    if not any(block.get("val_curves") for block in methods.values()):
        return None
    fig, axes = new_figure(1, len(architectures), panel_size=(4.4, 3.4))
    for ax, arch in zip(axes[0], architectures, strict=True):
        for method, block in methods.items():
            curves = block.get("val_curves") or []
            if arch_of(method) != arch or not curves:
                continue
            steps = curves[0]["step"]
            mean = np.mean([c["rmse"] for c in curves], axis=0)
            erm = label_of(method) == "erm"
            ax.plot(
                steps[1:],
                mean[1:],
                lw=2.2 if erm else 1.0,
                color="k" if erm else None,
                label=label_of(method),
            )
        if arch in (budget or {}):
            check = budget[arch]
            curve = check["val_curve"]
            ax.plot(curve["step"][1:], curve["rmse"][1:], "k--", lw=1.4, label=f"erm, {check['steps']} steps")
        _style(ax, arch.upper(), "training step", "validation RMSE (gamma = 1)", legend_size=7)
    return _save(
        fig,
        path,
        "Validation RMSE during training (mean over seeds; ERM in black; dashed: ERM's longer budget)",
    )


def plot_lambda_trajectories(methods: Methods, path: Path) -> dict[str, str] | None:
    """λ_l against the training step for every method that saved its trace (``lambda_trace``), one panel
    each: per layer the mean over seeds (thick) and each seed (thin, same colour). A layer whose λ is 0 at
    every recorded step of every seed is left out and named in the panel's title."""
    traced = {m: b["lambda_trace"] for m, b in methods.items() if b.get("lambda_trace")}
    if not traced:
        return None
    fig, axes = new_figure(1, len(traced), panel_size=(4.4, 3.4))
    for ax, (method, traces) in zip(axes[0], traced.items(), strict=True):
        steps = traces[0]["steps"]
        lam = [t["lambda"] for t in traces if t["steps"] == steps]  # [S, T, L]
        idle = plot_multipliers(ax, steps, lam)
        title = f"{method} ({len(lam)} seeds)" + (f"; λ = 0 throughout: {idle}" if idle else "")
        _style(ax, title, "training step", "multiplier λ_l", legend_size=7)
    return _save(
        fig,
        path,
        "Multipliers λ_l over training, per constrained layer: mean over the evaluation seeds (thick) and each "
        "seed (thin); layers whose λ stayed 0 are named in the title",
    )


def plot_rmse_with_baselines(
    results: Mapping[str, Any], architectures: Sequence[str], path: Path
) -> dict[str, str] | None:
    """Test RMSE against gamma: every learned method (solid) and classical baseline (dashed), per architecture."""
    methods, baselines = results.get("methods", {}), results.get("baselines", {})
    fig, axes = new_figure(1, len(architectures), panel_size=(4.4, 3.4))
    for ax, arch in zip(axes[0], architectures, strict=True):
        for method, block in methods.items():
            if arch_of(method) == arch:
                c = block["curves"]["gaussian"]
                ax.plot(c["x"], c["mean"], marker="o", ms=3, label=label_of(method))
        for k, (name, b) in enumerate(baselines.items()):
            x = methods[next(iter(methods))]["curves"]["gaussian"]["x"]
            ax.plot(x, b["rmse_mean"], ls="--", color=f"C{7 + k % 3}", marker="s", ms=3, label=name)
        _style(ax, arch.upper(), "gamma (test sigma / sigma_train)", "test RMSE", legend_size=7)
    return _save(
        fig, path, "Test RMSE against gamma: learned models (solid) and classical baselines (dashed)"
    )


def plot_budget_curve(curve: Mapping[str, Any], gammas: Sequence[float], path: Path) -> dict[str, str] | None:
    """Test RMSE against the step budget (log scale), one panel per architecture, at γ = 1 (solid) and at
    the largest γ (dashed), one colour per method."""
    rows = curve.get("rows") or []
    if not rows:
        return None
    archs = sorted({r["architecture"] for r in rows})
    one, top = list(gammas).index(1.0), len(gammas) - 1
    budgets = sorted({r["steps"] for r in rows})
    fig, axes = new_figure(1, len(archs), panel_size=(4.4, 3.4))
    for ax, arch in zip(axes[0], archs, strict=True):
        labels = sorted({r["label"] for r in rows if r["architecture"] == arch}, key=lambda x: x != "erm")
        for k, label in enumerate(labels):
            pts = sorted(
                (r["steps"], r["test_rmse"])
                for r in rows
                if r["architecture"] == arch and r["label"] == label
            )
            steps = [s for s, _ in pts]
            color = "k" if label == "erm" else f"C{k}"
            ax.plot(steps, [t[one] for _, t in pts], "o-", color=color, label=f"{label}, gamma=1")
            ax.plot(
                steps, [t[top] for _, t in pts], "s--", color=color, label=f"{label}, gamma={gammas[top]:g}"
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(budgets, [f"{s:,}" for s in budgets])
        ax.minorticks_off()
        _style(ax, arch.upper(), "training steps (each its own cosine schedule)", "test RMSE", legend_size=7)
    return _save(
        fig, path, "Test RMSE against the training budget (seed 0, settings chosen at the base budget)"
    )


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """The experiment's own figures, from ``results.json`` and ``sample-frames.npz`` (when saved)."""
    methods = results.get("methods", {})
    if not methods:
        return []
    present = {arch_of(m) for m in methods}
    architectures = [
        a for a in results.get("config", {}).get("architectures", sorted(present)) if a in present
    ]
    folder = Path(run_dir) / "figures"
    drawn = [
        plot_relative(methods, architectures, folder / "rmse-relative-to-erm.png"),
        plot_layer_profiles(methods, architectures, folder / "layer-mse-log.png"),
        plot_rmse_with_baselines(results, architectures, folder / "rmse-with-baselines.png"),
        plot_val_curves(
            methods, architectures, folder / "validation-curves.png", results.get("budget_check")
        ),
        plot_lambda_trajectories(methods, folder / "lambda-trajectory.png"),
        plot_budget_curve(
            results.get("budget_curve") or {},
            results.get("protocol", {}).get("gammas", [1.0]),
            folder / "budget-curve.png",
        ),
    ]
    drawn = [d for d in drawn if d is not None]
    samples = Path(run_dir) / SAMPLE_FRAMES
    if samples.is_file():
        drawn.append(plot_samples(load_arrays(samples), architectures, folder / "sample-frames.png"))
    return drawn
