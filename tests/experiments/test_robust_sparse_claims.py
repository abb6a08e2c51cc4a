"""robust-sparse claims on synthetic per-review correctness with a known answer."""

from __future__ import annotations

import numpy as np
import pytest

from descentlab.report.robust_sparse_claims import clean_cells, evaluate_claims, robust_cells

GAMMAS = [0.0, 1.0, 2.0]
LEVELS = [0.0, 0.5]


def _cells(rng: np.random.Generator, p_clean: float, p_noisy: float) -> np.ndarray:
    """Correctness [seed 3, draw 2, γ 3, review 400]: clean draws identical, noisy ones at p_noisy."""
    out = np.empty((3, 2, 3, 400), dtype=np.uint8)
    clean = rng.random((3, 400)) < p_clean
    out[:, :, 0] = clean[:, None]
    out[:, :, 1:] = rng.random((3, 2, 2, 400)) < p_noisy
    return out


def test_claims_find_a_planted_effect_and_none_where_there_is_none() -> None:
    rng = np.random.default_rng(0)
    correct = {
        "erm-horst": [_cells(rng, 0.8, 0.6), _cells(rng, 0.7, 0.55)],
        "constrained-horst": [_cells(rng, 0.8, 0.75), _cells(rng, 0.7, 0.7)],  # +0.15 at γ >= 1
        "erm-adamw": [_cells(rng, 0.8, 0.6), _cells(rng, 0.6, 0.5)],  # prunes worse: -0.2 against -0.1
    }
    claims = {(c["claim"], c["sparsity"]): c for c in evaluate_claims(correct, LEVELS, GAMMAS, n_boot=500)}
    assert set(claims) == {
        ("robust", 0.0), ("robust", 0.5), ("robust-and-sparse", 0.0), ("robust-and-sparse", 0.5),
        ("prunable", 0.5), ("control-pruning", 0.5),
    }  # fmt: skip
    assert claims["robust", 0.0]["verdict"] == claims["robust", 0.5]["verdict"] == "reproduced"
    assert claims["robust", 0.0]["estimate"] == pytest.approx(0.15, abs=0.03)
    assert claims["prunable", 0.5]["verdict"] == "reproduced"  # erm-horst loses 0.1, erm-adamw 0.2
    assert claims["prunable", 0.5]["estimate"] == pytest.approx(0.1, abs=0.04)
    control = claims["control-pruning", 0.5]
    assert control["verdict"] == "reproduced" and control["direction"] == "less"
    assert control["estimate"] == pytest.approx(-0.2, abs=0.04)
    # the same model against itself: a zero difference is never "reproduced"
    same = {"erm-horst": correct["erm-horst"], "constrained-horst": correct["erm-horst"]}
    (dense, pruned) = evaluate_claims(same, LEVELS, GAMMAS, n_boot=500)
    assert dense["estimate"] == pruned["estimate"] == 0.0 and dense["verdict"] == "inconclusive"


def test_cells_and_bad_grids() -> None:
    c = np.zeros((1, 2, 3, 5))
    c[0, :, 1:, :2] = 1.0
    c[0, :, 0, 4] = 1.0
    assert robust_cells(c, GAMMAS).shape == (1, 2, 5) and robust_cells(c, GAMMAS)[0, 0].tolist() == [
        1,
        1,
        0,
        0,
        0,
    ]
    assert clean_cells(c).tolist() == [[0, 0, 0, 0, 1]]
    with pytest.raises(ValueError, match="no level >= 1"):
        robust_cells(c, [0.0, 0.5, 0.7])
    with pytest.raises(ValueError, match="must start at 0"):
        evaluate_claims({"erm-horst": [c]}, [0.5], GAMMAS, n_boot=100)
