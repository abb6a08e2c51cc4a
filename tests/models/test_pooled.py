"""The mean-pooling classifier predicts through the rule it is read out with, at every layer."""

from __future__ import annotations

import torch
from transformers import BertConfig, BertModel

from descentlab.models.pooled import MeanPoolingForSequenceClassification, masked_mean
from descentlab.perturbations import perturb_embeddings
from descentlab.readout import EncoderClassifierReadout, layer_losses


def _model() -> MeanPoolingForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return MeanPoolingForSequenceClassification(
        BertModel(config, add_pooling_layer=False), num_labels=2
    ).eval()


def test_masked_mean_ignores_padding() -> None:
    x = torch.arange(12.0).view(1, 4, 3)
    assert torch.equal(masked_mean(x, torch.tensor([[1, 1, 0, 0]])), x[:, :2].mean(1))


def test_every_layer_is_read_out_through_the_models_own_pooling_and_head() -> None:
    model = _model()
    batch = {
        "input_ids": torch.tensor([[2, 5, 7, 0], [2, 9, 3, 4]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
        "labels": torch.tensor([0, 1]),
    }
    with torch.no_grad():
        f = layer_losses(model, batch)
        logits = EncoderClassifierReadout().layer_logits(model, batch)
        out = model(**batch, output_hidden_states=True)
    assert f.shape == (4,) and torch.allclose(f[-1], out.loss)
    assert torch.allclose(logits[-1], out.logits)
    # layer l's logits are the head on the masked mean of hidden state l
    for layer, state in enumerate(out.hidden_states):
        expected = model.classifier(masked_mean(state, batch["attention_mask"]))
        assert torch.allclose(logits[layer], expected, atol=1e-6)
    with perturb_embeddings(model, "gaussian", 1.0) as record, torch.no_grad():
        model(**batch)
    assert record.calls == 1  # the noise hook finds the backbone's embeddings
