"""SIGKILL at random points of a run, a checkpoint write included: the resumed run equals an uninterrupted one
bit for bit (issue 45, item 7).

The points are drawn from a seeded generator, one per phase of a step (inside the objective, after the
optimizer step, half-way through the weights file, before the manifest), each at a random step; the child
stops dead at its point and the parent SIGKILLs it there, so the kill lands exactly where drawn.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from descentlab.train.checkpoint import list_checkpoints
from faults import kill_child

CHILD = Path(__file__).with_name("kill_child.py")
SEED = 45
PHASES = kill_child.PHASES
STEPS = kill_child.STEPS


def kill_points(seed: int = SEED) -> list[tuple[int, str]]:
    """One (step, phase) per phase, the step drawn uniformly from 2..STEPS-1 (a checkpoint exists before)."""
    rng = random.Random(seed)
    return [(rng.randrange(2, STEPS), phase) for phase in PHASES]


def _kill_at(root: Path, marker: Path, step: int, phase: str) -> Path:
    """Start the child, SIGKILL it once it waits at (step, phase); return its run directory."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(root), str(marker), str(step), phase],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not marker.exists() or not marker.read_text():
            assert child.poll() is None, (
                f"the child ended before {phase} of step {step}: {child.stderr.read()}"
            )
            assert time.monotonic() < deadline, f"the child never reached {phase} of step {step}"
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    return Path(marker.read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    root = tmp_path_factory.mktemp("reference")
    return kill_child.train_here(root, root / "final.pt")


def test_the_seeded_points_cover_every_phase_and_differ_by_seed() -> None:
    points = kill_points()
    assert [phase for _, phase in points] == list(PHASES)
    assert all(2 <= step < STEPS for step, _ in points)
    assert kill_points(SEED) == points and kill_points(SEED + 1) != points


@pytest.mark.parametrize(("step", "phase"), kill_points(), ids=lambda v: str(v))
def test_a_sigkill_at_a_random_point_resumes_bit_for_bit(step, phase, uninterrupted, tmp_path) -> None:
    run_dir = _kill_at(tmp_path, tmp_path / "marker", step, phase)
    ckpts = run_dir / "checkpoints" / "t"
    complete = [p.name for p in list_checkpoints(ckpts)]
    # one checkpoint per step, written after the step's callbacks: every kill point leaves step - 1 newest
    assert complete[-1] == f"step-{step - 1:08d}"
    half_made = [p.name for p in ckpts.iterdir() if p.name.startswith(f".step-{step:08d}.tmp-")]
    assert bool(half_made) == (phase in ("weights", "manifest"))  # killed mid-write: a temporary name
    resumed = kill_child.train_here(run_dir, tmp_path / "final.pt")
    assert resumed.keys() == uninterrupted.keys()
    for name, value in uninterrupted.items():
        assert torch.equal(resumed[name], value), f"{name} differs after a kill at {phase} of step {step}"
