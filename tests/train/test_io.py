"""descentlab.io: atomic JSON and .npz writes; rundir keeps re-exporting the writers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from descentlab import io
from descentlab.train import rundir


def test_rundir_re_exports_the_io_writers() -> None:
    assert rundir.atomic_write_text is io.atomic_write_text
    assert rundir.atomic_write_bytes is io.atomic_write_bytes
    assert rundir.dumps_json is io.dumps_json


def test_json_round_trip_turns_tensors_into_lists_and_nan_into_null(tmp_path: Path) -> None:
    path = io.save_json(tmp_path / "a" / "r.json", {"t": torch.tensor([1.5, 2.0]), "x": math.nan, 3: (1, 2)})
    assert io.load_json(path) == {"t": [1.5, 2.0], "x": None, "3": [1, 2]}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary file left behind


def test_arrays_round_trip_exactly(tmp_path: Path) -> None:
    w = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    path = io.save_arrays(tmp_path / "f.npz", weights=w, steps=torch.arange(5), grid=[0.0, 0.5])
    out = io.load_arrays(path)
    assert set(out) == {"weights", "steps", "grid"}
    np.testing.assert_array_equal(out["weights"], w)
    assert out["weights"].dtype == np.float32
    np.testing.assert_array_equal(out["steps"], np.arange(5))
    np.testing.assert_array_equal(out["grid"], [0.0, 0.5])


def test_object_arrays_are_refused_on_load(tmp_path: Path) -> None:
    path = io.save_arrays(tmp_path / "o.npz", mixed=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="pickle"):
        io.load_arrays(path)


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "keep.txt"
    io.atomic_write_text(path, "old")
    with pytest.raises(TypeError):
        io.atomic_write_bytes(path, "not bytes")  # type: ignore[arg-type]
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
