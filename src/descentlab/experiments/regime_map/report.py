"""regime-map's tables and figure, drawn from the saved cell store only.

The prediction at the paper's size is the least-squares line of each seed's HORST − AdamW difference on
log10 parameters, evaluated at ``paper_params`` (claims.prediction_weights). Its interval for the mean over
seeds is the engine's seed-level interval of that contrast; the interval for one new run adds the seed
spread, ``ŷ ± t_{S−1} · sd_s(ŷ_s) · √(1 + 1/S)``. It extrapolates beyond the largest size measured and
assumes the trend is linear in log parameters: a prediction for the paper preset to test, not a verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

from descentlab.experiments.regime_map.claims import (
    contrast,
    depth_x,
    horst_pair,
    horst_x,
    levels,
    prediction_weights,
    trend_weights,
)
from descentlab.experiments.regime_map.config import condition
from descentlab.report.claims import Cells
from descentlab.report.figures import new_figure, save_figure
from descentlab.report.stats import PairedInterval, paired_interval
from descentlab.study.cells import CellStore
from descentlab.study.figures import figure_record
from descentlab.study.tables import Table, ci, signed_ci

FIGURE = "figures/regime-map.png"


def interval(cells: Cells) -> PairedInterval:
    return paired_interval(cells.a, cells.b)


def cell_intervals(store: CellStore) -> list[list[PairedInterval]]:
    """HORST − AdamW's seed-level interval per width (rows, smallest first) and sparsity (columns): what
    the per-cell table, the heat map and the trend panel all show."""
    sizes, _ = horst_x(store)
    return [[interval(horst_pair(store, size, p)) for p in levels(store)] for size in sizes]


def depth_intervals(store: CellStore, metric: str) -> list[PairedInterval]:
    """Constrained − ERM's seed-level interval on ``metric`` (noisy, clean) at every depth."""
    depths, _ = depth_x(store)
    return [
        interval(store.compare(metric, "constrained", "erm", condition("constrained", d))) for d in depths
    ]


def _ci(iv: PairedInterval, digits: int) -> str:
    return signed_ci(iv.mean, iv.low, iv.high, digits)


def prediction(store: CellStore, p: float) -> tuple[PairedInterval, float]:
    """The fitted HORST − AdamW at the paper's size and sparsity ``p``: its 95 % interval for the mean over
    seeds, and the half-width of the 95 % prediction interval for one run about the same mean."""
    _, x = horst_x(store)
    fitted = contrast(store, prediction_weights(x, np.log10(store.design.extra["paper_params"])), p)
    per_seed = (fitted.a - fitted.b).mean(axis=-1)
    s = len(per_seed)
    return interval(fitted), sps.t.ppf(0.975, s - 1) * per_seed.std(ddof=1) * np.sqrt(1 + 1 / s)


def tables(store: CellStore) -> list[Table]:
    """The per-cell HORST − AdamW intervals, the trend and prediction per sparsity, and the depth sweep."""
    out: list[Table] = []
    extra = store.design.extra
    if "adamw" in store.design.arms:
        sizes, x = horst_x(store)
        cells = Table(
            "HORST − AdamW test log-ppl after one-shot pruning: mean [95 % seed-level interval] over seeds × "
            "test blocks (negative: HORST better)",
            ["width", "parameters", *(f"{100 * p:g} %" for p in levels(store))],
        )
        for size, row in zip(sizes, cell_intervals(store), strict=True):
            cells.add(size, f"{extra['params'][size]:,}", *(_ci(iv, 3) for iv in row))
        paper = f"{extra['paper_params'] / 1e6:.0f} M"
        trend = Table(
            f"The trend in log10 parameters and the prediction at the paper's size ({paper} parameters, an "
            "extrapolation, not a verdict)",
            [
                "sparsity",
                "slope per decade [95 %]",
                f"fitted at {paper} [95 %, mean]",
                "95 % prediction, one run",
            ],
            note=f"The prediction extrapolates {np.log10(extra['paper_params']) - x.max():.1f} decades beyond the "
            "largest width measured.",
        )
        for p in levels(store):
            fitted, half = prediction(store, p)
            slope = interval(contrast(store, trend_weights(x), p))
            trend.add(
                f"{100 * p:g} %",
                _ci(slope, 3),
                _ci(fitted, 3),
                ci(fitted.mean - half, fitted.mean + half, 3, signed=True),
            )
        out += [cells, trend]
    if "erm" in store.design.arms:
        depths, _ = depth_x(store)
        depth = Table(
            "Constrained − ERM test accuracy under Gaussian embedding noise (mean over γ >= 1) and clean, per "
            "encoder depth: mean [95 % seed-level interval]",
            ["layers", "noisy: constrained − ERM", "clean: constrained − ERM", "ERM noisy accuracy"],
        )
        noisy, clean = depth_intervals(store, "noisy"), depth_intervals(store, "clean")
        for d, n, c in zip(depths, noisy, clean, strict=True):
            erm = float(np.mean(store.get("noisy", "erm", condition("constrained", d))))
            depth.add(d, _ci(n, 4), _ci(c, 4), f"{erm:.4f}")
        out.append(depth)
    return out


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """The heat map of per-cell intervals, the trend with its prediction, and the depth sweep."""
    store = CellStore.load(run_dir)
    panels: list[Callable[[Any], None]] = []
    if store is not None and "adamw" in store.design.arms:
        sizes, x = horst_x(store)
        ivs = cell_intervals(store)
        panels += [
            partial(_heat_map, store=store, sizes=sizes, ivs=ivs),
            partial(_trend, store=store, x=x, ivs=ivs),
        ]
    if store is not None and "erm" in store.design.arms:
        panels.append(partial(_depths, store=store))
    if not panels:
        return []
    fig, axes = new_figure(1, len(panels), panel_size=(4.6, 3.6))
    for ax, draw in zip(axes[0], panels, strict=True):
        draw(ax)
    fig.tight_layout()
    save_figure(fig, Path(run_dir) / FIGURE)
    caption = (
        "Left: HORST − AdamW test log-ppl after one-shot pruning per width and sparsity, with its 95 % seed-level "
        "interval (negative: HORST better). Middle: the same difference against log10 parameters with the "
        "least-squares trend per sparsity, extrapolated to the paper's size (a prediction: mean and one-run "
        "95 % intervals). Right: constrained − ERM accuracy under Gaussian embedding noise against encoder depth."
    )
    return [figure_record(FIGURE, caption)]


def _errorbars(ivs: list[PairedInterval]) -> tuple[np.ndarray, np.ndarray]:
    """Means and the ``[below, above]`` error bars of ``ivs``."""
    mean = np.array([iv.mean for iv in ivs])
    return mean, np.array([[iv.mean - iv.low for iv in ivs], [iv.high - iv.mean for iv in ivs]])


def _heat_map(ax: Any, store: CellStore, sizes: list[str], ivs: list[list[PairedInterval]]) -> None:
    means = np.array([[iv.mean for iv in row] for row in ivs])
    bound = float(np.abs(means).max()) or 1.0
    ax.imshow(means, cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto")
    for i, row in enumerate(ivs):
        for j, iv in enumerate(row):
            ax.text(
                j, i, f"{iv.mean:+.2f}\n[{iv.low:+.2f}, {iv.high:+.2f}]", ha="center", va="center", fontsize=7
            )
    ax.set_xticks(range(len(levels(store))), [f"{100 * p:g} %" for p in levels(store)])
    ax.set_yticks(range(len(sizes)), [f"{s}\n{store.design.extra['params'][s] / 1e6:.2f} M" for s in sizes])
    ax.set_xlabel("sparsity")
    ax.set_title("HORST − AdamW log-ppl")


def _trend(ax: Any, store: CellStore, x: np.ndarray, ivs: list[list[PairedInterval]]) -> None:
    x0 = float(np.log10(store.design.extra["paper_params"]))
    grid = np.linspace(x.min(), x0, 50)
    for j, p in enumerate(levels(store)):
        mean, err = _errorbars([row[j] for row in ivs])
        bar = ax.errorbar(x, mean, yerr=err, marker="o", capsize=3, linestyle="none", label=f"{100 * p:g} %")
        slope = float(trend_weights(x) @ mean)
        ax.plot(
            grid, mean.mean() + slope * (grid - x.mean()), color=bar[0].get_color(), alpha=0.6, linewidth=1
        )
        fitted, half = prediction(store, p)
        ax.errorbar(
            [x0], [fitted.mean], yerr=half, color=bar[0].get_color(), marker="D", capsize=4, alpha=0.5
        )
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("log10 parameters (diamonds: prediction at the paper's size)")
    ax.set_ylabel("HORST − AdamW test log-ppl")
    ax.legend(title="sparsity", fontsize=7)


def _depths(ax: Any, store: CellStore) -> None:
    depths, _ = depth_x(store)
    mean, err = _errorbars(depth_intervals(store, "noisy"))
    ax.errorbar(depths, mean, yerr=err, marker="o", capsize=3)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xticks(depths)
    ax.set_xlabel("encoder layers (MiniLM, first k)")
    ax.set_ylabel("constrained − ERM accuracy, γ >= 1")


def _curve(x_name: str, x: list, metric: str, cells: list[np.ndarray]) -> dict[str, Any]:
    """A results.json curve: the mean and sd over seeds of each cell's per-seed mean, at every x."""
    per_seed = np.stack([c.mean(axis=-1) for c in cells])
    return {"x_name": x_name, "x": x, "metric": metric,
            "mean": per_seed.mean(axis=1).tolist(), "std": per_seed.std(axis=1, ddof=1).tolist()}  # fmt: skip


def method_curves(store: CellStore) -> dict[str, dict[str, Any]]:
    """Each arm's ``results.json`` block: per HORST width, test log-ppl against sparsity (0 = dense); per
    encoder, noisy and clean accuracy against depth; mean and sd over seeds of the per-seed means."""
    out: dict[str, dict[str, Any]] = {arm: {"metrics": {}, "curves": {}} for arm in store.design.arms}
    extra, dense = store.design.extra, [0.0, *levels(store)]
    for arm in (a for a in ("adamw", "horst") if a in out):
        for size in extra["sizes"]:
            nll = [store.get("nll", arm, condition("horst", size, p)) for p in dense]
            out[arm]["curves"][f"test_nll_{size}"] = _curve("sparsity", dense, "test log-ppl", nll)
    for arm in (a for a in ("erm", "constrained") if a in out):
        depths = list(extra["depths"])
        for metric in ("noisy", "clean"):
            accuracy = [store.get(metric, arm, condition("constrained", d)) for d in depths]
            out[arm]["curves"][f"{metric}_accuracy"] = _curve(
                "layers", depths, f"{metric} test accuracy", accuracy
            )
    return out
