"""llm-robustness's tables, from a results body alone (the claims table is the engine's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _fmt_ci(x: float, ci: Sequence[float], pct: bool) -> str:
    if pct:
        return f"{100 * x:.1f} % [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
    return f"{x:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}]"


def tables(results: Mapping[str, Any], baseline: str) -> list[dict[str, Any]]:
    """Grid, perplexity, head-to-head and fine-tuning tables of a results body."""
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
            "title": f"Head to head against {baseline}: win rate [95 % interval], W / T / L, per-token delta NLL [95 % interval]",
            "columns": ["method", "kind", "level", "win rate", "W / T / L", "delta NLL"],
            "rows": h2h,
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


__all__ = ["tables"]
