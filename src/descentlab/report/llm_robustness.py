"""llm-robustness tables and the win-rate figure, drawn from ``results.json`` alone.

Each non-baseline method's block carries ``win_rate@<kind>`` curves (likelihood judge; the pooled draw-0
head-to-head adds ``pooled_rate``, ``stderr``, ``wins``, ``ties``, ``losses`` per γ), optionally
``judged_win_rate@<kind>`` curves (generate-then-judge), and every block a ``train`` list (one entry per
seed: steps, seconds, final loss, multipliers).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from descentlab.report.figures import new_figure, save_figure

PAPER_WIN_RATE = {0.0: 0.50, 1.5: 0.6993}  # Llama 3.1 8B, AlpacaEval, constrained vs unconstrained
WIN_RATE_PREFIXES = ("win_rate@", "judged_win_rate@")

Methods = Mapping[str, Mapping[str, Any]]


def win_rate_curves(methods: Methods) -> dict[str, dict[str, Any]]:
    """``{method: {curve name: curve}}`` of the head-to-head curves, in results order (baseline has none)."""
    out: dict[str, dict[str, Any]] = {}
    for method, block in methods.items():
        curves = {n: c for n, c in block.get("curves", {}).items() if n.startswith(WIN_RATE_PREFIXES)}
        if curves:
            out[method] = curves
    return out


def head_to_head_rows(methods: Methods) -> list[list[Any]]:
    """method, kind, γ, pooled win rate, s.e., wins, ties, losses: one row per likelihood-judge point."""
    rows = []
    for method, curves in win_rate_curves(methods).items():
        for name, c in curves.items():
            if not name.startswith("win_rate@"):
                continue
            kind = name.partition("@")[2]
            rows += [
                [method, kind, *point]
                for point in zip(
                    c["x"], c["pooled_rate"], c["stderr"], c["wins"], c["ties"], c["losses"], strict=True
                )
            ]
    return rows


def paper_rows(methods: Methods) -> list[list[Any]]:
    """method, γ, the paper's win rate, ours (seed-mean at draw 0 of the first kind; gaussian at 1.5)."""
    rows = []
    for method, block in methods.items():
        metrics = block.get("metrics", {})
        if "win_rate" not in metrics:
            continue
        rows.append([method, "0", "50.00 %", f"{100 * metrics['win_rate']:.2f} %"])
        if "win_rate@gaussian1.5" in metrics:
            rows.append(
                [method, "1.5 (gaussian)", "69.93 %", f"{100 * metrics['win_rate@gaussian1.5']:.2f} %"]
            )
    return rows


def train_rows(methods: Methods) -> list[list[Any]]:
    """method, seed, steps, seconds, final loss, largest multiplier (0 without constraints)."""
    return [
        [
            m,
            t["seed"],
            t["steps"],
            t["train_seconds"],
            t["final_train_loss"],
            max(t.get("multipliers", [0.0])),
        ]
        for m, block in methods.items()
        for t in block.get("train", [])
    ]


def tables(methods: Methods, baseline: str) -> list[dict[str, Any]]:
    """The results.json ``tables`` of a run: head to head, against the paper, fine-tuning facts."""
    return [
        {
            "title": f"Head-to-head vs {baseline}, likelihood judge (pooled over seeds, draw 0)",
            "columns": ["method", "kind", "gamma", "win rate", "s.e.", "wins", "ties", "losses"],
            "rows": head_to_head_rows(methods),
        },
        {
            "title": "Against the paper",
            "columns": ["method", "gamma", "paper", "here"],
            "rows": paper_rows(methods),
        },
        {
            "title": "Fine-tuning",
            "columns": ["method", "seed", "steps", "seconds", "final loss", "max lambda"],
            "rows": train_rows(methods),
        },
    ]


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """Win rate vs γ for every method and curve (± s.e. over examples), parity, and the paper's two points."""
    curves = win_rate_curves(results.get("methods", {}))
    if not curves:
        return []
    baseline = results.get("config", {}).get("baseline", "the baseline")
    fig, axes = new_figure(figsize=(5.6, 3.8))
    ax = axes[0][0]
    for method, block in curves.items():
        for name, c in block.items():
            ax.errorbar(
                c["x"], c["mean"], yerr=c.get("stderr"), marker="o", ms=3, capsize=2, label=f"{method} {name}"
            )
    ax.axhline(0.5, color="grey", lw=1, ls="--", label="parity")
    ax.plot(list(PAPER_WIN_RATE), list(PAPER_WIN_RATE.values()), "k*", ms=10, label="paper (Llama 3.1 8B)")
    ax.set(xlabel="γ (noise std / σ_E)", ylabel=f"win rate vs {baseline}", ylim=(0, 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, Path(run_dir) / "figures" / "win-rate.png", dpi=120)
    caption = f"Head-to-head win rate vs {baseline} (± s.e. over examples); stars: the paper"
    return [{"path": "figures/win-rate.png", "caption": caption}]


__all__ = [
    "PAPER_WIN_RATE",
    "figures",
    "head_to_head_rows",
    "paper_rows",
    "tables",
    "train_rows",
    "win_rate_curves",
]
