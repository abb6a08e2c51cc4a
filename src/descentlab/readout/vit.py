"""ViT image classifiers: the final layernorm and the classifier on every layer's CLS token.

f_l = task loss of classifier(layernorm(Φ_l)[:, 0]). The layernorm is per token, so it runs on the CLS rows
only. Hugging Face ViT returns its last hidden state *before* the final layernorm in ``hidden_states`` (the
model applies it afterwards), so every layer, the last included, goes through the same layernorm.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from descentlab.readout.base import (
    Batch,
    InnerCall,
    Readout,
    classification_loss,
    hidden_states_of,
    model_inputs,
    require_labels,
)

VIT_FAMILIES = ("vit", "deit")


class ViTReadout(Readout):
    """Per-layer loss of a Hugging Face ``ViTForImageClassification`` (batch: pixel_values, labels)."""

    name = "vit"

    def supports(self, model: nn.Module) -> bool:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        return type(model).__name__.endswith("ForImageClassification") and model_type in VIT_FAMILIES

    def compute(self, model: nn.Module, batch: Batch, call_model: InnerCall) -> Tensor:
        labels = require_labels(batch)
        base = model.base_model
        out = base(**model_inputs(base, batch), output_hidden_states=True, return_dict=True)
        states = hidden_states_of(out, getattr(model.config, "num_hidden_layers", None), model)
        cls = torch.stack([h[:, 0] for h in states])  # [L+1, B, H]
        if out.last_hidden_state is states[-1]:
            # A model that ties its last state to the normed output: do not normalise that one twice.
            normed = torch.cat([base.layernorm(cls[:-1]), cls[-1:]])
        else:
            normed = base.layernorm(cls)
        logits = model.classifier(normed)
        return torch.stack([classification_loss(logits[i], labels, model.config) for i in range(len(states))])
