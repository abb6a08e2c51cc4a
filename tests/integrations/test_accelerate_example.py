"""``examples/accelerate_loop.py`` as its docstring launches it: ``accelerate launch --multi_gpu
--num_processes 2`` (on the CPU the two processes talk over gloo), ``--tiny``. Both ranks end with the same λ
(printed by each, to 6 decimals), off 0; AC/DC ends at 50 % global sparsity; ``save_state`` wrote the
checkpoint. ``tests/test_examples.py`` runs the one-process form."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "accelerate_loop.py"


@pytest.mark.distributed
def test_two_processes_run_the_example_and_hold_the_same_lambda(tmp_path) -> None:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    out = tmp_path / "state"
    proc = subprocess.run(
        [*launch, str(EXAMPLE), "--tiny", "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lambdas = dict(re.findall(r"^rank (\d) lambda (\[.*\])$", proc.stdout, flags=re.MULTILINE))
    assert sorted(lambdas) == ["0", "1"], proc.stdout[-2000:]
    assert lambdas["0"] == lambdas["1"]
    assert max(float(v) for v in lambdas["0"].strip("[]").split(",")) > 0
    assert re.search(r"^global\s+all\s+[\d,]+\s+[\d,]+\s+0\.5000$", proc.stdout, flags=re.MULTILINE)
    assert (out / "optimizer.bin").is_file() or any(out.glob("optimizer*")), sorted(os.listdir(out))
