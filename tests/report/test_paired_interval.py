"""The seed-level interval: coverage on simulated crossed designs, its pieces, and the verdict rules."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from descentlab.report.coverage import REGIMES, coverage, seed_level
from descentlab.report.stats import claim_tests, holm, outcome, paired_interval


@pytest.mark.parametrize("regime", REGIMES, ids=lambda r: r.name)
@pytest.mark.parametrize("seeds", [3, 5, 10])
@pytest.mark.parametrize("examples", [200, 1000])
def test_coverage_is_near_nominal_from_three_seeds(regime, seeds, examples) -> None:
    got = coverage(seed_level, regime, seeds, examples, reps=1500, seed=seeds * examples)
    assert 0.93 <= got <= 0.985, f"{regime.name} S={seeds} E={examples}: coverage {got}"


def test_per_seed_scalars_give_the_seed_t_interval() -> None:
    rng = np.random.default_rng(0)
    d = rng.normal(0.3, 1.0, size=6)
    iv = paired_interval(d, np.zeros(6))
    half = sps.t.ppf(0.975, 5) * d.std(ddof=1) / np.sqrt(6)
    assert iv.mean == pytest.approx(d.mean())
    assert (iv.low, iv.high) == pytest.approx((d.mean() - half, d.mean() + half))
    assert iv.min_detectable_effect() == pytest.approx(
        (sps.t.ppf(0.975, 5) + sps.t.ppf(0.8, 5)) * half / sps.t.ppf(0.975, 5)
    )


def test_seed_dominated_design_is_the_t_interval_on_per_seed_means() -> None:
    rng = np.random.default_rng(1)
    d = rng.normal(size=(3, 1)) + 1e-6 * rng.normal(size=(3, 400))
    iv = paired_interval(d, np.zeros_like(d))
    seed_means = d.mean(axis=1)
    half = sps.t.ppf(0.975, 2) * seed_means.std(ddof=1) / np.sqrt(3)
    assert iv.half_width == pytest.approx(half, rel=1e-6)


def test_one_seed_counts_examples_only_and_says_so() -> None:
    rng = np.random.default_rng(2)
    d = rng.normal(size=(1, 300))
    iv = paired_interval(d, np.zeros_like(d))
    assert iv.one_seed
    half = sps.t.ppf(0.975, 299) * d.std(ddof=1) / np.sqrt(300)
    assert iv.half_width == pytest.approx(half)


def test_middle_axes_are_averaged_into_the_cell() -> None:
    rng = np.random.default_rng(3)
    d = rng.normal(size=(4, 3, 50))
    a = paired_interval(d, np.zeros_like(d))
    b = paired_interval(d.mean(axis=1), np.zeros((4, 50)))
    assert (a.low, a.high) == pytest.approx((b.low, b.high))
    assert a.shape == (4, 3, 50)


@pytest.mark.parametrize(
    ("a", "b", "match"),
    [
        (np.zeros((2, 3)), np.zeros((3, 2)), "one shape"),
        (np.array([np.nan, 1.0]), np.zeros(2), "non-finite"),
        (np.zeros(1), np.zeros(1), "at least two"),
        (np.float64(1.0), np.float64(0.0), r"\[seeds"),
    ],
)
def test_bad_cells_raise_one_clear_error(a, b, match) -> None:
    with pytest.raises(ValueError, match=match):
        paired_interval(a, b)


def test_p_values_are_dual_to_the_interval() -> None:
    rng = np.random.default_rng(4)
    d = rng.normal(0.2, 1.0, size=(5, 100)) + rng.normal(size=(5, 1))
    iv = paired_interval(d, np.zeros_like(d))
    p = iv.p_beyond(0.0, "above")
    low, _ = iv.interval(1 - 2 * p)
    assert low == pytest.approx(0.0, abs=1e-9)
    assert iv.p_beyond(0.0, "above") + iv.p_beyond(0.0, "below") == pytest.approx(1.0)


def _iv(mean: float, sd: float = 0.1, seeds: int = 8):
    # per-seed scalars with exactly this mean and sample sd
    z = np.linspace(-1, 1, seeds)
    z = (z - z.mean()) / z.std(ddof=1)
    return paired_interval(mean + sd * z, np.zeros(seeds))


@pytest.mark.parametrize(
    ("mean", "kind", "kw", "expected"),
    [
        (0.5, "directional", {"sesoi": 0.1}, "reproduced"),
        (-0.5, "directional", {"sesoi": 0.1}, "refuted"),
        (0.0, "directional", {"sesoi": 0.01}, "inconclusive"),
        (0.005, "directional", {"sesoi": 0.5}, "refuted"),  # every effect >= SESOI excluded, 0 not
        (-0.5, "directional", {"sesoi": 0.1, "direction": "less"}, "reproduced"),
        (0.5, "directional", {"sesoi": 0.1, "direction": "less"}, "refuted"),
        (3.0, "sized", {"size": 2.0}, "reproduced"),
        (2.94, "sized", {"size": 3.0}, "inconclusive"),  # the CI straddles the claimed size
        (1.0, "sized", {"size": 3.0}, "refuted"),
        (-3.0, "sized", {"size": 2.0, "direction": "less"}, "reproduced"),
        (0.0, "parity", {"margin": 0.3}, "reproduced"),
        (0.0, "parity", {"margin": 0.05}, "inconclusive"),  # a wide CI does not show parity
        (1.0, "parity", {"margin": 0.3}, "refuted"),
        (-1.0, "parity", {"margin": 0.3}, "refuted"),
    ],
)
def test_verdict_rules(mean, kind, kw, expected) -> None:
    assert outcome(claim_tests(_iv(mean), kind, **kw), 0.05) == expected


def test_sized_verdict_agrees_with_the_interval() -> None:
    iv = _iv(2.94)
    assert iv.low < 3.0 < iv.high
    assert outcome(claim_tests(iv, "sized", size=3.0), 0.05) == "inconclusive"


def test_parity_reproduces_exactly_when_the_90_ci_is_inside_the_margin() -> None:
    for mean in np.linspace(-0.4, 0.4, 41):
        iv = _iv(float(mean))
        low, high = iv.interval(0.90)
        inside = low > -0.3 and high < 0.3
        assert (outcome(claim_tests(iv, "parity", margin=0.3), 0.05) == "reproduced") == inside


@pytest.mark.parametrize("kind", ["directional", "sized", "parity"])
def test_a_kind_without_its_number_is_refused(kind) -> None:
    with pytest.raises(ValueError, match="> 0"):
        claim_tests(_iv(0.1), kind)


def test_holm_matches_the_step_down_definition() -> None:
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005 (x4), 0.01 (x3), 0.03 (x2), 0.04 (x1), running max
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([]) == []
    assert holm([0.6, 0.7]) == [1.0, 1.0]
