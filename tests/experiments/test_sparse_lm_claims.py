"""sparse-lm's claim math on synthetic cells with a known answer: the OLS indicator, the paired rows, the checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from descentlab.report.sparse_lm_claims import (
    evaluate_claims,
    ols_indicator,
    relative_spread,
    seed_spread_checks,
)

XS = [0.0, 0.5, 0.9]


def test_ols_indicator_recovers_a_known_optimizer_effect_at_equal_dense_loss():
    rng = np.random.default_rng(0)
    dense = rng.uniform(3.0, 4.0, 30)
    groups = ["adamw", "horst", "ham"] * 10
    effect = {"adamw": 0.0, "horst": -0.05, "ham": 0.02}
    damage = 0.1 + 0.3 * dense + np.array([effect[g] for g in groups])
    exact = ols_indicator(damage, dense, groups, reference="adamw")
    assert exact["coef"]["horst"] == pytest.approx(-0.05, abs=1e-10)
    assert exact["coef"]["ham"] == pytest.approx(0.02, abs=1e-10) and exact["coef"]["dense"] == pytest.approx(
        0.3
    )
    noisy = ols_indicator(damage + rng.normal(0, 0.01, 30), dense, groups, reference="adamw")
    lo, hi = noisy["ci"]["horst"]
    assert lo < -0.05 < hi and hi < 0 and noisy["dof"] == 26
    # a naive difference of group means is confounded when HORST's runs are the better-trained ones
    skewed = dense + np.array([-0.5 if g == "horst" else 0.0 for g in groups])
    damage2 = 0.1 + 0.3 * skewed + np.array([effect[g] for g in groups])
    naive = damage2[np.array(groups) == "horst"].mean() - damage2[np.array(groups) == "adamw"].mean()
    assert naive < -0.15
    assert ols_indicator(damage2, skewed, groups, reference="adamw")["coef"]["horst"] == pytest.approx(-0.05)
    with pytest.raises(ValueError, match="full-rank"):
        ols_indicator([0.1, 0.2, 0.3], [1.0, 2.0, 3.0], ["adamw", "horst", "horst"], reference="adamw")


def test_seed_spread_is_max_minus_min_over_mean_of_the_dense_validation_ppl():
    jobs = [{"val_nll": [math.log(p)]} for p in (100.0, 102.0, 104.0)]
    (row,) = seed_spread_checks({"adamw": jobs}, 0.03)
    assert row["spread"] == pytest.approx(4 / 102) and row["verdict"] == "not met"
    assert seed_spread_checks({"adamw": jobs[:2]}, 0.03)[0]["verdict"] == "met"
    assert seed_spread_checks({"adamw": jobs[:1]}, 0.03)[0]["verdict"] == "untested (one seed)"
    assert relative_spread([5.0]) == 0.0


def _cells(gap_lo: float, gap_hi: float, seed: int):
    """AdamW cells with a known pruning damage, and HORST shifted by ``gap_lo`` at 50 %, ``gap_hi`` at 90 %."""
    rng = np.random.default_rng(seed)
    base = rng.normal(5.0, 0.3, (3, 1, 200))
    a = np.concatenate([base, base + 0.05, base + 0.3], axis=1) + rng.normal(0, 0.01, (3, 3, 200))
    h = a + np.array([0.0, gap_lo, gap_hi])[None, :, None] + rng.normal(0, 0.01, (3, 3, 200))
    return {"adamw": a, "horst": h, "ham": a + 0.02}


def test_paired_rows_find_a_planted_gap_and_its_widening():
    rows = evaluate_claims(_cells(-0.01, -0.08, 0), XS, lo=0.5, hi=0.9, n_boot=300)
    by = {(r["claim"], r["sparsity"]): r for r in rows}
    assert by["control", 0.9]["verdict"] == "reproduced" and by["control", 0.9]["estimate"] == pytest.approx(
        0.25, abs=0.01
    )
    assert by["horst-beats-adamw", 0.9]["verdict"] == "reproduced"
    assert by["horst-beats-adamw", 0.9]["estimate"] == pytest.approx(-0.08, abs=0.005)
    assert by["horst-beats-adamw", 0.0]["verdict"] == "inconclusive"  # no planted difference when dense
    assert by["gap-widens", 0.9]["estimate"] == pytest.approx(-0.07, abs=0.005)
    assert by["gap-widens", 0.9]["verdict"] == "reproduced" and by["damage", 0.9]["verdict"] == "reproduced"
    assert by["horst-beats-ham", 0.9]["verdict"] == "reproduced" and by["horst-beats-ham", 0.9]["shape"] == [
        3,
        200,
    ]
    # the other way round: HORST worse after pruning, the same rows are refuted
    worse = {
        (r["claim"], r["sparsity"]): r
        for r in evaluate_claims(_cells(0.01, 0.08, 1), XS, lo=0.5, hi=0.9, n_boot=300)
    }
    assert (
        worse["horst-beats-adamw", 0.9]["verdict"] == "refuted"
        and worse["gap-widens", 0.9]["verdict"] == "refuted"
    )
