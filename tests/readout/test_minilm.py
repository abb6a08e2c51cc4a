"""Readout fidelity on the real pretrained MiniLM-L6 classifier and real Rotten Tomatoes reviews."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from descentlab.constrained import LayerwiseDescent, PrimalDual
from descentlab.errors import AssetMissingError
from descentlab.readout import layer_losses


@pytest.fixture(scope="module")
def minilm_batch():
    from descentlab.data import load_encoder_classifier, load_text_classification

    try:
        torch.manual_seed(0)
        model, tokenizer = load_encoder_classifier("minilm", num_labels=2)
        data = load_text_classification("rotten_tomatoes", max_train=16, max_eval=16)
    except AssetMissingError as exc:
        pytest.skip(f"offline asset missing: {exc}")
    rows = data["validation"][:16]
    batch = dict(tokenizer(rows["text"], padding=True, truncation=True, max_length=64, return_tensors="pt"))
    batch["labels"] = torch.tensor(rows["label"])
    return model.eval(), batch


def test_minilm_layer_losses_equal_its_own_and_its_truncations_loss(minilm_batch) -> None:
    model, batch = minilm_batch
    with torch.no_grad():
        f = layer_losses(model, batch)
        assert f.shape == (model.config.num_hidden_layers + 1,) == (7,)
        torch.testing.assert_close(f[-1], model(**batch).loss, rtol=0, atol=1e-6)
        cut = copy.deepcopy(model)
        cut.bert.encoder.layer = nn.ModuleList(list(cut.bert.encoder.layer)[:3])
        cut.config.num_hidden_layers = 3
        torch.testing.assert_close(f[3], cut(**batch).loss, rtol=0, atol=1e-6)


def test_one_primal_dual_step_on_minilm_moves_the_multipliers(minilm_batch) -> None:
    model, batch = minilm_batch
    model = copy.deepcopy(model).train()
    constraint = LayerwiseDescent(model.config.num_hidden_layers, alpha=0.1, dual_lr=0.05)
    opt = PrimalDual(torch.optim.AdamW(model.parameters(), lr=3e-5), constraint)
    loss = constraint.lagrangian(layer_losses(model, batch))
    loss.backward()
    opt.step()
    g = constraint.violations
    torch.testing.assert_close(constraint.multipliers, torch.clamp(0.05 * g.double(), min=0))
    assert set(constraint.log_dict()) >= {"f/0", "f/6", "g/6", "lambda/6"}
