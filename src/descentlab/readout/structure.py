"""The model's own readout path, found from its structure: blocks, final transform, pooler, head.

A Hugging Face task model is ``head(backbone(x))``. The backbone runs L blocks, then a *tail* that turns
the last block's output into ``last_hidden_state`` (a final norm, OPT's ``project_out``, nothing for BERT),
and may add a pooler (``pooler_output``). The readout of layer l feeds Φ_l through the same tail, pooler and
head, so f_L is the model's own loss and the final norm is applied once per layer.

Nothing here lists model classes. :func:`trace_backbone` runs the backbone once with forward hooks on its
sub-modules and reads the structure off the calls:

* the blocks: the ``nn.ModuleList`` whose children are called L times in all (L = len(hidden_states) - 1;
  ALBERT calls one shared group L times);
* the tail: the module calls that start after the last block returned, made by the code that called the
  blocks (or its callers), that carry the running state from the last block's output to
  ``last_hidden_state``;
* the pooler: the remaining tail calls that map ``last_hidden_state`` (or its first token) to
  ``pooler_output``.

Every link is checked on the traced tensors (by identity, else by value); anything that does not chain up
raises one :class:`~descentlab.errors.ModelError` naming the missing piece. The readouts trace a separate
forward on one row and two positions of the batch (:func:`minimal_inputs`), without gradients and with the
random state restored (:func:`probing`), never the training forward: hooks that keep every sub-module's
input and output would defeat activation checkpointing on the first step. The result is a
:class:`BackbonePlan` of module names, cached per model; the head itself is the model's own code, replayed
with :func:`replay_head` on the backbone output of another layer.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from descentlab.errors import ModelError

_MISSING = object()


@dataclasses.dataclass(frozen=True)
class BackbonePlan:
    """What :func:`trace_backbone` found, as module names relative to the backbone.

    Attributes:
        blocks: the block list (e.g. ``"layers"``, ``"encoder.layer"``, ``"decoder.layers"``).
        tail: modules applied in order to the last block's output to give ``last_hidden_state``.
        pooler: modules that give ``pooler_output`` from ``last_hidden_state``, or None (no pooler).
        pooler_input: "sequence" (the whole state) or "first" (its first token ``[:, 0]``).
        intermediate_raw: the hidden states of layers 0..L-1 are the blocks' raw inputs (not yet tailed).
    """

    blocks: str
    tail: tuple[str, ...]
    pooler: tuple[str, ...] | None
    pooler_input: str
    intermediate_raw: bool = True

    def apply_tail(self, backbone: nn.Module, x: Tensor) -> Tensor:
        """Φ_l -> what ``last_hidden_state`` would be if the model ended after layer l."""
        for name in self.tail:
            x = backbone.get_submodule(name)(x)
        return x

    def apply_pooler(self, backbone: nn.Module, x: Tensor) -> Tensor | None:
        """``last_hidden_state``-like state -> ``pooler_output`` (None when the backbone has no pooler)."""
        if self.pooler is None:
            return None
        if self.pooler_input == "first":
            x = x[:, 0]
        for name in self.pooler:
            x = backbone.get_submodule(name)(x)
        return x

    def describe(self) -> str:
        tail = " -> ".join(self.tail) if self.tail else "none"
        pool = "none" if self.pooler is None else " -> ".join(self.pooler)
        if self.pooler is not None and self.pooler_input == "first":
            pool = "[:, 0]" + (f" -> {pool}" if self.pooler else "")
        return f"blocks {self.blocks}; final transform {tail}; pooler {pool}"


@dataclasses.dataclass
class _Call:
    name: str
    parent: str | None  # the hooked module whose forward made this call (None: the backbone's own code)
    stack: tuple[str, ...]
    start: int
    end: int = -1
    inp: Any = None
    out: Any = None


def first_tensor(value: Any) -> Tensor | None:
    """The first tensor of a module's input or output (a tensor, a tuple, or a ModelOutput)."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, Tensor):
                return item
    return None


def same(a: Tensor | None, b: Tensor | None) -> bool:
    """The same tensor object, or equal in shape and value (exactly; the trace compares what ran)."""
    if a is None or b is None:
        return False
    if a is b:
        return True
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.detach(), b.detach()))


@contextlib.contextmanager
def _recorder(backbone: nn.Module) -> Iterator[list[_Call]]:
    calls: list[_Call] = []
    stack: list[_Call] = []
    counter = [0]
    handles = []

    def pre(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            inp = args[0] if args else first_tensor(kwargs)
            call = _Call(
                name,
                stack[-1].name if stack else None,
                tuple(c.name for c in stack),
                counter[0],
                inp=inp,
            )
            counter[0] += 1
            stack.append(call)

        return hook

    def post(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            # pop up to this call (a module that raised inside leaves nothing behind: the forward fails)
            while stack and stack[-1].name != name:
                stack.pop()
            if not stack:
                return
            call = stack.pop()
            call.out, call.end = output, counter[0]
            counter[0] += 1
            calls.append(call)

        return hook

    for name, module in backbone.named_modules():
        if module is backbone or not name:
            continue
        handles.append(module.register_forward_pre_hook(pre(name), with_kwargs=True))
        handles.append(module.register_forward_hook(post(name), with_kwargs=True))
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def _find_blocks(backbone: nn.Module, calls: list[_Call], num_layers: int) -> tuple[str, list[_Call]]:
    counts: dict[str, list[_Call]] = {}
    lists = {name for name, m in backbone.named_modules() if isinstance(m, nn.ModuleList) and name}
    for call in calls:
        owner = call.name.rsplit(".", 1)[0] if "." in call.name else ""
        if owner in lists and call.name.rsplit(".", 1)[1].isdigit():
            counts.setdefault(owner, []).append(call)
    matching = [name for name in counts if len(counts[name]) == num_layers]
    if not matching:
        found = {name: len(c) for name, c in counts.items()} or "none"
        raise ModelError(
            f"{type(backbone).__name__}: no block list runs {num_layers} times (the number of hidden states "
            f"minus one); module lists called: {found}. Pass layer_losses(model, batch, readout=fn) or "
            "register_readout(...) for this family"
        )
    name = min(matching, key=lambda n: (n.count("."), n))  # the outermost (ALBERT: the layer groups)
    return name, sorted(counts[name], key=lambda c: c.start)


def trace_backbone(backbone: nn.Module, run: Callable[[], Any]) -> tuple[BackbonePlan, Any]:
    """Run ``run()`` (the backbone's forward with hidden states) under hooks and read off its structure.

    Returns:
        (the plan, the forward's output), so the traced forward is also the one the readout uses.

    Raises:
        ModelError: no hidden states, no block list, or a tail / pooler that does not chain up.
    """
    with _recorder(backbone) as calls:
        out = run()
    owner = type(backbone).__name__
    states = getattr(out, "hidden_states", None)
    last = getattr(out, "last_hidden_state", None)
    if states is None or not isinstance(last, Tensor):
        raise ModelError(
            f"{owner} returned no hidden_states / last_hidden_state with output_hidden_states=True; per-layer "
            "losses need every layer's representation: pass layer_losses(model, batch, readout=fn)"
        )
    num_layers = len(states) - 1
    blocks, block_calls = _find_blocks(backbone, calls, num_layers)
    last_block = block_calls[-1]
    callers = {None, *last_block.stack}

    def inside_blocks(call: _Call) -> bool:
        return any(s == blocks or s.startswith(blocks + ".") for s in (call.name, *call.stack))

    after = sorted(
        (c for c in calls if c.start > last_block.end and c.parent in callers and not inside_blocks(c)),
        key=lambda c: c.start,
    )
    # the tail: calls that carry the running state, from the last block's output to last_hidden_state
    x = first_tensor(last_block.out)
    tail: list[str] = []
    used: set[int] = set()
    for i, call in enumerate(after):
        if same(x, last):
            break
        if same(call.inp, x) and isinstance(first_tensor(call.out), Tensor):
            tail.append(call.name)
            used.add(i)
            x = first_tensor(call.out)
    if not same(x, last):
        traced = " -> ".join(tail) or "nothing"
        raise ModelError(
            f"{owner}: could not trace how the last block's output ('{blocks}') becomes last_hidden_state "
            f"(traced: {traced}); the final transform is not a chain of sub-modules. Pass "
            "layer_losses(model, batch, readout=fn) or register_readout(...) for this family"
        )
    # the intermediate hidden states must be the raw block inputs, or the tail would be applied twice
    raw = all(same(states[k + 1], first_tensor(block_calls[k].out)) for k in range(num_layers - 1))
    if not raw:
        raise ModelError(
            f"{owner}: hidden_states[1..L-1] are not the outputs of the blocks '{blocks}', so the final "
            "transform cannot be applied exactly once; pass layer_losses(model, batch, readout=fn)"
        )
    pooler, pooler_input = _trace_pooler(owner, out, last, [c for i, c in enumerate(after) if i not in used])
    return BackbonePlan(blocks, tuple(tail), pooler, pooler_input, raw), out


def _trace_pooler(
    owner: str, out: Any, last: Tensor, rest: list[_Call]
) -> tuple[tuple[str, ...] | None, str]:
    pooled = getattr(out, "pooler_output", None)
    if not isinstance(pooled, Tensor):
        return None, "sequence"
    if last.dim() >= 2 and same(pooled, last[:, 0]):
        return (), "first"  # the first token itself (DINOv2)
    for start, call in enumerate(rest):
        if same(call.inp, last):
            kind = "sequence"
        elif last.dim() >= 2 and same(call.inp, last[:, 0]):
            kind = "first"
        else:
            continue
        chain, x = [call.name], first_tensor(call.out)
        for nxt in rest[start + 1 :]:
            if same(x, pooled):
                break
            if same(nxt.inp, x):
                chain.append(nxt.name)
                x = first_tensor(nxt.out)
        if same(x, pooled):
            return tuple(chain), kind
    raise ModelError(
        f"{owner} returns a pooler_output that no chain of its sub-modules computes from last_hidden_state "
        "(or its first token); pass layer_losses(model, batch, readout=fn) for this family"
    )


_PLANS: weakref.WeakKeyDictionary[nn.Module, BackbonePlan] = weakref.WeakKeyDictionary()

PROBE_TOKENS = 2


def minimal_inputs(inputs: Mapping[str, Any], tokens: int | None = PROBE_TOKENS) -> dict[str, Any]:
    """The first row of a batch, cut to its first ``tokens`` positions (None: all), with every position
    attended: the smallest forward that shows a model's structure.

    Tensors whose leading dimension is the batch size lose the other rows; those shaped ``[B, T, ...]``
    like ``input_ids`` (or ``[B, ., T, T]`` masks) also lose positions >= ``tokens``. Other values pass.
    """
    ids = inputs.get("input_ids")
    lead = ids if isinstance(ids, Tensor) else first_tensor(dict(inputs))
    if lead is None or lead.dim() == 0:
        return dict(inputs)
    batch = lead.shape[0]
    length = lead.shape[1] if isinstance(ids, Tensor) and ids.dim() >= 2 else None
    keep = None if tokens is None or length is None else min(tokens, length)
    small: dict[str, Any] = {}
    for key, value in inputs.items():
        if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == batch:
            value = value[:1]
            if keep is not None and value.dim() >= 2 and value.shape[1] == length:
                value = value[:, :keep]
            elif keep is not None and value.dim() == 4 and value.shape[-2:] == (length, length):
                value = value[..., :keep, :keep]
            if key == "attention_mask":
                value = torch.ones_like(value) if value.dim() == 2 else value
        small[key] = value
    return small


@contextlib.contextmanager
def probing(module: nn.Module) -> Iterator[None]:
    """No gradients, and the random state restored afterwards (a probe forward draws no dropout mask that
    the training forward would otherwise have drawn). :func:`in_probe` is True inside, so that input hooks
    (noise that expects whole replicas of the batch) let the probe pass untouched."""
    param = next(module.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    devices = [device] if device.type not in ("cpu", "meta") else []
    kwargs = {"device_type": device.type} if devices else {}
    token = _PROBING.set(True)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices, **kwargs):
            yield
    finally:
        _PROBING.reset(token)


_PROBING: contextvars.ContextVar[bool] = contextvars.ContextVar("descentlab_probing", default=False)


def in_probe() -> bool:
    """True while a structure probe forward runs (:func:`probing`): its batch is one short row, not data."""
    return _PROBING.get()


def backbone_forward(
    backbone: nn.Module,
    run: Callable[[], Any],
    probe: Callable[[int | None], Any] | None = None,
) -> tuple[BackbonePlan, Any]:
    """The backbone's forward output and its plan (traced once per backbone, then cached).

    Args:
        backbone: the backbone.
        run: its forward with hidden states, as the readout uses it.
        probe: ``probe(tokens)`` runs the same forward on :func:`minimal_inputs` of the batch. When given,
            the structure is traced on ``probe(PROBE_TOKENS)`` under :func:`probing` (retried once on the
            whole first row), so the traced forward holds a few small tensors and the training forward
            runs without hooks: the first step's peak memory is that of every later step. Without it,
            ``run()`` itself is traced (its hooks keep every sub-module's input and output to the end).
    """
    plan = _PLANS.get(backbone)
    if plan is not None:
        return plan, run()
    if probe is None:
        plan, out = trace_backbone(backbone, run)
        _PLANS[backbone] = plan
        return plan, out
    with probing(backbone):
        try:
            plan, _ = trace_backbone(backbone, lambda: probe(PROBE_TOKENS))
        except Exception:  # a model that needs more positions than the probe has: its whole first row
            plan, _ = trace_backbone(backbone, lambda: probe(None))
    _PLANS[backbone] = plan
    return plan, run()


def backbone_of(model: nn.Module) -> nn.Module:
    """``model.base_model`` (the backbone a Hugging Face task model wraps), or a ModelError."""
    base = getattr(model, "base_model", None)
    if not isinstance(base, nn.Module) or base is model:
        raise ModelError(
            f"{type(model).__name__} has no backbone (base_model) distinct from itself; per-layer readout "
            "needs a task model that wraps one: pass layer_losses(model, batch, readout=fn)"
        )
    return base


def layer_output(out: Any, plan: BackbonePlan, backbone: nn.Module, state: Tensor) -> Any:
    """The backbone output as it would be if the model ended at the layer whose hidden state is ``state``."""
    last = plan.apply_tail(backbone, state) if plan.intermediate_raw else state
    fields = dict(out.items())
    fields["last_hidden_state"] = last
    if "pooler_output" in fields:
        fields["pooler_output"] = plan.apply_pooler(backbone, last)
    return type(out)(**fields)


def _containers(backbone: nn.Module, plan: BackbonePlan | None) -> list[nn.Module]:
    """The backbone and the modules between it and its blocks (OPT's ``decoder``): a task model may call
    any of them (OPTForCausalLM calls ``model.decoder`` directly)."""
    modules = [backbone]
    if plan is not None:
        parts = plan.blocks.split(".")[:-1]
        for i in range(1, len(parts) + 1):
            modules.append(backbone.get_submodule(".".join(parts[:i])))
    return modules


@contextlib.contextmanager
def returning(backbone: nn.Module, output: Any, plan: BackbonePlan | None = None) -> Iterator[list[bool]]:
    """Within the block, calling the backbone (or a module between it and its blocks) returns ``output``
    without running it. Yields a one-element list that turns True once one of them was called."""
    called = [False]

    def patched(*args: Any, **kwargs: Any) -> Any:
        called[0] = True
        return output

    modules = _containers(backbone, plan)
    saved = [m.__dict__.get("forward", _MISSING) for m in modules]
    for module in modules:
        module.forward = patched
    try:
        yield called
    finally:
        for module, old in zip(modules, saved, strict=True):
            if old is _MISSING:
                del module.forward
            else:
                module.forward = old


def replay_head(
    call_model: Callable[..., Any],
    backbone: nn.Module,
    output: Any,
    inputs: dict[str, Any],
    plan: BackbonePlan | None = None,
) -> Any:
    """Run the task model's own forward with its backbone returning ``output``: its head, pooling and loss.

    The head is the model's code, not a copy: pooling choices (ModernBERT's mean / cls, GPT-2's last
    non-padding token), dropout and the loss rule (``problem_type``) are the model's own.

    Raises:
        ModelError: the task model's forward never called its backbone (its head cannot be replayed).
    """
    with returning(backbone, output, plan) as called:
        result = call_model(**inputs)
    if not called[0]:
        raise ModelError(
            f"the task model of {type(backbone).__name__} does not call its backbone (base_model), so its head "
            "cannot be replayed on other layers; pass layer_losses(model, batch, readout=fn)"
        )
    return result


def loss_of(result: Any, owner: str) -> Tensor:
    loss = getattr(result, "loss", None)
    if loss is None and isinstance(result, (tuple, list)) and result and isinstance(result[0], Tensor):
        loss = result[0]
    if not isinstance(loss, Tensor):
        raise ModelError(f"{owner} computed no loss from the labels; per-layer losses need the model's loss")
    return loss


__all__ = [
    "BackbonePlan",
    "backbone_forward",
    "backbone_of",
    "first_tensor",
    "layer_output",
    "loss_of",
    "minimal_inputs",
    "probing",
    "replay_head",
    "returning",
    "trace_backbone",
]
