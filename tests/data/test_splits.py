"""Stratified splits: errors name the config key; the take helper matches the old fraction path."""

from __future__ import annotations

import numpy as np
import pytest

from descentlab.data.splits import stratified_split, stratified_take
from descentlab.errors import ConfigError

LABELS = np.array([0, 1] * 45 + [2] * 10)


def test_a_negative_size_names_its_key() -> None:
    with pytest.raises(ConfigError, match=r"n_train must be >= 0 .* got -5"):
        stratified_take(LABELS, -5, seed=0, key="n_train")


def test_a_negative_fraction_names_its_key() -> None:
    with pytest.raises(ConfigError, match=r"data\.val_frac must be >= 0, got -0\.1"):
        stratified_split(LABELS, (-0.1, 0.2), 0, keys=("data.val_frac", "data.test_frac"))
    with pytest.raises(ConfigError, match=r"\(data\.val_frac, data\.test_frac\) must be >= 0 and sum to < 1"):
        stratified_split(LABELS, (0.6, 0.5), 0, keys=("data.val_frac", "data.test_frac"))


def test_take_is_the_stratified_fraction_split() -> None:
    take = stratified_take(LABELS, 30, seed=3)
    _, part = stratified_split(LABELS, (30 / len(LABELS),), 3)
    np.testing.assert_array_equal(take, np.sort(part))
    assert np.bincount(LABELS[take]).tolist() == [14, 14, 3]  # round(0.3 · n_c) per class
    np.testing.assert_array_equal(stratified_take(LABELS, 500, seed=3), np.arange(len(LABELS)))
