"""Tiny real transformers models for the sparsity tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn


@pytest.fixture
def make_vit() -> Callable[..., nn.Module]:
    from descentlab.models.vit import ViTSpec, build_vit

    def make(hidden: int = 16, layers: int = 2, seed: int = 0) -> nn.Module:
        return build_vit(ViTSpec(hidden_size=hidden, num_layers=layers, num_heads=2, mlp_ratio=2), seed=seed)

    return make


@pytest.fixture
def make_gpt2() -> Callable[[], nn.Module]:
    from tiny_models import tiny_gpt2

    def make() -> nn.Module:
        return tiny_gpt2(layers=2, hidden=16, vocab=50, positions=16, seed=0)

    return make


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    # These models are tiny: a second intra-op thread only adds spin-waiting on a shared 2-core machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
