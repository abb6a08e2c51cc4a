"""The counter-based noise: hash against numpy's native uint32 arithmetic, distributions against scipy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from descentlab.perturbations import noise as nz


def _mix32_numpy(x: np.ndarray) -> np.ndarray:
    """Slow twin: lowbias32 with numpy uint32 wrap-around multiplication."""
    x = x.astype(np.uint32)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x7FEB352D)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x846CA68B)
        x ^= x >> np.uint32(16)
    return x


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**32 - 1), min_size=1, max_size=64))
def test_mix32_matches_uint32_reference(values: list[int]) -> None:
    expected = _mix32_numpy(np.array(values, dtype=np.uint64))
    got = nz.mix32(torch.tensor(values, dtype=torch.int64))
    np.testing.assert_array_equal(got.numpy().astype(np.uint32), expected)
    # python ints take the same path
    assert [nz.mix32(v) for v in values] == expected.astype(np.int64).tolist()


def test_mul32_extremes() -> None:
    x = torch.tensor([0, 1, 2**32 - 1, 2**31, 0xDEADBEEF], dtype=torch.int64)
    for c in (1, 0x7FEB352D, 2**32 - 1):
        expected = (x.numpy().astype(object) * c) % 2**32
        assert nz.mul32(x, c).tolist() == list(expected)


@pytest.mark.parametrize("kind", ["gaussian", "uniform", "discrete"])
def test_standard_noise_is_unit_variance_with_the_right_law(kind: str) -> None:
    keys = torch.tensor([nz.fold_key(7, r) for r in range(4)], dtype=torch.int64)
    xi = nz.standard_noise(kind, keys, (4, 50, 250)).flatten().numpy()
    assert abs(xi.mean()) < 0.01
    assert abs(xi.var() - 1.0) < 0.01
    if kind == "gaussian":
        assert stats.kstest(xi, "norm").pvalue > 1e-3
    elif kind == "uniform":
        assert stats.kstest(xi, stats.uniform(loc=-np.sqrt(3), scale=2 * np.sqrt(3)).cdf).pvalue > 1e-3
    else:
        assert set(np.unique(xi)) == {-1.0, 1.0}


def test_noise_is_uncorrelated_across_coordinates_rows_and_streams() -> None:
    keys = torch.tensor([nz.fold_key(1, r) for r in range(2)], dtype=torch.int64)
    xi = nz.standard_noise("gaussian", keys, (2, 40_000)).numpy()
    n = xi.shape[1]
    bound = 4 / np.sqrt(n)
    assert abs(np.corrcoef(xi[0], xi[1])[0, 1]) < bound
    assert abs(np.corrcoef(xi[0, :-1], xi[0, 1:])[0, 1]) < bound
    a = nz.bits_to_unit(nz.uniform_bits(keys[:1], n, nz.STREAM_A))[0].numpy()
    b = nz.bits_to_unit(nz.uniform_bits(keys[:1], n, nz.STREAM_B))[0].numpy()
    assert abs(np.corrcoef(a, b)[0, 1]) < bound


def test_content_keys_ignore_invalid_positions_and_see_order() -> None:
    ids = torch.tensor([[5, 6, 7, 0, 0], [5, 6, 7, 9, 0], [6, 5, 7, 0, 0]])
    short = torch.tensor([[5, 6, 7]])
    keys = nz.content_keys(ids, ids != 0)
    assert keys[0] == nz.content_keys(short, short != 0)[0]
    assert len(set(keys.tolist())) == 3
    floats = torch.randn(3, 4, 4)
    assert torch.equal(nz.content_keys(floats), nz.content_keys(floats.clone()))
    assert nz.content_keys(floats)[0] != nz.content_keys(floats + 1e-3)[0]


def test_substitution_plan_rate_and_range() -> None:
    keys = torch.arange(64, dtype=torch.int64)
    mask, ids = nz.substitution_plan(keys, 500, 0.3, 1000)
    assert abs(mask.double().mean().item() - 0.3) < 0.01
    assert ids.min() >= 0 and ids.max() < 1000
    assert abs(ids.double().mean().item() - 499.5) < 5
