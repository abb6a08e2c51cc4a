"""Atomic file writes and the JSON / ``.npz`` formats every run directory uses.

Every file is written through a temporary file in the same folder, ``fsync`` and ``os.replace``, so a killed
process leaves either the old or the new version of a file, never half of one. ``report/`` and ``train/``
both write through these helpers; neither needs the other to do so.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def jsonable(value: Any) -> Any:
    """``value`` with tensors/arrays as lists, paths as strings, NaN as None and ±Inf as ±1e308."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        return jsonable(value.item())
    if hasattr(value, "tolist"):
        return jsonable(value.tolist())
    if isinstance(value, Path):
        return str(value)
    return value


def dumps_json(obj: Any) -> str:
    """JSON text with tensors/arrays turned into lists and NaN written as null."""
    return json.dumps(jsonable(obj), indent=2, allow_nan=False) + "\n"


def save_json(path: Path | str, obj: Any) -> Path:
    """Write ``obj`` as :func:`dumps_json` text to ``path``, atomically."""
    path = Path(path)
    atomic_write_text(path, dumps_json(obj))
    return path


def load_json(path: Path | str) -> Any:
    return json.loads(Path(path).read_text())


def save_arrays(path: Path | str, **arrays: Any) -> Path:
    """Write named arrays (numpy arrays, CPU tensors, nested lists) to one ``.npz`` file, atomically.

    This is the data a figure is drawn from, saved in the run directory so that ``descentlab report``
    redraws the figure without the model. The file is uncompressed and holds no pickled objects.
    """
    path = Path(path)
    buffer = io.BytesIO()
    np.savez(buffer, **{name: np.asarray(value) for name, value in arrays.items()})
    atomic_write_bytes(path, buffer.getvalue())
    return path


def load_arrays(path: Path | str) -> dict[str, np.ndarray]:
    """The arrays of a :func:`save_arrays` file, by name (loaded eagerly; pickles are refused)."""
    with np.load(Path(path), allow_pickle=False) as data:
        return {name: data[name] for name in data.files}
