"""The verdict rules are exclusive and monotone: widening an interval (Holm's adjustment, a higher level)
only moves a verdict toward less information, never to its opposite; degenerate intervals are not judged;
a diverged arm counts against itself; exploratory rows never read as a refutation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from descentlab.report.claims import (
    DEGENERATE,
    EXPLORATORY_WORDS,
    Cells,
    ClaimSpec,
    judge,
    judge_cells,
)
from descentlab.report.stats import (
    OUTCOME_ORDER,
    UNDERPOWERED,
    WIDENING,
    ClaimTests,
    PairedInterval,
    VariancePiece,
    claim_tests,
    holm,
    outcome,
    paired_interval,
    sd_upper_bound,
    seeds_needed,
)


def _iv(mean: float, se: float, seeds: int = 5) -> PairedInterval:
    return PairedInterval(mean, (VariancePiece(se**2, seeds - 1, "seeds"),), seeds, 1, (seeds,))


def _tests(iv: PairedInterval, kind: str, direction: str, threshold: float) -> ClaimTests:
    key = {"directional": "sesoi", "sized": "size", "parity": "margin"}[kind]
    return claim_tests(iv, kind, direction=direction, **{key: threshold})  # type: ignore[arg-type]


claims = st.tuples(
    st.floats(-3, 3),  # mean
    st.floats(0.01, 2),  # se
    st.integers(2, 30),  # seeds
    st.sampled_from(["directional", "sized", "parity"]),
    st.sampled_from(["greater", "less"]),
    st.floats(0.01, 2),  # SESOI / size / margin
)


@settings(max_examples=400, deadline=None)
@given(claims, st.floats(1.0, 4.0))
def test_a_wider_interval_never_turns_a_verdict_into_its_opposite(claim, widen) -> None:
    mean, se, seeds, kind, direction, threshold = claim
    narrow = outcome(_tests(_iv(mean, se, seeds), kind, direction, threshold), 0.05)
    wide = outcome(_tests(_iv(mean, se * widen, seeds), kind, direction, threshold), 0.05)
    assert wide in WIDENING[narrow], (narrow, wide)


@settings(max_examples=300, deadline=None)
@given(claims, st.floats(0.001, 0.05))
def test_a_higher_level_never_turns_a_verdict_into_its_opposite(claim, alpha) -> None:
    mean, se, seeds, kind, direction, threshold = claim
    tests = _tests(_iv(mean, se, seeds), kind, direction, threshold)
    at_05, stricter = outcome(tests, 0.05), outcome(tests, alpha)
    assert stricter in WIDENING[at_05]


@settings(max_examples=200, deadline=None)
@given(st.lists(claims, min_size=2, max_size=8))
def test_holm_never_turns_a_verdict_into_its_opposite(family) -> None:
    tests = [_tests(_iv(m, se, s), k, d, t) for m, se, s, k, d, t in family]
    rep = holm([t.p_reproduce for t in tests])
    ref = holm([t.p_refute for t in tests])
    for t, p_rep, p_ref in zip(tests, rep, ref, strict=True):
        assert outcome(ClaimTests(p_rep, p_ref), 0.05) in WIDENING[outcome(t, 0.05)]


def test_widening_is_an_order_and_reproduced_and_refuted_never_meet() -> None:
    assert set(OUTCOME_ORDER) == set(WIDENING)
    assert "refuted" not in WIDENING["reproduced"] and "reproduced" not in WIDENING["refuted"]
    for verdict, reachable in WIDENING.items():  # moves only down the order of information
        assert all(OUTCOME_ORDER.index(r) >= OUTCOME_ORDER.index(verdict) for r in reachable)


def test_an_interval_between_zero_and_the_sesoi_is_negligible_and_holm_cannot_flip_it_to_opposites() -> None:
    # the committed case that was "reproduced" unadjusted and "refuted" after Holm: +0.0036 [+0.0004, +0.0068]
    iv = _iv(0.0036, 0.0032 / 2.776, seeds=5)
    tests = claim_tests(iv, "directional", sesoi=0.01)
    assert iv.low > 0 and iv.high < 0.01
    assert outcome(tests, 0.05) == "negligible"
    # Holm with 4 rows: the direction is no longer shown, the size still excluded -> refuted, which is
    # allowed from negligible (it kept one of its two parts)
    assert outcome(ClaimTests(min(1, 4 * tests.p_reproduce), tests.p_refute), 0.05) in WIDENING["negligible"]


def test_sized_and_parity_claims_are_never_negligible() -> None:
    for mean in np.linspace(-2, 2, 41):
        for se in (0.01, 0.1, 1.0):
            iv = _iv(float(mean), se)
            assert outcome(claim_tests(iv, "sized", size=0.5), 0.05) != "negligible"
            assert outcome(claim_tests(iv, "parity", margin=0.5), 0.05) != "negligible"


def _spec(**kw) -> ClaimSpec:
    kw.setdefault("sesoi", 0.5)
    return ClaimSpec("x", "x claim", lambda arrays: [Cells(arrays["a"], arrays["b"], "m", "r")], "acc", **kw)


def test_identical_seeds_are_degenerate_and_not_judged() -> None:
    row, tests = judge_cells(_spec(), Cells(np.full(4, 2.0), np.ones(4), "m", "r"))
    assert row.verdict == DEGENERATE and tests is None and row.estimate == 1.0
    cells = np.ones((3, 10))  # seeds x examples, every difference the same
    row, tests = judge_cells(_spec(), Cells(cells + 1, cells, "m", "r"))
    assert row.verdict == DEGENERATE and tests is None


def test_a_diverged_method_counts_against_itself_and_stays_in_holm() -> None:
    rng = np.random.default_rng(0)
    b = rng.normal(0, 0.1, 8)
    a = b + 2.0 + rng.normal(0, 0.1, 8)
    row, _ = judge_cells(_spec(), Cells(a, b, "m", "r"))
    assert row.verdict == "reproduced"
    a_diverged = a.copy()
    a_diverged[:5] = np.nan  # diverged on 5 of 8 seeds: each becomes the worst finite value of the row
    row, tests = judge_cells(_spec(), Cells(a_diverged, b, "m", "r"))
    assert row.diverged == {"m": 5, "r": 0} and "m diverged on 5 of 8 seeds" in row.reason
    assert tests is not None and row.verdict != "reproduced" and row.estimate < 2.0
    # lower is better ("less"): the worst value is the largest
    row, _ = judge_cells(_spec(direction="less"), Cells(-a_diverged, -b, "m", "r"))
    assert row.verdict != "reproduced"
    # a diverged reference counts against the reference, i.e. for the method
    row, _ = judge_cells(_spec(), Cells(b + 0.1, np.where(np.arange(8) < 4, np.inf, b), "m", "r"))
    assert row.diverged == {"m": 0, "r": 4}
    specs = [
        _spec(primary=True),
        ClaimSpec("y", "y", lambda arr: [Cells(a_diverged, b, "m", "r")], "acc", sesoi=0.5),
        ClaimSpec("z", "z", lambda arr: [Cells(a, b, "m", "r")], "acc", sesoi=0.5),
    ]
    rows = judge(specs, {"a": a, "b": b})
    assert rows[1].holm_verdict is not None and rows[1].p_reproduce is not None


def test_every_cell_diverged_is_untestable() -> None:
    row, tests = judge_cells(_spec(), Cells(np.full(3, np.nan), np.full(3, np.inf), "m", "r"))
    assert tests is None and "diverged in every cell" in row.reason


def test_an_exploratory_row_never_reads_refuted_and_is_outside_holm() -> None:
    scope = "the paper leaves p = ∞ open"
    a = np.linspace(0.70, 0.76, 10)
    spec = ClaimSpec(
        "inf",
        "sign",
        lambda arr: [Cells(a, np.zeros(10), "m", "0")],
        "ratio",
        kind="sized",
        size=0.9,
        exploratory=scope,
    )
    row, _ = judge_cells(spec, Cells(a, np.zeros(10), "m", "0"))
    assert row.role == "exploratory" and row.verdict == EXPLORATORY_WORDS["refuted"]
    assert row.reason.startswith(f"{scope}; here: ") and "refuted" not in row.verdict
    rows = judge([_spec(primary=True), spec], {"a": np.ones(4) + np.arange(4), "b": np.zeros(4)})
    assert rows[1].holm_verdict is None and rows[1].label == EXPLORATORY_WORDS["refuted"]
    with pytest.raises(ValueError, match="exploratory"):
        ClaimSpec("p", "p", spec.cells, "ratio", kind="sized", size=0.9, exploratory=scope, primary=True)


def test_an_inconclusive_row_says_how_many_seeds_would_decide_it() -> None:
    diff = np.array([-0.8, 0.2, 1.2])  # a small effect, three noisy seeds
    row, _ = judge_cells(_spec(sesoi=0.5), Cells(diff, np.zeros(3), "m", "r"))
    # its MDE (≈ 3.7) exceeds the SESOI: inconclusive, and underpowered
    assert row.verdict == UNDERPOWERED and row.seeds_needed is not None and row.seeds_needed > 3
    assert f"about {row.seeds_needed} seeds" in row.reason
    iv = paired_interval(diff, np.zeros(3))
    # at the answer the MDE reaches the SESOI, one seed fewer it does not
    n = seeds_needed(iv, 0.5)
    assert n is not None and _mde_with_seeds(iv, n) <= 0.5 < _mde_with_seeds(iv, n - 1)


def _mde_with_seeds(iv: PairedInterval, n: int) -> float:
    from scipy.stats import t

    (piece,) = iv.pieces
    return (t.ppf(0.975, n - 1) + t.ppf(0.8, n - 1)) * math.sqrt(piece.variance * iv.seeds / n)


def test_seeds_needed_is_none_when_the_example_piece_alone_is_too_wide() -> None:
    iv = PairedInterval(
        0.0, (VariancePiece(1e-4, 2, "seeds"), VariancePiece(1.0, 99, "examples")), 3, 100, (3, 100)
    )
    assert seeds_needed(iv, 0.1) is None


def test_sd_upper_bound_matches_the_chi_square_bound_and_covers_by_simulation() -> None:
    assert sd_upper_bound(1.0, 3) == pytest.approx(2.117, abs=1e-3)  # the "about 2.1x at 3 seeds"
    rng = np.random.default_rng(0)
    sds = rng.normal(size=(20_000, 3)).std(axis=1, ddof=1)
    covered = np.mean([sd_upper_bound(s, 3) >= 1.0 for s in sds])
    assert abs(covered - 0.8) < 3 * math.sqrt(0.8 * 0.2 / 20_000)
    with pytest.raises(ValueError):
        sd_upper_bound(1.0, 1)


def test_no_committed_row_reads_reproduced_inside_the_sesoi_or_carries_opposite_verdicts() -> None:
    import json
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "docs" / "results"
    rows = [
        row
        for path in results.glob("**/results.json")
        for row in json.loads(path.read_text()).get("claims", [])
        if "role" in row
    ]
    assert rows
    for row in rows:
        verdicts = {row["verdict"], row.get("holm_verdict") or row["verdict"]}
        assert verdicts != {"reproduced", "refuted"}, row["name"]
        if row["kind"] == "directional" and row["verdict"] == "reproduced" and row["low"] is not None:
            sign = 1.0 if row["direction"] == "greater" else -1.0
            low, high = sorted((sign * row["low"], sign * row["high"]))
            assert not (low > 0 and high < row["threshold"]), row["name"]
        if row["verdict"] in ("reproduced", "refuted", "negligible", "inconclusive"):
            assert row["low"] < row["high"], row["name"]  # never judged on a zero-width interval
