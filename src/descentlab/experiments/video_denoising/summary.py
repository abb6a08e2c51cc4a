"""The ``results.json`` body of the video-denoising study: every method's block and the report's tables.

Method names are ``<architecture>-<label>`` (``ut-erm``, ``dust-constrained``...). Tables: test RMSE
against γ (mean ± std over seeds) with the classical baselines and the noisy input; the paired difference
to ERM of the same architecture and seed; each method against the best classical baseline per γ; every
validation candidate; convergence of the validation curves. The claims are judged separately
(:mod:`.claims`), from the arrays the run saves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.io import load_arrays
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import column_mean_std
from descentlab.study.tables import Table, pm

NOTES = [
    "RMSE in [0, 1] pixel units over all test pixels; the noisy input's RMSE is gamma * sigma_train.",
    "layer_loss is the test MSE of each layer's estimate (index 0: the initial iterate; DUST's is D·0).",
    "Baselines are tuned at gamma = 1 on validation and then held fixed, like the learned models.",
]

Methods = Mapping[str, Mapping[str, Any]]


def arch_of(method: str) -> str:
    """``ut`` of ``ut-erm``."""
    return method.split("-", 1)[0]


def label_of(method: str) -> str:
    """``erm`` of ``ut-erm``."""
    return method.split("-", 1)[1]


def rmse_table(
    methods: Methods,
    noisy_rmse: Sequence[float],
    gammas: Sequence[float],
    baselines: Mapping[str, Mapping[str, Any]],
) -> Table:
    """Test RMSE against γ, mean ± std over seeds: the noisy input, the classical baselines, every method."""
    table = Table(
        "Test RMSE vs gamma (mean ± std over seeds); classical baselines tuned on validation",
        ["method", *map(str, gammas)],
    )
    table.add("noisy input", *[f"{v:.4f}" for v in noisy_rmse])
    for row in _baseline_rows(baselines):
        table.add(*row)
    for method, block in methods.items():
        c = block["curves"]["gaussian"]
        table.add(method, *[pm(a, s) for a, s in zip(c["mean"], c["std"], strict=True)])
    return table


def _differences(evs: Sequence[Sequence[float]], base: Sequence[Sequence[float]], n: int) -> list[str]:
    """``evs − base`` per seed: mean ± std over seeds and, in brackets, the seeds where it is below 0."""
    diffs = [[a - b for a, b in zip(e, r, strict=True)] for e, r in zip(evs, base, strict=True)]
    mean, std = column_mean_std(diffs, ddof=1, impl="torch")
    wins = [sum(d[i] < 0 for d in diffs) for i in range(n)]
    return [f"{pm(m, s, signed=True)} ({w}/{len(diffs)})" for m, s, w in zip(mean, std, wins, strict=True)]


def paired_table(per_seed_rmse: Mapping[str, Sequence[Sequence[float]]], gammas: Sequence[float]) -> Table:
    """RMSE(method) - RMSE(ERM) of the same architecture and seed, mean ± std over seeds, and the wins.

    Args:
        per_seed_rmse: method -> ``[seeds][gammas]`` RMSE, every method over the same seeds in the same order.
        gammas: the noise levels of the columns.
    """
    table = Table(
        "Paired RMSE difference to ERM of the same architecture and seed (negative = lower RMSE; "
        "in brackets: seeds where it beats ERM)",
        ["method", *map(str, gammas)],
    )
    for method, evs in per_seed_rmse.items():
        base = per_seed_rmse.get(f"{arch_of(method)}-erm")
        if base is not None and label_of(method) != "erm":
            table.add(method, *_differences(evs, base, len(gammas)))
    return table


def versus_baselines(
    per_seed_rmse: Mapping[str, Sequence[Sequence[float]]],
    baselines: Mapping[str, Mapping[str, Any]],
    gammas: Sequence[float],
) -> dict[str, Any]:
    """Per γ, the best classical baseline (lowest mean RMSE over seeds) and every learned method's RMSE minus
    it, per seed (each seed's noise draw is the baseline's too)."""
    if not baselines:
        return {"best": [], "rows": {}}
    mean = {b: np.mean(v["rmse"], axis=0) for b, v in baselines.items()}
    best = [min(mean, key=lambda b, i=i: float(mean[b][i])) for i in range(len(gammas))]
    seeds = len(next(iter(per_seed_rmse.values())))
    best_rmse = [[baselines[b]["rmse"][s][i] for i, b in enumerate(best)] for s in range(seeds)]
    rows = {m: _differences(evs, best_rmse, len(gammas)) for m, evs in per_seed_rmse.items()}
    return {"best": best, "rows": rows}


def _versus_table(vs: Mapping[str, Any], gammas: Sequence[float]) -> Table:
    return Table(
        "Learned model minus the best classical baseline at each gamma: pooled RMSE, mean ± std over "
        "seeds (negative = the learned model is better; in brackets: seeds where it is)",
        ["method", *map(str, gammas)],
        [["best baseline", *vs["best"]], *[[m, *cells] for m, cells in vs["rows"].items()]],
    )


def selection_table(selection: Mapping[str, Mapping[str, Any]], tune_seed: int) -> Table:
    """Every validation candidate of every tuned method, and the chosen one."""
    return Table(
        f"Selection on validation (tuning seed {tune_seed}, never an evaluation seed; RMSE at gamma = 1 "
        "after training): every candidate",
        ["method", "chosen", "candidates: val RMSE"],
        [
            [m, s["chosen"], "; ".join(f"{c or 'base'}: {_val(v)}" for c, v in s.items() if c != "chosen")]
            for m, s in selection.items()
        ],
    )


def _method_result(evs: list[dict], gammas: Sequence[float], grid: Mapping[str, Any] | None) -> MethodResult:
    """Mean ± std over seeds of one method's RMSE curve; per-layer MSE at γ = 1 and the largest γ."""
    mean, std = column_mean_std([ev["rmse"] for ev in evs], ddof=1, impl="torch")
    one = list(gammas).index(1.0)
    ood = [i for i, g in enumerate(gammas) if g > 1.0]
    layer = {
        f"gamma={gamma:g}": column_mean_std([ev["layer_mse"][i] for ev in evs], ddof=1, impl="torch")[0]
        for i, gamma in enumerate(gammas)
        if gamma in (1.0, max(gammas))
    }
    curve = Curve("gamma", list(gammas), "rmse", mean, std, extra={"summary": sum(mean) / len(mean)})
    extra: dict[str, Any] = {
        "spec": evs[0]["spec"],
        "val_curves": [ev["val_curve"] for ev in evs],
        "per_seed_rmse": [ev["rmse"] for ev in evs],
    }
    if "lambda" in evs[0]:
        extra["lambda"] = [ev["lambda"] for ev in evs]
    if all("lambda_trace" in ev for ev in evs):
        extra["lambda_trace"] = [ev["lambda_trace"] for ev in evs]
    if grid is not None:
        extra["grid"] = dict(grid)
    return MethodResult(
        metrics={
            "rmse_in_distribution": mean[one],
            "rmse_mean_gamma_gt_1": sum(mean[i] for i in ood) / max(len(ood), 1),
            "val_rmse": sum(ev["val_rmse"] for ev in evs) / len(evs),
            "train_seconds": sum(ev["train_seconds"] for ev in evs) / len(evs),
        },
        curves={"gaussian": curve},
        layer_loss=layer,
        extra=extra,
    )


def _baseline_rows(baselines: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for name, b in baselines.items():
        mean, std = column_mean_std(b["rmse"], ddof=1, impl="torch")
        params = ", ".join(f"{k}={v:g}" for k, v in b["params"].items())
        rows.append([f"{name} ({params})", *[pm(a, s) for a, s in zip(mean, std, strict=True)]])
    return rows


def _val(rmse: float | None) -> str:  # NaN: a candidate that diverged or whose constraint proved infeasible
    return "failed" if rmse is None or math.isnan(rmse) else f"{rmse:.4f}"


def summarise(
    *,
    per_seed: Mapping[str, list[dict]],
    grids: Mapping[str, Any],
    baselines: Mapping[str, Any],
    gammas: Sequence[float],
    tune_seed: int,
) -> dict[str, Any]:
    """The study's results body: ``methods``, ``tables``, ``baselines``, ``selection``, ``versus_baselines``.

    ``grids``: tuned method -> (its candidates, the chosen index, the ``tune_seed`` result of every
    candidate); a method that had one candidate has no entry.
    """
    grids = {
        m: {
            "candidates": list(c),
            "chosen": i,
            "val_rmse": [r["val_rmse"] for r in runs],
            "failed": {c[k]: r["failed"] for k, r in enumerate(runs) if "failed" in r},
        }
        for m, (c, i, runs) in grids.items()
    }
    methods = {m: _method_result(evs, gammas, grids.get(m)) for m, evs in per_seed.items()}
    method_dicts = {m: r.to_dict() for m, r in methods.items()}
    noisy_mean, _ = column_mean_std([ev["noisy_rmse"] for ev in next(iter(per_seed.values()))])
    per_seed_rmse = {m: [ev["rmse"] for ev in evs] for m, evs in per_seed.items()}
    vs = versus_baselines(per_seed_rmse, baselines, gammas)
    selection = {
        m: {
            "chosen": g["candidates"][g["chosen"]],
            **{c: v for c, v in zip(g["candidates"], g["val_rmse"], strict=True)},
        }
        for m, g in grids.items()
    }
    for b in baselines.values():
        b["rmse_mean"] = column_mean_std(b["rmse"], ddof=1, impl="torch")[0]
    return {
        "methods": methods,
        "tables": [
            t.to_dict()
            for t in (
                rmse_table(method_dicts, noisy_mean, gammas, baselines),
                paired_table(per_seed_rmse, gammas),
                *([_versus_table(vs, gammas)] if vs["best"] else []),
                *([selection_table(selection, tune_seed)] if selection else []),
                convergence_table(method_dicts),
            )
        ],
        "baselines": dict(baselines),
        "selection": selection,
        "versus_baselines": vs,
    }


def convergence_table(methods: Methods) -> Table:
    """Validation RMSE at 50 %, 75 % and 100 % of training (mean over seeds) and the last quarter's gain."""
    table = Table(
        "Validation RMSE (gamma = 1) during training, mean over seeds: has it stopped improving?",
        ["method", "at 50 %", "at 75 %", "at 100 %", "gain over the last quarter"],
    )
    for name, block in methods.items():
        curves = block.get("val_curves") or []
        if not curves:
            continue
        steps = curves[0]["step"]
        at = [
            min(range(len(steps)), key=lambda i, f=f: abs(steps[i] - f * steps[-1])) for f in (0.5, 0.75, 1.0)
        ]
        vals = [sum(c["rmse"][i] for c in curves) / len(curves) for i in at]
        gain = (vals[1] - vals[2]) / vals[1] if vals[1] > 0 and not math.isnan(vals[1]) else float("nan")
        table.add(name, *[f"{v:.4f}" for v in vals], f"{100 * gain:.2f} %")
    return table


def load_job_arrays(
    jobs_dir: Path,
    keys: Mapping[str, Sequence[str]],
    baselines: Sequence[str],
    baseline_key: str = "baselines",
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """The arrays the jobs saved under ``jobs_dir``: per method (its job keys, one per seed), ``errors`` stacks
    ``<key>-errors.npz``'s ``example_mse`` over seeds (``[S, G, L+1, N]``); per baseline,
    ``<baseline_key>-<name>.npz``'s ``example_mse`` (``[S, G, N]``); ``denoised`` stacks the first key's
    ``<key>-frames.npz`` of every method, then every baseline's frames, in that order."""
    runs = {
        name: [load_arrays(jobs_dir / f"{k}-errors.npz")["example_mse"] for k in ks]
        for name, ks in keys.items()
    }
    base = {b: load_arrays(jobs_dir / f"{baseline_key}-{b}.npz") for b in baselines}
    frames = [load_arrays(jobs_dir / f"{ks[0]}-frames.npz")["denoised"] for ks in keys.values()]
    denoised = np.stack(frames + [base[b]["denoised"] for b in baselines])
    return {k: np.stack(v) for k, v in runs.items()}, {b: base[b]["example_mse"] for b in baselines}, denoised
