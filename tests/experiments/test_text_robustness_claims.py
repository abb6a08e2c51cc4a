"""text-robustness's claims on synthetic per-review arrays with a known answer: the engine finds a planted
effect against the matched control, finds none where there is none, marks the monotone claim untestable when
ERM already descends, and says "pending re-run" when the arrays are missing; the cell store a run saves and
the files of runs made before it (``legacy.py``) judge alike."""

from __future__ import annotations

import numpy as np
import pytest

from descentlab.experiments.text_robustness import legacy
from descentlab.experiments.text_robustness.claims import (
    CLAIMS,
    CONTROL,
    CORRECT,
    LOSS,
    claim_arrays,
    layer_rise,
    rise,
)
from descentlab.io import save_arrays
from descentlab.report.claims import NOT_IN_RUN, ONE_SEED, PENDING, UNDERPOWERED, UNTESTABLE, judge
from descentlab.study.cells import CellStore, Design

GAMMAS = [0.0, 1.0, 2.0]
KINDS = ["gaussian", "uniform"]
SEEDS, REVIEWS, LAYERS = 5, 400, 6


def _correct(rng: np.random.Generator, p_clean: float, p_noisy: float, seeds: int = SEEDS) -> np.ndarray:
    """Correctness [seed, draw 2, γ 3, review]: each seed's model shifted by N(0, 0.01); γ = 0 draws equal."""
    out = np.empty((seeds, 2, len(GAMMAS), REVIEWS), dtype=np.float32)
    for s in range(seeds):
        shift = rng.normal(0.0, 0.01)
        out[s, :, 0] = rng.random(REVIEWS) < p_clean + shift
        out[s, :, 1:] = rng.random((2, len(GAMMAS) - 1, REVIEWS)) < p_noisy + shift
    return out


def _losses(rng: np.random.Generator, spike: float = 0.0, seeds: int = SEEDS) -> np.ndarray:
    """Per-review loss [seed, L+1, review]: a descending profile, plus ``spike`` at layer 4."""
    profile = np.linspace(0.7, 0.4, LAYERS + 1)
    profile[4] += spike
    return (profile[None, :, None] + rng.normal(0.0, 0.05, (seeds, LAYERS + 1, REVIEWS))).astype(np.float32)


def _arrays(
    noisy: dict[str, float],
    *,
    erm_spike: float = 0.0,
    seeds: int = SEEDS,
    val_profile: np.ndarray | None = None,
) -> CellStore:
    """The cell store of a run of the methods in ``noisy`` (accuracy at γ >= 1; clean accuracy 0.8)."""
    rng = np.random.default_rng(0)
    extra = {"gammas": GAMMAS} | ({} if val_profile is None else {"erm_val_profile": val_profile.tolist()})
    store = CellStore(Design(tuple(noisy), tuple(KINDS), tuple(range(seeds)), REVIEWS, extra))
    for m, p in noisy.items():
        for kind in KINDS:
            store.put(CORRECT, m, kind, _correct(rng, 0.8, p, seeds))
        store.put(LOSS, m, None, _losses(rng, erm_spike if m == "erm" else 0.0, seeds))
    return store


ALL = ["erm", CONTROL, "deep-supervision", "constrained", "resilient", "erm-noise"]


def _rows(arrays: CellStore) -> dict[tuple[str, str, str, str], object]:
    return {(c.name, c.method, c.reference, c.at): c for c in judge(CLAIMS, arrays)}


def test_a_planted_gain_against_the_matched_control_is_reproduced() -> None:
    noisy = dict.fromkeys(ALL, 0.6) | {"constrained": 0.68, "erm-noise": 0.7}
    rows = _rows(_arrays(noisy))
    primary = rows["graceful-gaussian", "constrained", CONTROL, "gaussian, γ >= 1"]
    assert primary.role == "primary" and primary.verdict == "reproduced" and primary.holm_verdict is None
    assert primary.estimate == pytest.approx(0.08, abs=0.02)
    assert primary.seeds == SEEDS and primary.examples == REVIEWS
    assert primary.estimate > 2 * primary.min_detectable_effect
    assert rows["graceful", "constrained", CONTROL, "uniform, γ >= 1"].verdict == "reproduced"
    # the resilient method gains nothing: not reproduced; the positive control gains 0.1: reproduced
    assert rows["graceful", "resilient", CONTROL, "gaussian, γ >= 1"].verdict != "reproduced"
    for kind in KINDS:
        assert rows["positive-control", "erm-noise", "erm", f"{kind}, γ >= 1"].label == "reproduced"
    # the primary is one comparison and is not repeated among the secondary rows
    assert ("graceful", "constrained", CONTROL, "gaussian, γ >= 1") not in rows
    assert all(c.holm_verdict is not None for c in rows.values() if c.role == "secondary")
    # the controls are judged unadjusted, outside the secondary rows' Holm family
    controls = {c.name for c in rows.values() if c.role == "control"}
    assert controls == {"positive-control", "null-control", "beats-deep-supervision"}
    assert all(c.holm_verdict is None for c in rows.values() if c.role == "control")


def test_no_effect_is_not_reproduced_and_a_clear_loss_is_refuted() -> None:
    rows = _rows(_arrays(dict.fromkeys(ALL, 0.6)))
    assert rows["graceful-gaussian", "constrained", CONTROL, "gaussian, γ >= 1"].verdict != "reproduced"
    assert rows["positive-control", "erm-noise", "erm", "gaussian, γ >= 1"].verdict != "reproduced"
    # a constrained model 0.1 worse than the control under noise: every gain of interest is excluded
    rows = _rows(_arrays(dict.fromkeys(ALL, 0.6) | {"constrained": 0.5}))
    assert rows["graceful-gaussian", "constrained", CONTROL, "gaussian, γ >= 1"].verdict == "refuted"
    assert rows["beats-deep-supervision", "constrained", "deep-supervision", "gaussian, γ >= 1"].verdict == (
        "refuted"
    )


def test_clean_parity_is_an_equivalence_claim() -> None:
    arrays = _arrays(dict.fromkeys(ALL, 0.6))
    control = arrays.get(CORRECT, CONTROL, "gaussian")
    # the same clean predictions but for one review won in seed 0 and one lost in seed 1: equivalent
    near = control.copy()
    near[0, :, 0, np.flatnonzero(control[0, 0, 0] == 0)[0]] = 1.0
    near[1, :, 0, np.flatnonzero(control[1, 0, 0] == 1)[0]] = 0.0
    arrays.put(CORRECT, "constrained", "gaussian", near)
    rows = _rows(arrays)
    parity = rows["clean-parity", "constrained", CONTROL, "clean"]
    assert parity.estimate == 0.0 and parity.verdict == "reproduced" and parity.high < 0.003
    # 5 points lower on clean reviews: wholly outside the 0.3-point margin
    worse = control.copy()
    worse[:, :, 0, :20] = 0.0
    worse[:, :, 0, 20:40] = 0.0
    arrays.put(CORRECT, "constrained", "gaussian", worse)
    won = control.copy()
    won[:, :, 0, :40] = 1.0
    arrays.put(CORRECT, CONTROL, "gaussian", won)
    rows = _rows(arrays)
    assert rows["clean-parity", "constrained", CONTROL, "clean"].verdict == "refuted"
    # independent models differing by sampling noise alone are not shown equivalent at 0.3 points: the
    # design's equivalence MDE is wider than the margin
    assert rows["clean-parity", "resilient", "erm", "clean"].verdict == UNDERPOWERED


def test_monotone_is_untestable_when_erm_already_descends() -> None:
    rows = _rows(_arrays(dict.fromkeys(ALL, 0.6)))
    row = rows["monotone", "constrained", "erm", "clean per-layer test loss"]
    assert row.verdict == UNTESTABLE and "already rises by only" in row.reason
    # ERM spikes at layer 4 (+0.1 nats), the constrained model descends: reproduced
    rows = _rows(_arrays(dict.fromkeys(ALL, 0.6), erm_spike=0.1))
    row = rows["monotone", "constrained", "erm", "clean per-layer test loss"]
    assert row.verdict == "reproduced" and row.estimate == pytest.approx(-0.05, abs=0.01)
    assert row.seeds == SEEDS and row.examples == REVIEWS
    assert rise(np.array([0.7, 0.71, 0.5, 0.52])) == pytest.approx(0.03)
    # each review's share of the rise averages, per seed, to exactly the rise of that seed's profile
    arrays = _arrays(dict.fromkeys(ALL, 0.6), erm_spike=0.1)
    np.testing.assert_allclose(
        layer_rise(arrays, "erm").mean(axis=-1), rise(arrays.get(LOSS, "erm").mean(axis=-1)), atol=1e-6
    )


def test_monotone_is_untestable_when_erms_validation_profile_never_rises() -> None:
    # ERM spikes on test (testable on its test profile alone), but its validation profile never rises
    flat_then_down = np.array([0.7, 0.7, 0.6, 0.55, 0.5, 0.45, 0.4])  # p_l <= p_{l-1}: ties count
    row = _rows(_arrays(dict.fromkeys(ALL, 0.6), erm_spike=0.1, val_profile=flat_then_down))[
        "monotone", "constrained", "erm", "clean per-layer test loss"
    ]
    assert row.verdict == UNTESTABLE and "validation loss (tuning seed) is already monotone" in row.reason
    # one rise anywhere in the validation profile: judged on the test cells as before
    rising = flat_then_down.copy()
    rising[3] = 0.61
    row = _rows(_arrays(dict.fromkeys(ALL, 0.6), erm_spike=0.1, val_profile=rising))[
        "monotone", "constrained", "erm", "clean per-layer test loss"
    ]
    assert row.verdict == "reproduced"


def test_missing_arrays_give_pending_rows() -> None:
    rows = judge(CLAIMS, {})
    assert {c.verdict for c in rows} == {PENDING}
    assert sorted(c.name for c in rows) == sorted(s.name for s in CLAIMS)
    # a run that saved its arrays but trained no λ ≡ 0 control arm: the primary is not in this run, and
    # says which arm it lacks
    without = _arrays(dict.fromkeys([m for m in ALL if m != CONTROL], 0.6))
    primary = next(c for c in judge(CLAIMS, without) if c.role == "primary")
    assert primary.verdict == NOT_IN_RUN and CONTROL in primary.reason
    # the design has the control, but the run saved none of its cells: the primary pends until a re-run
    store = _arrays(dict.fromkeys(ALL, 0.6))
    unsaved = CellStore(store.design, {k: v for k, v in store.items() if f"/{CONTROL}/" not in k})
    primary = next(c for c in judge(CLAIMS, unsaved) if c.role == "primary")
    assert primary.verdict == PENDING and f"{CORRECT}/{CONTROL}/gaussian" in primary.reason


def test_one_seed_is_never_judged() -> None:
    rows = _rows(_arrays(dict.fromkeys(ALL, 0.6) | {"constrained": 0.75}, seeds=1))
    assert rows["graceful-gaussian", "constrained", CONTROL, "gaussian, γ >= 1"].verdict == ONE_SEED


def test_claim_arrays_reads_the_cell_store_the_run_saves(tmp_path) -> None:
    store = _arrays(dict.fromkeys(ALL, 0.6) | {"constrained": 0.7}, val_profile=np.linspace(0.7, 0.4, 7))
    store.save(tmp_path)
    read = claim_arrays(tmp_path)
    assert isinstance(read, CellStore) and read.design == store.design and set(read) == set(store)
    assert [c.to_dict() for c in judge(CLAIMS, read)] == [c.to_dict() for c in judge(CLAIMS, store)]
    assert claim_arrays(tmp_path / "no-such-run") == {}


def test_a_run_from_before_the_cell_store_is_read_from_its_old_files(tmp_path) -> None:
    """The committed run's layout: ``examples.npz`` (``gammas``, ``<m>__<kind>``), ``layer_loss.npz``
    (``<m>``) and ``erm-val-profile.npz`` (``profile``), no design record."""
    store = _arrays(dict.fromkeys(ALL, 0.6) | {"constrained": 0.7}, erm_spike=0.1)
    old = {"gammas": np.asarray(GAMMAS)} | {f"{m}__{k}": store.get(CORRECT, m, k) for m in ALL for k in KINDS}
    save_arrays(tmp_path / legacy.EXAMPLES, **old)
    save_arrays(tmp_path / legacy.LAYER_LOSS, **{m: store.get(LOSS, m) for m in ALL})
    read = claim_arrays(tmp_path)
    assert read.design.arms == tuple(ALL) and read.conditions() == KINDS and read.design.examples == REVIEWS
    assert [c.to_dict() for c in judge(CLAIMS, read)] == [c.to_dict() for c in judge(CLAIMS, store)]
    # ERM's validation profile, when the run saved it, makes the monotone claim untestable as before
    save_arrays(tmp_path / legacy.ERM_VAL_PROFILE, profile=np.linspace(0.7, 0.4, LAYERS + 1))
    read = claim_arrays(tmp_path)
    assert read.design.extra["erm_val_profile"] == pytest.approx(np.linspace(0.7, 0.4, 7).tolist())
    row = _rows(read)["monotone", "constrained", "erm", "clean per-layer test loss"]
    assert row.verdict == UNTESTABLE and "validation loss (tuning seed) is already monotone" in row.reason
