"""Per-layer losses f(X, Φ_l), l = 0..L, read out with the model's own head.

The paper (arXiv 2601.17257) constrains the loss f(X, Φ_l) at every layer of an unchanged architecture; how
each model family reads it out is our choice, listed in docs/methods.md.

``layer_losses(model, batch)`` dispatches through the registry (registered readouts first):

* any Hugging Face ``*ForSequenceClassification`` (BERT, DeBERTa-v2/v3, ModernBERT, MPNet, RoBERTa, ...):
  :class:`~descentlab.readout.encoder.EncoderClassifierReadout`;
* any Hugging Face causal LM (Llama, GPT-2, OPT, Falcon, ...): :class:`~descentlab.readout.causal_lm.CausalLMReadout`
  (fused chunked CE; in a training step layers 0..L-1 read an unbiased token subsample of ⌈N / 2R⌉ targets,
  so the readout costs under one extra LM-head pass whatever the depth; without gradients every token);
* any Hugging Face ``*ForImageClassification`` (ViT, DeiT, ...): :class:`~descentlab.readout.vit.ViTReadout`;

The Hugging Face readouts find the final norm, pooler and head from the model's structure
(:mod:`descentlab.readout.structure`), not from a list of classes; the classifier heads are the model's own
code, replayed on every layer.
* descentlab's unrolled models (UT, DUST): :class:`~descentlab.readout.unrolled.UnrolledReadout`;
* anything else: a head callable ``readout=fn(hidden_state, batch) -> loss``, or a registered Readout.
"""

from __future__ import annotations

from torch import Tensor, nn

from descentlab.errors import ConfigError
from descentlab.readout.base import Batch, Readout, uncompiled
from descentlab.readout.causal_lm import CausalLMReadout, chunked_token_ce
from descentlab.readout.classifier import ClassifierReadout
from descentlab.readout.custom import HeadReadout, find_readout, register_readout, registered
from descentlab.readout.encoder import EncoderClassifierReadout
from descentlab.readout.structure import BackbonePlan, trace_backbone
from descentlab.readout.unrolled import (
    LayerEstimates,
    UnrolledReadout,
    estimate_losses,
    returns_layer_estimates,
)
from descentlab.readout.vit import ImageClassifierReadout, ViTReadout

for _builtin in (EncoderClassifierReadout(), CausalLMReadout(), ViTReadout(), UnrolledReadout()):
    register_readout(_builtin, first=False)

BUILTIN = {r.name: type(r) for r in registered()}


def layer_losses(
    model: nn.Module, batch: Batch, readout: Readout | str | object | None = None, *, layers: str = "all"
) -> Tensor:
    """The batch-mean loss read out at layers 0..L, from one forward pass, as a tensor [L+1].

    Args:
        model: the model, in the mode (train/eval) the caller wants; a ``torch.compile``-d model is read
            through its original module (``_orig_mod``), eagerly, with the same parameters.
        batch: the batch as the model takes it, with the targets (``labels``, or ``target`` for unrolled).
        readout: None to dispatch by family; a Readout (e.g. ``CausalLMReadout(sample_tokens=64)``); a
            built-in name ("encoder", "causal_lm", "vit", "unrolled"); or a head callable
            ``fn(hidden_state, batch) -> scalar loss`` applied to each of the L+1 hidden states.
        layers: "all" reads every layer; "final" only what an evaluation needs beside the model's own loss,
            the final constraint's check f_{L-1}, f_L: a causal LM's readout then reads layer L-1 and L (two
            head passes where "all" takes L+1; the others come back NaN), other families every layer (their
            heads are small).

    Returns:
        f [L+1], differentiable in the model's parameters; f[-1] is the model's own loss. For a causal LM
        with gradients enabled, f[:-1] are unbiased estimates from a shared token subsample (the default
        readout's ``sample_tokens="auto"``); pass ``CausalLMReadout(sample_tokens=None)`` for every token.
    """
    model = uncompiled(model)  # torch.compile(model): the readout reads the original module
    if layers not in ("all", "final"):
        raise ConfigError(f"layers must be 'all' or 'final', got {layers!r}")
    if readout is None:
        chosen: Readout = find_readout(model)
    elif isinstance(readout, Readout):
        chosen = readout
    elif isinstance(readout, str):
        if readout not in BUILTIN:
            raise ConfigError(
                f"unknown readout {readout!r}; choose one of {sorted(BUILTIN)} or pass a callable"
            )
        chosen = BUILTIN[readout]()
    elif callable(readout):
        chosen = HeadReadout(readout)
    else:
        raise ConfigError(
            f"readout must be None, a Readout, a name or a callable, got {type(readout).__name__}"
        )
    if layers == "final" and isinstance(chosen, CausalLMReadout):
        chosen = chosen.reading([-1])
    return chosen(model, batch)


__all__ = [
    "BackbonePlan",
    "CausalLMReadout",
    "ClassifierReadout",
    "EncoderClassifierReadout",
    "HeadReadout",
    "ImageClassifierReadout",
    "LayerEstimates",
    "Readout",
    "UnrolledReadout",
    "ViTReadout",
    "chunked_token_ce",
    "estimate_losses",
    "find_readout",
    "layer_losses",
    "register_readout",
    "returns_layer_estimates",
    "trace_backbone",
]
