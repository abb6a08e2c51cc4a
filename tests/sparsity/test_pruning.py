"""prune_magnitude and sparsity_report on real transformers models (global masks across ranks: tests/distributed)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_model

from descentlab.errors import ConfigError
from descentlab.sparsity import prune_magnitude, select_prunable, sparsity_report


def test_layer_scope_exact_per_matrix_and_rest_untouched(make_vit) -> None:
    model = make_vit()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = prune_magnitude(model, 0.8, scope="layer")
    prunable = {t.name for t in select_prunable(model)}
    for name, count in report.tensors.items():
        assert count.zeros == round(0.8 * count.numel), name
    after = model.state_dict()
    assert list(after) == list(before)  # no re-parametrisation: same keys, same order
    for k, v in after.items():
        if k not in prunable:
            assert torch.equal(v, before[k]), k  # embeddings, head, biases, norms untouched
        else:
            kept = v != 0
            assert torch.equal(v[kept], before[k][kept])  # survivors keep their exact value


def test_global_scope_exact_and_one_threshold(make_gpt2) -> None:
    model = make_gpt2()
    before = {t.name: t.param.detach().clone() for t in select_prunable(model)}
    report = prune_magnitude(model, 0.65, scope="global")
    assert report.total.zeros == round(0.65 * report.total.numel)
    after = {t.name: t.param.detach() for t in select_prunable(model)}
    kept = torch.cat([before[n][after[n] != 0].abs() for n in before])
    dropped = torch.cat([before[n][after[n] == 0].abs() for n in before])
    assert kept.min() >= dropped.max()  # one threshold shared by every matrix
    # ... so per-matrix sparsities differ, unlike scope="layer"
    assert len({round(c.sparsity, 3) for c in report.tensors.values()}) > 1


def test_nm_scope(make_vit) -> None:
    model = make_vit()
    report = prune_magnitude(model, 0.5, scope="nm", nm=(2, 4))
    for t in select_prunable(model):
        groups = (t.param.detach() != 0).reshape(-1, 4)
        assert torch.all(groups.sum(1) == 2), t.name
    assert report.global_sparsity == 0.5


def test_bad_arguments(make_vit) -> None:
    model = make_vit()
    for bad in (1.0, -0.01, 2):
        with pytest.raises(ConfigError):
            prune_magnitude(model, bad)
    with pytest.raises(ConfigError, match="scope"):
        prune_magnitude(model, 0.5, scope="rows")


def test_report_from_safetensors_matches_model(tmp_path, make_vit) -> None:
    model = make_vit()
    report = prune_magnitude(model, 0.9, scope="global")
    save_model(model, str(tmp_path / "model.safetensors"))
    back = sparsity_report(load_file(str(tmp_path / "model.safetensors")))
    assert back.to_dict() == report.to_dict()
    table = back.to_markdown()
    assert "**global**" in table and "| (block total) | 1 |" in table
