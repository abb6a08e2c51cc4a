"""Checkpoints are atomic, verified on load, and a damaged one falls back to the previous good one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from descentlab.errors import CheckpointError
from descentlab.train.checkpoint import list_checkpoints, load_latest, save_checkpoint


def _save(folder, step: int, value: float) -> None:
    model = nn.Linear(3, 2)
    nn.init.constant_(model.weight, value)
    opt = torch.optim.AdamW(model.parameters())
    save_checkpoint(
        folder, step=step, model=model, optimizer=opt, extra={"sparsity": {"mask": torch.ones(2)}}, keep=3
    )


def test_round_trip_and_keep(tmp_path) -> None:
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, float(step))
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003", "step-00000004"]
    ckpt = load_latest(tmp_path)
    model = nn.Linear(3, 2)
    ckpt.load_model_(model)
    assert ckpt.step == 4 and torch.equal(model.weight, torch.full((2, 3), 4.0))
    assert torch.equal(ckpt.extra_state()["sparsity"]["mask"], torch.ones(2))


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete_manifest"])
def test_damaged_checkpoint_falls_back(tmp_path, damage: str) -> None:
    _save(tmp_path, 1, 1.0)
    _save(tmp_path, 2, 2.0)
    newest = list_checkpoints(tmp_path)[-1]
    weights = newest / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-7])
    elif damage == "flip":
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF
        weights.write_bytes(bytes(data))
    else:
        (newest / "MANIFEST.json").unlink()
    with pytest.warns(UserWarning, match="skipping bad checkpoint"):
        ckpt = load_latest(tmp_path)
    assert ckpt.step == 1


def test_no_good_checkpoint_is_an_error_not_a_silent_restart(tmp_path) -> None:
    _save(tmp_path, 1, 1.0)
    (list_checkpoints(tmp_path)[0] / "optimizer.pt").write_bytes(b"garbage")
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match="no usable checkpoint"):
        load_latest(tmp_path)
    assert load_latest(tmp_path / "absent") is None


def test_leftover_temporary_folder_is_ignored(tmp_path) -> None:
    _save(tmp_path, 1, 1.0)
    (tmp_path / ".step-00000002.tmp-999").mkdir()
    assert load_latest(tmp_path).step == 1
