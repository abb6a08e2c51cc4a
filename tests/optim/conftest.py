"""Fixtures shared by the optimizer tests: a tiny GPT-2 (from tests/tiny_models.py) and its LM loss."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from tiny_models import tiny_gpt2 as gpt2


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: one thread is fastest, and it keeps a shared 2-core machine usable."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_gpt2() -> Callable[[], torch.nn.Module]:
    """A factory of identical copies of a 1-layer GPT-2 (embeddings, attention, MLP, LayerNorms, biases)."""
    base = gpt2(layers=1, hidden=16, vocab=64, positions=16, seed=0)
    return lambda: copy.deepcopy(base)


@pytest.fixture(scope="module")
def lm_batches() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 64, (4, 12), generator=gen) for _ in range(8)]


@pytest.fixture(scope="module")
def lm_loss() -> Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]:
    return lambda model, ids: model(input_ids=ids, labels=ids).loss
