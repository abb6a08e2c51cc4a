"""text-robustness's figures, drawn from the arrays the run saved (:mod:`.arrays`: the per-review ones from
its cell store), never a live model.

Every band is the seed-level 95 % interval of :func:`~descentlab.report.stats.paired_interval` (a mean
against 0, or a method against its reference over the same cells), so a band and a claim's interval are
the same kind of object.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.text_robustness.arrays import (
    ACCURACY,
    CORRECT,
    LAMBDA,
    LDP,
    LOSS,
    SEP,
    by_method,
    load,
)
from descentlab.experiments.text_robustness.claims import CONTROL, ERM, claim_arrays
from descentlab.experiments.text_robustness.tables import paired_gaps
from descentlab.report.figures import new_figure, plot_multipliers, save_figure
from descentlab.report.stats import column_mean_std, paired_interval
from descentlab.study.cells import CellStore, cell_key
from descentlab.study.figures import panel_figure, plot_band


def mean_interval(x: np.ndarray, reference: np.ndarray | None = None) -> tuple[float, float, float]:
    """Mean of ``x − reference`` (``reference`` 0 when None) with its seed-level 95 % interval."""
    iv = paired_interval(x, np.zeros_like(x) if reference is None else reference)
    return iv.mean, iv.low, iv.high


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """Every figure whose arrays the run saved."""
    run_dir = Path(run_dir)
    store = claim_arrays(run_dir)
    return [
        *(_accuracy(store, run_dir) + _layer_loss(store, run_dir) if isinstance(store, CellStore) else []),
        *_lambda(run_dir),
        *_paired_gap(results, run_dir),
        *_ldp(results, run_dir),
    ]


def _accuracy(store: CellStore, run_dir: Path) -> list[dict[str, Any]]:
    gammas = np.asarray(store.design.extra["gammas"], dtype=np.float64)
    kinds = store.conditions()
    methods = {m: {k: store[cell_key(CORRECT, m, k)] for k in kinds} for m in _saved(store, CORRECT, kinds)}
    if not methods or not kinds:
        return []
    caption = "Test accuracy against γ per noise kind, mean and seed-level 95 % interval"
    draw = partial(_accuracy_panel, gammas, methods, kinds[0])
    return panel_figure(run_dir, "figures/accuracy-ci.png", kinds, draw, caption, sharey=True)


def _accuracy_panel(
    gammas: np.ndarray, methods: dict[str, dict[str, np.ndarray]], first: str, ax: Any, kind: str
) -> None:
    """Each method's accuracy under ``kind`` against γ with its seed-level 95 % band."""
    for m, by in methods.items():
        stats = np.array([mean_interval(by[kind][:, :, g]) for g in range(len(gammas))])
        ax.plot(gammas, stats[:, 0], marker="o", ms=3, label=m)
        ax.fill_between(gammas, stats[:, 1], stats[:, 2], alpha=0.15)
    ax.set_title(kind)
    ax.set_xlabel("gamma")
    if kind == first:
        ax.set_ylabel("test accuracy")


def _saved(store: CellStore, metric: str, kinds: list[str] | None = None) -> list[str]:
    """The design's methods whose ``metric`` cells the run saved (under every one of ``kinds``)."""
    keys = [[cell_key(metric, m, k) for k in kinds or [None]] for m in store.design.arms]
    return [m for m, ks in zip(store.design.arms, keys, strict=True) if all(k in store for k in ks)]


def _layer_loss(store: CellStore, run_dir: Path) -> list[dict[str, Any]]:
    arrays = {m: store[cell_key(LOSS, m)] for m in _saved(store, LOSS)}
    if not arrays:
        return []
    depth = max(x.shape[1] for x in arrays.values())
    fig, axes = new_figure(1, 1, panel_size=(max(4.2, 0.28 * depth), 3.4))
    ax = axes[0][0]
    for m, x in arrays.items():  # [seed, L+1, example]: every layer, 0..L
        stats = np.array([mean_interval(x[:, layer]) for layer in range(x.shape[1])])
        layers = np.arange(x.shape[1])
        ax.plot(layers, stats[:, 0], marker="o", ms=3, label=m)
        ax.fill_between(layers, stats[:, 1], stats[:, 2], alpha=0.15)
    caption = "Per-layer clean test loss at every layer, mean and seed-level 95 % interval"
    spike = largest_rise(arrays[ERM]) if ERM in arrays else None
    if (
        spike is not None
    ):  # the paper: ERM's loss spikes at layer 19 of its RoBERTa (deeper than base; it names no size)
        layer, rise = spike
        ax.axvline(layer, color="grey", ls=":", lw=1.0)
        caption += f"; dotted: ERM's largest rise, at layer {layer} (+{rise:.3g} nats over layer {layer - 1})"
    ax.set_xticks(np.arange(depth))
    ax.set_xlabel("layer (0 = embedding output)")
    ax.set_ylabel("clean test loss read out at the layer")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, run_dir / "figures" / "layer-loss-ci.png")
    return [{"path": "figures/layer-loss-ci.png", "caption": caption}]


def largest_rise(losses: np.ndarray) -> tuple[int, float] | None:
    """``(l, f_l − f_{l−1})`` of the largest rise of the mean per-layer loss ``losses [seed, L+1, example]``,
    l in 1..L; None when the mean loss never rises."""
    mean = np.asarray(losses, dtype=np.float64).mean(axis=(0, 2))
    rises = np.diff(mean)
    layer = int(np.argmax(rises)) + 1
    return (layer, float(rises[layer - 1])) if rises[layer - 1] > 0 else None


def _lambda(run_dir: Path) -> list[dict[str, Any]]:
    """λ_l over training for every trained constrained method, one panel each: per constrained layer the
    mean over the evaluation seeds (thick) and each seed (thin, same colour). Layers whose λ is 0 in every
    seed and step (e.g. layer 1 with ``constrain_first=False``) are left out."""
    arrays = load(run_dir, LAMBDA)
    methods = [m for m in arrays if SEP not in m]
    if not methods:
        return []
    fig, axes = new_figure(1, len(methods), sharey=True)
    for ax, m in zip(axes[0], methods, strict=True):
        steps, lam = arrays[f"{m}{SEP}steps"], arrays[m]  # [seed, T, L]
        plot_multipliers(ax, steps, lam)
        ax.set_title(f"{m} ({lam.shape[0]} seeds)")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[0][0].set_ylabel("multiplier λ_l")
    fig.tight_layout()
    save_figure(fig, run_dir / "figures" / "lambda-trajectory.png")
    caption = (
        "Multipliers λ_l over training per constrained layer: mean over the evaluation seeds (thick) and "
        "each seed (thin); layers whose λ stayed 0 throughout are not drawn"
    )
    return [{"path": "figures/lambda-trajectory.png", "caption": caption}]


def _paired_gap(results: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """Each method minus ERM per noise kind, ±1 std over (seed, draw) pairs."""
    arrays = load(run_dir, ACCURACY)
    if not arrays:
        return []
    gammas = arrays.pop("gammas")
    gaps = paired_gaps(by_method(arrays))
    if not gaps:
        return []
    kinds = list(dict.fromkeys(kind for _, kind in gaps))
    caption = "Accuracy minus ERM's against γ (paired: same seeds, same noise), mean ± std over (seed, draw)"
    draw = partial(_gap_panel, gammas, gaps, kinds[0])
    suptitle = str(results.get("experiment", ""))
    return panel_figure(
        run_dir, "figures/paired-gap.png", kinds, draw, caption, sharey=True, suptitle=suptitle
    )


def _gap_panel(
    gammas: np.ndarray, gaps: dict[tuple[str, str], np.ndarray], first: str, ax: Any, kind: str
) -> None:
    """Each method minus ERM under ``kind`` against γ, ±1 std over (seed, draw) pairs."""
    for (method, k), diff in gaps.items():
        if k == kind:
            mean, std = column_mean_std(diff, ddof=0, impl="numpy")
            plot_band(ax, gammas, mean, std, label=method, alpha=0.2)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_title(kind)
    ax.set_xlabel("gamma")
    if kind == first:
        ax.set_ylabel("accuracy minus ERM's")


def _ldp(results: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """Accuracy against ε per local-DP kind (top: each method, the clean accuracy dashed; bottom: each
    method minus the matched control, or ERM without one), log ε axis."""
    arrays = load(run_dir, LDP)
    if not arrays:
        return []
    epsilons = arrays.pop("epsilons")
    by_kind: dict[str, dict[str, np.ndarray]] = {}
    for method, per_kind in by_method(arrays).items():
        for kind, v in per_kind.items():
            by_kind.setdefault(kind, {})[method] = np.asarray(v, dtype=np.float64)
    kinds = list(by_kind)
    reference = next((r for r in (CONTROL, ERM) if all(r in v for v in by_kind.values())), None)
    fig, axes = new_figure(2 if reference else 1, len(kinds), sharex=True)
    clean = {m: b.get("metrics", {}).get("accuracy") for m, b in results.get("methods", {}).items()}
    for col, kind in enumerate(kinds):
        ax = axes[0][col]
        for i, (method, values) in enumerate(by_kind[kind].items()):
            stats = np.array([mean_interval(values[:, :, j]) for j in range(len(epsilons))])
            ax.plot(epsilons, stats[:, 0], marker="o", ms=3, color=f"C{i}", label=method)
            ax.fill_between(epsilons, stats[:, 1], stats[:, 2], color=f"C{i}", alpha=0.2)
            if clean.get(method) is not None:
                ax.axhline(clean[method], color=f"C{i}", ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_title(kind)
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
        if reference is None:
            continue
        ax = axes[1][col]
        ref = by_kind[kind][reference]
        for i, (method, values) in enumerate(by_kind[kind].items()):
            if method == reference:
                continue
            stats = np.array([mean_interval(values[:, :, j], ref[:, :, j]) for j in range(len(epsilons))])
            ax.plot(epsilons, stats[:, 0], marker="o", ms=3, color=f"C{i}", label=f"{method} − {reference}")
            ax.fill_between(epsilons, stats[:, 1], stats[:, 2], color=f"C{i}", alpha=0.2)
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_ylabel(f"accuracy minus {reference}'s")
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("epsilon (log scale)")
    axes[0][0].legend(fontsize=8)
    if reference:
        axes[1][0].legend(fontsize=8)
    fig.suptitle(f"{results.get('experiment', '')}: accuracy against ε (seed-level 95 % intervals)")
    fig.tight_layout()
    save_figure(fig, run_dir / "figures" / "ldp-accuracy.png")
    caption = (
        "Accuracy against the local-DP ε (top: seed-level 95 % interval; dashed: clean accuracy); bottom: "
        "minus the reference's, paired over the same seeds and noise"
    )
    return [{"path": "figures/ldp-accuracy.png", "caption": caption}]
