"""The claims engine: one verdict rule for every declared claim, primary vs secondary, pending and one-seed
rows, re-judging, and a planted effect for every claim that every study declares."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from descentlab import experiments
from descentlab.report.claims import (
    EXPLORATORY_WORDS,
    NOT_IN_RUN,
    ONE_SEED,
    PENDING,
    UNTESTABLE,
    Cells,
    Claim,
    ClaimSpec,
    MissingArrays,
    claim_notes,
    claims_table,
    judge,
    judge_cells,
    require_arm,
)
from descentlab.report.stats import UNDERPOWERED, paired_interval


def _design(rng, seeds=8, examples=200, effect=0.0, scale=1.0):
    base = rng.normal(size=(seeds, examples))
    diff = scale * (
        rng.normal(size=(seeds, 1))
        + 0.5 * rng.normal(size=(1, examples))
        + 0.5 * rng.normal(size=(seeds, examples))
    )
    return base + diff + effect, base


def _pair(name):
    def cells(arrays):
        return [Cells(arrays[f"{name}_a"], arrays[f"{name}_b"], "method", "reference")]

    return cells


def _spec(name, primary=False, **kw):
    kw.setdefault("kind", "directional")
    if kw["kind"] == "directional":
        kw.setdefault("sesoi", 0.1)
    return ClaimSpec(
        name=name, description=f"{name} claim", cells=_pair(name), metric="accuracy", primary=primary, **kw
    )


def _per_seed(mean: float, sd: float = 1.0, seeds: int = 8) -> np.ndarray:
    z = np.linspace(-1, 1, seeds)
    return mean + sd * (z - z.mean()) / z.std(ddof=1)


def test_judge_rows_roles_and_holm() -> None:
    arrays = {
        "main_a": _per_seed(3.0),
        "main_b": np.zeros(8),
        "null_a": _per_seed(0.0),
        "null_b": np.zeros(8),
    }
    arrays["strong_a"], arrays["strong_b"] = _per_seed(5.0), np.zeros(8)
    specs = [_spec("main", primary=True), _spec("strong"), _spec("null")]
    rows = {r.name: r for r in judge(specs, arrays)}
    assert rows["main"].role == "primary" and rows["main"].holm_verdict is None
    assert rows["main"].verdict == "reproduced"
    assert {rows["strong"].role, rows["null"].role} == {"secondary"}
    assert rows["strong"].holm_verdict == "reproduced"
    # sd 1 over 8 seeds detects ≈ 1.0, ten times the SESOI: the design could not have decided it
    assert rows["null"].verdict == UNDERPOWERED and rows["null"].holm_verdict == UNDERPOWERED
    assert rows["null"].p_reproduce == pytest.approx(1.0)


def test_holm_turns_marginal_secondaries_inconclusive() -> None:
    # a one-sided p of about 0.01 (two-sided 0.02) is reproduced alone; four of them are not, after Holm
    marginal = _per_seed(1.0, sd=1.0)
    alone = paired_interval(marginal, np.zeros(8)).p_beyond(0.0, "above") * 2
    assert 0.0125 < alone < 0.05
    arrays = {"main_a": _per_seed(5.0), "main_b": np.zeros(8)}
    specs = [_spec("main", primary=True)]
    for i in range(4):
        arrays[f"s{i}_a"], arrays[f"s{i}_b"] = marginal, np.zeros(8)
        # SESOI 1.5 lies above the design's MDE (≈ 1.0): a Holm-inconclusive row that is not underpowered
        specs.append(_spec(f"s{i}", sesoi=1.5))
    rows = [r for r in judge(specs, arrays) if r.role == "secondary"]
    assert all(r.verdict == "reproduced" and r.holm_verdict == "inconclusive" for r in rows)
    assert all(r.p_reproduce == pytest.approx(alone) for r in rows)
    # one marginal claim alone beside the primary keeps its verdict
    rows = [r for r in judge(specs[:2], arrays) if r.role == "secondary"]
    assert rows[0].holm_verdict == "reproduced"


def test_missing_arrays_give_pending_rows() -> None:
    def missing(arrays):
        raise MissingArrays("nll-horst-seed0")

    rng = np.random.default_rng(2)
    arrays = dict(zip(("main_a", "main_b"), _design(rng, effect=1.0), strict=True))
    spec = ClaimSpec("gone", "needs an array", missing, "ppl", sesoi=0.1)
    rows = judge([_spec("main", primary=True), spec], arrays)
    assert rows[1].verdict == PENDING and "nll-horst-seed0" in rows[1].reason
    assert rows[1].estimate is None


def test_an_arm_the_design_lacks_is_not_in_this_run_and_is_not_a_re_run_away() -> None:
    def no_ham(arrays):
        require_arm(["adamw", "horst"], "ham")
        yield from ()

    rng = np.random.default_rng(2)
    arrays = dict(zip(("main_a", "main_b"), _design(rng, effect=1.0), strict=True))
    rows = judge(
        [_spec("main", primary=True), ClaimSpec("vs-ham", "needs HAM", no_ham, "ppl", sesoi=0.1)], arrays
    )
    assert rows[1].verdict == rows[1].holm_verdict == NOT_IN_RUN and rows[1].estimate is None
    assert "no ham arm (it trained adamw, horst)" in rows[1].reason and "re-run" not in rows[1].reason
    assert rows[0].verdict == "reproduced"  # the primary is judged beside it
    require_arm(["adamw", "ham"], "ham")  # an arm the run has passes


def test_one_seed_is_never_judged() -> None:
    rng = np.random.default_rng(3)
    a, b = _design(rng, seeds=1, effect=5.0)
    row, tests = judge_cells(_spec("x"), Cells(a, b, "m", "r"))
    assert row.verdict == ONE_SEED and tests is None
    assert row.estimate == pytest.approx(float((a - b).mean()))


def test_untestable_rows_say_why() -> None:
    rng = np.random.default_rng(4)
    a, b = _design(rng)
    spec = ClaimSpec(
        "mono", "monotone", _pair("x"), "loss", kind="untestable", reason="ERM is already monotone"
    )
    row, _ = judge_cells(spec, Cells(a, b, "m", "r"))
    assert row.verdict == UNTESTABLE and "already monotone" in row.reason
    row, _ = judge_cells(_spec("x"), Cells(a, b, "m", "r", untestable="the statistic sits at its bound 0"))
    assert row.verdict == UNTESTABLE and "bound" in row.reason


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"kind": "directional", "sesoi": None}, "sesoi"),
        ({"kind": "sized"}, "size"),
        ({"kind": "parity"}, "margin"),
        ({"kind": "untestable"}, "reason"),
        ({"kind": "bigger"}, "kind must be"),
        ({"kind": "untestable", "reason": "r", "primary": True}, "primary"),
    ],
)
def test_a_spec_declares_what_its_kind_needs(kw, match) -> None:
    with pytest.raises(ValueError, match=match):
        ClaimSpec("c", "d", _pair("c"), "m", **kw)


def test_a_study_has_exactly_one_primary() -> None:
    with pytest.raises(ValueError, match="exactly one primary"):
        judge([_spec("a"), _spec("b")], {})
    with pytest.raises(ValueError, match="unique"):
        judge([_spec("a", primary=True), _spec("a")], {})


def test_rows_round_trip_and_render() -> None:
    rng = np.random.default_rng(5)
    arrays = dict(zip(("main_a", "main_b"), _design(rng, effect=1.0), strict=True))
    rows = judge([_spec("main", primary=True, paper="76.83 vs 68.86", source="Table 2")], arrays)
    assert [Claim.from_dict(r.to_dict()) for r in rows] == rows
    table = claims_table(rows)
    assert table["rows"][0][0].startswith("**main**") and table["rows"][0][-1] == "76.83 vs 68.86"
    assert claim_notes(rows)[0].startswith("primary main")


# --- every study's declared claims --------------------------------------------------------------------


def _declared() -> list[tuple[str, ClaimSpec]]:
    return [(name, spec) for name in experiments.available() for spec in experiments.get(name).claims]


def test_every_study_with_claims_declares_one_primary() -> None:
    for name in experiments.available():
        specs = experiments.get(name).claims
        if specs:
            assert sum(s.primary for s in specs) == 1, name
            for s in specs:
                if s.kind == "directional":
                    assert s.sesoi is not None and s.sesoi > 0, (name, s.name)


def _planted(spec: ClaimSpec, null: bool) -> Cells:
    """Cells with a planted effect of 3x the design's MDE on the claimed side (parity: a difference of 0 at
    an MDE of a third of the margin), or the null (no effect; parity: 3 margins off)."""
    rng = np.random.default_rng(zlib.crc32(spec.name.encode()))
    a0, b = _design(rng, seeds=10)
    a0 = (
        a0 - (a0 - b).mean()
    )  # noise with a mean difference of exactly 0: the null is never "reproduced" by chance
    scale = 1.0
    iv = paired_interval(a0, b)
    if spec.kind == "parity":
        scale = spec.margin / (3 * iv.min_detectable_effect())
        effect = 3 * spec.margin if null else 0.0
    else:
        sign = 1.0 if spec.direction == "greater" else -1.0
        # beyond the SESOI too: an effect short of it is (rightly) "negligible", not "reproduced"
        base = spec.size if spec.kind == "sized" else spec.sesoi
        effect = 0.0 if null else sign * (base + 3 * iv.min_detectable_effect())
    return Cells(b + scale * (a0 - b) + effect, b, "method", "reference")


@pytest.mark.parametrize(
    ("study", "spec"),
    [pytest.param(n, s, id=f"{n}:{s.name}") for n, s in _declared() if s.kind != "untestable"]
    or [pytest.param(None, None, marks=pytest.mark.skip(reason="no study declares claims yet"))],
)
def test_planted_effect_is_reproduced_and_null_is_not(study, spec) -> None:
    reproduced = EXPLORATORY_WORDS["reproduced"] if spec.exploratory else "reproduced"
    row, _ = judge_cells(spec, _planted(spec, null=False))
    assert row.verdict == reproduced, (study, spec.name, row.reason)
    row, _ = judge_cells(spec, _planted(spec, null=True))
    assert row.verdict != reproduced, (study, spec.name, row.reason)


def test_one_seed_scalar_cells_are_labelled_without_an_interval() -> None:
    row, tests = judge_cells(_spec("x"), Cells(np.array([3.0]), np.array([2.0]), "m", "r"))
    assert row.verdict == ONE_SEED and tests is None and row.estimate == 1.0 and row.low is None
    spec = ClaimSpec("u", "d", _pair("u"), "ppl", kind="untestable", reason="ERM unmoved")
    row, _ = judge_cells(spec, Cells(np.array([3.0]), np.array([2.0]), "m", "r"))
    assert row.verdict == UNTESTABLE and "ERM unmoved" in row.reason


def test_controls_are_judged_outside_the_holm_family() -> None:
    marginal = _per_seed(1.0, sd=1.0)
    arrays = {"main_a": _per_seed(5.0), "main_b": np.zeros(8)}
    specs = [_spec("main", primary=True)]
    for i in range(4):
        arrays[f"s{i}_a"], arrays[f"s{i}_b"] = marginal, np.zeros(8)
        specs.append(_spec(f"s{i}", control=i == 0, sesoi=1.5))
    rows = {r.name: r for r in judge(specs, arrays)}
    assert (
        rows["s0"].role == "control" and rows["s0"].holm_verdict is None and rows["s0"].label == "reproduced"
    )
    # three secondaries in the family, not four: 3p ~ 0.06 still fails, but the control kept its verdict
    assert [rows[f"s{i}"].holm_verdict for i in (1, 2, 3)] == ["inconclusive"] * 3
    with pytest.raises(ValueError, match="control"):
        _spec("bad", primary=True, control=True)


def test_no_comparison_is_not_in_run_and_a_non_finite_cell_counts_against_its_arm() -> None:
    empty = ClaimSpec("none", "no arms", lambda arrays: [], "ppl", sesoi=0.1)
    arrays = {"main_a": _per_seed(5.0), "main_b": np.zeros(8)}
    rows = judge([_spec("main", primary=True), empty], arrays)
    assert rows[1].verdict == NOT_IN_RUN and "none of the arms" in rows[1].reason
    bad = np.array([1.0, np.inf, 2.0])
    row, tests = judge_cells(_spec("x"), Cells(bad, np.zeros(3), "m", "r"))
    assert tests is not None and row.diverged == {"m": 1, "r": 0}
    assert "m diverged on 1 of 3 seeds" in row.reason
    # the diverged cell took the row's worst finite value (0, the reference's) on the "greater" side
    assert row.estimate == pytest.approx(1.0)


def test_pairing_is_the_seed_variance_left_after_sharing_a_seed_between_arms() -> None:
    from descentlab.report.claims import pairing_ratio

    rng = np.random.default_rng(3)
    seed = rng.normal(size=(12, 1))  # what a seed fixes for both arms (init, data order)
    a = seed + 0.3 * rng.normal(size=(12, 50))
    b = seed + 0.3 * rng.normal(size=(12, 50))
    a_s, b_s = a.mean(axis=1), b.mean(axis=1)
    expected = np.var(a_s - b_s, ddof=1) / (np.var(a_s, ddof=1) + np.var(b_s, ddof=1))
    assert pairing_ratio(a, b) == pytest.approx(expected, rel=1e-12)
    assert pairing_ratio(a, b) < 0.1  # the shared seed effect cancels in the difference
    independent = pairing_ratio(rng.normal(size=(400, 5)), rng.normal(size=(400, 5)))
    assert independent == pytest.approx(1.0, abs=0.15)  # nothing shared: nothing bought
    assert pairing_ratio(a[:1], b[:1]) is None and pairing_ratio(a, np.full_like(a, 0.5)) is None
    spec = ClaimSpec("p", "d", lambda arrays: iter(()), "m", sesoi=0.1)
    row, _ = judge_cells(spec, Cells(a, b, "a", "b"))
    assert row.pairing == pytest.approx(expected, rel=1e-12)
