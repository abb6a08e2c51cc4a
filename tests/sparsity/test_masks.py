"""Masks: exact top-k (fast vs reference), layer / global / N:M counts, structural tensor selection."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from descentlab.errors import ConfigError, ModelError
from descentlab.sparsity.masks import (
    Selection,
    compute_masks,
    exact_topk_mask,
    exact_topk_mask_reference,
    find_blocks,
    global_masks,
    global_masks_reference,
    layer_masks,
    nm_mask,
    nm_mask_reference,
    select_prunable,
)


@pytest.mark.parametrize("levels", [3, 1000, None])
@pytest.mark.parametrize("k", [0, 1, 17, 63, 64])
def test_exact_topk_matches_reference_with_ties(levels: int | None, k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    scores = torch.rand(64, generator=gen, dtype=torch.float64)
    if levels is not None:  # heavy ties
        scores = torch.floor(scores * levels)
    fast = exact_topk_mask(scores, k)
    assert int(fast.sum()) == k
    assert torch.equal(fast, exact_topk_mask_reference(scores, k))


def test_layer_masks_exact_per_tensor() -> None:
    weights = {"a": torch.randn(7, 13), "b": torch.zeros(4, 4), "c": torch.randn(3, 33)}
    for s in (0.0, 0.1, 0.5, 0.9, 0.999):
        masks = layer_masks(weights, s)
        for name, w in weights.items():
            assert int((~masks[name]).sum()) == round(s * w.numel()), (name, s)


def test_global_masks_one_threshold() -> None:
    weights = {"a": torch.randn(20, 10), "b": 3 * torch.randn(10, 30)}
    masks = global_masks(weights, 0.7)
    pruned = sum(int((~m).sum()) for m in masks.values())
    assert pruned == round(0.7 * 500)
    kept = torch.cat([weights[n].abs()[masks[n]] for n in weights])
    dropped = torch.cat([weights[n].abs()[~masks[n]] for n in weights])
    assert kept.min() >= dropped.max()
    # the larger-scale tensor keeps more of its entries: the threshold is shared, not per tensor
    assert masks["b"].float().mean() > masks["a"].float().mean()


@pytest.mark.parametrize(
    "dtypes", [(torch.float32,) * 3, (torch.bfloat16,) * 3, (torch.bfloat16, torch.float32, torch.float16)]
)
@pytest.mark.parametrize("levels", [None, 7])
def test_global_masks_device_paths_equal_the_host_twin(dtypes, levels) -> None:
    """kthvalue over the concatenated scores and the radix select without a concatenated copy (forced with
    concat_limit=0) give the host twin's masks, heavy ties (7 levels) and mixed dtypes included."""
    gen = torch.Generator().manual_seed(5)
    shapes = [(33, 17), (64,), (9, 8, 5)]
    weights = {}
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes, strict=True)):
        w = torch.randn(shape, generator=gen) * (i + 1)
        if levels is not None:
            w = torch.round(w * levels / 3) / levels
        weights[f"w{i}"] = w.to(dtype)
    for sparsity in (0.0, 0.3, 0.7, 0.95):
        slow = global_masks_reference(weights, sparsity)
        for fast in (global_masks(weights, sparsity), global_masks(weights, sparsity, concat_limit=0)):
            assert fast.keys() == slow.keys()
            for name in weights:
                assert fast[name].shape == weights[name].shape
                assert torch.equal(fast[name], slow[name]), (name, sparsity)
    total = sum(w.numel() for w in weights.values())
    kept = sum(int(m.sum()) for m in global_masks(weights, 0.7, concat_limit=0).values())
    assert kept == total - round(0.7 * total)


@pytest.mark.parametrize("in_dim", [0, 1])
def test_nm_mask_matches_reference(in_dim: int) -> None:
    w = torch.randn(8, 12, dtype=torch.float64)
    w[0, :4] = 1.0  # ties inside one group
    fast, ref = nm_mask(w, 2, 4, in_dim), nm_mask_reference(w, 2, 4, in_dim)
    assert torch.equal(fast, ref)
    groups = fast.movedim(in_dim, -1).reshape(-1, 4)
    assert torch.all(groups.sum(1) == 2)


def test_nm_rejects_bad_shapes() -> None:
    with pytest.raises(ConfigError, match="multiple of M"):
        nm_mask(torch.randn(4, 6), 2, 4)
    with pytest.raises(ConfigError, match="0 < N < M"):
        nm_mask(torch.randn(4, 8), 4, 4)


def test_sparsity_out_of_range() -> None:
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ConfigError, match=r"\[0, 1\)"):
            layer_masks({"a": torch.randn(3, 3)}, bad)


class _SelfAttention4x(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)


class _Layer4x(nn.Module):
    """The module tree of a transformers 4.x ViTLayer (names differ from 5.x; types and order do not)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.attention = nn.Module()
        self.attention.attention = _SelfAttention4x(d)
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(d, d)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(d, 2 * d)
        self.output = nn.Module()
        self.output.dense = nn.Linear(2 * d, d)
        self.layernorm_before, self.layernorm_after = nn.LayerNorm(d), nn.LayerNorm(d)


class _ViT4x(nn.Module):
    def __init__(self, d: int = 8, layers: int = 3) -> None:
        super().__init__()
        self.vit = nn.Module()
        self.vit.embeddings = nn.Linear(49, d)
        self.vit.encoder = nn.Module()
        self.vit.encoder.layer = nn.ModuleList(_Layer4x(d) for _ in range(layers))
        self.classifier = nn.Linear(d, 10)


def test_selection_vit_5x_default_is_block_linears(make_vit) -> None:
    from descentlab.sparsity import vit_block_linears

    model = make_vit()
    names = [t.name for t in select_prunable(model)]
    assert len(names) == 12 and all(n.endswith("weight") for n in names)
    assert not any("classifier" in n or "embeddings" in n or "norm" in n for n in names)
    roles = vit_block_linears(model)
    assert [t.name for t in roles["fc1"]] == ["vit.layers.0.mlp.fc1.weight", "vit.layers.1.mlp.fc1.weight"]
    assert roles["q"][1].name == "vit.layers.1.attention.q_proj.weight"


def test_selection_vit_4x_layout_by_type_and_position() -> None:
    from descentlab.sparsity import vit_block_linears

    model = _ViT4x()
    assert find_blocks(model)[0] == "vit.encoder.layer"
    roles = vit_block_linears(model)
    assert roles["q"][2].name == "vit.encoder.layer.2.attention.attention.query.weight"
    assert roles["out"][0].name == "vit.encoder.layer.0.attention.output.dense.weight"
    assert roles["fc1"][0].name == "vit.encoder.layer.0.intermediate.dense.weight"
    assert roles["fc2"][0].name == "vit.encoder.layer.0.output.dense.weight"


def test_selection_gpt2_conv1d_and_patterns(make_gpt2) -> None:
    model = make_gpt2()
    tensors = select_prunable(model)
    assert [t.name for t in tensors[:4]] == [
        f"transformer.h.0.{m}.weight" for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    ]
    assert all(t.in_dim == 0 for t in tensors)  # Conv1D stores [in, out]
    only_mlp = select_prunable(model, Selection(include=r"\.mlp\."))
    assert len(only_mlp) == 4
    no_attn = select_prunable(model, Selection(exclude=r"attn"))
    assert [t.name for t in no_attn] == [t.name for t in only_mlp]
    masks = compute_masks(tensors, 0.5, "nm")
    assert all(int(m.sum()) * 2 == m.numel() for m in masks.values())


def test_selection_errors() -> None:
    with pytest.raises(ModelError, match="no list of repeated"):
        select_prunable(nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3)))
    mlp = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))
    assert len(select_prunable(mlp, Selection(blocks_only=False))) == 2
    with pytest.raises(ModelError, match="no prunable"):
        select_prunable(mlp, Selection(blocks_only=False, include="nothing"))
    with pytest.raises(ConfigError, match="scope"):
        compute_masks(select_prunable(mlp, Selection(blocks_only=False)), 0.5, "rows")
    with pytest.raises(ConfigError, match="gives sparsity"):
        compute_masks(select_prunable(mlp, Selection(blocks_only=False)), 0.6, "nm", (2, 4))
