"""Any other model: a custom head callable, and the registry that ``layer_losses`` dispatches through."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from descentlab.errors import ConfigError, ModelError
from descentlab.readout.base import Batch, InnerCall, Readout, hidden_states_of, model_inputs, unwrap

Head = Callable[[Tensor, Batch], Tensor]


class HeadReadout(Readout):
    """f_l = head(Φ_l, batch) for each of the model's L+1 hidden states, from one forward pass.

    Args:
        head: (hidden_state [B, T, H] or whatever the model returns per layer, batch) -> scalar loss.
        num_layers: expected L (checked against the number of hidden states); None to accept any.

    The model is called as ``model(**inputs, output_hidden_states=True)`` with the batch tensors its forward
    names (minus ``labels``), and must return ``hidden_states``.
    """

    name = "head"

    def __init__(self, head: Head, num_layers: int | None = None) -> None:
        if not callable(head):
            raise ConfigError(
                f"head must be callable (hidden_state, batch) -> loss, got {type(head).__name__}"
            )
        self.head = head
        self.num_layers = num_layers

    def supports(self, model: nn.Module) -> bool:
        return True

    def compute(self, model: nn.Module, batch: Batch, call_model: InnerCall) -> Tensor:
        inputs = model_inputs(model, batch) if isinstance(batch, Mapping) else {}
        out = call_model(**inputs, output_hidden_states=True)
        states = hidden_states_of(out, self.num_layers, model)
        losses = [self.head(h, batch) for h in states]
        bad = [i for i, v in enumerate(losses) if not isinstance(v, Tensor) or v.numel() != 1]
        if bad:
            raise ModelError(f"the head must return a scalar tensor per layer; layer(s) {bad} did not")
        return torch.stack([v.reshape(()) for v in losses])


_REGISTRY: list[Readout] = []


def register_readout(readout: Readout, *, first: bool = True) -> Readout:
    """Add a readout for another model family; ``layer_losses`` tries it (first: before the built-ins)."""
    if not isinstance(readout, Readout):
        raise ConfigError(
            f"register a Readout instance (with supports() and __call__), got {type(readout).__name__}"
        )
    if first:
        _REGISTRY.insert(0, readout)
    else:
        _REGISTRY.append(readout)
    return readout


def registered() -> list[Readout]:
    """The registry in dispatch order."""
    return list(_REGISTRY)


def find_readout(model: nn.Module) -> Readout:
    """The first registered readout that supports ``model``; a ModelError that says how to pass one otherwise."""
    model = unwrap(model)
    for readout in _REGISTRY:
        if readout.supports(model):
            return readout
    names = ", ".join(r.name for r in _REGISTRY)
    raise ModelError(
        f"no per-layer readout for {type(model).__name__} (built in: {names}); pass "
        "layer_losses(model, batch, readout=head) with head(hidden_state, batch) -> loss, or "
        "register_readout(...) a Readout for this family"
    )
