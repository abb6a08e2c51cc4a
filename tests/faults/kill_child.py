"""Child of test_kill.py (a script, not collected): a ``fit`` run that stops dead at a chosen point.

    python kill_child.py RUN_ROOT_OR_DIR OUT_FILE [STEP PHASE]

Without STEP/PHASE it trains to the end (``fit`` resumes from the newest checkpoint when RUN_ROOT_OR_DIR
is an existing run directory) and saves the final weights to OUT_FILE. With them it writes its run
directory to OUT_FILE when it reaches PHASE of step STEP, then waits there for the parent's SIGKILL:

- ``forward``: inside the objective (the loss is computed, nothing stepped);
- ``callback``: after the optimizer step, before the step's checkpoint;
- ``weights``: inside the checkpoint write, half of ``model.safetensors`` on disk;
- ``manifest``: inside the checkpoint write, every file written but the manifest (the folder still has
  its temporary name).

Faults that end the run instead of stopping it (also run in-process by the tests, through :func:`main`):

- ``crash``: an exception in a callback after step STEP (before its checkpoint);
- ``enospc``: the disk fills while step STEP's checkpoint is written (half of ``model.safetensors``
  is on disk when the writer gets ``OSError(ENOSPC)``);
- ``fsize``: from step STEP on the process may not write a file past 100 bytes (``RLIMIT_FSIZE``, SIGXFSZ
  ignored), so the real writers (safetensors, ``torch.save``) fail as on a full disk.

The run has dropout, AdamW and a step LR schedule, so a resume is exact only if the weights, the optimizer
moments, the schedule, the RNG states and the data position all come back.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn

STEPS = 10
PHASES = ("forward", "callback", "weights", "manifest")


class Crash(Exception):
    """The injected failure of the ``crash`` fault."""


def _data(n: int = 60) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=gen)
    y = (x[:, :2].sum(1) > 0).long()
    return [{"x": x[i], "y": y[i]} for i in range(n)]


def _model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.ReLU(), nn.Linear(16, 2))


def main(target: Path, out: Path, stop: tuple[int, str] | None) -> None:
    import descentlab.train.checkpoint as ck
    from descentlab.train.rundir import RunDir

    torch.set_num_threads(1)
    run = RunDir.open(target) if (target / "config.yaml").exists() else RunDir.create(target, "kill")
    (run.path / "config.yaml").write_text("kill: true\n")
    state = {"step": 0}

    def wait_for_the_kill() -> None:
        out.write_text(str(run.path))
        time.sleep(600)

    def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        state["step"] += 1
        if stop == (state["step"], "forward"):
            wait_for_the_kill()
        return nn.functional.cross_entropy(model(batch["x"]), batch["y"])

    def callback(step: int, model: nn.Module, logs: dict) -> None:
        if stop == (step, "callback"):
            wait_for_the_kill()
        if stop == (step, "crash"):
            raise Crash(f"injected crash after step {step}")
        if stop == (step, "fsize"):  # callbacks run before the step's checkpoint: that write fails
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (100, resource.RLIM_INFINITY))

    save_model, write_manifest = ck.save_model, ck.atomic_write_text

    def half_weights(module, path):  # half the file on disk, then stop (or fail) inside the write
        save_model(module, path)
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[: len(data) // 2])
        if stop == (state["step"], "weights"):
            wait_for_the_kill()
        if stop == (state["step"], "enospc"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        Path(path).write_bytes(data)

    def manifest(path, text):
        if stop == (state["step"], "manifest"):
            wait_for_the_kill()
        write_manifest(path, text)

    ck.save_model, ck.atomic_write_text = half_weights, manifest
    try:
        _train(run, loss, callback, out)
    finally:
        ck.save_model, ck.atomic_write_text = save_model, write_manifest


def _train(run, loss, callback, out: Path) -> None:
    from descentlab.train.loop import TrainConfig, fit
    from descentlab.train.objectives import ERM

    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fit(
        model,
        _data(),
        objective=ERM(loss),
        optimizer=opt,
        scheduler=torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5),
        cfg=TrainConfig(max_steps=STEPS, batch_size=12, checkpoint_every=1, progress=False),
        run=run,
        tag="t",
        callbacks=[callback],
    )
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out)


def train_here(target: Path, out: Path) -> dict[str, torch.Tensor]:
    """The run to the end (resuming when ``target`` is a run directory) in the calling process, its thread
    count restored afterwards; returns the final weights."""
    threads = torch.get_num_threads()
    try:
        main(target, out, None)
    finally:
        torch.set_num_threads(threads)
    return torch.load(out, weights_only=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(Path(args[0]), Path(args[1]), (int(args[2]), args[3]) if len(args) > 2 else None)
