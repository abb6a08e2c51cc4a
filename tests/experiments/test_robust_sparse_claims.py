"""robust-sparse's claims on synthetic per-review correctness with a known answer, judged by the engine."""

from __future__ import annotations

import numpy as np
import pytest

from descentlab.experiments.robust_sparse import claims as rs
from descentlab.report.claims import DEGENERATE, NOT_IN_RUN, ONE_SEED, PENDING, judge
from descentlab.study.cells import CellStore, Design

GAMMAS = np.asarray([0.0, 1.0, 2.0])
LEVELS = (0.0, 0.5)


def _cells(rng: np.random.Generator, p_clean: np.ndarray, p_noisy: np.ndarray) -> np.ndarray:
    """Correctness [seed, draw 2, γ 3, review 400] with per-seed rates: clean draws identical."""
    seeds = len(p_clean)
    out = np.empty((seeds, 2, 3, 400), dtype=np.uint8)
    clean = rng.random((seeds, 400)) < p_clean[:, None]
    out[:, :, 0] = clean[:, None]
    out[:, :, 1:] = rng.random((seeds, 2, 2, 400)) < p_noisy[:, None, None, None]
    return out


def _arrays(seeds: int = 6, gain: float = 0.15, arms: tuple[str, ...] | None = None) -> CellStore:
    """Every method at both levels; constrained methods +``gain`` under noise, erm-adamw prunes worse, the
    noise-trained control +0.1 under noise; training seeds move every method's rates together."""
    rng = np.random.default_rng(0)
    seed_shift = rng.normal(0, 0.02, seeds)
    rates = {  # method -> level -> (clean, noisy)
        rs.ERM_HORST: {0.0: (0.80, 0.55), 0.5: (0.70, 0.50)},
        rs.CON_HORST: {0.0: (0.80, 0.55 + gain), 0.5: (0.70, 0.50 + gain)},
        rs.ERM_ADAMW: {0.0: (0.80, 0.55), 0.5: (0.60, 0.45)},  # loses 0.2 clean to pruning, HORST 0.1
        rs.CON_ADAMW: {0.0: (0.80, 0.55 + gain), 0.5: (0.60, 0.45 + gain)},
        rs.NOISE_HORST: {0.0: (0.78, 0.65), 0.5: (0.70, 0.60)},
    }
    design = Design(arms or tuple(rates), LEVELS, range(seeds), 400, {"gammas": GAMMAS.tolist()})
    store = CellStore(design)
    for m, per in rates.items():
        for s, (clean, noisy) in per.items():
            if m in design.arms:
                store.put(rs.CORRECT, m, s, _cells(rng, clean + seed_shift, noisy + seed_shift))
    return store


def _rows(arrays: CellStore) -> dict[tuple[str, str], object]:
    return {(r.name, r.at): r for r in judge(rs.CLAIMS, arrays)}


def test_planted_effects_are_reproduced_at_every_level() -> None:
    rows = _rows(_arrays())
    assert set(rows) == {
        ("robust-sparsest", "sparsity 0.5"), ("robust", "sparsity 0"),
        ("robust-adamw", "sparsity 0"), ("robust-adamw", "sparsity 0.5"),
        ("robust-and-sparse", "sparsity 0"), ("robust-and-sparse", "sparsity 0.5"),
        ("prunable", "sparsity 0.5"), ("control-noise", "sparsity 0"), ("control-noise", "sparsity 0.5"),
        ("control-pruning", "sparsity 0.5"),
    }  # fmt: skip
    primary = rows["robust-sparsest", "sparsity 0.5"]
    assert primary.role == "primary" and primary.verdict == "reproduced"
    assert primary.estimate == pytest.approx(0.15, abs=0.03) and primary.seeds == 6
    assert primary.threshold == rs.SESOI == 0.01
    prunable = rows["prunable", "sparsity 0.5"]
    assert prunable.verdict == "reproduced" and prunable.estimate == pytest.approx(0.1, abs=0.03)
    control = rows["control-pruning", "sparsity 0.5"]
    assert control.verdict == "reproduced" and control.direction == "less"
    assert control.estimate == pytest.approx(-0.2, abs=0.03)
    assert rows["control-noise", "sparsity 0"].verdict == "reproduced"


def test_no_effect_is_never_reproduced_and_identical_seeds_are_degenerate() -> None:
    same = _arrays(gain=0.0)
    same.put(rs.CORRECT, rs.CON_HORST, 0.5, same.get(rs.CORRECT, rs.ERM_HORST, 0.5))  # the same model
    rows = _rows(same)
    assert rows["robust-sparsest", "sparsity 0.5"].estimate == 0.0
    # every seed the same difference: a zero-width interval is degenerate, not a refutation
    assert rows["robust-sparsest", "sparsity 0.5"].verdict == DEGENERATE
    assert rows["robust", "sparsity 0"].verdict != "reproduced"


def test_one_seed_is_not_judged_and_a_missing_method_is_pending() -> None:
    arrays = _arrays(seeds=1)
    rows = _rows(arrays)
    assert rows["robust-sparsest", "sparsity 0.5"].verdict == ONE_SEED
    # designed but not saved: pending; not designed: not in this run (the design record tells them apart)
    full = _arrays()
    partial = CellStore(
        full.design, {k: v for k, v in full.items() if not k.startswith(f"correct/{rs.CON_ADAMW}/")}
    )
    rows = _rows(partial)
    assert (
        rows["robust-adamw", ""].verdict == PENDING and "constrained-adamw" in rows["robust-adamw", ""].reason
    )
    assert rows["robust-sparsest", "sparsity 0.5"].verdict == "reproduced"
    without = _rows(_arrays(arms=(rs.ERM_HORST, rs.CON_HORST, rs.ERM_ADAMW, rs.NOISE_HORST)))
    assert (
        without["robust-adamw", ""].verdict == NOT_IN_RUN
        and "no constrained-adamw arm" in without["robust-adamw", ""].reason
    )
    assert without["robust-sparsest", "sparsity 0.5"].verdict == "reproduced"
    assert {r.verdict for r in judge(rs.CLAIMS, {})} == {PENDING}


def test_cells_and_bad_grids() -> None:
    c = np.zeros((1, 2, 3, 5))
    c[0, :, 1:, :2] = 1.0
    c[0, :, 0, 4] = 1.0
    assert rs.robust_cells(c, GAMMAS).shape == (1, 2, 5)
    assert rs.robust_cells(c, GAMMAS)[0, 0].tolist() == [1, 1, 0, 0, 0]
    assert rs.clean_cells(c).tolist() == [[0, 0, 0, 0, 1]]
    with pytest.raises(ValueError, match="no level >= 1"):
        rs.robust_cells(c, [0.0, 0.5, 0.7])
    assert rs.levels(CellStore(Design(("a",), (0.7, 0.0)))) == [0.0, 0.7]


def test_the_committed_run_is_judged_from_its_saved_arrays() -> None:
    from pathlib import Path

    run_dir = Path(__file__).parents[2] / "docs" / "results" / "robust-sparse"
    arrays = rs.claim_arrays(run_dir)  # a run before the cell store: read by legacy.py
    assert isinstance(arrays, CellStore) and arrays.design.arms == (
        "erm-horst", "constrained-horst", "erm-adamw", "constrained-adamw", "erm-noise-horst"
    )  # fmt: skip
    assert arrays.get(rs.CORRECT, "erm-horst", 0.7).shape == (3, 2, 3, 800)
    rows = _rows(arrays)
    primary = rows["robust-sparsest", "sparsity 0.7"]
    # the mean over (seed, draw, review) of the committed cells: constrained-horst − erm-horst at 70 %
    gammas = arrays.design.extra["gammas"]
    a = rs.robust_cells(arrays.get(rs.CORRECT, "constrained-horst", 0.7), gammas)
    b = rs.robust_cells(arrays.get(rs.CORRECT, "erm-horst", 0.7), gammas)
    assert primary.estimate == pytest.approx(float((a - b).mean()), abs=1e-12)
    assert primary.seeds == 3 and primary.examples == 800
