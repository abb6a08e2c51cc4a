"""The budget curve of the video-denoising study: is a constrained model's gain over ERM a budget effect?

ERM and the constrained labels retrain with the setting each chose on validation (first seed) at longer
step budgets S, each on its own cosine schedule over S steps. At every budget, each non-ERM label is compared
with ERM *of the same budget* by the claims of :mod:`descentlab.report.video_claims` (paired bootstrap over
test sequences; one seed, so the CI covers sequences only). A gain that shrinks to nothing as S grows was
a budget effect: the constrained objective reached sooner what ERM reaches later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from descentlab.report.video_claims import evaluate_claims

BudgetKey = tuple[str, str, int]  # (architecture, label, steps)


def budget_curve(
    jobs: Mapping[BudgetKey, Mapping[str, Any]],
    errors: Mapping[BudgetKey, np.ndarray],
    gammas: Sequence[float],
    *,
    margin: float,
    n_boot: int,
) -> dict[str, Any]:
    """``rows``: per (architecture, label, steps) the validation RMSE and the test RMSE at every γ; ``claims``:
    :func:`~descentlab.report.video_claims.evaluate_claims` at each budget, every row tagged with its
    ``steps``. ``jobs`` and ``errors`` (``[1, G, L+1, N]`` per-sequence MSE) share their keys."""
    rows = [
        {
            "architecture": a,
            "label": lab,
            "steps": s,
            "val_rmse": job["val_rmse"],
            "test_rmse": list(job["rmse"]),
        }
        for (a, lab, s), job in sorted(jobs.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1] != "erm"))
    ]
    claims = []
    for steps in sorted({s for _, _, s in errors}):
        at = {f"{a}-{lab}": e for (a, lab, s), e in errors.items() if s == steps}
        claims += [{**c, "steps": steps} for c in evaluate_claims(at, gammas, margin=margin, n_boot=n_boot)]
    return {"rows": rows, "claims": claims}


def budget_tables(curve: Mapping[str, Any], gammas: Sequence[float]) -> list[dict[str, Any]]:
    """Two report tables of a :func:`budget_curve`: the RMSE of every (architecture, method, steps), and every
    claim at every budget with its CI, verdict and minimum detectable effect."""
    rmse = {
        "title": "Budget curve: validation and test RMSE of the chosen settings (seed 0) at each step budget",
        "columns": ["architecture", "method", "steps", "val RMSE", *[f"test gamma={g:g}" for g in gammas]],
        "rows": [
            [r["architecture"].upper(), r["label"], r["steps"], f"{r['val_rmse']:.4f}",
             *[f"{x:.4f}" for x in r["test_rmse"]]]
            for r in curve["rows"]
        ],
    }  # fmt: skip
    claims = {
        "title": "Budget curve: each claim against ERM of the same budget (paired bootstrap over test sequences)",
        "columns": ["method", "steps", "claim", "estimate [95 % CI]", "verdict", "MDE"],
        "rows": [
            [c["method"], c["steps"], c["claim"], f"{c['estimate']:+.4g} [{c['ci'][0]:+.4g}, {c['ci'][1]:+.4g}]",
             c["verdict"], f"{c['min_detectable_effect']:.3g}"]
            for c in curve["claims"]
        ],
    }  # fmt: skip
    return [rmse, claims]
