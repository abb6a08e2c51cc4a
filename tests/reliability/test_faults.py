"""Issue 45 (7): faults injected into a run, each with the outcome docs/reliability.md promises.

Kill during a checkpoint write -> the previous checkpoint loads, weights exact; a truncated or corrupt
checkpoint with no good one before it -> exit 2, one error line naming the file; an empty or unwritable
--out -> exit 2 (tests/test_cli.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from descentlab.cli import main
from descentlab.data import available_assets
from descentlab.train.checkpoint import list_checkpoints, load_latest

# The child saves step 1, then starts step 2 and stops inside it: its files are written, its manifest
# (the last file) is not, and the folder is still under its temporary name. The parent SIGKILLs it there.
_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import torch
    from torch import nn
    import descentlab.train.checkpoint as ck

    folder, marker = Path(sys.argv[1]), Path(sys.argv[2])
    model = nn.Linear(3, 2)
    nn.init.constant_(model.weight, 1.0)
    ck.save_checkpoint(folder, step=1, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))

    def hang(path, text):  # the manifest write: say where we are, then wait for the kill
        marker.write_text(str(path))
        time.sleep(120)

    ck.atomic_write_text = hang
    nn.init.constant_(model.weight, 2.0)
    ck.save_checkpoint(folder, step=2, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    """
)


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one_usable(tmp_path: Path) -> None:
    folder, marker = tmp_path / "ckpt", tmp_path / "marker"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(folder), str(marker)], env=env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert child.poll() is None, "the child ended before reaching the checkpoint write"
            assert time.monotonic() < deadline, "the child never reached the checkpoint write"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    assert ".step-00000002.tmp-" in marker.read_text()  # killed mid-write of step 2
    assert [p.name for p in list_checkpoints(folder)] == ["step-00000001"]
    ckpt = load_latest(folder)
    assert ckpt is not None and ckpt.step == 1
    model = nn.Linear(3, 2)
    ckpt.load_model_(model)
    assert torch.equal(model.weight, torch.ones(2, 3))


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
