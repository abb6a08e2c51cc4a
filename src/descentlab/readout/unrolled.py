"""Unrolled models (UT, DUST): every layer already produces an estimate through the shared decoder.

f_l = mean over the batch of ||x̂_l - x||² / numel(x)    (MSE of layer l's estimate, l = 0..L)

The model's output carries ``layer_estimates`` ([L+1, ...] tensor or a list; index 0 is the initial
iterate's estimate) and ``final``; the batch carries the clean ``target``.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from descentlab.errors import DataError, ModelError
from descentlab.readout.base import Batch, InnerCall, Readout

INPUT_KEYS = ("noisy", "input", "inputs", "x")
TARGET_KEYS = ("target", "clean", "labels")
LAYER_ESTIMATE_FIELDS = ("final", "layer_estimates")


def estimate_losses(layer_estimates: Tensor | Sequence[Tensor], target: Tensor) -> Tensor:
    """f_l = mean((x̂_l - x)²) for each layer's estimate x̂_l; returns [L+1]."""
    est = layer_estimates if isinstance(layer_estimates, Tensor) else torch.stack(list(layer_estimates))
    if est.shape[1:] != target.shape:
        raise DataError(
            f"layer estimates have shape {tuple(est.shape[1:])} but the target has {tuple(target.shape)}; the "
            "batch's 'target' must be the clean signal the model estimates"
        )
    return (est - target.to(est.dtype).unsqueeze(0)).pow(2).flatten(1).mean(1)


@runtime_checkable
class LayerEstimates(Protocol):
    """What an unrolled model's forward returns: the final estimate and every layer's (index 0 first)."""

    final: Tensor
    layer_estimates: Tensor | Sequence[Tensor]


def returns_layer_estimates(model: nn.Module) -> bool:
    """Whether ``model.forward`` is annotated to return a :class:`LayerEstimates` (e.g. UnrolledOutput).

    The model is recognised by its output type, read from the annotations, so no model class is imported.
    """
    forward = getattr(type(model), "forward", None)
    try:
        returned = typing.get_type_hints(forward).get("return") if forward is not None else None
    except Exception:  # annotations that do not resolve: not a model this readout knows
        return False
    if not isinstance(returned, type):
        return False
    fields: set[str] = set()
    for cls in returned.__mro__:
        fields.update(getattr(cls, "__annotations__", {}))
    return all(name in fields for name in LAYER_ESTIMATE_FIELDS)


def _pick(batch: Mapping[str, object], keys: Sequence[str], what: str) -> Tensor:
    for key in keys:
        value = batch.get(key)
        if isinstance(value, Tensor):
            return value
    raise DataError(f"the batch has no {what} tensor; put it under one of {list(keys)}")


class UnrolledReadout(Readout):
    """Per-layer MSE of a model whose forward returns a :class:`LayerEstimates` (e.g. UnrolledOutput)."""

    name = "unrolled"

    def supports(self, model: nn.Module) -> bool:
        return returns_layer_estimates(model)

    def compute(self, model: nn.Module, batch: Batch, call_model: InnerCall) -> Tensor:
        if isinstance(batch, Mapping):
            inputs, target = _pick(batch, INPUT_KEYS, "input"), _pick(batch, TARGET_KEYS, "target")
        elif isinstance(batch, Sequence) and len(batch) == 2:
            inputs, target = batch
        else:
            raise DataError("an unrolled-model batch is {'noisy': x, 'target': clean} or a pair (x, clean)")
        out = call_model(inputs)
        estimates = getattr(out, "layer_estimates", None)
        if estimates is None:
            raise ModelError(
                f"{type(model).__name__} output has no layer_estimates; return an UnrolledOutput or pass "
                "readout=fn(hidden_state, batch)"
            )
        return estimate_losses(estimates, target)
