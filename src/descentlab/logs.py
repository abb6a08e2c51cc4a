"""Log values kept on the device until somebody reads them: one host read per log, none per step.

A training step that turns its log values into Python floats reads the device once per value (a host sync
on a GPU). :class:`LazyLogs` holds them as tensors instead; the first read of any key (``logs["loss"]``,
``dict(logs)``, ``**logs``, ``json.dumps(dict(logs))``) concatenates every tensor into one float64 vector
and reads it back with a single ``tolist()``. A loop that writes logs every k steps therefore syncs for its
logs once every k steps, and never on the steps in between.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = ["LazyLogs"]


class LazyLogs(Mapping[str, float]):
    """A read-only mapping ``name -> float`` whose values stay tensors until the first read.

    Args:
        scalars: ``name -> 0-d tensor (or float)``.
        vectors: ``prefix -> (1-d tensor, first index)``: entry i is logged as ``f"{prefix}/{i + first}"``.
        alarm: ``(flag, callback)``: a device bool read back with the values (no extra read); when it is
            True, ``callback()`` runs right after the read (e.g. a deferred health check that raises).

    Keys are known without reading the device; values are read all at once. Pickling stores the plain
    floats (it reads them), so a result crossing a process boundary carries no tensors and no callback.
    """

    def __init__(
        self,
        scalars: Mapping[str, Tensor | float] | None = None,
        vectors: Mapping[str, tuple[Tensor, int]] | None = None,
        alarm: tuple[Tensor, Callable[[], None]] | None = None,
    ) -> None:
        self._scalars = dict(scalars or {})
        self._vectors = {k: (v.detach(), int(first)) for k, (v, first) in (vectors or {}).items()}
        self._alarms = [alarm] if alarm is not None else []
        self._keys: list[str] = list(self._scalars)
        for prefix, (v, first) in self._vectors.items():
            self._keys += [f"{prefix}/{i + first}" for i in range(v.numel())]
        self._values: dict[str, float] | None = None

    def update(self, other: Mapping[str, Any]) -> None:
        """Add the entries of ``other`` (another LazyLogs stays lazy; plain values are kept as they are)."""
        if self._values is not None:
            self._values.update({k: float(v) for k, v in other.items()})
            self._keys = list(self._values)
            return
        if isinstance(other, LazyLogs) and other._values is None:
            for k in other._scalars:
                self._scalars[k] = other._scalars[k]
            self._vectors.update(other._vectors)
            self._keys = [k for k in self._keys if k not in other._keys] + other._keys
            self._alarms += other._alarms
            return
        for k, v in other.items():
            self._scalars[k] = v
            if k not in self._keys:
                self._keys.append(k)

    @property
    def read(self) -> bool:
        """Whether the values were read back already."""
        return self._values is not None

    def _materialise(self) -> dict[str, float]:
        if self._values is not None:
            return self._values
        parts: list[Tensor] = []
        python: dict[str, float] = {}
        names: list[str] = []
        device = None
        for k, v in self._scalars.items():
            if isinstance(v, Tensor):
                device = device or v.device
                parts.append(v.detach().reshape(1))
                names.append(k)
            else:
                python[k] = float(v)
        for prefix, (v, first) in self._vectors.items():
            device = device or v.device
            parts.append(v.reshape(-1))
            names += [f"{prefix}/{i + first}" for i in range(v.numel())]
        for flag, _ in self._alarms:
            device = device or flag.device
            parts.append(flag.reshape(1))
        values: list[float] = []
        if parts:
            flat = torch.cat([p.to(device=device, dtype=torch.float64) for p in parts])
            values = flat.tolist()  # the one host read
        fired = values[len(names) :]
        read = dict(zip(names, values[: len(names)], strict=True))
        read.update(python)
        self._values = {k: read[k] for k in self._keys}
        alarms, self._scalars, self._vectors, self._alarms = self._alarms, {}, {}, []
        for (_, callback), value in zip(alarms, fired, strict=True):
            if value:
                callback()
        return self._values

    def __getitem__(self, key: str) -> float:
        return self._materialise()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __reduce__(self) -> tuple[Any, ...]:
        return (LazyLogs, (dict(self._materialise()),))

    def __repr__(self) -> str:
        if self._values is None:
            return f"LazyLogs(<{len(self)} values not read yet>)"
        return f"LazyLogs({self._values!r})"
