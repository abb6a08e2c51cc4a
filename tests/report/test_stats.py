"""Statistics: mean_std as the experiments computed it; the paired bootstrap against closed forms."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats as sp

from descentlab.report.stats import column_mean_std, mean_std, paired_bootstrap


def test_mean_std_matches_the_experiments_copies() -> None:
    values = [0.81, 0.79, 0.835, 0.8]
    t = torch.tensor(values, dtype=torch.float64)
    assert mean_std(values) == (float(t.mean()), float(t.std()))  # sparse_vit_report.mean_std
    arr = np.asarray(values, dtype=float)
    assert mean_std(values, impl="numpy") == (float(arr.mean()), float(arr.std(ddof=1)))  # implicit_bias
    assert mean_std(values, ddof=0, impl="numpy") == (float(arr.mean()), float(arr.std()))
    assert mean_std([0.5]) == (0.5, 0.0)
    rows = [[1.0, 2.0, 4.0], [1.5, 2.5, 3.0]]
    r = torch.tensor(rows, dtype=torch.float64)
    assert column_mean_std(rows) == (r.mean(0).tolist(), r.std(0, correction=1).tolist())  # sparse_lm, video
    assert column_mean_std([[1.0, 2.0]]) == ([1.0, 2.0], [0.0, 0.0])


def test_bootstrap_matches_the_t_interval_for_large_normal_samples() -> None:
    rng = np.random.default_rng(1)
    a = rng.normal(0.3, 1.0, 4000)
    b = rng.normal(0.0, 1.0, 4000)
    ci = paired_bootstrap(a, b, n_boot=4000, seed=0)
    d = a - b
    half = sp.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    assert ci.mean == pytest.approx(d.mean())
    assert ci.half_width == pytest.approx(half, rel=0.04)
    assert ci.low == pytest.approx(d.mean() - half, abs=0.04 * half)
    assert ci.high == pytest.approx(d.mean() + half, abs=0.04 * half)
    assert ci.n == 4000 and ci.shape == (4000,)


def test_bootstrap_is_deterministic_and_pairs_the_cells() -> None:
    rng = np.random.default_rng(2)
    a = rng.normal(size=(2, 3, 50))
    assert paired_bootstrap(a, a - 0.1, seed=5) == paired_bootstrap(a, a - 0.1, seed=5)
    # a constant paired difference has no spread, however noisy the methods are
    ci = paired_bootstrap(a, a - 0.1, seed=5)
    assert ci.low == pytest.approx(0.1) and ci.high == pytest.approx(0.1)
    assert paired_bootstrap(a, a[::-1], seed=5) != paired_bootstrap(a, a[::-1], seed=6)


def test_bootstrap_replicates_equal_explicit_resampling() -> None:
    rng = np.random.default_rng(3)
    d = rng.normal(size=(3, 2, 7))
    n_boot = 50
    ci = paired_bootstrap(d, np.zeros_like(d), n_boot=n_boot, seed=9)
    gen = np.random.default_rng(9)
    counts = [gen.multinomial(n, np.full(n, 1.0 / n), size=n_boot) for n in d.shape]
    reps = [
        np.einsum("s,d,e,sde->", counts[0][r], counts[1][r], counts[2][r], d) / d.size for r in range(n_boot)
    ]
    low, high = np.quantile(reps, [0.025, 0.975])
    assert (ci.low, ci.high) == pytest.approx((low, high), rel=1e-12)


@pytest.mark.parametrize("shape", [(60,), (1, 1, 60), (3, 2, 40)])
def test_coverage_near_95_percent(shape: tuple[int, ...]) -> None:
    """Example effects dominate (as on a test set): the true mean is covered about 95 % of the time."""
    rng = np.random.default_rng(4)
    hits, trials = 0, 300
    for i in range(trials):
        example = rng.standard_normal(shape[-1])  # per-example difficulty difference, shared by seeds
        d = 0.2 + example + 0.1 * rng.standard_normal(shape)
        ci = paired_bootstrap(d, np.zeros(shape), n_boot=500, seed=i)
        hits += ci.low <= 0.2 <= ci.high
    assert 0.90 <= hits / trials <= 0.985
