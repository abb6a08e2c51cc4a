"""robust-sparse claims: is a model trained under the descent constraints still more robust once pruned, and
does HORST make one-shot pruning cheaper? Each a paired bootstrap 95 % CI and a verdict.

Cells. ``correct[m][i]`` is method m's 0/1 correctness ``[seed, draw, γ, example]`` at the i-th requested
sparsity (``levels[0] = 0``, the dense model). Every method is evaluated on the same test reviews under the
same content-keyed noise and shares the training seeds, so cell (seed, draw, γ, example) of one method pairs
with the same cell of another. With Γ = {γ >= 1}, the robust accuracy of a cell is its mean over Γ
(``[seed, draw, example]``); the clean correctness is γ = 0, draw 0 (``[seed, example]``); the damage of
pruning to level s is clean(s) - clean(0), per example.

Claims, each at every level s, for the labels present (a − b, all "greater": a better):

1. ``robust``: constrained-horst − erm-horst, robust accuracy. The constraint's robustness survives pruning.
2. ``robust-adamw``: constrained-adamw − erm-adamw, the same with AdamW (separates the constraint from HORST).
3. ``robust-and-sparse``: constrained-horst − erm-adamw, robust accuracy: the combination against the
   baseline a practitioner starts from.
4. ``prunable`` (s > 0): damage of erm-horst − damage of erm-adamw, clean: HORST's L1 bias makes one-shot
   magnitude pruning cost less.
5. ``control-noise``: erm-noise-horst (ERM trained on Gaussian embedding noise) − erm-horst, robust accuracy:
   the positive control of robustness; a run that cannot see it cannot see claim 1.
6. ``control-pruning`` (highest level only): erm-adamw's clean accuracy at s − at 0, "less": pruning
   costs accuracy here, so claim 4 has a loss to recover.

Verdicts: :func:`~descentlab.report.stats.verdict` (reproduced / refuted / inconclusive, with the minimum
detectable effect).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from descentlab.report.stats import BootstrapCI, claim_row, paired_bootstrap

ERM_HORST, CON_HORST = "erm-horst", "constrained-horst"
ERM_ADAMW, CON_ADAMW = "erm-adamw", "constrained-adamw"
NOISE_HORST = "erm-noise-horst"

DESCRIPTIONS = {
    "robust": "constrained beats ERM (HORST) at gamma >= 1",
    "robust-adamw": "constrained beats ERM (AdamW) at gamma >= 1",
    "robust-and-sparse": "constrained HORST beats ERM AdamW at gamma >= 1",
    "prunable": "HORST loses less clean accuracy to pruning than AdamW",
    "control-noise": "noise-trained ERM beats ERM at gamma >= 1 (positive control)",
    "control-pruning": "pruning costs clean accuracy (AdamW; the loss claim 'prunable' recovers)",
}

# (claim, a, b, cells, direction, levels: "all" | "pruned" | "highest")
_PAIRS = (
    ("robust", CON_HORST, ERM_HORST, "robust", "greater", "all"),
    ("robust-adamw", CON_ADAMW, ERM_ADAMW, "robust", "greater", "all"),
    ("robust-and-sparse", CON_HORST, ERM_ADAMW, "robust", "greater", "all"),
    ("prunable", ERM_HORST, ERM_ADAMW, "damage", "greater", "pruned"),
    ("control-noise", NOISE_HORST, ERM_HORST, "robust", "greater", "all"),
)


def robust_cells(correct: np.ndarray, gammas: Sequence[float]) -> np.ndarray:
    """Mean correctness over γ >= 1: ``[seed, draw, γ, example]`` -> ``[seed, draw, example]``."""
    noisy = [g for g, gamma in enumerate(gammas) if gamma >= 1.0]
    if not noisy:
        raise ValueError(f"the γ grid {list(gammas)} has no level >= 1 to average robust accuracy over")
    return np.asarray(correct, dtype=np.float64)[:, :, noisy, :].mean(axis=2)


def clean_cells(correct: np.ndarray) -> np.ndarray:
    """Clean correctness ``[seed, example]`` (γ = 0 is the first level; every draw of it is the same input)."""
    return np.asarray(correct, dtype=np.float64)[:, 0, 0, :]


def _row(claim: str, s: float, a: str, b: str, ci: BootstrapCI, means: tuple[float, float], direction: str):
    head = {"claim": claim, "sparsity": s, "a": a, "b": b, "description": DESCRIPTIONS[claim]}
    return {**head, **claim_row(ci, direction, means)}  # type: ignore[arg-type]


def evaluate_claims(
    correct: Mapping[str, Sequence[np.ndarray]],
    levels: Sequence[float],
    gammas: Sequence[float],
    *,
    n_boot: int,
) -> list[dict[str, Any]]:
    """The claims of the module docs whose methods were run.

    Args:
        correct: label -> per requested sparsity (``levels`` order), the correctness ``[seed, draw, γ, example]``.
        levels: the requested sparsities; ``levels[0]`` must be 0 (the dense model the damage is taken from).
        gammas: the γ grid (with 0 first).
        n_boot: bootstrap replicates.
    """
    if float(levels[0]) != 0.0 or float(gammas[0]) != 0.0:
        raise ValueError(f"levels and gammas must start at 0 (dense, clean), got {levels[0]}, {gammas[0]}")

    def cells(label: str, kind: str, i: int) -> np.ndarray:
        if kind == "robust":
            return robust_cells(correct[label][i], gammas)
        return clean_cells(correct[label][i]) - clean_cells(correct[label][0])  # damage

    rows = []
    for claim, a, b, kind, direction, where in _PAIRS:
        if a not in correct or b not in correct:
            continue
        for i, s in enumerate(levels):
            if where == "pruned" and i == 0:
                continue
            ca, cb = cells(a, kind, i), cells(b, kind, i)
            ci = paired_bootstrap(ca, cb, n_boot=n_boot)
            rows.append(_row(claim, float(s), a, b, ci, (float(ca.mean()), float(cb.mean())), direction))
    if ERM_ADAMW in correct and len(levels) > 1:
        top, dense = clean_cells(correct[ERM_ADAMW][-1]), clean_cells(correct[ERM_ADAMW][0])
        ci = paired_bootstrap(top, dense, n_boot=n_boot)
        means = (float(top.mean()), float(dense.mean()))
        rows.append(_row("control-pruning", float(levels[-1]), ERM_ADAMW, ERM_ADAMW, ci, means, "less"))
    return rows


def claims_table(claims: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every claim row: accuracy differences (robust: mean over γ >= 1; damage and control: clean)."""
    rows = []
    for c in claims:
        lo, hi = c["ci"]
        pair = f"{c['a']} − {c['b']}" if c["a"] != c["b"] else f"{c['a']}: s={c['sparsity']:g} − s=0"
        rows.append(
            [
                c["claim"],
                f"{c['sparsity']:g}",
                pair,
                f"{c['a_mean']:.4f} vs {c['b_mean']:.4f}",
                f"{c['estimate']:+.4f} [{lo:+.4f}, {hi:+.4f}]",
                c["verdict"],
                f"{c['min_detectable_effect']:.3f}",
            ]
        )
    return {
        "title": "Claims: paired 95 % bootstrap CI of a − b over (seed, draw, review) cells (robust accuracy: "
        "mean over γ >= 1) or (seed, review) cells (clean accuracy; prunable: damage = clean(s) − clean(0))",
        "columns": ["claim", "sparsity", "a − b", "a vs b", "difference [95 % CI]", "verdict", "MDE"],
        "rows": rows,
    }


def claim_notes(claims: Sequence[Mapping[str, Any]]) -> list[str]:
    """One sentence per claim."""
    notes = []
    for c in claims:
        est, lo, hi = (format(x, "+.4f") for x in (c["estimate"], *c["ci"]))
        notes.append(
            f"{c['claim']} at sparsity {c['sparsity']:g} ({c['description']}; {c['a']} − {c['b']}): "
            f"{est} [{lo}, {hi}]: {c['verdict']} ({c['reason']})."
        )
    return notes
