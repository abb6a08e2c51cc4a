"""Count the host syncs of a piece of torch code, op by op: the one counter the tests and benchmarks share.

A host sync is an operation after which the Python thread waits for the accelerator to finish its queued
work. :class:`HostSyncCounter` counts them by kind:

``item``
    reading a device scalar into Python: ``.item()``, ``float(t)``, ``int(t)``, ``bool(t)``, an ``if`` on
    a tensor (all ``aten._local_scalar_dense``).
``bool_mask``
    ops whose output size depends on the data: ``nonzero``, ``masked_select``, indexing (read or write)
    with a boolean mask, ``unique``, ``torch.equal`` (the device must report a count before the host can
    allocate the result).
``device_to_host``
    copies of device memory to the host: ``.cpu()``, ``.to("cpu")``, ``.tolist()``, ``.numpy()``,
    ``cpu_tensor.copy_(device_tensor)``.
``host_to_device``
    blocking copies of host memory to the device: ``.to(device)`` / ``.cuda()`` / ``copy_`` of a host
    tensor without ``non_blocking=True``, and ``torch.tensor(python_data, device=device)``. From pageable
    memory torch then synchronises the stream (the host waits for every queued kernel). A copy with
    ``non_blocking=True`` is not counted.

Two modes, chosen by ``device``:

* **On an accelerator** (``device`` a CUDA device): a tensor is on the device when its ``device.type`` is
  the accelerator's; CPU tensors are host memory. Exactly the ops above that touch device memory count
  (``.item()`` of a CPU scalar, as AdamW's step counters, is no sync and is not counted).
* **On the CPU** (``device`` the CPU, the default when no device is given): nothing really waits, so the
  counter counts the ops that *would* sync if the code ran on a GPU. Every tensor that exists when
  counting starts plays device memory (the model, its batch, optimizer state: on a GPU run they live on
  the device). A tensor created inside the counted region is host memory when a GPU run would create it
  on the host: from Python data or numpy without a device, by a factory (``torch.zeros``,
  ``torch.randperm``, ...) with no ``device`` or with the string ``"cpu"``, by ``.cpu()`` /
  ``.to("cpu")``, or by an op whose tensor inputs are all host memory. A factory given a ``torch.device``
  (typically ``some_tensor.device``) or a device tensor creates device memory. So
  ``torch.randperm(n, device="cpu").to(y.device)`` counts one ``host_to_device`` on the CPU, as it
  syncs on a GPU, and ``.item()`` of a freshly made host scalar counts nothing. Pre-existing tensors that
  a GPU run keeps on the host can be declared with :meth:`HostSyncCounter.host`.

Each counted op is recorded once, at the outermost call that causes it (``.tolist()`` of a CUDA tensor
is one ``device_to_host``, not also the ``_to_copy`` it runs), in ``counts`` (kind -> n) and ``ops``
(``kind: op name`` -> n).

Usage::

    with HostSyncCounter() as syncs:
        loss = model(**batch).loss
        loss.backward()
    assert syncs.total == 0, syncs.ops
"""

from __future__ import annotations

import collections
import os
import traceback
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

#: the kinds of host sync, in the order they are reported
KINDS = ("item", "bool_mask", "device_to_host", "host_to_device")

_ITEM_OPS = {"aten._local_scalar_dense.default"}
_DATA_DEPENDENT_OPS = {
    "aten.nonzero.default",
    "aten.masked_select.default",
    "aten.equal.default",
    "aten._unique2.default",
    "aten.unique_dim.default",
    "aten.unique_consecutive.default",
    "aten.masked_scatter.default",
    "aten.masked_scatter_.default",
}
_INDEX_OPS = (
    "aten.index.Tensor",
    "aten.index_put.default",
    "aten.index_put_.default",
    "aten._index_put_impl_",
)
# torch-level factories: where a GPU run creates their result is decided by their ``device`` argument
_FACTORIES = {
    "tensor",
    "as_tensor",
    "from_numpy",
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "range",
    "linspace",
    "logspace",
    "eye",
    "rand",
    "randn",
    "randint",
    "randperm",
    "scalar_tensor",
    "empty_strided",
}
_FROM_DATA = {"tensor", "as_tensor", "from_numpy"}
_TO_HOST_METHODS = {"tolist", "numpy", "cpu"}


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _caller() -> str:
    """The innermost frame outside torch and this module: the line of code that asked for the sync."""
    torch_dir = os.path.dirname(torch.__file__)
    for frame in reversed(traceback.extract_stack()):
        if frame.filename != __file__ and not frame.filename.startswith(torch_dir):
            return f"{frame.filename}:{frame.lineno}"
    return "?"


class _Functions(TorchFunctionMode):
    """Copies between host and device (seen at the Python level, where the CPU still shows them), and, on
    the CPU, where each new tensor would live on a GPU run."""

    def __init__(self, counter: HostSyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        c = self.counter
        name = getattr(func, "__name__", "")
        kind, host_result = c._classify_call(name, args, kwargs)
        if kind is not None:
            c._record(kind, name)
            c._quiet += 1  # the dispatcher ops this call runs are the same sync: not counted again
        try:
            out = func(*args, **kwargs)
        finally:
            if kind is not None:
                c._quiet -= 1
        if c.emulated:
            moved = name in ("to", "cpu", "cuda") and args and out is args[0]
            if moved and host_result is not None and host_result != c.is_host(out):
                out = out.clone()  # on the CPU a move is a no-op returning self; a GPU run gets a new tensor
            if host_result is None:  # an ordinary op: host memory iff all its tensor inputs are
                inputs = _tensors((args, kwargs))
                host_result = bool(inputs) and all(c.is_host(t) for t in inputs)
            if host_result:
                for t in _tensors(out):
                    c._mark_host(t)
        return out


class _Dispatch(TorchDispatchMode):
    """Reads of device memory by the host, at the aten level."""

    def __init__(self, counter: HostSyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        c = self.counter
        if not c._quiet:
            name = str(func)
            kind = None
            if name in _ITEM_OPS:
                kind = "item"
            elif name in _DATA_DEPENDENT_OPS:
                kind = "bool_mask"
            elif name.startswith(_INDEX_OPS):
                indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
                if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ()):
                    kind = "bool_mask"
            elif not c.emulated and name in ("aten._to_copy.default", "aten.copy_.default"):
                kind = c._copy_kind_at_dispatch(name, args, kwargs)
            if kind is not None and any(c.is_device(t) for t in _tensors((args, kwargs))):
                c._record(kind, name)
        return func(*args, **kwargs)


class HostSyncCounter:
    """``with HostSyncCounter(device) as syncs: ...``, then ``syncs.total``, ``syncs.counts`` (kind -> n,
    kinds in :data:`KINDS`) and ``syncs.ops`` (``"kind: op"`` -> n). See the module docs for what counts.

    Args:
        device: the accelerator the code runs on (a CUDA device: real syncs), or the CPU / None: count what
            would sync on a GPU (module docs).
        locate: also record, in ``where`` (``"kind: op at file:line"`` -> n), the innermost caller outside
            torch of each counted op (slower: a stack walk per sync), to find the line that syncs.
    """

    def __init__(self, device: torch.device | str | None = None, *, locate: bool = False) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        #: True on the CPU: counting the ops that would sync on a GPU
        self.emulated = self.device.type == "cpu"
        self.counts: collections.Counter[str] = collections.Counter()
        self.ops: collections.Counter[str] = collections.Counter()
        self.locate = locate
        self.where: collections.Counter[str] = collections.Counter()
        self._host = WeakIdKeyDictionary()  # tensor -> True, by identity (a tensor's == is elementwise)
        self._quiet = 0
        self._modes: tuple[TorchFunctionMode, TorchDispatchMode] | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def reset(self) -> None:
        self.counts.clear()
        self.ops.clear()
        self.where.clear()

    def host(self, *tensors: torch.Tensor) -> HostSyncCounter:
        """Declare pre-existing tensors host memory (on the CPU; e.g. step counters a GPU run keeps there)."""
        for t in tensors:
            self._mark_host(t)
        return self

    def is_host(self, t: torch.Tensor) -> bool:
        if self.emulated:
            return t in self._host
        return t.device.type == "cpu"

    def is_device(self, t: torch.Tensor) -> bool:
        if self.emulated:
            return t not in self._host
        return t.device.type == self.device.type

    def __enter__(self) -> HostSyncCounter:
        self._modes = (_Functions(self), _Dispatch(self))
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._modes is not None
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        self._modes = None

    # -- bookkeeping -------------------------------------------------------------------------------------

    def _record(self, kind: str, op: str) -> None:
        self.counts[kind] += 1
        self.ops[f"{kind}: {op}"] += 1
        if self.locate:
            self.where[f"{kind}: {op} at {_caller()}"] += 1

    def _mark_host(self, t: torch.Tensor) -> None:
        self._host[t] = True

    def _target_is_host(self, target: Any) -> bool | None:
        """Where a ``device`` argument puts a tensor: True host, False device, None unknown / not given."""
        if target is None:
            return None
        if isinstance(target, torch.Tensor):
            return self.is_host(target)
        if isinstance(target, str | int):
            target = torch.device(target)
        if not isinstance(target, torch.device):
            return None
        if self.emulated:
            # on the CPU the string "cpu" means the host and a torch.device (usually some_tensor.device)
            # the device; module docs
            return None if target.type != "cpu" else False
        return target.type == "cpu"

    def _device_arg_is_host(self, raw: Any) -> bool | None:
        if self.emulated and isinstance(raw, str):
            return torch.device(raw).type == "cpu"
        return self._target_is_host(raw)

    def _classify_call(self, name: str, args: tuple, kwargs: dict) -> tuple[str | None, bool | None]:
        """(the sync kind this call is, or None; whether its result is host memory, or None to infer)."""
        if name in _FACTORIES:
            device = kwargs.get("device")
            data = args[0] if args else kwargs.get("data")
            from_data = name in _FROM_DATA and not isinstance(data, torch.Tensor)
            if device is None:
                if isinstance(data, torch.Tensor) and name == "as_tensor":
                    return None, self.is_host(data)
                gen = kwargs.get("generator")
                return None, gen is None or gen.device.type == "cpu"
            host = self._device_arg_is_host(device)
            if host is False and (from_data or (isinstance(data, torch.Tensor) and self.is_host(data))):
                return "host_to_device", False
            return None, bool(host)
        if name in _TO_HOST_METHODS and args and isinstance(args[0], torch.Tensor):
            return ("device_to_host" if self.is_device(args[0]) else None), True
        if name == "cuda" and args and isinstance(args[0], torch.Tensor):
            blocking = not kwargs.get("non_blocking", False)
            return ("host_to_device" if self.is_host(args[0]) and blocking else None), False
        if name == "to" and args and isinstance(args[0], torch.Tensor):
            return self._classify_to(args, kwargs)
        if name == "copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor):
            dst, src = args[0], args[1]
            blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            if self.is_device(src) and self.is_host(dst):
                return "device_to_host", True
            if self.is_host(src) and self.is_device(dst) and blocking:
                return "host_to_device", False
            return None, self.is_host(dst)
        return None, None

    def _classify_to(self, args: tuple, kwargs: dict) -> tuple[str | None, bool | None]:
        src = args[0]
        target: Any = kwargs.get("device", kwargs.get("other"))
        non_blocking = bool(kwargs.get("non_blocking", False))
        for a in args[1:]:
            if isinstance(a, torch.Tensor | torch.device | str | int) and not isinstance(a, bool):
                target = a if target is None else target
            elif isinstance(a, bool):
                non_blocking = a
                break
        if isinstance(target, torch.Tensor):
            to_host: bool | None = self.is_host(target)
        else:
            to_host = self._device_arg_is_host(target)
        if to_host is None:  # a dtype conversion: stays where it is
            return None, self.is_host(src)
        if to_host and self.is_device(src):
            return "device_to_host", True
        if not to_host and self.is_host(src):
            return ("host_to_device" if not non_blocking else None), False
        return None, to_host

    def _copy_kind_at_dispatch(self, name: str, args: tuple, kwargs: dict) -> str | None:
        """On an accelerator: a copy the Python level did not see (run by another op)."""
        if name == "aten._to_copy.default":
            src, target = args[0], kwargs.get("device")
            if target is None:
                return None
            dst_host = torch.device(target).type == "cpu"
            blocking = not kwargs.get("non_blocking", False)
        else:
            dst, src = args[0], args[1]
            dst_host = dst.device.type == "cpu"
            blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        src_host = src.device.type == "cpu"
        if dst_host and not src_host:
            return "device_to_host"
        if src_host and not dst_host and blocking:
            return "host_to_device"
        return None
