"""Training logs: values kept on the device until a log step reads them, and curves written for people.

A training step that turns its log values into Python floats reads the device once per value (a host sync
on a GPU). :class:`LazyLogs` holds them as tensors instead; the first read of any key (``logs["loss"]``,
``dict(logs)``, ``**logs``, ``json.dumps(dict(logs))``) concatenates every tensor into one float64 vector
and reads it back with a single ``tolist()``. A loop that writes logs every k steps therefore syncs for its
logs once every k steps, and never on the steps in between.

:class:`CurveWriter` writes the values of those log steps (already read) as curves in the tools people
watch runs with: ``metrics.csv`` (pandas, a spreadsheet) and TensorBoard event files (``tensorboard
--logdir RUN_DIR/tensorboard``, one TensorBoard run per training job, so jobs compare side by side).
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["CSV_COLUMNS", "CurveWriter", "LazyLogs"]

CSV_COLUMNS = ("time", "tag", "step", "name", "value")


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


def _create_with_header(path: Path, header: str) -> None:
    """Make ``path`` holding ``header`` unless it exists, race-free across processes.

    The header is written to a temporary file that is then hard-linked into place: ``link`` fails when the
    name exists, so of several workers starting at once exactly one makes the file, and nobody ever sees
    it without its header (an ``O_EXCL`` create followed by a write would leave a moment without one).
    """
    if path.exists():
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(header)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


class CurveWriter:
    """One training job's curves in a run directory: ``metrics.csv`` and TensorBoard event files.

    ``metrics.csv`` is in long form, one row per value: ``time, tag, step, name, value`` (``time`` in Unix
    seconds, ``tag`` the job, e.g. ``erm-seed0``). Long, not one column per name, because several jobs of a
    run (worker processes) append to the same file at once, each with its own names: every row is complete
    on its own, and the rows of one :meth:`write` go out in one ``write`` call to a file opened for
    appending. Pivot it with ``pandas.read_csv(...).pivot_table(index=["tag", "step"], columns="name",
    values="value")``. A resumed job writes again the steps between its last checkpoint and the kill; keep
    the last row of each (tag, step, name).

    TensorBoard events go to ``tensorboard/<tag>/`` (``tensorboard --logdir RUN_DIR/tensorboard``). Without
    the ``tensorboard`` package only the CSV is written, after one warning.

    Args:
        folder: the run directory.
        tag: the job's name (``fit``'s ``tag``); "" is written as ``main``.
        tensorboard: also write event files.

    :meth:`write` takes values already read on the host (a log step's); the writer never touches a tensor,
    so it adds no device sync. Use it as a context manager, or call :meth:`close`.
    """

    def __init__(self, folder: Path | str, tag: str = "", *, tensorboard: bool = True) -> None:
        self.folder = Path(folder)
        self.tag = tag or "main"
        self.csv_path = self.folder / "metrics.csv"
        header = io.StringIO()
        csv.writer(header, lineterminator="\n").writerow(CSV_COLUMNS)
        _create_with_header(self.csv_path, header.getvalue())
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # torch's writer needs the tensorboard package
                warnings.warn(
                    "tensorboard is not installed: training curves go to metrics.csv only "
                    "(pip install tensorboard for event files)",
                    stacklevel=2,
                )
            else:
                # flush_secs: a live `tensorboard --logdir` shows a long run within seconds, not minutes
                self._tb = SummaryWriter(log_dir=str(self.folder / "tensorboard" / self.tag), flush_secs=10)

    @property
    def tensorboard_dir(self) -> Path | None:
        """Where the event files go; None when they are not written."""
        return None if self._tb is None else self.folder / "tensorboard" / self.tag

    def write(self, step: int, values: Mapping[str, float]) -> None:
        """Append ``values`` (name -> float, e.g. ``loss``, ``layer_loss/3``, ``lr``) at ``step``.

        Non-finite values are written as they are (``nan``, ``inf``): a curve that breaks is the news.
        """
        now = round(time.time(), 3)
        rows = [(name, float(value)) for name, value in values.items()]
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        for name, value in rows:
            writer.writerow((now, self.tag, int(step), name, value))
        with open(self.csv_path, "a", encoding="utf-8", newline="") as fh:
            fh.write(buffer.getvalue())
        if self._tb is not None:
            for name, value in rows:
                self._tb.add_scalar(name, value, global_step=int(step), walltime=now)

    def close(self) -> None:
        """Flush and close the event file (the CSV is closed after every write)."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> CurveWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
