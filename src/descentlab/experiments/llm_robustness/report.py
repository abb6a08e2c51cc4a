"""llm-robustness's report: the results body of a run (:func:`summarise`: per method its curves with
seed-level intervals, then the tables) and the figures, redrawn from ``results.json`` alone (the claims
table is the engine's).

Head to head. Against ERM of the same seed, per cell (seed, draw, example) of one condition, with r the
reference NLL and n its tokens: outcome 1[r_M < r_B − tol] + 1/2 · 1[|r_M − r_B| <= tol], ΔNLL
(r_M − r_B) / n. Each curve point carries the seed-level interval of paired_interval; ERM's own curves are
the null control (ERM on seed s_i against ERM on s_{i+1 mod S}).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from descentlab.evaluation.causal_lm import noise_key
from descentlab.evaluation.judge import likelihood_preferences
from descentlab.experiments.llm_robustness.claims import PAPER_KIND, PAPER_WIN_RATE
from descentlab.experiments.llm_robustness.config import LlmRobustnessConfig
from descentlab.experiments.llm_robustness.jobs import Outcome, grid_levels, profile_condition
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import paired_interval
from descentlab.study.figures import panel_figure, plot_multipliers
from descentlab.study.tables import Table, ci, signed_ci
from descentlab.study.tuning_rules import binding_level

Methods = Mapping[str, Mapping[str, Any]]


# -- head to head: the judged outcomes (the claims' cells) and the curves ----------------------------------


def _per_draw(ev: Mapping[str, Any], what: str, kind: str, level: float, draws: int) -> np.ndarray:
    """``ev[what]`` (``nll``: ``[draws, N]``; ``perplexity``: ``[draws]``) at one condition; clean is one draw."""
    n = 1 if level == 0 else draws
    return np.asarray([ev[what][noise_key(kind, level, d)] for d in range(n)], dtype=np.float64)


def outcomes(nll_m: np.ndarray, nll_b: np.ndarray, tol: float = 1e-6) -> np.ndarray:
    """The judged outcome of M against B per cell: 1 (lower NLL), 0, or 1/2 within ``tol`` nats
    (:func:`~descentlab.evaluation.judge.likelihood_preferences`, on arrays)."""
    return likelihood_preferences(torch.from_numpy(nll_m), torch.from_numpy(nll_b), tol=tol).numpy()


def shifted(evs: Sequence[Any]) -> list[Any]:
    """``evs`` (one per evaluation seed) shifted by one seed, cyclically: the null control's other arm."""
    return [evs[(i + 1) % len(evs)] for i in range(len(evs))]


def seed_outcomes(
    evs_m: Sequence[Mapping],
    evs_b: Sequence[Mapping],
    kind: str,
    level: float,
    *,
    draws: int,
    tol: float = 1e-6,
) -> np.ndarray:
    """``[seeds, draws, examples]`` outcomes of M against B, seed by seed (``evs_m[s]`` against ``evs_b[s]``)."""
    return outcomes(*paired_nll(evs_m, evs_b, kind, level, draws), tol)


def paired_nll(
    evs_m: Sequence[Mapping], evs_b: Sequence[Mapping], kind: str, level: float, draws: int
) -> tuple[np.ndarray, np.ndarray]:
    """The ``[seeds, draws, examples]`` reference NLLs of M and of B at one condition, seed by seed."""
    if len(evs_m) != len(evs_b):
        raise ValueError(f"paired by seed: {len(evs_m)} evaluations against {len(evs_b)}")
    nll = partial(_per_draw, what="nll", kind=kind, level=level, draws=draws)
    return np.stack([nll(e) for e in evs_m]), np.stack([nll(e) for e in evs_b])


def head_to_head(
    evs_m: Sequence[Mapping],
    evs_b: Sequence[Mapping],
    kind: str,
    level: float,
    *,
    draws: int,
    tol: float = 1e-6,
) -> dict[str, Any]:
    """Win rate and per-token ΔNLL of M against B at one condition, paired by seed, each with its
    seed-level 95 % interval, and the win rate of every seed."""
    a, b = paired_nll(evs_m, evs_b, kind, level, draws)
    p = outcomes(a, b, tol)
    n = np.asarray(evs_m[0]["ref_tokens"], dtype=np.float64)[None, None, :]
    win, delta = paired_interval(p, np.full_like(p, 0.5)), paired_interval(a / n, b / n)
    return {
        "outcomes": p,
        "win_rate": float(p.mean()),
        "win_ci": [0.5 + win.low, 0.5 + win.high],
        "per_seed": p.mean(axis=(1, 2)).tolist(),
        "wins": int((p == 1).sum()),
        "ties": int((p == 0.5).sum()),
        "losses": int((p == 0).sum()),
        "delta_nll": delta.mean,
        "delta_ci": [delta.low, delta.high],
    }


def seed_perplexity(evs: Sequence[Mapping[str, Any]], kind: str, level: float, draws: int) -> np.ndarray:
    """``[seeds]``: each seed's perplexity at one condition, the mean over its draws."""
    return np.asarray([_per_draw(ev, "perplexity", kind, level, draws).mean() for ev in evs])


def head_to_head_curves(
    evs_m: Sequence[Mapping],
    evs_b: Sequence[Mapping],
    kind: str,
    xs: Sequence[float],
    against: str,
    **kw: Any,
) -> dict[str, Curve]:
    """The ``win_rate@<kind>`` and ``delta_nll@<kind>`` curves of M against B (:func:`head_to_head` at each
    level of ``xs``, with ``kw``: ``draws`` and ``tol``); ``against``: whom M is compared with, in words."""
    points = [head_to_head(evs_m, evs_b, kind, x, **kw) for x in xs]
    h = {key: [p[key] for p in points] for key in points[0]}

    def interval(key: str) -> dict[str, list[float]]:
        return {"ci_low": [lo for lo, _ in h[key]], "ci_high": [hi for _, hi in h[key]]}

    win = {**interval("win_ci"), "per_seed": h["per_seed"], "against": against}
    win |= {k: h[k] for k in ("wins", "ties", "losses")}
    delta = {**interval("delta_ci"), "against": against}
    return {
        f"win_rate@{kind}": Curve("gamma", list(xs), "win_rate", h["win_rate"], extra=win),
        f"delta_nll@{kind}": Curve("gamma", list(xs), "delta_nll_per_token", h["delta_nll"], extra=delta),
    }


# -- the results body ------------------------------------------------------------------------------------------


def summarise(cfg: LlmRobustnessConfig, outcome: Outcome) -> dict[str, Any]:
    """``methods`` (per method its perplexity, win-rate and ΔNLL curves and its fine-tunes of every seed),
    ``tables``, ``notes`` and ``extra`` (the grid, the reference profile, the selection) of the results body.
    The claims are not here: the runner judges them from the cell store."""
    baseline, seeds, draws, tol = cfg.baseline, list(cfg.seeds), cfg.grid.draws, cfg.eval.tie_tol
    evaluations, levels = outcome.evaluations, grid_levels(cfg, outcome.grid)
    base = evaluations[baseline]
    methods: dict[str, MethodResult] = {}
    for m, evs in evaluations.items():
        curves: dict[str, Curve] = {}
        metrics: dict[str, Any] = {"perplexity": float(np.mean([ev["perplexity"]["clean"] for ev in evs]))}
        for kind, xs in levels.items():
            ppl = [float(np.mean([_per_draw(ev, "perplexity", kind, x, draws) for ev in evs])) for x in xs]
            extra = {"per_seed": [seed_perplexity(evs, kind, x, draws).tolist() for x in xs]}
            curves[f"perplexity@{kind}"] = Curve("gamma", list(xs), "perplexity", ppl, extra=extra)
            metrics.update({f"perplexity@{kind}{x:g}": v for x, v in zip(xs, ppl, strict=True) if x > 0})
            if m != baseline:
                curves |= head_to_head_curves(
                    evs, base, kind, xs, f"{baseline}, same seed", draws=draws, tol=tol
                )
                metrics.setdefault(
                    "win_rate", curves[f"win_rate@{kind}"].mean[0]
                )  # clean: every kind's first
            elif len(evs) > 1:  # the null control
                curves |= head_to_head_curves(
                    evs, shifted(evs), kind, xs, f"{m}, the next seed", draws=draws, tol=tol
                )
        runs = list(outcome.facts.get(m, []))
        for k in ("train_seconds", "seconds_per_step", "steps"):
            if values := [x[k] for x in runs if x.get(k) is not None]:
                metrics[k] = float(np.mean(values))
        metrics["eval_seconds"] = float(np.mean([ev.get("eval_seconds", float("nan")) for ev in evs]))
        profiles = {
            k: np.mean([ev["layer_loss"][k] for ev in evs], axis=0).tolist() for k in evs[0]["layer_loss"]
        }
        extra = {"seeds": seeds, "train": [dict(x) for x in runs]}
        methods[m] = MethodResult(metrics=metrics, curves=curves, layer_loss=profiles, extra=extra)
    extra = {
        "grid": dict(outcome.grid),
        "reference": dict(outcome.reference),
        "profile_condition": "{}@{:g}".format(*profile_condition(cfg, outcome.grid)),
        "seeds": seeds,
        "selection": dict(outcome.selection),
    }
    body = {"methods": {m: r.to_dict() for m, r in methods.items()}, **extra}
    judged = [judged_table(outcome.judged, baseline, str(cfg.generative.model))] if outcome.judged else []
    n = len(seeds)
    notes = [
        "Win rate: likelihood judge, ties count half, 50 % is parity; each method is compared with ERM of the "
        f"same evaluation seed ({n} seed{'s' if n > 1 else ''}: {seeds}). The curves' 95 % intervals are "
        "paired_interval over (seeds, noise draws, held-out examples), the seed the unit of replication"
        + ("." if n > 1 else "; with one seed they count examples only.")
        + " The paper's 50 % -> 69.93 % is Llama 3.1 8B judged on AlpacaEval.",
        f"The null control ({baseline}'s own win-rate rows): {baseline} on seed s_i against {baseline} on the "
        "next seed s_(i+1 mod S); its interval is the spread between ERM seeds every win rate is read against"
        + (" (it needs two seeds; this run has one)." if n < 2 else "."),
        "delta_nll: (method - ERM) reference NLL per token, nats; negative favours the method.",
        "Levels: gaussian in units of sigma_E; neftune is NEFTune's alpha (noise alpha / sqrt(n d)). They come "
        "from ERM's fine-tune on the tuning seed (validation only), as every other choice.",
        "Per-example NLLs of every method, seed and condition are in jobs/eval-<method>-seed<s>.json; the "
        "judged outcomes the claims read are in arrays/cells.npz (design record: arrays/design.json).",
    ]
    return {"methods": methods, "tables": tables(body, baseline) + judged, "notes": notes, "extra": extra}


def seed_facts(block: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A method block's fine-tunes, one per evaluation seed (a run saved before the seeds had one dict)."""
    train = block.get("train", [])
    return [dict(train)] if isinstance(train, Mapping) else [dict(t) for t in train]


def _mean(values: Sequence[Any]) -> float:
    kept = [float(v) for v in values if v is not None]
    return sum(kept) / len(kept) if kept else float("nan")


def _percent_ci(x: float, low: float, high: float) -> str:
    return f"{100 * x:.1f} % {ci(low, high, 1, scale=100)}"


# -- tables --------------------------------------------------------------------------------------------------


def tables(results: Mapping[str, Any], baseline: str) -> list[dict[str, Any]]:
    """Grid, perplexity, head-to-head, fine-tuning and (when a method was tuned) selection tables."""
    methods = results["methods"]
    out = [
        grid_table(results["grid"], methods[baseline]["curves"]),
        perplexity_table(methods),
        head_to_head_table(methods, baseline),
        training_table(methods),
    ]
    if (results.get("selection") or {}).get("rows"):
        out.append(selection_table(results["selection"], baseline))
    return [t.to_dict() for t in out]


def grid_table(grid: Mapping[str, Any], baseline_curves: Mapping[str, Any]) -> Table:
    """The noise levels the bisection found on validation, with the baseline's held-out perplexity ratio."""
    table = Table(
        "Noise levels from ERM's degradation (validation bisection; held-out ratio beside it)",
        ["kind", "target", "level", "validation ratio (bracket)", "held-out ratio"],
    )
    for kind, s in grid["kinds"].items():
        held = baseline_curves[f"perplexity@{kind}"]
        for target, level, near in zip(s["targets"], s["levels"], s["bracket_ratios"], strict=True):
            ratio = (
                f"{held['mean'][held['x'].index(level)] / held['mean'][0]:.3g}" if level in held["x"] else ""
            )
            table.add(kind, f"x{target:g}", f"{level:.4g}", f"{near:.3g}", ratio)
    return table


def perplexity_table(methods: Methods) -> Table:
    """Each method's held-out perplexity at every level of every noise kind."""
    table = Table("Held-out perplexity (level: value)", ["method", "kind", "levels"])
    for m, block in methods.items():
        for name, c in block["curves"].items():
            if name.startswith("perplexity@"):
                values = "; ".join(f"{x:g}: {v:.2f}" for x, v in zip(c["x"], c["mean"], strict=True))
                table.add(m, name.partition("@")[2], values)
    return table


def head_to_head_table(methods: Methods, baseline: str) -> Table:
    """Win rate and ΔNLL against ``baseline`` of the same seed at every level, with their intervals."""
    table = Table(
        f"Head to head against {baseline} of the same seed: win rate [seed-level 95 % interval], "
        "win rate per seed (%), W / T / L over every seed, per-token delta NLL [95 % interval]",
        ["method", "kind", "level", "win rate", "per seed", "W / T / L", "delta NLL"],
    )
    for m, block in methods.items():
        for name, c in block["curves"].items():
            if not name.startswith("win_rate@"):
                continue
            kind = name.partition("@")[2]
            d = block["curves"][f"delta_nll@{kind}"]
            label = f"{m} vs {m} (next seed): null control" if m == baseline else m
            per_seed = c.get("per_seed")
            for i, x in enumerate(c["x"]):
                table.add(
                    label,
                    kind,
                    f"{x:g}",
                    _percent_ci(c["mean"][i], c["ci_low"][i], c["ci_high"][i]),
                    "" if per_seed is None else ", ".join(f"{100 * w:.1f}" for w in per_seed[i]),
                    f"{c['wins'][i]} / {c['ties'][i]} / {c['losses'][i]}",
                    signed_ci(d["mean"][i], d["ci_low"][i], d["ci_high"][i]),
                )
    return table


def training_table(methods: Methods) -> Table:
    """The fine-tunes of every method over the evaluation seeds: cost, loss, convergence, λ, binding."""
    columns = ["method", "seeds", "steps", "s / step", "final train loss", "val loss, last doubling"]
    columns += ["max lambda", "binding", "constrained layers", "candidate", "training noise"]
    table = Table(
        "Fine-tuning, over the evaluation seeds: mean s / step and final train loss; validation loss "
        "change over the last doubling of steps per seed (converged: |change| < 2 %); max lambda; binding "
        "(time-average of the sum of lambda over the second half of training, mean over seeds)",
        columns,
    )
    for m, block in methods.items():
        if not (runs := seed_facts(block)):
            continue
        t = runs[0]
        lams = [max(r["multipliers"]) for r in runs if r.get("multipliers")]
        traces = [r["lambda_trace"] for r in runs if r.get("lambda_trace")]
        binds = [binding_level(tr["steps"], tr["lambda"]) for tr in traces]
        changes = [r["val_curve"]["last_doubling_change"] for r in runs if r.get("val_curve")]
        noise = t.get("noisy_training")
        table.add(
            m,
            len(runs),
            t.get("steps"),
            f"{_mean([r.get('seconds_per_step') for r in runs]):.2f}",
            f"{_mean([r.get('final_train_loss') for r in runs]):.3f}",
            ", ".join("" if c is None else f"{100 * c:+.1f} %" for c in changes)  # none: too few points
            if any(c is not None for c in changes)
            else "",
            "" if not lams else f"{max(lams):.3f}",
            "" if not binds else f"{_mean(binds):.4f}",
            "" if not lams else str(t.get("constrained_layers")),
            t.get("candidate") or "",
            "" if not noise else f"{noise[0]} {noise[1]:g}",
        )
    return table


def selection_table(selection: Mapping[str, Any], baseline: str) -> Table:
    """Every candidate's validation scores on the tuning seed and which one was chosen."""
    table = Table(
        f"Selection on validation (tuning seed {selection.get('tune_seed')}, "
        f"{selection.get('examples')} examples): win rate against {baseline}'s tuning run, clean and "
        "over the gaussian levels; binding of the candidate's own run",
        ["method", "candidate", "clean win rate", "noisy win rate", "binding", "chosen"],
    )
    for method, spec, clean, noisy, bind, chosen in selection["rows"]:
        binding = f"{bind:.4f}" if isinstance(bind, int | float) else str(bind)
        table.add(method, spec, f"{100 * clean:.1f} %", f"{100 * noisy:.1f} %", binding, chosen)
    return table


def judged_table(judged: Mapping[str, Any], baseline: str, judge_name: str) -> dict[str, Any]:
    """Generate then judge: raw and length-controlled win rates against the baseline, each with its
    seed-level 95 % interval (:func:`~descentlab.report.stats.paired_interval` against 1/2)."""

    def rate(cells: list[list[float]]) -> str:
        a = np.asarray(cells, dtype=np.float64)[:, None]  # [seeds, 1, examples]
        iv = paired_interval(a, np.full_like(a, 0.5))
        return _percent_ci(0.5 + iv.mean, 0.5 + iv.low, 0.5 + iv.high)

    table = Table(
        f"Generate then judge against {baseline} (judge {judge_name}, both orders): win rate and "
        "length-controlled win rate [seed-level 95 % interval], length coefficient per seed, mean answer tokens "
        "(method / baseline)",
        ["method", "condition", "win rate", "LC win rate", "phi", "tokens"],
    )
    for method, by_condition in judged["verdicts"].items():
        for name, v in by_condition.items():
            table.add(
                method,
                name,
                rate(v["preferences"]),
                rate(v["adjusted"]) if v["length_controlled"] else "(no length spread: = raw)",
                ", ".join(f"{phi:+.3f}" for phi in v["length_coefficient"]),
                f"{v['mean_tokens']:.0f} / {v['baseline_mean_tokens']:.0f}",
            )
    return table.to_dict()


# -- figures -------------------------------------------------------------------------------------------------

# metric -> (file, y label with {baseline}, scale, reference line)
HEAD_TO_HEAD = {
    "win_rate": ("win-rate.png", "win rate vs {baseline} (%)", 100.0, 50.0),
    "delta_nll": ("delta-nll.png", "ΔNLL per token vs {baseline} (nats)", 1.0, 0.0),
}


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """``win-rate.png`` and ``delta-nll.png`` (against the level, seed-level 95 % intervals, the null control
    beside the methods), ``layer-profiles.png``, ``lambda.png`` (λ over training, the mean over the seeds
    thick, each seed thin) and ``val-loss.png`` (the convergence check); each only when there is data."""
    methods = results.get("methods", {})
    baseline = results.get("config", {}).get("baseline", "erm")
    n_seeds = len(results.get("seeds") or results.get("protocol", {}).get("seeds") or [0])
    seeds_text = f"{n_seeds} seeds" if n_seeds > 1 else "one seed: over examples only"
    curves = [name for b in methods.values() for name in b.get("curves", {})]
    kinds = sorted({name.partition("@")[2] for name in curves if name.startswith("win_rate@")})
    out: list[dict[str, str]] = []
    for metric, (fname, ylabel, _, _) in HEAD_TO_HEAD.items():
        caption = (
            f"{ylabel.format(baseline=baseline)} against the noise level, each method against {baseline} of "
            f"the same seed and {baseline} against itself on the next seed (the null control); seed-level "
            f"95 % intervals ({seeds_text})"
        )
        draw = partial(_draw_head_to_head, methods, baseline, metric)
        out += panel_figure(run_dir, f"figures/{fname}", kinds, draw, caption, legend=None)

    reference = results.get("reference", {})
    if methods and reference.get("held_profile"):
        conds = ["clean"] + ([results["profile_condition"]] if results.get("profile_condition") else [])
        caption = "Per-layer logit-lens loss on held-out examples: pretrained, then each fine-tune"
        draw = partial(_draw_profile, methods, reference)
        out += panel_figure(run_dir, "figures/layer-profiles.png", conds, draw, caption, legend=None)

    traced = [
        (m, runs) for m, b in methods.items() if (runs := [r for r in seed_facts(b) if r.get("lambda_trace")])
    ]
    caption = (
        "Multipliers λ_l of the constrained layers over training: the mean over the evaluation seeds (thick), "
        "each seed (thin)"
    )
    out += panel_figure(run_dir, "figures/lambda.png", traced, _draw_lambda, caption, legend=None)

    if any(r.get("val_curve") for b in methods.values() for r in seed_facts(b)):
        caption = (
            "Validation loss over training, every fine-tune on an evaluation seed (one line per seed): converged "
            "when it changes by < 2 % over the last doubling of steps"
        )
        draw = partial(_draw_val_loss, methods)
        out += panel_figure(run_dir, "figures/val-loss.png", ["convergence"], draw, caption, legend=None)
    return out


def _draw_head_to_head(methods: Methods, baseline: str, metric: str, ax: Any, kind: str) -> None:
    """Each method's ``metric`` curve at ``kind`` with its interval as error bars (the paper's points on the
    scale its γ is read on)."""
    _, ylabel, scale, reference = HEAD_TO_HEAD[metric]
    for m, b in methods.items():
        if (c := b["curves"].get(f"{metric}@{kind}")) is None:
            continue
        mean, lo, hi = (np.asarray(c[k]) * scale for k in ("mean", "ci_low", "ci_high"))
        # the mean and the interval are computed apart (p.mean() vs 1/2 + the interval's mean): clip the rounding
        yerr = [np.maximum(mean - lo, 0.0), np.maximum(hi - mean, 0.0)]
        label = f"{m} vs {m} (next seed)" if m == baseline else m
        ax.errorbar(
            np.asarray(c["x"], dtype=float), mean, yerr=yerr, marker="o", ms=3, capsize=3, label=label
        )
    ax.axhline(reference, color="grey", lw=1, ls="--")
    if metric == "win_rate" and kind == PAPER_KIND:
        paper = [100 * v for v in PAPER_WIN_RATE.values()]
        ax.plot(list(PAPER_WIN_RATE), paper, "k*", ms=10, label="paper (Llama 3.1 8B, AlpacaEval)")
    xlabel = "γ (noise std / σ_E)" if kind != "neftune" else "NEFTune α (noise α/√(n·d))"
    ax.set(xlabel=xlabel, ylabel=ylabel.format(baseline=baseline), title=kind)
    ax.legend(fontsize=7)


def _draw_profile(methods: Methods, reference: Mapping[str, Any], ax: Any, cond: str) -> None:
    if cond == "clean":
        p = reference["held_profile"]
        ax.plot(range(1, len(p)), p[1:], "k--", lw=1.5, label="pretrained")
    for m, b in methods.items():
        if p := b.get("layer_loss", {}).get(cond):
            ax.plot(range(1, len(p)), p[1:], marker=".", ms=3, label=m)
    # every constrained method shares the layers: the first method's that has them
    runs = [seed_facts(b)[0] for b in methods.values() if seed_facts(b)]
    if layers := next((r["constrained_layers"] for r in runs if r.get("constrained_layers")), None):
        ax.axvspan(min(layers) - 0.5, max(layers) + 0.5, color="orange", alpha=0.08, label="constrained")
    ax.set(xlabel="layer l (1..L; layer 0 omitted)", ylabel="logit-lens loss (nats)", title=cond)
    ax.legend(fontsize=7)


def _draw_lambda(ax: Any, method_runs: tuple[str, list[Mapping[str, Any]]]) -> None:
    """λ_l of one method's seeds whose trace has the first seed's steps."""
    m, runs = method_runs
    steps = runs[0]["lambda_trace"]["steps"]
    lam = np.stack(
        [np.asarray(r["lambda_trace"]["lambda"]) for r in runs if r["lambda_trace"]["steps"] == steps]
    )
    constrained = set(runs[0].get("constrained_layers") or range(1, lam.shape[2] + 1))
    idle = [layer for layer in plot_multipliers(ax, steps, lam) if layer in constrained]
    n = lam.shape[0]
    title = f"{m} ({n} seed{'s' if n > 1 else ''})"
    if idle:  # plot_multipliers leaves them out: say so
        title += f"; λ = 0 throughout at l = {', '.join(map(str, idle))}"
    ax.set(xlabel="step", ylabel="λ", title=title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, ncol=2)


def _draw_val_loss(methods: Methods, ax: Any, _: str) -> None:
    for m, b in methods.items():
        color = None
        for i, r in enumerate(r for r in seed_facts(b) if r.get("val_curve")):
            c = r["val_curve"]
            (line,) = ax.plot(c["steps"], c["loss"], lw=1, marker=".", ms=3, color=color,
                              label=m if i == 0 else None)  # fmt: skip
            color = line.get_color()
    ax.set(xlabel="step", ylabel="validation loss (nats per token)", title="convergence")
    ax.legend(fontsize=7)
