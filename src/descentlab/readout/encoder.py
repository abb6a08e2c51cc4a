"""Sequence classifiers of any family (BERT, ALBERT, DistilBERT, RoBERTa, XLM-R, ELECTRA, DeBERTa-v2/v3,
MPNet, ModernBERT, GPT-2/Llama ``*ForSequenceClassification``, ...): the model's own head on every layer.

See :mod:`descentlab.readout.classifier` for how the pooler and head are found and replayed.
"""

from __future__ import annotations

from descentlab.readout.classifier import ClassifierReadout


class EncoderClassifierReadout(ClassifierReadout):
    """Per-layer loss of any Hugging Face ``*ForSequenceClassification`` (needs ``batch['labels']``)."""

    name = "encoder"
    suffixes = ("ForSequenceClassification",)
