"""What every readout shares: the interface, input filtering, hidden-state checks and the task losses."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from descentlab.errors import DataError, ModelError

Batch = Mapping[str, Any]
InnerCall = Callable[..., Any]
_MISSING = object()


class Readout:
    """Reads a model's task loss out at each of its L+1 representations, from one forward pass.

    Subclasses implement :meth:`supports` (may this readout handle the model?) and :meth:`compute` (the
    losses f_0..f_L as one tensor [L+1], differentiable in the model's parameters). Calling the readout
    unwraps DistributedDataParallel and runs ``compute`` inside the wrapper's forward (see
    :func:`run_in_forward`).
    """

    name = "readout"

    def supports(self, model: nn.Module) -> bool:
        raise NotImplementedError

    def compute(self, model: nn.Module, batch: Batch, call_model: InnerCall) -> Tensor:
        """The [L+1] losses of the unwrapped ``model``; ``call_model(...)`` runs its full forward."""
        raise NotImplementedError

    def __call__(self, model: nn.Module, batch: Batch) -> Tensor:
        return run_in_forward(
            uncompiled(model), lambda inner, call_inner: self.compute(inner, batch, call_inner)
        )


def _is_fsdp(model: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # older torch: no FSDP2
        return False
    return isinstance(model, FSDPModule)


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` is the ``OptimizedModule`` that ``torch.compile(model)`` returns."""
    dynamo = getattr(torch, "_dynamo", None)
    return dynamo is not None and isinstance(model, dynamo.eval_frame.OptimizedModule)


def uncompiled(model: nn.Module) -> nn.Module:
    """The module a ``torch.compile`` wrapper holds (``_orig_mod``, however many times it was compiled).

    A readout calls the model's sub-modules one by one (the body, then the head on every layer), which the
    compiled forward does not expose, so it reads the original module, eagerly; its parameters are the
    compiled model's own, so the gradients land where the optimizer expects them.
    """
    while is_compiled(model):
        model = model._orig_mod
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel wrapper and any ``torch.compile`` wrapper (the model
    itself otherwise)."""
    model = uncompiled(model)
    return uncompiled(model.module) if isinstance(model, nn.parallel.DistributedDataParallel) else model


def run_in_forward(model: nn.Module, compute: Callable[[nn.Module, InnerCall], Tensor]) -> Tensor:
    """Run ``compute(inner, call_inner)`` so that data-parallel machinery sees it as the model's forward.

    A readout calls sub-modules (the body, then the head on every layer) rather than ``model(...)``. Under
    DistributedDataParallel the gradients are only all-reduced after a forward through the wrapper, and
    under FSDP2 the root's parameters are only gathered by the root's forward hook. So for those models
    the computation runs *as* the inner module's forward for one call (the instance attribute ``forward``
    is swapped and restored); ``call_inner`` then is the inner module's original forward. For any other
    model it runs directly and ``call_inner`` is ``model`` itself (hooks and autocast wrappers included).
    """
    model = uncompiled(model)
    if not isinstance(model, nn.parallel.DistributedDataParallel) and not _is_fsdp(model):
        return compute(model, model)
    # under DDP the wrapped module (a compiled one too: its forward is an instance attribute) is swapped,
    # and the readout reads the original module inside it
    held = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    inner = uncompiled(held)
    saved = held.__dict__.get("forward", _MISSING)
    original = saved if saved is not _MISSING else type(held).forward.__get__(held)
    held.forward = lambda *args, **kwargs: compute(inner, original)
    try:
        return model()
    finally:
        if saved is _MISSING:
            del held.forward
        else:
            held.forward = saved


@lru_cache(maxsize=64)
def _named_parameters(forward_owner: type) -> frozenset[str]:
    params = inspect.signature(forward_owner.forward).parameters.values()
    return frozenset(
        p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
    )


def accepts(module: nn.Module, name: str) -> bool:
    """Whether ``module.forward`` has a parameter called ``name``."""
    return name in _named_parameters(type(module))


def model_inputs(module: nn.Module, batch: Batch, drop: Sequence[str] = ("labels",)) -> dict[str, Tensor]:
    """The tensors of ``batch`` that ``module.forward`` names, minus ``drop`` (labels are read out by us)."""
    if not isinstance(batch, Mapping):
        raise DataError(
            f"expected a dict batch (input_ids, attention_mask, labels, ...), got {type(batch).__name__}"
        )
    names = _named_parameters(type(module))
    inputs = {k: v for k, v in batch.items() if k in names and k not in drop and isinstance(v, Tensor)}
    check_sequence_length(module, inputs.get("input_ids"))
    return inputs


def check_sequence_length(module: nn.Module, input_ids: Tensor | None) -> None:
    """Raise DataError when the sequences are longer than the model's position table allows.

    Left alone, the model fails deep inside its embeddings with a shape error that names no cause.
    """
    config = getattr(module, "config", None)
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if input_ids is None or not isinstance(limit, int) or input_ids.dim() < 2:
        return
    length = int(input_ids.shape[-1])
    if length > limit:
        raise DataError(
            f"sequence length {length} exceeds the model's maximum of {limit} positions; tokenize with "
            f"truncation=True, max_length={limit} (or less)"
        )


def hidden_states_of(output: Any, num_layers: int | None, model: nn.Module) -> tuple[Tensor, ...]:
    """``output.hidden_states`` checked to hold L+1 states (the embedding output and one per layer)."""
    states = getattr(output, "hidden_states", None)
    if states is None:
        raise ModelError(
            f"{type(model).__name__} returned no hidden states with output_hidden_states=True; per-layer "
            "losses need every layer's representation: use a model that returns them, or pass "
            "layer_losses(model, batch, readout=fn) with fn returning the [L+1] losses"
        )
    if num_layers is not None and len(states) != num_layers + 1:
        raise ModelError(
            f"{type(model).__name__} returned {len(states)} hidden states for num_hidden_layers={num_layers}; "
            f"expected {num_layers + 1} (embeddings + one per layer)"
        )
    return tuple(states)


def require_labels(batch: Batch, key: str = "labels") -> Tensor:
    labels = batch.get(key) if isinstance(batch, Mapping) else None
    if not isinstance(labels, Tensor):
        raise DataError(
            f"the batch has no '{key}' tensor; per-layer losses need the targets in batch['{key}']"
        )
    return labels


def classification_loss(logits: Tensor, labels: Tensor, config: Any) -> Tensor:
    """The loss a Hugging Face sequence/image classifier computes from its logits.

    Same rule as transformers: ``config.problem_type``, else regression when num_labels == 1,
    single-label CE for integer labels, multi-label BCE otherwise. The config is not mutated.
    """
    num_labels = int(config.num_labels)
    problem = config.problem_type
    if problem is None:
        if num_labels == 1:
            problem = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem = "single_label_classification"
        else:
            problem = "multi_label_classification"
    labels = labels.to(logits.device)
    if problem == "regression":
        if num_labels == 1:
            return F.mse_loss(logits.squeeze(), labels.squeeze().to(logits.dtype))
        return F.mse_loss(logits, labels.to(logits.dtype))
    if problem == "single_label_classification":
        return F.cross_entropy(logits.view(-1, num_labels), labels.view(-1))
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
