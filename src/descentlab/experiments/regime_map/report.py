"""regime-map's tables and figure, drawn from the saved cell store only.

The prediction at the paper's size is the least-squares line of each seed's HORST − AdamW difference on
log10 parameters, evaluated at ``paper_params`` (claims.prediction_weights). Its interval for the mean over
seeds is the engine's seed-level interval of that contrast; the interval for one new run adds the seed
spread, ``ŷ ± t_{S−1} · sd_s(ŷ_s) · √(1 + 1/S)``. It extrapolates beyond the largest size measured and
assumes the trend is linear in log parameters: a prediction for the paper preset to test, not a verdict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

from descentlab.experiments.regime_map.claims import (
    contrast,
    depth_x,
    horst_gap,
    horst_x,
    prediction_weights,
    trend_weights,
)
from descentlab.experiments.regime_map.config import condition
from descentlab.report.claims import NotInRun
from descentlab.report.figures import new_figure, save_figure
from descentlab.report.stats import paired_interval
from descentlab.study.cells import CellStore
from descentlab.study.figures import figure_record
from descentlab.study.tables import Table, signed_ci

FIGURE = "figures/regime-map.png"


def prediction(store: CellStore, p: float) -> dict[str, float]:
    """The fitted HORST − AdamW at the paper's size and sparsity ``p``: ``mean``, the mean's 95 % interval
    (``low``, ``high``) and a 95 % prediction interval for one run (``pred_low``, ``pred_high``)."""
    _, x = horst_x(store)
    x0 = float(np.log10(store.design.extra["paper_params"]))
    a, b = contrast(store, prediction_weights(x, x0), p)
    iv = paired_interval(a, b)
    per_seed = (a - b).mean(axis=-1)
    s = len(per_seed)
    half = sps.t.ppf(0.975, s - 1) * per_seed.std(ddof=1) * np.sqrt(1 + 1 / s)
    return {"mean": iv.mean, "low": iv.low, "high": iv.high, "pred_low": iv.mean - half, "pred_high": iv.mean + half,
            "x0": x0, "beyond": x0 - float(x.max())}  # fmt: skip


def tables(store: CellStore) -> list[Table]:
    """The per-cell HORST − AdamW intervals, the trend and prediction per sparsity, and the depth sweep."""
    out: list[Table] = []
    extra = store.design.extra
    if "adamw" in store.design.arms:
        sizes, x = horst_x(store)
        levels = [float(p) for p in extra["sparsities"]]
        cells = Table(
            "HORST − AdamW test log-ppl after one-shot pruning: mean [95 % seed-level interval] over seeds × "
            "test blocks (negative: HORST better)",
            ["width", "parameters", *(f"{100 * p:g} %" for p in levels)],
        )
        for size in sizes:
            ivs = [paired_interval(*horst_gap(store, size, p)) for p in levels]
            cells.add(
                size, f"{extra['params'][size]:,}", *(signed_ci(iv.mean, iv.low, iv.high, 3) for iv in ivs)
            )
        out.append(cells)
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
        )
        for p in levels:
            slope = paired_interval(*contrast(store, trend_weights(x), p))
            pred = prediction(store, p)
            trend.add(
                f"{100 * p:g} %",
                signed_ci(slope.mean, slope.low, slope.high, 3),
                signed_ci(pred["mean"], pred["low"], pred["high"], 3),
                f"[{pred['pred_low']:+.3f}, {pred['pred_high']:+.3f}]",
            )
        trend.note = (
            f"The prediction extrapolates {pred['beyond']:.1f} decades beyond the largest width measured."
        )
        out.append(trend)
    if "erm" in store.design.arms:
        depths, _ = depth_x(store)
        depth = Table(
            "Constrained − ERM test accuracy under Gaussian embedding noise (mean over γ >= 1) and clean, per "
            "encoder depth: mean [95 % seed-level interval]",
            ["layers", "noisy: constrained − ERM", "clean: constrained − ERM", "ERM noisy accuracy"],
        )
        for d in depths:
            at = condition("constrained", d)
            noisy = paired_interval(store.get("noisy", "constrained", at), store.get("noisy", "erm", at))
            clean = paired_interval(store.get("clean", "constrained", at), store.get("clean", "erm", at))
            depth.add(d, signed_ci(noisy.mean, noisy.low, noisy.high, 4), signed_ci(clean.mean, clean.low, clean.high, 4),
                      f"{float(np.mean(store.get('noisy', 'erm', at))):.4f}")  # fmt: skip
        out.append(depth)
    return out


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """The heat map of per-cell intervals, the trend with its prediction, and the depth sweep."""
    store = CellStore.load(run_dir)
    if store is None:
        return []
    try:
        sizes, x = horst_x(store)
    except NotInRun:
        sizes = []
    has_depth = "erm" in store.design.arms
    panels = (2 if sizes else 0) + (1 if has_depth else 0)
    if not panels:
        return []
    fig, axes = new_figure(1, panels, panel_size=(4.6, 3.6))
    axes = list(axes[0])
    if sizes:
        _heat_map(axes.pop(0), store, sizes)
        _trend(axes.pop(0), store, sizes, x)
    if has_depth:
        _depths(axes.pop(0), store)
    fig.tight_layout()
    save_figure(fig, Path(run_dir) / FIGURE)
    caption = (
        "Left: HORST − AdamW test log-ppl after one-shot pruning per width and sparsity, with its 95 % seed-level "
        "interval (negative: HORST better). Middle: the same difference against log10 parameters with the "
        "least-squares trend per sparsity, extrapolated to the paper's size (a prediction: mean and one-run "
        "95 % intervals). Right: constrained − ERM accuracy under Gaussian embedding noise against encoder depth."
    )
    return [figure_record(FIGURE, caption)]


def _heat_map(ax: Any, store: CellStore, sizes: list[str]) -> None:
    levels = [float(p) for p in store.design.extra["sparsities"]]
    ivs = [[paired_interval(*horst_gap(store, s, p)) for p in levels] for s in sizes]
    means = np.array([[iv.mean for iv in row] for row in ivs])
    bound = float(np.abs(means).max()) or 1.0
    ax.imshow(means, cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto")
    for i, row in enumerate(ivs):
        for j, iv in enumerate(row):
            ax.text(
                j, i, f"{iv.mean:+.2f}\n[{iv.low:+.2f}, {iv.high:+.2f}]", ha="center", va="center", fontsize=7
            )
    ax.set_xticks(range(len(levels)), [f"{100 * p:g} %" for p in levels])
    ax.set_yticks(range(len(sizes)), [f"{s}\n{store.design.extra['params'][s] / 1e6:.2f} M" for s in sizes])
    ax.set_xlabel("sparsity")
    ax.set_title("HORST − AdamW log-ppl")


def _trend(ax: Any, store: CellStore, sizes: list[str], x: np.ndarray) -> None:
    x0 = float(np.log10(store.design.extra["paper_params"]))
    grid = np.linspace(x.min(), x0, 50)
    for p in [float(v) for v in store.design.extra["sparsities"]]:
        ivs = [paired_interval(*horst_gap(store, s, p)) for s in sizes]
        mean = np.array([iv.mean for iv in ivs])
        err = np.array([[iv.mean - iv.low for iv in ivs], [iv.high - iv.mean for iv in ivs]])
        bar = ax.errorbar(x, mean, yerr=err, marker="o", capsize=3, linestyle="none", label=f"{100 * p:g} %")
        slope = float(trend_weights(x) @ mean)
        ax.plot(
            grid, mean.mean() + slope * (grid - x.mean()), color=bar[0].get_color(), alpha=0.6, linewidth=1
        )
        pred = prediction(store, p)
        ax.errorbar([x0], [pred["mean"]], yerr=[[pred["mean"] - pred["pred_low"]], [pred["pred_high"] - pred["mean"]]],
                    color=bar[0].get_color(), marker="D", capsize=4, alpha=0.5)  # fmt: skip
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("log10 parameters (diamonds: prediction at the paper's size)")
    ax.set_ylabel("HORST − AdamW test log-ppl")
    ax.legend(title="sparsity", fontsize=7)


def _depths(ax: Any, store: CellStore) -> None:
    depths, _ = depth_x(store)
    ivs = [
        paired_interval(store.get("noisy", "constrained", condition("constrained", d)),
                        store.get("noisy", "erm", condition("constrained", d)))
        for d in depths
    ]  # fmt: skip
    mean = np.array([iv.mean for iv in ivs])
    err = np.array([[iv.mean - iv.low for iv in ivs], [iv.high - iv.mean for iv in ivs]])
    ax.errorbar(depths, mean, yerr=err, marker="o", capsize=3)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xticks(depths)
    ax.set_xlabel("encoder layers (MiniLM, first k)")
    ax.set_ylabel("constrained − ERM accuracy, γ >= 1")


def method_curves(store: CellStore) -> dict[str, dict[str, Any]]:
    """Each arm's ``results.json`` block: per HORST width, test log-ppl against sparsity (0 = dense); per
    encoder, noisy and clean accuracy against depth; mean and sd over seeds of the per-seed means."""
    out: dict[str, dict[str, Any]] = {arm: {"metrics": {}, "curves": {}} for arm in store.design.arms}
    extra = store.design.extra
    for arm in ("adamw", "horst"):
        if arm not in out:
            continue
        levels = [0.0, *(float(p) for p in extra["sparsities"])]
        for size in extra["sizes"]:
            per_seed = np.stack(
                [store.get("nll", arm, condition("horst", size, p)).mean(axis=-1) for p in levels]
            )
            out[arm]["curves"][f"test_nll_{size}"] = {
                "x_name": "sparsity", "x": levels, "metric": "test log-ppl",
                "mean": per_seed.mean(axis=1).tolist(), "std": per_seed.std(axis=1, ddof=1).tolist(),
            }  # fmt: skip
    for arm in ("erm", "constrained"):
        if arm not in out:
            continue
        depths = list(extra["depths"])
        for metric in ("noisy", "clean"):
            per_seed = np.stack(
                [store.get(metric, arm, condition("constrained", d)).mean(axis=-1) for d in depths]
            )
            out[arm]["curves"][f"{metric}_accuracy"] = {
                "x_name": "layers", "x": depths, "metric": f"{metric} test accuracy",
                "mean": per_seed.mean(axis=1).tolist(), "std": per_seed.std(axis=1, ddof=1).tolist(),
            }  # fmt: skip
    return out
