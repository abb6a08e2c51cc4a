"""Image classifiers of any family (ViT, DeiT, BEiT, DINOv2, ...): the final layernorm and classifier on every
layer, as the model applies them to its last layer.

Hugging Face ViT returns its last hidden state *before* the final layernorm in ``hidden_states`` and applies
the norm afterwards; the traced tail (:mod:`descentlab.readout.structure`) is applied once to each layer
0..L-1, and layer L is the model's own ``last_hidden_state``. See :mod:`descentlab.readout.classifier`.
"""

from __future__ import annotations

from descentlab.readout.classifier import ClassifierReadout


class ViTReadout(ClassifierReadout):
    """Per-layer loss of any Hugging Face ``*ForImageClassification`` (batch: pixel_values, labels)."""

    name = "vit"
    suffixes = ("ForImageClassification",)


ImageClassifierReadout = ViTReadout
