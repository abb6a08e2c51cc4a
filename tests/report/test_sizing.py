"""The sizing rule and the ``underpowered here`` verdict (issue: sizing that does not flatter)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from descentlab.report.claims import Cells, ClaimSpec, is_inconclusive, judge_cells
from descentlab.report.stats import (
    UNDERPOWERED,
    WIDENING,
    equivalence_mde,
    paired_interval,
    sd_upper_bound,
    seeds_needed,
    size_design,
)


def _seeds(mean: float, sd: float, n: int) -> np.ndarray:
    z = np.linspace(-1, 1, n)
    return mean + sd * (z - z.mean()) / z.std(ddof=1)


def test_the_bounded_rule_inflates_the_seed_piece_by_the_sd_bound() -> None:
    iv = paired_interval(_seeds(0.01, 0.02, 3), np.zeros(3))
    plug_in, bounded = seeds_needed(iv, 0.01), seeds_needed(iv, 0.01, sd_confidence=0.8)
    assert plug_in is not None and bounded is not None
    # seed-dominated design: n ∝ s², so the bound's ≈ 2.1² inflation carries through, up to the t quantiles
    factor = sd_upper_bound(1.0, 3) ** 2
    assert 0.8 * factor < bounded / plug_in < 1.25 * factor

    # the rule reached its target: the inflated MDE at `bounded` seeds is at most the effect, and not before
    def mde(n: int) -> float:
        from scipy.stats import t

        v = iv.pieces[0].variance * factor * iv.seeds / n
        return (t.ppf(0.975, n - 1) + t.ppf(0.8, n - 1)) * math.sqrt(v)

    assert mde(bounded) <= 0.01 < mde(bounded - 1)


def test_size_design_reports_hours_from_the_measured_cost_per_seed() -> None:
    iv = paired_interval(_seeds(0.0, 0.02, 5), np.zeros(5))
    size = size_design(iv, 0.01, seconds_per_seed=600.0)
    assert size.bounded is not None and size.plug_in is not None and size.bounded > size.plug_in
    assert size.hours_here == pytest.approx(size.bounded * 600.0 / 3600)
    assert size_design(iv, 0.01).hours_here is None


def test_an_example_dominated_design_has_no_number_of_seeds() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(0, 1.0, (4, 50)) + rng.normal(0, 1e-4, (4, 1))
    iv = paired_interval(a, np.zeros_like(a))
    assert seeds_needed(iv, 0.01) is None and size_design(iv, 0.01).bounded is None


def _directional(sesoi: float) -> ClaimSpec:
    return ClaimSpec(
        name="c", description="c", cells=lambda arrays: [], metric="m", kind="directional", sesoi=sesoi
    )


def test_an_inconclusive_row_whose_design_cannot_see_its_sesoi_is_underpowered() -> None:
    a = _seeds(0.0, 1.0, 5)
    wide, _ = judge_cells(_directional(0.1), Cells(a, np.zeros(5), "m", "r"))
    assert wide.verdict == UNDERPOWERED and wide.min_detectable_effect > 0.1
    assert "detects" in wide.reason and wide.seeds_needed_bounded > wide.seeds_needed
    # mean 1 over the same spread ([−0.24, +2.24], MDE ≈ 1.66) against a SESOI of 2 that the design can
    # detect: plain inconclusive
    shifted = _seeds(1.0, 1.0, 5)
    narrow, _ = judge_cells(_directional(2.0), Cells(shifted, np.zeros(5), "m", "r"))
    assert narrow.verdict == "inconclusive" and narrow.min_detectable_effect < 2.0


def test_a_parity_row_is_underpowered_when_its_equivalence_mde_exceeds_the_margin() -> None:
    a = _seeds(0.0, 1.0, 5)
    iv = paired_interval(a, np.zeros(5))
    spec = ClaimSpec(name="p", description="p", cells=lambda arr: [], metric="m", kind="parity", margin=0.5)
    row, _ = judge_cells(spec, Cells(a, np.zeros(5), "m", "r"))
    assert equivalence_mde(iv) > 0.5 and row.verdict == UNDERPOWERED


@settings(max_examples=200, deadline=None)
@given(
    mean=st.floats(-2, 2),
    sd=st.floats(0.05, 2),
    sesoi=st.floats(0.01, 3),
    seeds=st.integers(3, 12),
    widen=st.floats(1.0, 4.0),
)
def test_underpowered_is_an_inconclusive_that_widening_keeps(mean, sd, sesoi, seeds, widen) -> None:
    """Widening the spread (a noisier design of the same mean) never turns ``underpowered here`` into a
    decided verdict, and a decided verdict only moves along WIDENING, reading underpowered as inconclusive."""
    spec = _directional(sesoi)
    narrow, _ = judge_cells(spec, Cells(_seeds(mean, sd, seeds), np.zeros(seeds), "m", "r"))
    wide, _ = judge_cells(spec, Cells(_seeds(mean, sd * widen, seeds), np.zeros(seeds), "m", "r"))

    def as_outcome(v: str) -> str:
        return "inconclusive" if is_inconclusive(v) else v

    assert as_outcome(wide.verdict) in WIDENING[as_outcome(narrow.verdict)]
    if narrow.verdict == UNDERPOWERED:
        assert wide.verdict == UNDERPOWERED
