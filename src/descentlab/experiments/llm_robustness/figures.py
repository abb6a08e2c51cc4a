"""llm-robustness tables and figures, drawn from ``results.json`` alone (the statistics and claims are in
:mod:`descentlab.report.llm_claims`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.report.figures import new_figure, save_figure

PAPER_WIN_RATE = {0.0: 0.50, 1.5: 0.6993}  # Llama 3.1 8B, AlpacaEval, constrained vs unconstrained
PAPER_KIND = "neftune"  # the scale the paper's γ = 1.5 is read on here (METHODS.md §4.1 "Noise scale")


def _fmt_ci(x: float, ci: Sequence[float], pct: bool) -> str:
    if pct:
        return f"{100 * x:.1f} % [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
    return f"{x:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}]"


def tables(results: Mapping[str, Any], baseline: str) -> list[dict[str, Any]]:
    """Grid, perplexity, head to head, claims and fine-tuning tables of a results body."""
    methods = results["methods"]
    grid_rows = []
    for kind, s in results["grid"]["kinds"].items():
        for target, level, near in zip(s["targets"], s["levels"], s["bracket_ratios"], strict=True):
            held = methods[baseline]["curves"][f"perplexity@{kind}"]
            ratio = held["mean"][held["x"].index(level)] / held["mean"][0] if level in held["x"] else None
            grid_rows.append(
                [kind, f"x{target:g}", f"{level:.4g}", f"{near:.3g}", "" if ratio is None else f"{ratio:.3g}"]
            )
    ppl_rows = []
    for m, block in methods.items():
        for name, c in block["curves"].items():
            if name.startswith("perplexity@"):
                ppl_rows.append(
                    [
                        m,
                        name.partition("@")[2],
                        "; ".join(f"{x:g}: {v:.2f}" for x, v in zip(c["x"], c["mean"], strict=True)),
                    ]
                )
    h2h = []
    for m, block in methods.items():
        for name, c in block["curves"].items():
            if not name.startswith("win_rate@"):
                continue
            kind = name.partition("@")[2]
            d = block["curves"][f"delta_nll@{kind}"]
            for i, x in enumerate(c["x"]):
                h2h.append(
                    [
                        m,
                        kind,
                        f"{x:g}",
                        _fmt_ci(c["mean"][i], [c["ci_low"][i], c["ci_high"][i]], True),
                        f"{c['wins'][i]} / {c['ties'][i]} / {c['losses'][i]}",
                        _fmt_ci(d["mean"][i], [d["ci_low"][i], d["ci_high"][i]], False),
                    ]
                )
    claim_rows = []
    for c in results["claims"]:
        pct = c["claim"] != "noisy-nll"
        null = c.get("vs_null")
        claim_rows.append(
            [
                c["method"],
                c["claim"],
                c["kind"],
                f"{c['level']:g}",
                f"x{c['erm_ratio']:.3g}",
                c["paper"],
                _fmt_ci(c["estimate"], c["ci"], pct),
                c["verdict"],
                f"{c['min_detectable_effect']:.3g}",
                "" if null is None else f"{_fmt_ci(null['estimate'], null['ci'], pct)}: {null['verdict']}",
                c.get("verdict_both", c["verdict"]),
            ]
        )
    train_rows = []
    for m, block in methods.items():
        t = block.get("train", {})
        lam = t.get("multipliers")
        train_rows.append(
            [
                m,
                t.get("steps"),
                f"{t.get('seconds_per_step', float('nan')):.2f}",
                f"{t.get('final_train_loss') or float('nan'):.3f}",
                "" if lam is None else f"{max(lam):.3f}",
                "" if lam is None else str(t.get("constrained_layers")),
                "" if not t.get("noisy_training") else f"{t['noisy_training'][0]} {t['noisy_training'][1]:g}",
            ]
        )
    return [
        {
            "title": "Noise levels from ERM's degradation (validation bisection; held-out ratio beside it)",
            "columns": ["kind", "target", "level", "validation ratio (bracket)", "held-out ratio"],
            "rows": grid_rows,
        },
        {
            "title": "Held-out perplexity (level: value)",
            "columns": ["method", "kind", "levels"],
            "rows": ppl_rows,
        },
        {
            "title": f"Head to head against {baseline}: win rate [95 % CI], W / T / L, per-token delta NLL [95 % CI]",
            "columns": ["method", "kind", "level", "win rate", "W / T / L", "delta NLL"],
            "rows": h2h,
        },
        {
            "title": "Claims and verdicts",
            "columns": [
                "method",
                "claim",
                "kind",
                "level",
                "ERM ppl growth",
                "paper",
                "ours [95 % CI]",
                "verdict",
                "MDE",
                "against the re-seeded ERM",
                "verdict (both ERMs)",
            ],
            "rows": claim_rows,
        },
        {
            "title": "Fine-tuning",
            "columns": [
                "method",
                "steps",
                "s / step",
                "final train loss",
                "max lambda",
                "constrained layers",
                "training noise",
            ],
            "rows": train_rows,
        },
    ]


def _band(ax: Any, c: Mapping[str, Any], label: str, scale: float = 1.0) -> None:
    x = np.asarray(c["x"], dtype=float)
    mean = np.asarray(c["mean"]) * scale
    lo, hi = np.asarray(c["ci_low"]) * scale, np.asarray(c["ci_high"]) * scale
    ax.errorbar(x, mean, yerr=[mean - lo, hi - mean], marker="o", ms=3, capsize=3, label=label)


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
                        _band(ax, c, m, 100.0 if metric == "win_rate" else 1.0)
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
                    "caption": f"{ylabel} against the noise level (95 % bootstrap CIs)",
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
                    b["train"].get("constrained_layers")
                    for b in methods.values()
                    if b.get("train", {}).get("constrained_layers")
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
        m: b["train"]["lambda_trace"] for m, b in methods.items() if b.get("train", {}).get("lambda_trace")
    }
    if traced:
        fig, axes = new_figure(1, len(traced))
        for ax, (m, t) in zip(axes[0], traced.items(), strict=True):
            lam = np.asarray(t["lambda"])
            layers = methods[m]["train"].get("constrained_layers") or list(range(1, lam.shape[1] + 1))
            for layer in layers:
                ax.plot(t["steps"], lam[:, layer - 1], lw=1, label=f"λ_{layer}")
            ax.set(xlabel="step", ylabel="λ", title=m)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        save_figure(fig, figdir / "lambda.png")
        out.append(
            {
                "path": "figures/lambda.png",
                "caption": "Multipliers λ_l of the constrained layers over training",
            }
        )
    return out


__all__ = ["PAPER_KIND", "PAPER_WIN_RATE", "figures", "tables"]
