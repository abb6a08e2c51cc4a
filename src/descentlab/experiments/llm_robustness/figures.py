"""llm-robustness's figures, drawn from ``results.json`` alone, one function per figure:

* :func:`head_to_head_figures`: win rate and ΔNLL against the noise level, one panel per noise kind, with
  seed-level 95 % intervals (the null control, ERM against ERM on the next seed, beside the methods);
* :func:`layer_profile_figure`: per-layer logit-lens loss, clean and at the profile condition;
* :func:`lambda_figure`: λ over training for every constrained method (the mean over the seeds thick, each
  seed thin), :func:`~descentlab.study.figures.plot_multipliers`;
* :func:`val_loss_figure`: the validation loss over training (the convergence check).

Each returns its ``[{"path", "caption"}]`` record (empty when the results hold nothing to draw).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.llm_robustness.claims import PAPER_KIND, PAPER_WIN_RATE
from descentlab.experiments.llm_robustness.tables import seed_facts
from descentlab.study.figures import panel_figure, plot_multipliers

Methods = Mapping[str, Mapping[str, Any]]

# metric -> (file, y label with {baseline}, scale, reference line)
HEAD_TO_HEAD = {
    "win_rate": ("win-rate.png", "win rate vs {baseline} (%)", 100.0, 50.0),
    "delta_nll": ("delta-nll.png", "ΔNLL per token vs {baseline} (nats)", 1.0, 0.0),
}


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """Win rate and ΔNLL against the level with CIs, per-layer profiles, λ over training, validation loss."""
    methods = results.get("methods", {})
    baseline = results.get("config", {}).get("baseline", "erm")
    n_seeds = len(results.get("seeds") or results.get("protocol", {}).get("seeds") or [0])
    return [
        *head_to_head_figures(methods, baseline, n_seeds, run_dir),
        *layer_profile_figure(
            methods, results.get("reference", {}), results.get("profile_condition"), run_dir
        ),
        *lambda_figure(methods, run_dir),
        *val_loss_figure(methods, run_dir),
    ]


def noise_kinds(methods: Methods) -> list[str]:
    """The noise kinds with a win-rate curve, sorted."""
    return sorted(
        {
            n.partition("@")[2]
            for b in methods.values()
            for n in b.get("curves", {})
            if n.startswith("win_rate@")
        }
    )


def plot_interval(ax: Any, curve: Mapping[str, Any], label: str, scale: float = 1.0) -> None:
    """A curve's mean against its level with its interval ``[ci_low, ci_high]`` as error bars."""
    x = np.asarray(curve["x"], dtype=float)
    mean = np.asarray(curve["mean"]) * scale
    lo, hi = np.asarray(curve["ci_low"]) * scale, np.asarray(curve["ci_high"]) * scale
    # the mean and the interval are computed apart (p.mean() vs 1/2 + the interval's mean): clip the rounding
    yerr = [np.maximum(mean - lo, 0.0), np.maximum(hi - mean, 0.0)]
    ax.errorbar(x, mean, yerr=yerr, marker="o", ms=3, capsize=3, label=label)


def _draw_head_to_head(methods: Methods, baseline: str, metric: str, ax: Any, kind: str) -> None:
    _, ylabel, scale, reference = HEAD_TO_HEAD[metric]
    for m, b in methods.items():
        c = b["curves"].get(f"{metric}@{kind}")
        if c is not None:
            plot_interval(ax, c, f"{m} vs {m} (next seed)" if m == baseline else m, scale)
    ax.axhline(reference, color="grey", lw=1, ls="--")
    if metric == "win_rate" and kind == PAPER_KIND:
        paper = [100 * v for v in PAPER_WIN_RATE.values()]
        ax.plot(list(PAPER_WIN_RATE), paper, "k*", ms=10, label="paper (Llama 3.1 8B, AlpacaEval)")
    xlabel = "γ (noise std / σ_E)" if kind != "neftune" else "NEFTune α (noise α/√(n·d))"
    ax.set(xlabel=xlabel, ylabel=ylabel.format(baseline=baseline), title=kind)
    ax.legend(fontsize=7)


def head_to_head_figures(
    methods: Methods, baseline: str, n_seeds: int, run_dir: Path
) -> list[dict[str, str]]:
    """``win-rate.png`` and ``delta-nll.png``: each method against ``baseline`` of the same seed, per noise
    kind, with seed-level 95 % intervals."""
    seeds_text = f"{n_seeds} seeds" if n_seeds > 1 else "one seed: over examples only"
    out: list[dict[str, str]] = []
    for metric, (fname, ylabel, _, _) in HEAD_TO_HEAD.items():
        caption = (
            f"{ylabel.format(baseline=baseline)} against the noise level, each method against {baseline} of "
            f"the same seed and {baseline} against itself on the next seed (the null control); seed-level "
            f"95 % intervals ({seeds_text})"
        )
        draw = partial(_draw_head_to_head, methods, baseline, metric)
        out += panel_figure(run_dir, f"figures/{fname}", noise_kinds(methods), draw, caption, legend=None)
    return out


def constrained_layers(methods: Methods) -> list[int] | None:
    """The constrained layers of the first method that has them (every constrained method shares them)."""
    return next(
        (
            seed_facts(b)[0].get("constrained_layers")
            for b in methods.values()
            if seed_facts(b) and seed_facts(b)[0].get("constrained_layers")
        ),
        None,
    )


def _draw_profile(methods: Methods, reference: Mapping[str, Any], ax: Any, cond: str) -> None:
    if cond == "clean":
        p = reference["held_profile"]
        ax.plot(range(1, len(p)), p[1:], "k--", lw=1.5, label="pretrained")
    for m, b in methods.items():
        p = b.get("layer_loss", {}).get(cond)
        if p:
            ax.plot(range(1, len(p)), p[1:], marker=".", ms=3, label=m)
    if layers := constrained_layers(methods):
        ax.axvspan(min(layers) - 0.5, max(layers) + 0.5, color="orange", alpha=0.08, label="constrained")
    ax.set(xlabel="layer l (1..L; layer 0 omitted)", ylabel="logit-lens loss (nats)", title=cond)
    ax.legend(fontsize=7)


def layer_profile_figure(
    methods: Methods, reference: Mapping[str, Any], profile_condition: str | None, run_dir: Path
) -> list[dict[str, str]]:
    """``layer-profiles.png``: the per-layer logit-lens loss on held-out examples, clean (with the
    pretrained model's) and at the profile condition."""
    if not (methods and reference.get("held_profile")):
        return []
    conds = ["clean"] + ([profile_condition] if profile_condition else [])
    caption = "Per-layer logit-lens loss on held-out examples: pretrained, then each fine-tune"
    draw = partial(_draw_profile, methods, reference)
    return panel_figure(run_dir, "figures/layer-profiles.png", conds, draw, caption, legend=None)


def _draw_lambda(ax: Any, method_runs: tuple[str, list[Mapping[str, Any]]]) -> None:
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


def lambda_figure(methods: Methods, run_dir: Path) -> list[dict[str, str]]:
    """``lambda.png``: λ_l of the constrained layers over training, one panel per constrained method (the
    seeds whose trace has the first seed's steps)."""
    traced = [
        (m, runs) for m, b in methods.items() if (runs := [r for r in seed_facts(b) if r.get("lambda_trace")])
    ]
    caption = (
        "Multipliers λ_l of the constrained layers over training: the mean over the evaluation seeds (thick), "
        "each seed (thin)"
    )
    return panel_figure(run_dir, "figures/lambda.png", traced, _draw_lambda, caption, legend=None)


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


def val_loss_figure(methods: Methods, run_dir: Path) -> list[dict[str, str]]:
    """``val-loss.png``: the validation loss over training of every fine-tune on an evaluation seed."""
    if not any(r.get("val_curve") for b in methods.values() for r in seed_facts(b)):
        return []
    caption = (
        "Validation loss over training, every fine-tune on an evaluation seed (one line per seed): converged "
        "when it changes by < 2 % over the last doubling of steps"
    )
    draw = partial(_draw_val_loss, methods)
    return panel_figure(run_dir, "figures/val-loss.png", ["convergence"], draw, caption, legend=None)


__all__ = [
    "figures",
    "head_to_head_figures",
    "lambda_figure",
    "layer_profile_figure",
    "val_loss_figure",
]
