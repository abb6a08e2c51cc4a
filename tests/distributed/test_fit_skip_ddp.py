"""``fit`` under DDP (2 gloo ranks): a non-finite loss on one rank makes every rank skip the step (issue 31,
item 6a; before, the other rank stepped alone and the run hung), and gradient accumulation under DDP equals
one process at the full batch."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("fit_nan_worker.py")
WORLD = 2


def _load_worker():
    spec = importlib.util.spec_from_file_location("descentlab_fit_nan_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this build")
    out = tmp_path_factory.mktemp("ranks")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}"]
    try:
        proc = subprocess.run(
            [*cmd, str(WORKER), str(out)], env=env, capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.fail("fit hung under DDP: the ranks disagreed about skipping a step")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


@pytest.mark.distributed
def test_a_nan_loss_on_one_rank_skips_the_step_on_every_rank(ranks) -> None:
    worker = _load_worker()
    a, b = ranks[0]["nan"], ranks[1]["nan"]
    assert a["steps"] == b["steps"] == worker.STEPS
    assert a["skipped"] == b["skipped"] == 1
    assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
    single = worker.train(nan_on_rank=-1)  # one process skipping the same step
    assert single["skipped"] == 1
    for k, v in single["params"].items():
        torch.testing.assert_close(a["params"][k], v, rtol=0, atol=1e-12)


@pytest.mark.distributed
def test_accumulation_under_ddp_equals_one_process_at_the_full_batch(ranks) -> None:
    worker = _load_worker()
    a, b = ranks[0]["accum"], ranks[1]["accum"]
    assert a["skipped"] == b["skipped"] == 0 and a["steps"] == worker.STEPS
    assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
    single = worker.train(None)  # accumulation 1 at twice the micro-batch
    for k, v in single["params"].items():
        torch.testing.assert_close(a["params"][k], v, rtol=0, atol=1e-12)
