"""Encoder sequence classifiers (BERT, ALBERT, DistilBERT, RoBERTa, XLM-R, ELECTRA): the model's own head
applied to every layer's first token.

f_l = task loss of head(Φ_l), where head is exactly what the model applies to its last layer:

* BERT:                  classifier(dropout(pooler(Φ_l)))         (pooler = dense + tanh on token 0)
* ALBERT:                classifier(dropout(tanh(pooler(Φ_l[:, 0]))))
* DistilBERT:            classifier(dropout(relu(pre_classifier(Φ_l[:, 0]))))
* RoBERTa / XLM-R / ELECTRA: classifier(Φ_l)                      (its head takes the sequence, uses token 0)

The head runs once on the stacked first tokens of all L+1 layers ([L+1]·B rows), so the readout costs one
extra head evaluation per layer on B tokens; the body runs once.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from descentlab.errors import ModelError
from descentlab.readout.base import (
    Batch,
    InnerCall,
    Readout,
    classification_loss,
    hidden_states_of,
    model_inputs,
    require_labels,
)

POOLER_FAMILIES = ("bert", "megatron-bert")
LINEAR_POOLER_FAMILIES = ("albert",)
DISTIL_FAMILIES = ("distilbert",)
SEQUENCE_HEAD_FAMILIES = ("roberta", "xlm-roberta", "camembert", "roberta-prelayernorm", "electra")


def _model_type(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None)


class EncoderClassifierReadout(Readout):
    """Per-layer loss of a Hugging Face ``*ForSequenceClassification`` encoder (needs ``batch['labels']``)."""

    name = "encoder"

    def supports(self, model: nn.Module) -> bool:
        families = POOLER_FAMILIES + LINEAR_POOLER_FAMILIES + DISTIL_FAMILIES + SEQUENCE_HEAD_FAMILIES
        return type(model).__name__.endswith("ForSequenceClassification") and _model_type(model) in families

    def head_logits(self, model: nn.Module, first_tokens: Tensor) -> Tensor:
        """The model's classification head on first-token states ``[N, H]`` -> logits ``[N, C]``."""
        family = _model_type(model)
        if family in POOLER_FAMILIES:
            pooler = getattr(model.base_model, "pooler", None)
            if pooler is None:
                raise ModelError(
                    f"{type(model).__name__} has no pooler; pass readout=fn(hidden_state, batch)"
                )
            return model.classifier(model.dropout(pooler(first_tokens.unsqueeze(1))))
        if family in LINEAR_POOLER_FAMILIES:
            base = model.base_model
            return model.classifier(model.dropout(base.pooler_activation(base.pooler(first_tokens))))
        if family in DISTIL_FAMILIES:
            pooled = torch.relu(model.pre_classifier(first_tokens))
            return model.classifier(model.dropout(pooled))
        return model.classifier(first_tokens.unsqueeze(1))

    def compute(self, model: nn.Module, batch: Batch, call_model: InnerCall) -> Tensor:
        labels = require_labels(batch)
        base = model.base_model
        out = base(**model_inputs(base, batch), output_hidden_states=True, return_dict=True)
        states = hidden_states_of(out, getattr(model.config, "num_hidden_layers", None), model)
        firsts = torch.stack([h[:, 0] for h in states])  # [L+1, B, H]
        n_states, b, width = firsts.shape
        logits = self.head_logits(model, firsts.reshape(n_states * b, width)).view(n_states, b, -1)
        return torch.stack([classification_loss(logits[i], labels, model.config) for i in range(n_states)])
