"""llm-robustness's figures, drawn from ``results.json`` alone: win rate and ΔNLL against the noise level
(the null control, ERM against ERM on the next seed, beside the methods), per-layer profiles, λ over
training for every constrained method (mean over the seeds, each seed thin), the validation loss over
training (the convergence check)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.llm_robustness.claims import PAPER_KIND, PAPER_WIN_RATE
from descentlab.experiments.llm_robustness.tables import seed_facts
from descentlab.report.figures import new_figure, save_figure


def _band(ax: Any, c: Mapping[str, Any], label: str, scale: float = 1.0) -> None:
    x = np.asarray(c["x"], dtype=float)
    mean = np.asarray(c["mean"]) * scale
    lo, hi = np.asarray(c["ci_low"]) * scale, np.asarray(c["ci_high"]) * scale
    # the mean and the interval are computed apart (p.mean() vs 1/2 + the interval's mean): clip the rounding
    yerr = [np.maximum(mean - lo, 0.0), np.maximum(hi - mean, 0.0)]
    ax.errorbar(x, mean, yerr=yerr, marker="o", ms=3, capsize=3, label=label)


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """Win rate and ΔNLL against the level with CIs, per-layer profiles, λ over training."""
    methods = results.get("methods", {})
    baseline = results.get("config", {}).get("baseline", "erm")
    kinds = sorted(
        {
            n.partition("@")[2]
            for b in methods.values()
            for n in b.get("curves", {})
            if n.startswith("win_rate@")
        }
    )
    out: list[dict[str, str]] = []
    figdir = Path(run_dir) / "figures"
    n_seeds = len(results.get("seeds") or results.get("protocol", {}).get("seeds") or [0])
    seeds_text = f"{n_seeds} seeds" if n_seeds > 1 else "one seed: over examples only"
    if kinds:
        for metric, fname, ylabel in (
            ("win_rate", "win-rate.png", f"win rate vs {baseline} (%)"),
            ("delta_nll", "delta-nll.png", f"ΔNLL per token vs {baseline} (nats)"),
        ):
            fig, axes = new_figure(1, len(kinds))
            for ax, kind in zip(axes[0], kinds, strict=True):
                for m, b in methods.items():
                    c = b["curves"].get(f"{metric}@{kind}")
                    if c is not None:
                        label = f"{m} vs {m} (next seed)" if m == baseline else m
                        _band(ax, c, label, 100.0 if metric == "win_rate" else 1.0)
                ax.axhline(50.0 if metric == "win_rate" else 0.0, color="grey", lw=1, ls="--")
                if metric == "win_rate" and kind == PAPER_KIND:
                    ax.plot(
                        list(PAPER_WIN_RATE),
                        [100 * v for v in PAPER_WIN_RATE.values()],
                        "k*",
                        ms=10,
                        label="paper (Llama 3.1 8B, AlpacaEval)",
                    )
                xl = "γ (noise std / σ_E)" if kind != "neftune" else "NEFTune α (noise α/√(n·d))"
                ax.set(xlabel=xl, ylabel=ylabel, title=kind)
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7)
            fig.tight_layout()
            save_figure(fig, figdir / fname)
            out.append(
                {
                    "path": f"figures/{fname}",
                    "caption": f"{ylabel} against the noise level, each method against {baseline} of the same "
                    f"seed and {baseline} against itself on the next seed (the null control); seed-level 95 % "
                    f"intervals ({seeds_text})",
                }
            )
    prof = results.get("profile_condition")
    ref = results.get("reference", {})
    if methods and ref.get("held_profile"):
        conds = ["clean"] + ([prof] if prof else [])
        fig, axes = new_figure(1, len(conds))
        for ax, cond in zip(axes[0], conds, strict=True):
            if cond == "clean":
                p = ref["held_profile"]
                ax.plot(range(1, len(p)), p[1:], "k--", lw=1.5, label="pretrained")
            for m, b in methods.items():
                p = b.get("layer_loss", {}).get(cond)
                if p:
                    ax.plot(range(1, len(p)), p[1:], marker=".", ms=3, label=m)
            layers = next(
                (
                    seed_facts(b)[0].get("constrained_layers")
                    for b in methods.values()
                    if seed_facts(b) and seed_facts(b)[0].get("constrained_layers")
                ),
                None,
            )
            if layers:
                ax.axvspan(
                    min(layers) - 0.5, max(layers) + 0.5, color="orange", alpha=0.08, label="constrained"
                )
            ax.set(xlabel="layer l (1..L; layer 0 omitted)", ylabel="logit-lens loss (nats)", title=cond)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        save_figure(fig, figdir / "layer-profiles.png")
        out.append(
            {
                "path": "figures/layer-profiles.png",
                "caption": "Per-layer logit-lens loss on held-out examples: pretrained, then each fine-tune",
            }
        )
    traced = {
        m: runs for m, b in methods.items() if (runs := [r for r in seed_facts(b) if r.get("lambda_trace")])
    }
    if traced:
        fig, axes = new_figure(1, len(traced))
        for ax, (m, runs) in zip(axes[0], traced.items(), strict=True):
            steps = runs[0]["lambda_trace"]["steps"]
            lams = [
                np.asarray(r["lambda_trace"]["lambda"]) for r in runs if r["lambda_trace"]["steps"] == steps
            ]
            mean = np.mean(lams, axis=0)
            layers = runs[0].get("constrained_layers") or list(range(1, mean.shape[1] + 1))
            for layer in layers:
                (line,) = ax.plot(steps, mean[:, layer - 1], lw=1.5, label=f"λ_{layer}")
                if len(lams) > 1:
                    for lam in lams:
                        ax.plot(steps, lam[:, layer - 1], lw=0.5, alpha=0.35, color=line.get_color())
            ax.set(xlabel="step", ylabel="λ", title=f"{m} ({len(lams)} seed{'s' if len(lams) > 1 else ''})")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        save_figure(fig, figdir / "lambda.png")
        out.append(
            {
                "path": "figures/lambda.png",
                "caption": "Multipliers λ_l of the constrained layers over training: the mean over the evaluation "
                "seeds (thick), each seed (thin)",
            }
        )
    curves = {
        m: runs for m, b in methods.items() if (runs := [r for r in seed_facts(b) if r.get("val_curve")])
    }
    if curves:
        fig, axes = new_figure(1, 1)
        ax = axes[0][0]
        for m, runs in curves.items():
            color = None
            for i, r in enumerate(runs):
                c = r["val_curve"]
                (line,) = ax.plot(c["steps"], c["loss"], lw=1, marker=".", ms=3, color=color,
                                  label=m if i == 0 else None)  # fmt: skip
                color = line.get_color()
        ax.set(xlabel="step", ylabel="validation loss (nats per token)", title="convergence")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        save_figure(fig, figdir / "val-loss.png")
        out.append(
            {
                "path": "figures/val-loss.png",
                "caption": "Validation loss over training, every fine-tune on an evaluation seed (one line per "
                "seed): converged when it changes by < 2 % over the last doubling of steps",
            }
        )
    return out


__all__ = ["figures"]
