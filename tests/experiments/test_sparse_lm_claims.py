"""sparse-lm's claims on synthetic cells with a known answer: a planted gap is reproduced and a null is not,
the grid slope of the matched comparison, the cells read from a run directory (a missing file pends), and
the seed-spread check."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from descentlab.experiments.sparse_lm.claims import CLAIMS, claim_arrays, grid_slope, tuning_grid
from descentlab.experiments.sparse_lm.report import relative_spread, seed_spread_checks
from descentlab.io import save_arrays
from descentlab.report.claims import NOT_IN_RUN, ONE_SEED, PENDING, UNTESTABLE, judge
from descentlab.study.cells import CellStore, Design

LEVELS = [0.0, 0.5, 0.8, 0.9]
SEEDS, BLOCKS = 8, 200


def _nll(gaps: list[float], seed: int, seeds: int = SEEDS) -> dict[str, np.ndarray]:
    """AdamW's ``[seeds, levels, blocks]`` NLLs with a known pruning damage; HORST shifted by ``gaps`` per
    level; HAM and AdamW-L2 equal to AdamW plus noise."""
    rng = np.random.default_rng(seed)
    block = rng.normal(5.0, 0.3, (1, 1, BLOCKS))
    seed_effect = rng.normal(0, 0.02, (seeds, 1, 1)) * np.array([0.0, 0.2, 1.0, 2.0])[None, :, None]
    damage = np.array([0.0, 0.06, 0.6, 1.4])[None, :, None]
    a = block + damage + seed_effect + rng.normal(0, 0.01, (seeds, len(LEVELS), BLOCKS))

    def noisy(shift: np.ndarray) -> np.ndarray:
        return a + shift + rng.normal(0, 0.01, a.shape) + rng.normal(0, 0.003, (seeds, len(LEVELS), 1))

    return {
        "nll/adamw": a,
        "nll/horst": noisy(np.asarray(gaps)[None, :, None]),
        "nll/ham": noisy(np.zeros((1, len(LEVELS), 1))),
        "nll/adamw-l2": noisy(np.zeros((1, len(LEVELS), 1))),
    }


def _grid(k: float, seed: int = 0) -> dict[str, np.ndarray]:
    """Tuning runs whose 90 % validation NLL is ``k`` times their dense one plus a per-method offset."""
    rng = np.random.default_rng(seed)
    labels = np.asarray(["adamw"] * 3 + ["horst"] * 4 + ["ham"] * 3)
    dense = rng.uniform(3.8, 4.1, labels.size)
    offset = np.select([labels == "horst", labels == "ham"], [-0.2, 0.05], 0.0)
    val = np.column_stack([dense, dense + 0.06, dense + 0.6, k * dense + 1.0 + offset])
    return {"grid/val_nll": val, "grid/label": labels}


def _store(
    nll: dict[str, np.ndarray],
    grid: dict[str, np.ndarray] | None,
    shape: dict[str, np.ndarray],
    *,
    arms: tuple[str, ...] | None = None,
    levels: list[float] = LEVELS,
    tune: bool = True,
) -> CellStore:
    """A run's cell store: ``nll/<arm>/<level>`` from ``[seeds, levels, blocks]`` arrays, the weight shape,
    and the design record (claim levels 50 / 90 %, the tuning grid)."""
    extra: dict = {"claim_low": 0.5, "claim_high": 0.9, "tune": tune}
    if grid is not None:
        extra["grid"] = {"val_nll": grid["grid/val_nll"].tolist(), "label": grid["grid/label"].tolist(),
                         "weight_decay": [None] * len(grid["grid/label"])}  # fmt: skip
    arms = arms or tuple(k.split("/")[1] for k in nll)
    seeds = next(iter(nll.values())).shape[0]
    store = CellStore(Design(arms, levels, range(seeds), BLOCKS, extra), shape)
    for key, cells in nll.items():
        for i, p in enumerate(levels):
            if key.split("/")[1] in arms:
                store.put("nll", key.split("/")[1], p, cells[:, i])
    return store


def _shape(seeds: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    out = {}
    for stat, base in (("frac_below", 0.02), ("kurtosis", 2.0)):
        out[f"{stat}/adamw"] = base + rng.normal(0, 0.001 * base, (seeds, 16))
        out[f"{stat}/horst"] = 3 * base + rng.normal(0, 0.001 * base, (seeds, 16))
    return out


def _arrays(gaps: list[float], *, seeds: int = SEEDS, k: float = 1.2, **design) -> CellStore:
    return _store(_nll(gaps, 0, seeds), _grid(k), _shape(seeds), **design)


def _rows(arrays):
    return {r.name: r for r in judge(CLAIMS, arrays)}


def test_declared_claims_one_primary_with_thresholds():
    primary = [s for s in CLAIMS if s.primary]
    assert [s.name for s in primary] == ["horst-adamw"]
    assert primary[0].direction == "less" and primary[0].sesoi == 0.05
    assert next(s for s in CLAIMS if s.name == "dense-matched").kind == "parity"
    assert all(s.threshold for s in CLAIMS)


def test_a_planted_gap_is_reproduced_and_a_null_is_not():
    rows = _rows(_arrays([0.0, -0.01, -0.1, -0.2]))
    primary = rows["horst-adamw"]
    assert primary.verdict == "reproduced" and primary.estimate == pytest.approx(-0.2, abs=0.01)
    assert primary.seeds == SEEDS and primary.examples == BLOCKS and primary.at == "sparsity 90 %"
    assert rows["horst-adamw-80"].holm_verdict == "reproduced"
    assert rows["gap-widens"].estimate == pytest.approx(-0.19, abs=0.01)
    assert rows["gap-widens"].holm_verdict == "reproduced"
    assert rows["horst-ham"].holm_verdict == rows["horst-l2"].holm_verdict == "reproduced"
    assert rows["damage-50"].estimate == pytest.approx(-0.01, abs=0.003)
    assert rows["dense-matched"].verdict == "reproduced"  # no dense difference planted: equivalence
    assert rows["control"].role == "control" and rows["control"].label == "reproduced"
    assert rows["horst-peaked"].holm_verdict == "reproduced"
    # the null: no perplexity gap planted, none reproduced (the weight shape keeps its planted 3x); HORST
    # 0.1 worse at 90 %: refuted
    null = _rows(_arrays([0.0, 0.0, 0.0, 0.0]))
    ppl = [r for r in null.values() if r.metric.startswith(("test log-perplexity", "pruning damage"))]
    assert len(ppl) == 9 and all(
        r.verdict != "reproduced" for r in ppl if r.name not in ("control", "dense-matched")
    )
    assert _rows(_arrays([0.0, 0.0, 0.05, 0.1]))["horst-adamw"].verdict == "refuted"


def test_matched_ols_removes_a_dense_difference_by_the_grid_slope():
    vals = _grid(1.7)
    assert grid_slope(vals["grid/val_nll"], vals["grid/label"], 3) == pytest.approx(1.7)
    # HORST's dense model 0.1 worse and, by the slope, 0.17 worse at 90 %: the raw gap is all slope
    arrays = _arrays([0.1, 0.1, 0.1, 0.17], k=1.7)
    rows = _rows(arrays)
    assert rows["horst-adamw"].estimate == pytest.approx(0.17, abs=0.01)
    assert (
        rows["matched-ols"].estimate == pytest.approx(0.0, abs=0.01) and "k = 1.7" in rows["matched-ols"].at
    )
    assert rows["dense-matched"].verdict == "refuted"  # 0.1 apart: not matched within 0.03
    # too few tuning runs to fit a slope: the row says why
    two = {key: v[:2] for key, v in _grid(1.7).items()}
    few = _store(_nll([0.1, 0.1, 0.1, 0.17], 0), two, _shape(SEEDS))
    assert _rows(few)["matched-ols"].verdict == UNTESTABLE


def test_missing_cells_pend_and_one_seed_is_not_judged():
    arrays = _arrays([0.0, 0.0, -0.1, -0.2])
    no_ham = CellStore(arrays.design, {k: v for k, v in arrays.items() if not k.startswith("nll/ham/")})
    rows = _rows(no_ham)
    assert rows["horst-ham"].verdict == PENDING and rows["horst-adamw"].verdict == "reproduced"
    # an arm or a sparsity the run's design never had is not in this run, not a re-run away
    not_asked = _rows(_arrays([0.0, 0.0, -0.1, -0.2], arms=("adamw", "horst", "adamw-l2")))["horst-ham"]
    assert (
        not_asked.verdict == NOT_IN_RUN
        and "no ham arm (it trained adamw, horst, adamw-l2)" in not_asked.reason
    )
    no_80 = _arrays([0.0, 0.0, -0.1, -0.2], levels=[0.0, 0.5, 0.7, 0.9])
    assert _rows(no_80)["horst-adamw-80"].verdict == NOT_IN_RUN
    assert "no condition 0.8" in _rows(no_80)["horst-adamw-80"].reason
    untuned = _rows(_store(_nll([0.0, 0.0, -0.1, -0.2], 0), None, _shape(SEEDS), tune=False))
    assert untuned["matched-ols"].verdict == NOT_IN_RUN and "no tuning round" in untuned["matched-ols"].reason
    # the run tuned but its grid is not in the record: a re-run away
    assert _rows(_store(_nll([0.0] * 4, 0), None, _shape(SEEDS)))["matched-ols"].verdict == PENDING
    one = _rows(_arrays([0.0, 0.0, -0.1, -0.2], seeds=1))
    assert one["horst-adamw"].verdict == ONE_SEED


def test_claim_arrays_reads_the_saved_nlls_of_a_run(tmp_path):
    nll = _nll([0.0, -0.01, -0.1, -0.2], 0, seeds=3)
    files = {}
    for label, cells in nll.items():
        name = label.split("/")[1]
        files[name] = [f"arrays/nll-{name}-seed{s}.npz" for s in range(3)]
        for s, f in enumerate(files[name]):
            save_arrays(tmp_path / f, test=cells[s], val=cells[s])
    grid = _grid(1.2)
    runs = [
        {"seed": 0, "label": str(lab), "val_nll": [float(x) for x in v]}
        for v, lab in zip(grid["grid/val_nll"], grid["grid/label"], strict=True)
    ]
    runs.append({"seed": 1, "label": "adamw", "val_nll": [9.0] * 4})  # an evaluation seed: not a tuning run
    results = {"config": {"sparsities": LEVELS[1:], "claim_low": 0.5, "claim_high": 0.9, "seeds": [0, 1, 2]},
               "arrays": {"nll": files}, "runs": runs}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(results))
    arrays = claim_arrays(tmp_path)  # a run before the cell store: read by legacy.py
    assert arrays.get("nll", "horst", 0.9).shape == (3, BLOCKS) and tuning_grid(arrays)["val_nll"].shape == (
        10,
        4,
    )
    assert np.array_equal(arrays.get("nll", "adamw", 0.8), nll["nll/adamw"][:, 2])
    assert arrays.design.extra["claim_high"] == 0.9 and arrays.design.conditions == ("0", "0.5", "0.8", "0.9")
    rows = _rows(arrays)
    assert rows["horst-adamw"].estimate == pytest.approx(
        float((nll["nll/horst"] - nll["nll/adamw"])[:, 3].mean())
    )
    assert rows["horst-peaked"].verdict == PENDING  # no arrays/shape.npz: the committed run's case
    (tmp_path / files["ham"][1]).unlink()
    assert _rows(claim_arrays(tmp_path))["horst-ham"].verdict == PENDING
    # the config asked for ham and its file is gone: still a re-run away; without ham, not in this run
    results["config"]["methods"] = ["adamw", "horst", "ham"]
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert _rows(claim_arrays(tmp_path))["horst-ham"].verdict == PENDING
    results["config"]["methods"] = ["adamw", "horst"]
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert _rows(claim_arrays(tmp_path))["horst-ham"].verdict == NOT_IN_RUN
    assert claim_arrays(tmp_path / "nowhere") == {}


def test_seed_spread_is_max_minus_min_over_mean_of_the_dense_validation_ppl():
    jobs = [{"val_nll": [math.log(p)]} for p in (100.0, 102.0, 104.0)]
    (row,) = seed_spread_checks({"adamw": jobs}, 0.03)
    assert row["spread"] == pytest.approx(4 / 102) and row["verdict"] == "not met"
    assert seed_spread_checks({"adamw": jobs[:2]}, 0.03)[0]["verdict"] == "met"
    assert seed_spread_checks({"adamw": jobs[:1]}, 0.03)[0]["verdict"] == "untested (one seed)"
    assert relative_spread([5.0]) == 0.0
