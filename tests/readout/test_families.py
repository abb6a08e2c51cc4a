"""Every built-in readout against an independent reference: the model truncated to its first l layers.

A Hugging Face model cut after layer l (its own head and loss unchanged) computes exactly f_l of the
per-layer readout, so ``layer_losses(model)[l] == truncated_model(l)(**batch).loss`` for every l, and for
l = L that is the model's own loss. Tiny models are built from transformers configs, in float64.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import (
    AlbertConfig,
    AlbertForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    RobertaConfig,
    RobertaForSequenceClassification,
)

from descentlab.errors import DataError, ModelError
from descentlab.readout import CausalLMReadout, layer_losses
from tiny_models import tiny_bert, tiny_vit

V, H, L = 97, 32, 3
COMMON = {"hidden_size": H, "intermediate_size": 64, "num_attention_heads": 4, "vocab_size": V}


def _truncate(model: nn.Module, layers_path: str, keep: int) -> nn.Module:
    cut = copy.deepcopy(model)
    owner_path, name = layers_path.rsplit(".", 1)
    owner = cut.get_submodule(owner_path)
    setattr(owner, name, nn.ModuleList(list(getattr(owner, name))[:keep]))
    for key in ("num_hidden_layers", "n_layer", "n_layers"):
        if hasattr(cut.config, key):
            setattr(cut.config, key, keep)
    return cut


def _text_batch(labels: torch.Tensor | None) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, V, (4, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    mask[3, 5:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    if labels is not None:
        batch["labels"] = labels
    return batch


CLASSIFIERS = [
    (BertForSequenceClassification, BertConfig(num_hidden_layers=L, **COMMON), "bert.encoder.layer"),
    (
        AlbertForSequenceClassification,
        AlbertConfig(num_hidden_layers=L, embedding_size=16, **COMMON),
        None,  # ALBERT shares one layer across depth: no truncation twin, own loss only
    ),
    (
        DistilBertForSequenceClassification,
        DistilBertConfig(n_layers=L, dim=H, hidden_dim=64, n_heads=4, vocab_size=V),
        "distilbert.transformer.layer",
    ),
    (
        RobertaForSequenceClassification,
        RobertaConfig(num_hidden_layers=L, pad_token_id=1, **COMMON),
        "roberta.encoder.layer",
    ),
]


@pytest.mark.parametrize(
    ("cls", "config", "layers_path"), CLASSIFIERS, ids=lambda v: getattr(v, "__name__", "")
)
def test_encoder_classifiers_match_truncated_models(cls, config, layers_path) -> None:
    model = cls(config).double().eval()
    batch = _text_batch(torch.tensor([0, 1, 1, 0]))
    f = layer_losses(model, batch)
    assert f.shape == (L + 1,)
    torch.testing.assert_close(f[-1], model(**batch).loss, rtol=0, atol=1e-12)
    if layers_path is not None:
        for keep in range(L):
            ref = _truncate(model, layers_path, keep)(**batch).loss
            torch.testing.assert_close(f[keep], ref, rtol=0, atol=1e-12)


def test_regression_head_uses_mse_like_the_model() -> None:
    model = tiny_bert(layers=2, hidden=H, heads=4, vocab=V, num_labels=1).double().eval()
    batch = _text_batch(torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(layer_losses(model, batch)[-1], model(**batch).loss, rtol=0, atol=1e-12)


CAUSAL = [
    (
        GPT2LMHeadModel,
        GPT2Config(n_layer=L, n_embd=H, n_head=4, vocab_size=V, n_positions=32),
        "transformer.h",
    ),
    (
        LlamaForCausalLM,
        LlamaConfig(num_hidden_layers=L, num_key_value_heads=2, tie_word_embeddings=False, **COMMON),
        "model.layers",
    ),
]


@pytest.mark.parametrize(("cls", "config", "layers_path"), CAUSAL, ids=lambda v: getattr(v, "__name__", ""))
def test_causal_lms_match_truncated_models(cls, config, layers_path) -> None:
    model = cls(config).double().eval()
    batch = _text_batch(None)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    exact = CausalLMReadout(sample_tokens=None)  # every layer on every token, with gradients enabled too
    f = layer_losses(model, batch, readout=exact)
    with torch.no_grad():  # the default readout reads every token when no gradient is taken
        torch.testing.assert_close(layer_losses(model, batch), f.detach(), rtol=0, atol=1e-12)
    # transformers computes its CE in float32 even for a float64 model, hence 1e-6
    torch.testing.assert_close(f[-1], model(**batch, labels=labels).loss.double(), rtol=0, atol=1e-6)
    for keep in range(L):
        ref = _truncate(model, layers_path, keep)(**batch, labels=labels).loss.double()
        torch.testing.assert_close(f[keep], ref, rtol=0, atol=1e-6)
    # explicit labels with -100 are honoured the same way
    torch.testing.assert_close(
        layer_losses(model, {**batch, "labels": labels}, readout=exact), f, rtol=0, atol=0
    )


def test_vit_matches_truncated_models() -> None:
    model = tiny_vit(layers=L, hidden=H, heads=4, image=16, patch=4, num_labels=5).double().eval()
    g = torch.Generator().manual_seed(0)
    batch = {
        "pixel_values": torch.randn(3, 1, 16, 16, generator=g, dtype=torch.float64),
        "labels": torch.tensor([0, 4, 2]),
    }
    f = layer_losses(model, batch)
    torch.testing.assert_close(f[-1], model(**batch).loss, rtol=0, atol=1e-12)
    for keep in range(L):
        ref = _truncate(model, "vit.layers", keep)(**batch).loss
        torch.testing.assert_close(f[keep], ref, rtol=0, atol=1e-12)


def test_readout_is_differentiable_and_trains_every_layer() -> None:
    model = tiny_bert(layers=2, hidden=H, heads=4, vocab=V)
    f = layer_losses(model, _text_batch(torch.tensor([0, 1, 1, 0])))
    f[1].backward()  # layer 1's readout reaches layer 1 and the shared head, not layer 2
    assert model.bert.encoder.layer[0].output.dense.weight.grad.abs().sum() > 0
    assert model.classifier.weight.grad.abs().sum() > 0
    later = model.bert.encoder.layer[1].output.dense.weight.grad
    assert later is None or float(later.abs().sum()) == 0.0


class _NoStates(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, output_hidden_states: bool = False) -> torch.Tensor:
        return self.lin(x)


def test_custom_head_and_clear_errors() -> None:
    model = _NoStates()
    batch = {"x": torch.randn(3, 4), "labels": torch.tensor([0, 1, 0])}
    with pytest.raises(ModelError, match="readout=head"):
        layer_losses(model, batch)  # unsupported family: says how to pass a head
    with pytest.raises(ModelError, match="no hidden states"):
        layer_losses(model, batch, readout=lambda h, b: h.sum())
    bert = tiny_bert(layers=2, hidden=H, heads=4, vocab=V).eval()
    with pytest.raises(DataError, match="labels"):
        layer_losses(bert, _text_batch(None))

    def head(h: torch.Tensor, b) -> torch.Tensor:  # a probe: mean squared first-token state
        return h[:, 0].pow(2).mean()

    f = layer_losses(bert.bert, _text_batch(None), readout=head)
    states = bert.bert(**_text_batch(None), output_hidden_states=True).hidden_states
    torch.testing.assert_close(f, torch.stack([h[:, 0].pow(2).mean() for h in states]))


def test_unrolled_models_read_their_layer_estimates() -> None:
    unrolled = pytest.importorskip("descentlab.models.unrolled")
    model = unrolled.UnrolledTransformer(image_size=8, num_frames=2, patch_size=4, depth=3, width=16, heads=2)
    g = torch.Generator().manual_seed(0)
    clean = torch.rand(2, 2, 8, 8, generator=g)
    noisy = clean + 0.1 * torch.randn(2, 2, 8, 8, generator=g)
    f = layer_losses(model, {"noisy": noisy, "target": clean})
    out = model(noisy)
    assert f.shape == (4,)
    torch.testing.assert_close(f[-1], nn.functional.mse_loss(out.final, clean))
    torch.testing.assert_close(f[0], nn.functional.mse_loss(out.layer_estimates[0], clean))
    torch.testing.assert_close(layer_losses(model, (noisy, clean)), f)
