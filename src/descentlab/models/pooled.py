"""A sequence classifier that mean-pools its encoder's tokens: the pooling all-MiniLM-L6-v2 was trained with.

    logits = classifier(dropout(Σ_t m_t Φ_t / Σ_t m_t))        m = attention_mask

``MeanPoolingForSequenceClassification`` wraps any Hugging Face encoder backbone (``AutoModel``) and is itself
a ``*ForSequenceClassification`` with a ``base_model``, so :func:`descentlab.layer_losses` reads it out at
every layer by replaying *this* forward on each layer's hidden state: every layer is read out through the
same rule the model predicts with (no pooler, no [CLS]). ``get_input_embeddings`` is the backbone's, so the
embedding-noise hooks see the same module as for the backbone's own classifier.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn


def masked_mean(states: Tensor, attention_mask: Tensor | None) -> Tensor:
    """Mean of ``states [B, T, H]`` over the positions where ``attention_mask [B, T]`` is 1 (all if None)."""
    if attention_mask is None:
        return states.mean(1)
    m = attention_mask.to(states.dtype).unsqueeze(-1)
    return (states * m).sum(1) / m.sum(1).clamp_min(1.0)


class MeanPoolingForSequenceClassification(nn.Module):
    """``backbone`` (an HF encoder returning ``last_hidden_state``) + masked mean pooling + dropout + linear.

    Args:
        backbone: the encoder, e.g. ``AutoModel.from_pretrained(...)`` or ``BertModel(config)``.
        num_labels: classes of the new linear head.
        dropout: dropout before the head (default: the backbone's ``hidden_dropout_prob`` or 0.1).

    ``config`` is the backbone's config with ``num_labels`` set; the forward returns a
    ``SequenceClassifierOutput`` (cross-entropy loss when ``labels`` are given).
    """

    def __init__(self, backbone: nn.Module, num_labels: int = 2, dropout: float | None = None) -> None:
        super().__init__()
        self.encoder = backbone
        self.config = backbone.config
        self.config.num_labels = num_labels
        p = getattr(self.config, "hidden_dropout_prob", 0.1) if dropout is None else dropout
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(self.config.hidden_size, num_labels)
        nn.init.normal_(self.classifier.weight, std=getattr(self.config, "initializer_range", 0.02))
        nn.init.zeros_(self.classifier.bias)

    @property
    def base_model(self) -> nn.Module:
        return self.encoder

    def get_input_embeddings(self) -> nn.Module:
        return self.encoder.get_input_embeddings()

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> Any:
        from transformers.modeling_outputs import SequenceClassifierOutput

        kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        out = self.encoder(**kwargs, output_hidden_states=output_hidden_states, return_dict=True)
        logits = self.classifier(self.dropout(masked_mean(out.last_hidden_state, attention_mask)))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)


def mean_pooling_classifier(
    source: str, num_labels: int, **kwargs: Any
) -> MeanPoolingForSequenceClassification:
    """The pretrained encoder at ``source`` (HF id or folder) under a fresh mean-pooling head.

    The backbone is loaded without its pooler (``add_pooling_layer=False`` where the family has one).
    """
    from transformers import AutoModel

    try:
        backbone = AutoModel.from_pretrained(source, add_pooling_layer=False, **kwargs)
    except TypeError:  # families without a pooler do not take the keyword
        backbone = AutoModel.from_pretrained(source, **kwargs)
    return MeanPoolingForSequenceClassification(backbone, num_labels)


__all__ = ["MeanPoolingForSequenceClassification", "masked_mean", "mean_pooling_classifier"]
