"""Pruning a non-transformer model (issue 33): the error says where Selection lives and how to include
Conv2d, and a Selection that skips convolution weights says so once instead of skipping them silently."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from descentlab.errors import ModelError
from descentlab.sparsity import Selection, select_prunable
from descentlab.sparsity.masks import _WARNED_SKIPS


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU())
        self.head = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def test_the_error_on_a_model_without_blocks_says_where_selection_lives_and_how_to_add_conv2d() -> None:
    with pytest.raises(ModelError) as info:
        select_prunable(SmallCNN())
    message = str(info.value)
    assert "from descentlab.sparsity import Selection" in message and "nn.Conv2d" in message, message
    assert "\n" not in message


def test_a_selection_that_skips_conv_weights_warns_once() -> None:
    _WARNED_SKIPS.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            tensors = select_prunable(SmallCNN(), Selection(blocks_only=False))
    assert [t.name for t in tensors] == ["head.weight"]
    hits = [w for w in caught if "Conv2d" in str(w.message)]
    assert len(hits) == 1, [str(w.message) for w in caught]
    assert "2 Conv2d weight" in str(hits[0].message) and "module_types" in str(hits[0].message)


def test_a_selection_that_includes_conv2d_does_not_warn() -> None:
    _WARNED_SKIPS.clear()
    select = Selection(module_types=(nn.Linear, nn.Conv2d), blocks_only=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tensors = select_prunable(SmallCNN(), select)
    assert [t.name for t in tensors] == ["features.0.weight", "features.2.weight", "head.weight"]
    assert not [w for w in caught if "Conv" in str(w.message)]
