"""The video-denoising claims, each a paired bootstrap CI over (seeds x test sequences) and a verdict, and the
``results.json`` body (methods, tables) of the experiment.

Cells are test sequences n of seed s; ``mse[s, γ, l, n]`` is sequence n's MSE at layer l and level γ, and
``r[s, γ, n] = sqrt(mse[s, γ, L, n])`` its RMSE. With Γ = {γ > 1}, a method M against ERM E of the same
architecture and seed:

1. ``lower-rmse-ood``: mean over Γ of ``r_M - r_E``; claimed < 0.
2. ``graceful``: mean over Γ of ``r_M(γ)/r_M(1) - r_E(γ)/r_E(1)``; claimed < 0.
3. ``in-distribution``: ``r_M(1) - (1 + margin) r_E(1)``; claimed < 0 (no worse than ERM by more than
   ``margin``, relative); the raw difference ``r_M(1) - r_E(1)`` is reported beside it.
4. ``monotone``: the per-layer increase ``Σ_{l=1..L} max(0, mse_l - mse_{l-1})`` at γ = 1; claimed lower
   than ERM's (a monotone profile has 0). Whether each test-mean profile is monotone is reported too.

Verdicts come from :func:`descentlab.report.stats.verdict` (reproduced / refuted / inconclusive with the
minimum detectable effect).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.io import load_arrays
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import column_mean_std, paired_bootstrap, verdict
from descentlab.report.video_denoising import paired_table, rmse_table

NOTES = [
    "RMSE in [0, 1] pixel units over all test pixels; the noisy input's RMSE is gamma * sigma_train.",
    "layer_loss is the test MSE of each layer's estimate (index 0: the initial iterate; DUST's is D·0).",
    "Claim CIs: paired bootstrap over (seeds x test sequences) of per-sequence statistics "
    "(report.stats.paired_bootstrap); baselines are tuned at gamma = 1 on validation and then held "
    "fixed, like the learned models.",
]

CLAIMS = {
    "lower-rmse-ood": "lower RMSE than ERM at gamma > 1 (per-sequence RMSE, mean over gamma > 1)",
    "graceful": "RMSE(gamma)/RMSE(1) grows more slowly than ERM's (mean over gamma > 1)",
    "in-distribution": "RMSE at gamma = 1 no worse than ERM's (by more than the margin)",
    "monotone": "per-layer test MSE rises less than ERM's (sum of increases, gamma = 1)",
}


def layer_increase(mse: np.ndarray) -> np.ndarray:
    """``Σ_l max(0, mse_l - mse_{l-1})`` along the layer axis ``-2`` of ``[..., L+1, N]``."""
    return np.clip(np.diff(mse, axis=-2), 0.0, None).sum(-2)


def claim_cells(
    m: np.ndarray, e: np.ndarray, gammas: Sequence[float], margin: float
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``claim -> (a, b)`` cells ``[seeds, N]`` of method ``m`` and ERM ``e`` (both ``[S, G, L+1, N]``)."""
    one = list(gammas).index(1.0)
    ood = [i for i, g in enumerate(gammas) if g > 1.0]
    rm, re_ = np.sqrt(m[:, :, -1]), np.sqrt(e[:, :, -1])
    return {
        "lower-rmse-ood": (rm[:, ood].mean(1), re_[:, ood].mean(1)),
        "graceful": (
            (rm[:, ood] / rm[:, one : one + 1]).mean(1),
            (re_[:, ood] / re_[:, one : one + 1]).mean(1),
        ),
        "in-distribution": (rm[:, one], (1.0 + margin) * re_[:, one]),
        "monotone": (layer_increase(m[:, one]), layer_increase(e[:, one])),
    }


def evaluate_claims(
    errors: Mapping[str, np.ndarray], gammas: Sequence[float], *, margin: float, n_boot: int
) -> list[dict[str, Any]]:
    """Every claim for every non-ERM method against ERM of its architecture (``errors``: name -> mse)."""
    one = list(gammas).index(1.0)
    rows = []
    for name, m in errors.items():
        arch, label = name.split("-", 1)
        e = errors.get(f"{arch}-erm")
        if e is None or label == "erm":
            continue
        for claim, (a, b) in claim_cells(m, e, gammas, margin).items():
            ci = paired_bootstrap(a, b, n_boot=n_boot)
            v = verdict(ci, "less")
            row = {
                "method": name,
                "claim": claim,
                "description": CLAIMS[claim],
                "estimate": ci.mean,
                "ci": [ci.low, ci.high],
                "shape": list(ci.shape),
                "method_mean": float(a.mean()),
                "erm_mean": float(b.mean()),
                "verdict": v.outcome,
                "reason": v.reason,
                "min_detectable_effect": ci.min_detectable_effect(),
            }
            if claim == "in-distribution":
                raw = paired_bootstrap(a, b / (1.0 + margin), n_boot=n_boot)
                row.update(margin=margin, raw_estimate=raw.mean, raw_ci=[raw.low, raw.high])
                row["erm_mean"] = float((b / (1.0 + margin)).mean())
            if claim == "monotone":
                row["method_profile_monotone"] = bool(np.all(np.diff(m[:, one].mean((0, 2))) <= 0))
                row["erm_profile_monotone"] = bool(np.all(np.diff(e[:, one].mean((0, 2))) <= 0))
            rows.append(row)
    return rows


def claims_table(claims: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    rows = []
    for c in claims:
        est, (lo, hi) = c["estimate"], c["ci"]
        extra = ""
        if c["claim"] == "in-distribution":
            extra = f"; raw {c['raw_estimate']:+.4g} [{c['raw_ci'][0]:+.4g}, {c['raw_ci'][1]:+.4g}]"
        if c["claim"] == "monotone":
            extra = (
                f"; mean profile monotone: {c['method_profile_monotone']} (ERM {c['erm_profile_monotone']})"
            )
        rows.append(
            [
                c["method"],
                c["claim"],
                f"{est:+.4g} [{lo:+.4g}, {hi:+.4g}]{extra}",
                c["verdict"],
                f"{c['min_detectable_effect']:.3g}",
            ]
        )
    return {
        "title": "Claims against ERM of the same architecture: paired 95 % bootstrap CI over (seeds x test "
        "sequences) of method minus ERM (negative = the claimed side)",
        "columns": ["method", "claim", "difference [95 % CI]", "verdict", "min detectable effect"],
        "rows": rows,
    }


def versus_baselines(
    errors: Mapping[str, np.ndarray],
    baseline_errors: Mapping[str, np.ndarray],
    gammas: Sequence[float],
    n_boot: int,
) -> dict[str, Any]:
    """Per γ, the best classical baseline (lowest mean RMSE) and every learned method's paired CI against it."""
    if not baseline_errors:
        return {"best": [], "rows": {}}
    rb = {b: np.sqrt(v) for b, v in baseline_errors.items()}  # [S, G, N]
    best = [
        min(rb, key=lambda b: float(np.sqrt(baseline_errors[b][:, i].mean()))) for i in range(len(gammas))
    ]
    rows = {}
    for name, m in errors.items():
        rm = np.sqrt(m[:, :, -1])
        cis = [paired_bootstrap(rm[:, i], rb[best[i]][:, i], n_boot=n_boot) for i in range(len(gammas))]
        rows[name] = [
            {"estimate": c.mean, "ci": [c.low, c.high], "beats": c.high < 0, "loses": c.low > 0} for c in cis
        ]
    return {"best": best, "rows": rows}


def _versus_table(vs: Mapping[str, Any], gammas: Sequence[float]) -> dict[str, Any]:
    rows = [["best baseline", *vs["best"]]]
    for name, cells in vs["rows"].items():
        tag = {(True, False): "wins", (False, True): "LOSES", (False, False): "tie"}
        rows.append(
            [
                name,
                *[
                    f"{c['estimate']:+.4f} [{c['ci'][0]:+.4f}, {c['ci'][1]:+.4f}] {tag[c['beats'], c['loses']]}"
                    for c in cells
                ],
            ]
        )
    return {
        "title": "Learned model minus the best classical baseline at each gamma: per-sequence RMSE, paired 95 % CI "
        "(negative = the learned model is better; LOSES: the baseline is better)",
        "columns": ["method", *map(str, gammas)],
        "rows": rows,
    }


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
        rows.append([f"{name} ({params})", *[f"{a:.4f} ± {s:.4f}" for a, s in zip(mean, std, strict=True)]])
    return rows


def summarise(
    *,
    per_seed: Mapping[str, list[dict]],
    grids: Mapping[str, Any],
    errors: Mapping[str, np.ndarray],
    baselines: Mapping[str, Any],
    baseline_errors: Mapping[str, np.ndarray],
    gammas: Sequence[float],
    margin: float,
    n_boot: int,
    budget: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The experiment's results body: ``methods``, ``tables``, ``claims``, ``baselines``, ``selection``...

    ``grids``: method -> (its candidates, the chosen index, the first-seed result of every candidate). ``budget``: architecture -> the budget-check job of its ERM (the chosen setting, first seed, retrained for
    ``steps`` instead of ``base_steps``), compared with the same seed's run at the base budget.
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
    table = rmse_table(method_dicts, noisy_mean, gammas)
    table["rows"][1:1] = _baseline_rows(baselines)
    table["title"] = "Test RMSE vs gamma (mean ± std over seeds); classical baselines tuned on validation"
    claims = evaluate_claims(errors, gammas, margin=margin, n_boot=n_boot)
    vs = versus_baselines(errors, baseline_errors, gammas, n_boot)
    selection = {
        m: {
            "chosen": g["candidates"][g["chosen"]],
            **{c: v for c, v in zip(g["candidates"], g["val_rmse"], strict=True)},
        }
        for m, g in grids.items()
    }
    sel_table = {
        "title": "Selection on validation (seed 0, RMSE at gamma = 1 after training): every candidate",
        "columns": ["method", "chosen", "candidates: val RMSE"],
        "rows": [
            [m, s["chosen"], "; ".join(f"{c or 'base'}: {_val(v)}" for c, v in s.items() if c != "chosen")]
            for m, s in selection.items()
        ],
    }
    for b in baselines.values():
        b["rmse_mean"] = column_mean_std(b["rmse"], ddof=1, impl="torch")[0]
    return {
        "methods": methods,
        "tables": [
            table,
            paired_table({m: [ev["rmse"] for ev in evs] for m, evs in per_seed.items()}, gammas),
            claims_table(claims),
            _versus_table(vs, gammas),
            sel_table,
            convergence_table(method_dicts),
            *([budget_table(checks)] if (checks := budget_checks(budget or {}, per_seed, gammas)) else []),
        ],
        "claims": claims,
        "baselines": dict(baselines),
        "selection": selection,
        "versus_baselines": vs,
        "budget_check": checks,
    }


def _val(rmse: float | None) -> str:  # NaN: a candidate that diverged or whose constraint proved infeasible
    return "failed" if rmse is None or math.isnan(rmse) else f"{rmse:.4f}"


def budget_checks(
    budget: Mapping[str, Mapping[str, Any]],
    per_seed: Mapping[str, Sequence[Mapping[str, Any]]],
    gammas: Sequence[float],
) -> dict[str, dict[str, Any]]:
    """Per architecture: ERM's validation and test RMSE (γ = 1) at the base budget and at the longer one, and
    the relative gain ``(base - long) / base`` of the longer budget (positive: longer training still helps)."""
    out = {}
    for arch, job in budget.items():
        base = per_seed[f"{arch}-erm"][0]
        one = list(gammas).index(1.0)
        out[arch] = {
            "base_steps": job["base_steps"],
            "steps": job["steps"],
            "base_val_rmse": base["val_rmse"],
            "val_rmse": job["val_rmse"],
            "val_gain": (base["val_rmse"] - job["val_rmse"]) / base["val_rmse"],
            "val_curve": job["val_curve"],
            "base_test_rmse": base["rmse"][one],
            "test_rmse": job["rmse"][one],
        }
    return out


def budget_table(checks: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    return {
        "title": "Budget check: ERM (chosen setting, first seed) retrained with a longer cosine schedule",
        "columns": ["architecture", "steps", "val RMSE", "longer: steps", "longer: val RMSE", "gain"],
        "rows": [
            [a.upper(), c["base_steps"], f"{c['base_val_rmse']:.4f}", c["steps"], f"{c['val_rmse']:.4f}",
             f"{100 * c['val_gain']:.2f} %"]
            for a, c in checks.items()
        ],
    }  # fmt: skip


def convergence_table(methods: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Validation RMSE at 50 %, 75 % and 100 % of training (mean over seeds) and the last quarter's gain."""
    rows = []
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
        rows.append([name, *[f"{v:.4f}" for v in vals], f"{100 * gain:.2f} %"])
    return {
        "title": "Validation RMSE (gamma = 1) during training, mean over seeds: has it stopped improving?",
        "columns": ["method", "at 50 %", "at 75 %", "at 100 %", "gain over the last quarter"],
        "rows": rows,
    }


def load_job_arrays(
    jobs_dir: Path,
    keys: Mapping[str, Sequence[str]],
    baselines: Sequence[str],
    baseline_key: str = "baselines",
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """The arrays the jobs saved under ``jobs_dir``: per method (its job keys, one per seed), ``errors`` stacks
    ``<key>-errors.npz``'s ``example_mse`` over seeds; per baseline, ``<baseline_key>-<name>.npz``'s
    ``example_mse``; ``denoised`` stacks the first key's ``<key>-frames.npz`` of every method, then every
    baseline's frames, in that order."""
    runs = {
        name: [load_arrays(jobs_dir / f"{k}-errors.npz")["example_mse"] for k in ks]
        for name, ks in keys.items()
    }
    base = {b: load_arrays(jobs_dir / f"{baseline_key}-{b}.npz") for b in baselines}
    frames = [load_arrays(jobs_dir / f"{ks[0]}-frames.npz")["denoised"] for ks in keys.values()]
    denoised = np.stack(frames + [base[b]["denoised"] for b in baselines])
    return {k: np.stack(v) for k, v in runs.items()}, {b: base[b]["example_mse"] for b in baselines}, denoised
