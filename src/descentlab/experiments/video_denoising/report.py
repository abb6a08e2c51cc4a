"""video-denoising's report: the ``results.json`` body (every method's block, the baselines, the selection,
the budget check and curve of the config's ``budget_check`` and ``budget_curve``), its tables and the
figures, drawn from ``results.json`` and saved arrays only. Method names are ``<architecture>-<label>``;
the claims are judged separately (:mod:`.claims`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.video_denoising.config import VideoDenoisingConfig, arch_of, label_of
from descentlab.experiments.video_denoising.jobs import BudgetKey, Outcome
from descentlab.io import load_arrays
from descentlab.report.figures import new_figure, save_figure
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import column_mean_std
from descentlab.study.figures import figure_record, panel_figure, plot_band, plot_multipliers
from descentlab.study.tables import Table, pm

SAMPLE_FRAMES = "sample-frames.npz"
NOTES = [
    "RMSE in [0, 1] pixel units over all test pixels; the noisy input's RMSE is gamma * sigma_train.",
    "layer_loss is the test MSE of each layer's estimate (index 0: the initial iterate; DUST's is D·0).",
    "Baselines are tuned at gamma = 1 on validation and then held fixed, like the learned models.",
]

Methods = Mapping[str, Mapping[str, Any]]


# --- the results body ----------------------------------------------------------------------------------


def summarise(cfg: VideoDenoisingConfig, outcome: Outcome) -> dict[str, Any]:
    """The study's results body: ``methods``, ``tables``, ``notes`` and, in ``extra``, ``baselines``,
    ``selection``, ``versus_baselines`` and, when run, ``budget_check`` (:func:`budget_checks`) and
    ``budget_curve``. A tuned method's block holds its grid: the candidates, the chosen index, the tuning
    seed's validation RMSE of each and the failures."""
    gammas, per_seed, baselines, tuned = cfg.gammas, outcome.per_seed, outcome.baselines, outcome.tuned
    grids, selection = {}, {}
    for m, chosen in tuned.picks.items():
        candidates, runs = cfg.candidates(label_of(m)), tuned.results[m]
        val = [r["val_rmse"] for r in runs]
        grids[m] = {
            "candidates": candidates,
            "chosen": chosen,
            "val_rmse": val,
            "failed": {candidates[k]: r["failed"] for k, r in enumerate(runs) if "failed" in r},
        }
        selection[m] = {"chosen": candidates[chosen], **dict(zip(candidates, val, strict=True))}
    methods = {m: method_result(evs, gammas, grids.get(m)) for m, evs in per_seed.items()}
    method_dicts = {m: r.to_dict() for m, r in methods.items()}
    noisy_mean, _ = column_mean_std([ev["noisy_rmse"] for ev in next(iter(per_seed.values()))])
    per_seed_rmse = {m: [ev["rmse"] for ev in evs] for m, evs in per_seed.items()}
    vs = versus_baselines(per_seed_rmse, baselines, gammas)
    for b in baselines.values():
        b["rmse_mean"] = column_mean_std(b["rmse"])[0]
    tables = [
        rmse_table(method_dicts, noisy_mean, gammas, baselines),
        paired_table(per_seed_rmse, gammas),
        *([versus_table(vs, gammas)] if vs["best"] else []),
        *([selection_table(selection, cfg.tune_seed)] if selection else []),
        convergence_table(method_dicts),
    ]
    extra = {"baselines": dict(baselines), "selection": selection, "versus_baselines": vs}
    if checks := budget_checks(outcome.budget, per_seed, gammas):
        extra["budget_check"] = checks
        tables.append(budget_table(checks))
    if outcome.curve:
        extra["budget_curve"] = budget_curve(outcome.curve)
        tables.append(budget_curve_table(extra["budget_curve"], gammas))
    return {"methods": methods, "tables": [t.to_dict() for t in tables], "notes": list(NOTES), "extra": extra}


def method_result(evs: list[dict], gammas: Sequence[float], grid: Mapping[str, Any] | None) -> MethodResult:
    """Mean ± std over seeds of one method's RMSE curve; per-layer MSE at γ = 1 and the largest γ."""
    mean, std = column_mean_std([ev["rmse"] for ev in evs])
    one = list(gammas).index(1.0)
    ood = [i for i, g in enumerate(gammas) if g > 1.0]
    layer = {
        f"gamma={gamma:g}": column_mean_std([ev["layer_mse"][i] for ev in evs])[0]
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


def differences(evs: Sequence[Sequence[float]], base: Sequence[Sequence[float]]) -> list[str]:
    """``evs − base`` per seed and γ: mean ± std over seeds and, in brackets, the seeds where it is below 0."""
    diffs = np.asarray(evs, dtype=np.float64) - np.asarray(base, dtype=np.float64)
    mean, std = column_mean_std(diffs)
    wins = (diffs < 0).sum(0)
    return [f"{pm(m, s, signed=True)} ({w}/{len(diffs)})" for m, s, w in zip(mean, std, wins, strict=True)]


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
    return {"best": best, "rows": {m: differences(evs, best_rmse) for m, evs in per_seed_rmse.items()}}


def budget_checks(
    budget: Mapping[str, Mapping[str, Any]],
    per_seed: Mapping[str, Sequence[Mapping[str, Any]]],
    gammas: Sequence[float],
) -> dict[str, dict[str, Any]]:
    """Per architecture: ERM's validation and test RMSE (γ = 1) at the base budget and at the longer one
    (``budget``: the budget-check job of its ERM, with ``steps`` and ``base_steps``), and the relative gain
    ``(base - long) / base`` of the longer budget (positive: longer training still helps)."""
    one = list(gammas).index(1.0)
    out = {}
    for arch, job in budget.items():
        base = per_seed[f"{arch}-erm"][0]
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


def budget_curve(jobs: Mapping[BudgetKey, Mapping[str, Any]]) -> dict[str, Any]:
    """``rows``: per (architecture, label, steps) the validation RMSE and the test RMSE at every γ, ERM first
    within a budget."""
    order = sorted(jobs.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1] != "erm"))
    keys = ("architecture", "label", "steps")
    return {
        "rows": [
            {**dict(zip(keys, key, strict=True)), "val_rmse": job["val_rmse"], "test_rmse": list(job["rmse"])}
            for key, job in order
        ]
    }


# --- the tables ----------------------------------------------------------------------------------------


def rmse_table(
    methods: Methods, noisy_rmse: Sequence[float], gammas: Sequence[float], baselines: Mapping[str, Any]
) -> Table:
    table = Table(
        "Test RMSE vs gamma (mean ± std over seeds); classical baselines tuned on validation",
        ["method", *map(str, gammas)],
    )
    table.add("noisy input", *[f"{v:.4f}" for v in noisy_rmse])
    for name, b in baselines.items():
        params = ", ".join(f"{k}={v:g}" for k, v in b["params"].items())
        table.add(f"{name} ({params})", *[pm(a, s) for a, s in zip(*column_mean_std(b["rmse"]), strict=True)])
    for method, block in methods.items():
        c = block["curves"]["gaussian"]
        table.add(method, *[pm(a, s) for a, s in zip(c["mean"], c["std"], strict=True)])
    return table


def paired_table(per_seed_rmse: Mapping[str, Sequence[Sequence[float]]], gammas: Sequence[float]) -> Table:
    """RMSE(method) - RMSE(ERM) of the same architecture and seed (``per_seed_rmse``: method -> ``[seeds][γ]``,
    every method over the same seeds in the same order), mean ± std over seeds, and the wins."""
    table = Table(
        "Paired RMSE difference to ERM of the same architecture and seed (negative = lower RMSE; "
        "in brackets: seeds where it beats ERM)",
        ["method", *map(str, gammas)],
    )
    for method, evs in per_seed_rmse.items():
        base = per_seed_rmse.get(f"{arch_of(method)}-erm")
        if base is not None and label_of(method) != "erm":
            table.add(method, *differences(evs, base))
    return table


def versus_table(vs: Mapping[str, Any], gammas: Sequence[float]) -> Table:
    return Table(
        "Learned model minus the best classical baseline at each gamma: pooled RMSE, mean ± std over "
        "seeds (negative = the learned model is better; in brackets: seeds where it is)",
        ["method", *map(str, gammas)],
        [["best baseline", *vs["best"]], *[[m, *cells] for m, cells in vs["rows"].items()]],
    )


def selection_table(selection: Mapping[str, Mapping[str, Any]], tune_seed: int) -> Table:
    """Every validation candidate of every tuned method, and the chosen one (NaN: a candidate that diverged
    or whose constraint proved infeasible)."""

    def val(rmse: float | None) -> str:
        return "failed" if rmse is None or math.isnan(rmse) else f"{rmse:.4f}"

    return Table(
        f"Selection on validation (tuning seed {tune_seed}, never an evaluation seed; RMSE at gamma = 1 "
        "after training): every candidate",
        ["method", "chosen", "candidates: val RMSE"],
        [
            [m, s["chosen"], "; ".join(f"{c or 'base'}: {val(v)}" for c, v in s.items() if c != "chosen")]
            for m, s in selection.items()
        ],
    )


def convergence_table(methods: Methods) -> Table:
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


def budget_table(checks: Mapping[str, Mapping[str, Any]]) -> Table:
    return Table(
        "Budget check: ERM (chosen setting, first seed) retrained with a longer cosine schedule",
        ["architecture", "steps", "val RMSE", "longer: steps", "longer: val RMSE", "gain"],
        [
            [a.upper(), c["base_steps"], f"{c['base_val_rmse']:.4f}", c["steps"], f"{c['val_rmse']:.4f}",
             f"{100 * c['val_gain']:.2f} %"]
            for a, c in checks.items()
        ],
    )  # fmt: skip


def budget_curve_table(curve: Mapping[str, Any], gammas: Sequence[float]) -> Table:
    return Table(
        "Budget curve: validation and test RMSE of the chosen settings (seed 0) at each step budget",
        ["architecture", "method", "steps", "val RMSE", *[f"test gamma={g:g}" for g in gammas]],
        [
            [r["architecture"].upper(), r["label"], r["steps"], f"{r['val_rmse']:.4f}",
             *[f"{x:.4f}" for x in r["test_rmse"]]]
            for r in curve["rows"]
        ],
    )  # fmt: skip


# --- the figures ---------------------------------------------------------------------------------------


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """The study's figures, from ``results.json`` and ``sample-frames.npz`` (when saved)."""
    methods = results.get("methods", {})
    if not methods:
        return []
    present = {arch_of(m) for m in methods}
    archs = [a for a in results.get("config", {}).get("architectures", sorted(present)) if a in present]
    gammas = results.get("protocol", {}).get("gammas", [1.0])
    samples = Path(run_dir) / SAMPLE_FRAMES
    return [
        *relative_figure(run_dir, methods, archs),
        *layer_figure(run_dir, methods, archs),
        *baselines_figure(run_dir, methods, results.get("baselines", {}), archs),
        *validation_figure(run_dir, methods, archs, results.get("budget_check") or {}),
        *lambda_figure(run_dir, methods),
        *budget_figure(run_dir, (results.get("budget_curve") or {}).get("rows") or [], gammas),
        *(sample_figure(run_dir, load_arrays(samples), archs) if samples.is_file() else []),
    ]


def _of(methods: Methods, arch: str) -> list[tuple[str, Mapping[str, Any]]]:
    return [(m, b) for m, b in methods.items() if arch_of(m) == arch]


def _axes(ax: Any, arch: str, xlabel: str, ylabel: str) -> None:
    ax.set(title=arch.upper(), xlabel=xlabel, ylabel=ylabel)


GAMMA_AXIS = "gamma (test sigma / sigma_train)"


def relative_figure(run_dir: Path, methods: Methods, archs: Sequence[str]) -> list[dict[str, str]]:
    def draw(ax: Any, arch: str) -> None:
        base = methods.get(f"{arch}-erm")
        for method, block in _of(methods, arch) if base is not None else []:
            b, c = np.asarray(base["curves"]["gaussian"]["mean"]), block["curves"]["gaussian"]
            mean, sd = np.asarray(c["mean"]) / b, np.asarray(c["std"]) / b
            plot_band(ax, c["x"], mean, sd, label=label_of(method), alpha=0.2)
        ax.axvline(1.0, color="grey", lw=0.8, ls=":")
        _axes(ax, arch, GAMMA_AXIS, "RMSE / RMSE of ERM")

    caption = (
        "Test RMSE relative to ERM of the same architecture "
        "(mean over seeds, band: std of the method's RMSE / ERM mean); below 1 = better than ERM"
    )
    return panel_figure(run_dir, "figures/rmse-relative-to-erm.png", archs, draw, caption)


def layer_figure(run_dir: Path, methods: Methods, archs: Sequence[str]) -> list[dict[str, str]]:
    def draw(ax: Any, arch: str) -> None:
        for k, (method, block) in enumerate(_of(methods, arch)):
            for j, (condition, values) in enumerate(block["layer_loss"].items()):
                style = {"color": f"C{k}", "ls": ["-", "--"][j % 2], "marker": "o", "ms": 3}
                ax.semilogy(range(len(values)), values, label=f"{label_of(method)} {condition}", **style)
        _axes(ax, arch, "layer", "test MSE (log)")

    caption = (
        "Test MSE of every layer's estimate (log scale), in distribution (solid) and at the largest gamma "
        "(dashed)"
    )
    return panel_figure(run_dir, "figures/layer-mse-log.png", archs, draw, caption)


def baselines_figure(
    run_dir: Path, methods: Methods, baselines: Mapping[str, Any], archs: Sequence[str]
) -> list[dict[str, str]]:
    x = next(iter(methods.values()))["curves"]["gaussian"]["x"]

    def draw(ax: Any, arch: str) -> None:
        for method, block in _of(methods, arch):
            c = block["curves"]["gaussian"]
            ax.plot(c["x"], c["mean"], marker="o", ms=3, label=label_of(method))
        for k, (name, b) in enumerate(baselines.items()):
            ax.plot(x, b["rmse_mean"], ls="--", color=f"C{7 + k % 3}", marker="s", ms=3, label=name)
        _axes(ax, arch, GAMMA_AXIS, "test RMSE")

    caption = "Test RMSE against gamma: learned models (solid) and classical baselines (dashed)"
    return panel_figure(run_dir, "figures/rmse-with-baselines.png", archs, draw, caption)


def validation_figure(
    run_dir: Path, methods: Methods, archs: Sequence[str], budget: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, str]]:
    def draw(ax: Any, arch: str) -> None:
        for method, block in _of(methods, arch):
            if curves := block.get("val_curves") or []:
                erm = label_of(method) == "erm"
                mean = np.mean([c["rmse"] for c in curves], axis=0)
                style = {"lw": 2.2, "color": "k"} if erm else {"lw": 1.0}
                ax.plot(curves[0]["step"][1:], mean[1:], label=label_of(method), **style)
        if check := budget.get(arch):
            curve = check["val_curve"]
            ax.plot(curve["step"][1:], curve["rmse"][1:], "k--", lw=1.4, label=f"erm, {check['steps']} steps")
        _axes(ax, arch, "training step", "validation RMSE (gamma = 1)")

    caption = "Validation RMSE during training (mean over seeds; ERM in black; dashed: ERM's longer budget)"
    drawn = any(block.get("val_curves") for block in methods.values())
    return panel_figure(run_dir, "figures/validation-curves.png", archs if drawn else [], draw, caption)


def lambda_figure(run_dir: Path, methods: Methods) -> list[dict[str, str]]:
    traced = {m: b["lambda_trace"] for m, b in methods.items() if b.get("lambda_trace")}

    def draw(ax: Any, method: str) -> None:
        steps = traced[method][0]["steps"]
        lam = [t["lambda"] for t in traced[method] if t["steps"] == steps]  # [S, T, L]
        idle = plot_multipliers(ax, steps, lam)
        title = f"{method} ({len(lam)} seeds)" + (f"; λ = 0 throughout: {idle}" if idle else "")
        ax.set(title=title, xlabel="training step", ylabel="multiplier λ_l")

    caption = (
        "Multipliers λ_l over training, per constrained layer: mean over the evaluation seeds (thick) and each "
        "seed (thin); layers whose λ stayed 0 are named in the title"
    )
    return panel_figure(run_dir, "figures/lambda-trajectory.png", list(traced), draw, caption)


def budget_figure(
    run_dir: Path, rows: Sequence[Mapping[str, Any]], gammas: Sequence[float]
) -> list[dict[str, str]]:
    one, top = list(gammas).index(1.0), len(gammas) - 1
    budgets = sorted({r["steps"] for r in rows})

    def draw(ax: Any, arch: str) -> None:
        mine = [r for r in rows if r["architecture"] == arch]
        for k, label in enumerate(sorted({r["label"] for r in mine}, key=lambda x: x != "erm")):
            pts = sorted((r["steps"], r["test_rmse"]) for r in mine if r["label"] == label)
            steps, color = [s for s, _ in pts], "k" if label == "erm" else f"C{k}"
            ax.plot(steps, [t[one] for _, t in pts], "o-", color=color, label=f"{label}, gamma=1")
            ax.plot(
                steps, [t[top] for _, t in pts], "s--", color=color, label=f"{label}, gamma={gammas[top]:g}"
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(budgets, [f"{s:,}" for s in budgets])
        ax.minorticks_off()
        _axes(ax, arch, "training steps (each its own cosine schedule)", "test RMSE")

    caption = "Test RMSE against the training budget (seed 0, settings chosen at the base budget)"
    archs = sorted({r["architecture"] for r in rows})
    return panel_figure(run_dir, "figures/budget-curve.png", archs, draw, caption)


def sample_figure(
    run_dir: Path, frames: Mapping[str, np.ndarray], archs: Sequence[str]
) -> list[dict[str, str]]:
    """Clean, noisy and denoised middle frame, one row per (architecture, γ), from ``sample-frames.npz``:
    ``clean [T, H, W]``, ``noisy [G, T, H, W]``, ``gammas [G]``, ``seed``, ``methods [M]`` and ``denoised
    [M, G, T, h, w]`` (h, w <= H, W); each title has the frame's RMSE."""
    clean, noisy, gammas = frames["clean"], frames["noisy"], frames["gammas"].tolist()
    names = frames["methods"].tolist()
    denoised = dict(zip(names, frames["denoised"], strict=True))
    t = clean.shape[0] // 2
    h, w = frames["denoised"].shape[-2:]
    baselines = [n for n in names if arch_of(n) not in archs]
    rows = [(arch, i) for arch in archs for i in range(len(gammas))]
    cols = 2 + len(baselines) + max(sum(arch_of(n) == a for n in names) for a in archs)
    fig, axes = new_figure(len(rows), cols, figsize=(1.9 * cols * w / h, 1.9 * len(rows)))
    target = clean[t, :h, :w]
    for r, (arch, i) in enumerate(rows):
        shown = [("clean", target), (f"noisy gamma={gammas[i]:g}", noisy[i][t, :h, :w])]
        shown += [
            (n.replace("-", " ", 1), denoised[n][i][t])
            for n in baselines + [n for n in names if arch_of(n) == arch]
        ]
        for c, ax in enumerate(axes[r]):
            ax.axis("off")
            if c < len(shown):
                title, img = shown[c]
                rmse = float(np.sqrt(np.mean(np.square(img - target))))
                ax.imshow(np.clip(img, 0, 1), cmap="gray", vmin=0, vmax=1)
                ax.set_title(title if c == 0 else f"{title} ({rmse:.3f})", fontsize=6)
    fig.tight_layout()
    save_figure(fig, Path(run_dir) / "figures" / "sample-frames.png", dpi=90)
    caption = (
        f"Middle frame of a test clip (seed {int(frames['seed'])}), every method and baseline denoising it tile "
        "by tile; frame RMSE in brackets"
    )
    return [figure_record("figures/sample-frames.png", caption)]
