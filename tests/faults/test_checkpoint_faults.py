"""Checkpoint faults: a damaged newest checkpoint, a damaged only checkpoint, and a full disk mid-write.

Each fault is injected into a real ``fit`` run (tests/faults/kill_child.py: dropout, AdamW, a LR schedule,
a checkpoint per step) and the outcome is checked end to end: the resumed run equals an uninterrupted one bit
for bit wherever a good checkpoint is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from descentlab.cli import main
from descentlab.data import available_assets
from descentlab.errors import CheckpointError
from descentlab.train.checkpoint import list_checkpoints
from faults import kill_child

FAULT_STEP = 6


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    root = tmp_path_factory.mktemp("reference")
    return kill_child.train_here(root, root / "final.pt")


def _interrupted(tmp_path: Path, phase: str, error: type[Exception]) -> tuple[Path, Exception]:
    """A run ended by ``phase`` at FAULT_STEP, in this process: its run directory and the error."""
    threads = torch.get_num_threads()
    try:
        with pytest.raises(error) as info:
            kill_child.main(tmp_path, tmp_path / "final.pt", (FAULT_STEP, phase))
    finally:
        torch.set_num_threads(threads)
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return run_dir, info.value


def _assert_equal(resumed: dict, reference: dict) -> None:
    assert resumed.keys() == reference.keys()
    assert all(torch.equal(resumed[k], v) for k, v in reference.items())


@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
def test_a_damaged_newest_checkpoint_falls_back_with_a_warning_and_resumes_exactly(
    damage, uninterrupted, tmp_path
) -> None:
    run_dir, _ = _interrupted(tmp_path, "crash", kill_child.Crash)
    ckpts = run_dir / "checkpoints" / "t"
    newest, previous = list_checkpoints(ckpts)[-1], list_checkpoints(ckpts)[-2]
    assert newest.name == f"step-{FAULT_STEP - 1:08d}"
    weights = newest / "model.safetensors"
    data = bytearray(weights.read_bytes())
    if damage == "truncate":
        weights.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match=f"skipping bad checkpoint.*{newest.name}") as record:
        resumed = kill_child.train_here(run_dir, tmp_path / "final.pt")
    assert any("model.safetensors" in str(w.message) for w in record)
    assert previous.name == f"step-{FAULT_STEP - 2:08d}"  # the one it fell back to
    _assert_equal(resumed, uninterrupted)


def test_a_full_disk_mid_checkpoint_is_one_clear_error_and_the_previous_checkpoint_resumes_exactly(
    uninterrupted, tmp_path
) -> None:
    run_dir, error = _interrupted(tmp_path, "enospc", CheckpointError)
    message = str(error)
    assert "\n" not in message
    assert (
        f"cannot write the step-{FAULT_STEP} checkpoint" in message and "No space left on device" in message
    )
    assert f"the newest complete checkpoint step-{FAULT_STEP - 1:08d} is intact" in message
    ckpts = run_dir / "checkpoints" / "t"
    assert sorted(p.name for p in ckpts.iterdir()) == [  # no half-written folder left behind
        f"step-{FAULT_STEP - 2:08d}",
        f"step-{FAULT_STEP - 1:08d}",
    ]
    _assert_equal(kill_child.train_here(run_dir, tmp_path / "final.pt"), uninterrupted)


@pytest.mark.skipif(
    sys.platform != "linux", reason="RLIMIT_FSIZE with SIGXFSZ ignored is POSIX; tested on Linux"
)
def test_a_file_size_limit_fails_the_real_writers_with_one_clear_error(uninterrupted, tmp_path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = Path(kill_child.__file__)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(tmp_path / "final.pt"), str(FAULT_STEP), "fsize"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("descentlab.errors.CheckpointError: cannot write the step-6 checkpoint"), last
    assert "File too large" in last and f"step-{FAULT_STEP - 1:08d} is intact" in last
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    ckpts = run_dir / "checkpoints" / "t"
    assert [p.name for p in ckpts.iterdir() if p.name.startswith(".")] == []
    assert list_checkpoints(ckpts)[-1].name == f"step-{FAULT_STEP - 1:08d}"
    _assert_equal(kill_child.train_here(run_dir, tmp_path / "final.pt"), uninterrupted)


def _fashion_or_mnist() -> bool:
    assets = available_assets()
    return bool(assets.get("fashion_mnist") or assets.get("mnist_5k"))


@pytest.mark.skipif(not _fashion_or_mnist(), reason="no image dataset installed (run `make setup`)")
@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
def test_a_resume_onto_a_damaged_only_checkpoint_exits_2_naming_the_file(damage, tmp_path, capsys) -> None:
    overrides = ["n_train=200", "n_test=100", "train.epochs=1", "train.progress=false"]
    assert main(["run", "smoke", "--out", str(tmp_path), *overrides]) == 0
    run_dir = Path(capsys.readouterr().out.strip().splitlines()[-1])
    # make the job train again on resume: drop its cached result, keep its one checkpoint, then damage it
    for cached in (run_dir / "jobs").glob("*.json"):
        cached.unlink()
    (ckpt,) = list_checkpoints(run_dir / "checkpoints" / "erm-seed0")
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    if damage == "truncate":
        weights.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="skipping bad checkpoint"):
        code = main(["run", "smoke", f"resume={run_dir}"])
    assert code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("descentlab: error:")]
    assert len(errors) == 1, errors
    assert "model.safetensors" in errors[0] and str(ckpt) in errors[0]
    assert ("truncated" if damage == "truncate" else "sha256") in errors[0]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "failed"
