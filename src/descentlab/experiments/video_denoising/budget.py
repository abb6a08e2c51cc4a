"""Has ERM converged, and is a constrained model's gain over ERM a budget effect?

* The budget check: ERM's chosen setting (first seed) retrained for ``budget_check`` times the steps, its
  cosine schedule stretched to match; the relative gain in validation RMSE says whether longer training
  still helps.
* The budget curve: ERM and the constrained labels retrain with the setting each chose on validation
  (first seed) at longer step budgets S, each on its own cosine schedule over S steps. Each budget's
  constrained model is judged against ERM *of the same budget* (:mod:`.claims`, ``budget-*``). A gain that
  shrinks to nothing as S grows was a budget effect: the constrained objective reached sooner what ERM
  reaches later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from descentlab.study.tables import Table

BudgetKey = tuple[str, str, int]  # (architecture, label, steps)


def budget_checks(
    budget: Mapping[str, Mapping[str, Any]],
    per_seed: Mapping[str, Sequence[Mapping[str, Any]]],
    gammas: Sequence[float],
) -> dict[str, dict[str, Any]]:
    """Per architecture: ERM's validation and test RMSE (γ = 1) at the base budget and at the longer one, and
    the relative gain ``(base - long) / base`` of the longer budget (positive: longer training still helps).

    ``budget``: architecture -> the budget-check job of its ERM (``steps``, ``base_steps`` and its
    evaluation), compared with the same seed's run at the base budget.
    """
    out = {}
    for arch, job in budget.items():
        base = per_seed[f"{arch}-erm"][0]
        one = list(gammas).index(1.0)
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


def budget_curve(jobs: Mapping[BudgetKey, Mapping[str, Any]]) -> dict[str, Any]:
    """``rows``: per (architecture, label, steps) the validation RMSE and the test RMSE at every γ, ERM first
    within a budget."""
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
    return {"rows": rows}


def budget_curve_table(curve: Mapping[str, Any], gammas: Sequence[float]) -> Table:
    """The RMSE of every (architecture, method, steps) of a :func:`budget_curve`."""
    return Table(
        "Budget curve: validation and test RMSE of the chosen settings (seed 0) at each step budget",
        ["architecture", "method", "steps", "val RMSE", *[f"test gamma={g:g}" for g in gammas]],
        [
            [r["architecture"].upper(), r["label"], r["steps"], f"{r['val_rmse']:.4f}",
             *[f"{x:.4f}" for x in r["test_rmse"]]]
            for r in curve["rows"]
        ],
    )  # fmt: skip
