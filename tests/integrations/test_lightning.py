"""descentlab.integrations.lightning: the DescentModule mixin under Lightning's CPU Trainer.

Checked: λ moves off 0 on a violated constraint and equals a plain PyTorch loop's λ and weights step for step;
the logs carry task_loss, λ and the per-layer losses; a Lightning checkpoint carries λ exactly and a resumed
fit ends where an uninterrupted one does; a plain optimizer and a non-finite gradient are refused; and two
gloo processes under ``strategy="ddp"`` hold the same λ, equal to one process on the same global batches.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

L = pytest.importorskip(
    "lightning", reason="lightning is not installed (pip install 'descentlab[lightning]')"
)

import descentlab as dl  # noqa: E402
from descentlab.errors import ConfigError, NumericalError  # noqa: E402
from descentlab.integrations.lightning import DescentModule  # noqa: E402
from lightning_trainer import cpu_trainer as _trainer  # noqa: E402
from tiny_models import tiny_bert  # noqa: E402

LAYERS = 2
STEPS = 6
BATCH = 4


def _data(n: int = STEPS * BATCH, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 97, (n, 12), generator=g)
    labels = torch.randint(0, 2, (n,), generator=g)
    return [
        {"input_ids": ids[i], "attention_mask": torch.ones(12, dtype=torch.long), "labels": labels[i]}
        for i in range(n)
    ]


def _loader(data, batch: int = BATCH) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(data, batch_size=batch, shuffle=False)


def _constraint() -> dl.LayerwiseDescent:
    # α = 0.5 asks every layer to halve the loss: violated by a random model, so λ must rise
    return dl.LayerwiseDescent(num_layers=LAYERS, alpha=0.5, dual_lr=0.5)


class Module(DescentModule, L.LightningModule):
    def __init__(self, check_finite: bool = True) -> None:
        super().__init__()
        self.model = tiny_bert(layers=LAYERS, hidden=16, seed=0)
        self.constraint = _constraint()
        self.check_finite = check_finite

    def configure_optimizers(self):
        inner = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return dl.PrimalDual(inner, self.constraint, check_finite=self.check_finite)


class Record(L.Callback):
    """λ after every optimizer step (after the dual step), and λ when training starts (after a restore)."""

    def __init__(self) -> None:
        self.lambdas: list[torch.Tensor] = []
        self.at_start: torch.Tensor | None = None

    def on_train_start(self, trainer, module) -> None:
        self.at_start = module.constraint.multipliers.clone()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.lambdas.append(module.constraint.multipliers.clone())


def _plain_loop(data, steps: int):
    """The same training in plain PyTorch: layer_losses, lagrangian, backward, PrimalDual(AdamW).step."""
    model = tiny_bert(layers=LAYERS, hidden=16, seed=0)
    constraint = _constraint()
    optimizer = dl.PrimalDual(torch.optim.AdamW(model.parameters(), lr=1e-2), constraint)
    model.train()
    lambdas = []
    batches = list(_loader(data))
    for step in range(steps):
        batch = batches[step % len(batches)]
        loss = constraint.lagrangian(dl.layer_losses(model, batch))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        lambdas.append(constraint.multipliers.clone())
    return model, constraint, lambdas


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*LeafSpec.*")
        warnings.filterwarnings("ignore", message=".*GPU available but not used.*")
        yield


def test_lambda_and_weights_match_a_plain_loop_step_for_step(tmp_path):
    data = _data()
    module, record = Module(), Record()
    logger = L.pytorch.loggers.CSVLogger(str(tmp_path), name="csv", version=0)
    trainer = _trainer(max_steps=STEPS, callbacks=[record], logger=logger, log_every_n_steps=2)
    trainer.fit(module, _loader(data))

    model, constraint, lambdas = _plain_loop(data, STEPS)
    assert len(record.lambdas) == STEPS
    assert float(lambdas[-1].min()) > 0, "the violated constraints must move λ off 0"
    for step, (ours, plain) in enumerate(zip(record.lambdas, lambdas, strict=True)):
        torch.testing.assert_close(ours, plain, rtol=0, atol=1e-12, msg=f"λ differs at step {step}")
    for (name, p), q in zip(module.model.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7, msg=name)

    # the logs: written at Lightning's cadence (steps 2, 4, 6), task loss, λ summary and per-layer values
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    steps = [row for row in rows if row.get("descent/lambda_mean")]
    assert [int(row["step"]) for row in steps] == [1, 3, 5]
    last = steps[-1]
    for key in ["task_loss_step", "descent/lagrangian", "descent/lambda_max"]:
        assert last[key] != "", key
    for layer in range(LAYERS + 1):
        assert last[f"descent/f/{layer}"] != ""
    for layer in range(1, LAYERS + 1):
        assert last[f"descent/g/{layer}"] != ""
        assert float(last[f"descent/lambda/{layer}"]) == pytest.approx(
            float(lambdas[-1][layer - 1]), rel=1e-6
        )
    assert float(last["descent/lambda_mean"]) == pytest.approx(float(lambdas[-1].mean()), rel=1e-6)
    assert float(last["descent/lambda_max"]) == pytest.approx(float(lambdas[-1].max()), rel=1e-6)
    assert float(last["task_loss_step"]) == pytest.approx(
        float(constraint.log_dict()[f"f/{LAYERS}"]), rel=1e-5
    )
    assert any(row.get("task_loss_epoch") for row in rows)


def test_checkpoint_round_trips_lambda_and_resume_matches_one_run(tmp_path):
    data = _data(n=3 * BATCH)  # 3 batches an epoch
    whole = Module()
    _trainer(max_epochs=2).fit(whole, _loader(data))

    first = Module()
    trainer = _trainer(max_epochs=1)
    trainer.fit(first, _loader(data))
    path = tmp_path / "epoch1.ckpt"
    trainer.save_checkpoint(str(path))
    saved = torch.load(path, weights_only=False, map_location="cpu")
    lam = saved["optimizer_states"][0]["descent"]["duals"]
    assert float(first.constraint.multipliers.min()) > 0
    assert any(
        torch.equal(v, first.constraint.multipliers) for v in lam.values() if isinstance(v, torch.Tensor)
    )

    resumed, record = Module(), Record()
    assert float(resumed.constraint.multipliers.abs().max()) == 0.0
    _trainer(max_epochs=2, callbacks=[record]).fit(resumed, _loader(data), ckpt_path=str(path))
    assert torch.equal(record.at_start, first.constraint.multipliers), "λ must come back bit for bit"
    assert len(record.lambdas) == 3  # only the second epoch ran
    torch.testing.assert_close(
        resumed.constraint.multipliers, whole.constraint.multipliers, rtol=0, atol=1e-12
    )
    for p, q in zip(resumed.parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_a_plain_optimizer_is_refused():
    class Plain(Module):
        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    with pytest.raises(ConfigError, match="PrimalDual"):
        _trainer(max_steps=1).fit(Plain(), _loader(_data()))


def test_a_non_finite_gradient_stops_before_the_step():
    class Poisoned(Module):
        def descent_losses(self, batch):
            f = super().descent_losses(batch)
            return f * torch.tensor(float("nan"))

    module = Poisoned()
    before = [p.detach().clone() for p in module.parameters()]
    with pytest.raises(NumericalError, match="non-finite"):
        _trainer(max_steps=1).fit(module, _loader(_data()))
    assert all(torch.equal(p, q) for p, q in zip(module.parameters(), before, strict=True))
    assert float(module.constraint.multipliers.abs().max()) == 0.0


def test_a_module_without_a_model_says_what_to_set():
    class NoModel(DescentModule, L.LightningModule):
        def __init__(self):
            super().__init__()
            self.constraint = _constraint()
            self.layer = torch.nn.Linear(2, 2)

        def configure_optimizers(self):
            return dl.PrimalDual(torch.optim.SGD(self.parameters(), lr=0.1), self.constraint)

    with pytest.raises(ConfigError, match="override descent_losses"):
        _trainer(max_steps=1).fit(NoModel(), _loader(_data()))


DDP_SCRIPT = Path(__file__).with_name("lightning_ddp_script.py")


@pytest.mark.distributed
def test_ddp_two_cpu_processes_hold_the_same_lambda(tmp_path):
    """strategy="ddp", 2 gloo CPU processes: λ equal on both ranks and to one process on the global batches."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    env.pop("LOCAL_RANK", None)
    started = time.monotonic()
    try:
        run = subprocess.run(
            [sys.executable, str(DDP_SCRIPT), str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("the 2-process Lightning DDP run took over 180 s on this machine")
    seconds = time.monotonic() - started
    assert run.returncode == 0, run.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[0]["world_size"] == ranks[1]["world_size"] == 2
    assert float(ranks[0]["lambda"].min()) > 0
    assert torch.equal(ranks[0]["lambdas"], ranks[1]["lambdas"]), (
        "every rank must hold the same λ at every step"
    )

    # one process on the same global batches: each rank's batch k is half of the one process's batch k
    spec = importlib.util.spec_from_file_location("lightning_ddp_script", DDP_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    model, constraint = script.make_model(), script.make_constraint()
    optimizer = dl.PrimalDual(torch.optim.AdamW(model.parameters(), lr=1e-2), constraint)
    batches = list(torch.utils.data.DataLoader(script.data(), batch_size=2 * script.BATCH, shuffle=False))
    model.train()
    lambdas = []
    for step in range(script.STEPS):
        loss = constraint.lagrangian(dl.layer_losses(model, batches[step]))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        lambdas.append(constraint.multipliers.clone())
    torch.testing.assert_close(ranks[0]["lambdas"], torch.stack(lambdas), rtol=1e-5, atol=1e-7)
    print(f"2-process Lightning DDP run: {seconds:.1f} s")


def test_no_false_warning_and_a_missing_lagrangian_warns(recwarn):
    _trainer(max_steps=2).fit(Module(), _loader(_data()))
    assert not [w for w in recwarn if "lagrangian" in str(w.message)]

    class Forgetful(Module):
        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss  # never calls constraint.lagrangian

    with pytest.warns(RuntimeWarning, match="lagrangian"):
        _trainer(max_steps=2).fit(Forgetful(), _loader(_data()))
