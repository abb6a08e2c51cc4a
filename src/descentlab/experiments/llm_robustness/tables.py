"""llm-robustness's tables, from a results body alone (the claims table is the engine's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from descentlab.study.tables import Table, signed_ci
from descentlab.study.tables import ci as interval
from descentlab.train.tuning import binding_level


def _fmt_ci(x: float, ci: Sequence[float], pct: bool) -> str:
    if pct:
        return f"{100 * x:.1f} % {interval(ci[0], ci[1], 1, scale=100)}"
    return signed_ci(x, ci[0], ci[1])


def seed_facts(block: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A method block's fine-tunes, one per evaluation seed (a run saved before the seeds had one dict)."""
    train = block.get("train", [])
    return [dict(train)] if isinstance(train, Mapping) else [dict(t) for t in train]


def _mean(values: Sequence[Any]) -> float:
    kept = [float(v) for v in values if v is not None]
    return sum(kept) / len(kept) if kept else float("nan")


def _binding(facts: Mapping[str, Any]) -> float | None:
    trace = facts.get("lambda_trace")
    return binding_level(trace["steps"], trace["lambda"]) if trace else None


def tables(results: Mapping[str, Any], baseline: str) -> list[dict[str, Any]]:
    """Grid, perplexity, head-to-head, fine-tuning and selection tables of a results body."""
    methods = results["methods"]
    out = [
        grid_table(results["grid"], methods[baseline]["curves"]),
        perplexity_table(methods),
        head_to_head_table(methods, baseline),
        training_table(methods),
    ]
    selection = results.get("selection") or {}
    if selection.get("rows"):
        out.append(selection_table(selection, baseline))
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
            ratio = held["mean"][held["x"].index(level)] / held["mean"][0] if level in held["x"] else None
            table.add(
                kind, f"x{target:g}", f"{level:.4g}", f"{near:.3g}", "" if ratio is None else f"{ratio:.3g}"
            )
    return table


def perplexity_table(methods: Mapping[str, Any]) -> Table:
    """Each method's held-out perplexity at every level of every noise kind."""
    table = Table("Held-out perplexity (level: value)", ["method", "kind", "levels"])
    for m, block in methods.items():
        for name, c in block["curves"].items():
            if name.startswith("perplexity@"):
                values = "; ".join(f"{x:g}: {v:.2f}" for x, v in zip(c["x"], c["mean"], strict=True))
                table.add(m, name.partition("@")[2], values)
    return table


def head_to_head_table(methods: Mapping[str, Any], baseline: str) -> Table:
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
                    _fmt_ci(c["mean"][i], [c["ci_low"][i], c["ci_high"][i]], True),
                    "" if per_seed is None else ", ".join(f"{100 * w:.1f}" for w in per_seed[i]),
                    f"{c['wins'][i]} / {c['ties'][i]} / {c['losses'][i]}",
                    _fmt_ci(d["mean"][i], [d["ci_low"][i], d["ci_high"][i]], False),
                )
    return table


def training_table(methods: Mapping[str, Any]) -> Table:
    """The fine-tunes of every method over the evaluation seeds: cost, loss, convergence, λ, binding."""
    table = Table(
        "Fine-tuning, over the evaluation seeds: mean s / step and final train loss; validation loss "
        "change over the last doubling of steps per seed (converged: |change| < 2 %); max lambda; binding "
        "(time-average of the sum of lambda over the second half of training, mean over seeds)",
        [
            "method",
            "seeds",
            "steps",
            "s / step",
            "final train loss",
            "val loss, last doubling",
            "max lambda",
            "binding",
            "constrained layers",
            "candidate",
            "training noise",
        ],
    )
    for m, block in methods.items():
        if runs := seed_facts(block):
            table.add(m, *_training_row(runs))
    return table


def _training_row(runs: Sequence[Mapping[str, Any]]) -> list[Any]:
    t = runs[0]
    lams = [max(r["multipliers"]) for r in runs if r.get("multipliers")]
    binds = [b for r in runs if (b := _binding(r)) is not None]
    changes = [r["val_curve"]["last_doubling_change"] for r in runs if r.get("val_curve")]
    if all(c is None for c in changes):  # too few points for a doubling (or no curve)
        changes = []
    return [
        len(runs),
        t.get("steps"),
        f"{_mean([r.get('seconds_per_step') for r in runs]):.2f}",
        f"{_mean([r.get('final_train_loss') for r in runs]):.3f}",
        "" if not changes else ", ".join("" if c is None else f"{100 * c:+.1f} %" for c in changes),
        "" if not lams else f"{max(lams):.3f}",
        "" if not binds else f"{_mean(binds):.4f}",
        "" if not lams else str(t.get("constrained_layers")),
        t.get("candidate") or "",
        "" if not t.get("noisy_training") else f"{t['noisy_training'][0]} {t['noisy_training'][1]:g}",
    ]


def selection_table(selection: Mapping[str, Any], baseline: str) -> Table:
    """Every candidate's validation scores on the tuning seed and which one was chosen."""
    return Table(
        f"Selection on validation (tuning seed {selection.get('tune_seed')}, "
        f"{selection.get('examples')} examples): win rate against {baseline}'s tuning run, clean and "
        "over the gaussian levels; binding of the candidate's own run",
        ["method", "candidate", "clean win rate", "noisy win rate", "binding", "chosen"],
        [
            [r[0], r[1], f"{100 * r[2]:.1f} %", f"{100 * r[3]:.1f} %", _fmt_binding(r[4]), r[5]]
            for r in selection["rows"]
        ],
    )


def _fmt_binding(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, int | float) else str(value)


__all__ = [
    "grid_table",
    "head_to_head_table",
    "perplexity_table",
    "seed_facts",
    "selection_table",
    "tables",
    "training_table",
]
