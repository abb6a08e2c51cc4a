"""Activation checkpointing for Hugging Face transformers, under either of its API names."""

from __future__ import annotations

from torch import nn


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer in the backward pass (transformers >= 5 name, else the older one).

    The non-reentrant form is used: it supports graphs with extra branches, such as a per-layer readout
    that reads every hidden state.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


__all__ = ["enable_activation_checkpointing"]
