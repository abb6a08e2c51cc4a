"""A run killed with SIGKILL (or stopped with SIGTERM) resumes to the same final weights, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from descentlab.data import available_assets

pytestmark = pytest.mark.skipif(
    not (available_assets().get("fashion_mnist") or available_assets().get("mnist_5k")),
    reason="no image dataset installed (run `make setup`)",
)
ARGS = [
    "n_train=3000",
    "n_test=100",
    "train.epochs=3",
    "train.batch_size=16",
    "train.checkpoint_every=25",
    "train.progress=false",
    "hidden=64",
]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "descentlab.cli", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _final_weights(run_dir: Path) -> dict:
    ckpts = sorted((run_dir / "checkpoints" / "erm-seed0").glob("step-*"))
    return load_file(ckpts[-1] / "model.safetensors")


def _start_and_stop(root: Path, sig: int) -> tuple[Path, int, str, str]:
    proc = subprocess.Popen(
        _cli("run", "smoke", "--out", str(root), *ARGS),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        ckpts = list(root.glob("smoke-*/checkpoints/erm-seed0/step-*/MANIFEST.json"))
        if ckpts:
            break
        time.sleep(0.01)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    (run_dir,) = root.glob("smoke-*")
    return run_dir, proc.returncode, out, err


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_stopped_run_resumes_bit_for_bit(tmp_path, sig) -> None:
    uninterrupted = subprocess.run(
        _cli("run", "smoke", "--out", str(tmp_path / "a"), *ARGS),
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    reference = _final_weights(Path(uninterrupted.stdout.strip().splitlines()[-1]))

    run_dir, code, out, err = _start_and_stop(tmp_path / "b", sig)
    assert not (run_dir / "results.json").exists(), "the run finished before it could be stopped"
    status = json.loads((run_dir / "status.json").read_text())
    if sig == signal.SIGTERM:
        assert code == 130 and status["state"] == "interrupted"
        # issue 33: stderr names the run directory to resume (not "<run dir>"), stdout's last line is it
        assert f"resume={run_dir.resolve()}" in err and "<run dir>" not in err, err
        assert out.strip().splitlines()[-1] == str(run_dir.resolve()), out
    else:
        assert code == -signal.SIGKILL and status["state"] == "running"
    resumed = subprocess.run(
        _cli("run", "smoke", f"resume={run_dir}"), env=_env(), capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run_dir / "status.json").read_text())["state"] == "done"
    final = _final_weights(run_dir)
    assert final.keys() == reference.keys()
    for name in reference:
        assert (final[name] == reference[name]).all(), name
