"""descentlab.integrations.lightning's callbacks under Lightning's CPU Trainer, on modules with nothing of ours.

Checked: ConstraintCallback on a plain LightningModule with a plain optimizer gives the λ and weights of a
plain PyTorch loop with PrimalDual, step for step, under gradient accumulation 1 and 2 (a ConstraintSet with
a proxy/strict inequality and an augmented-Lagrangian equality), and logs λ and the violations; with a
LayerwiseDescent on a module that returns the model's own loss it equals the PrimalDual loop of the mixin's
test; a checkpoint taken mid-run in a compressed AC/DC phase carries the masks and λ, and the resumed fit ends
with the masks, λ, AC/DC step and weights of an uninterrupted fit; a NaN gradient and a step without
constraint values are refused.
"""

from __future__ import annotations

import csv
import warnings

import pytest
import torch
from torch import nn

L = pytest.importorskip(
    "lightning", reason="lightning is not installed (pip install 'descentlab[lightning]')"
)

import descentlab as dl  # noqa: E402
from descentlab.errors import ConfigError, NumericalError  # noqa: E402
from descentlab.integrations.lightning import ACDC_KEY, ACDCCallback, ConstraintCallback  # noqa: E402
from descentlab.sparsity import Selection  # noqa: E402
from lightning_trainer import cpu_trainer as _trainer  # noqa: E402
from tiny_models import tiny_bert  # noqa: E402

BATCH = 4
CAP = -0.2  # positive rate <= 0.3: the fit pushes it up, so λ must rise
NORM = 0.02  # the first layer's mean squared weight = NORM (an equality, away from its initial value)


def _rows(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g, dtype=torch.float64)
    y = torch.sin(x).sum(-1) + 2.0  # mostly positive: the fit pushes the positive rate up
    return [{"x": x[i], "y": y[i]} for i in range(n)]


def _loader(rows, batch: int = BATCH) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(rows, batch_size=batch, shuffle=False)


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1)).double()


def _constraints() -> dl.ConstraintSet:
    return dl.ConstraintSet(
        [
            dl.Constraint("mean_pred", dual_lr=0.5),
            dl.Constraint(
                "norm", kind="equality", formulation="augmented_lagrangian", penalty=2.0, dual_lr=2.0
            ),
        ]
    )


def _step(net: nn.Module, batch: dict[str, torch.Tensor]) -> dict:
    """The task loss and the constraint values: a sigmoid proxy of the positive rate with its strict twin
    (both batch means, so k equal micro-batches average to the whole batch), and a weight-only equality."""
    pred = net(batch["x"]).squeeze(-1)
    loss = nn.functional.mse_loss(pred, batch["y"])
    mean_pred = dl.ConstraintValue(
        torch.sigmoid(pred).mean() - 0.5 - CAP, strict=(pred > 0).double().mean() - 0.5 - CAP
    )
    norm = net[0].weight.pow(2).mean() - NORM
    return {"loss": loss, "mean_pred": mean_pred, "norm": norm}


class Regressor(L.LightningModule):
    """A LightningModule with nothing of descentlab: it returns its loss and its constraint values."""

    def __init__(self, optimizer: str = "sgd") -> None:
        super().__init__()
        self.net = _net()
        self.optimizer_name = optimizer

    def training_step(self, batch, batch_idx):
        return _step(self.net, batch)

    def configure_optimizers(self):
        if self.optimizer_name == "adamw":
            return torch.optim.AdamW(self.parameters(), lr=1e-2)
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Record(L.Callback):
    """λ after every batch (after the optimizer step's dual step), and λ when training starts."""

    def __init__(self, constraint) -> None:
        self.constraint = constraint
        self.lambdas: list[torch.Tensor] = []
        self.at_start: torch.Tensor | None = None

    def _lam(self) -> torch.Tensor:
        lam = self.constraint.multipliers
        return (torch.cat(list(lam.values())) if isinstance(lam, dict) else lam).clone()

    def on_train_start(self, trainer, module) -> None:
        self.at_start = self._lam()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.lambdas.append(self._lam())


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*LeafSpec.*")
        warnings.filterwarnings("ignore", message=".*GPU available but not used.*")
        yield


def _plain_loop(rows, steps: int, batch: int) -> tuple[nn.Module, dl.ConstraintSet, list[torch.Tensor]]:
    """The same training in plain PyTorch: lagrangian, backward, PrimalDual(SGD).step."""
    net, cs = _net(), _constraints()
    optimizer = dl.PrimalDual(torch.optim.SGD(net.parameters(), lr=0.1), cs)
    lambdas = []
    for b in list(_loader(rows, batch))[:steps]:
        out = _step(net, b)
        loss = out.pop("loss")
        cs.lagrangian(loss, out).backward()
        optimizer.step()
        optimizer.zero_grad()
        lambdas.append(torch.cat(list(cs.multipliers.values())).clone())
    return net, cs, lambdas


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_plain_module_and_optimizer_match_a_primal_dual_loop_step_for_step(tmp_path, accumulate) -> None:
    steps = 6
    rows = _rows(steps * BATCH)
    cs = _constraints()
    module, record = Regressor(), Record(cs)
    logger = L.pytorch.loggers.CSVLogger(str(tmp_path), name="csv", version=0)
    trainer = _trainer(
        max_steps=steps // accumulate,
        accumulate_grad_batches=accumulate,
        callbacks=[ConstraintCallback(cs), record],
        logger=logger,
        log_every_n_steps=1,
    )
    trainer.fit(module, _loader(rows, BATCH))

    net, _, lambdas = _plain_loop(rows, steps // accumulate, BATCH * accumulate)
    assert float(lambdas[-1][0]) > 0, "the violated rate constraint must move λ off 0"
    assert float(lambdas[-1][1].abs()) > 0, "the equality's μ must move"
    ours = record.lambdas[accumulate - 1 :: accumulate]  # λ after each optimizer step
    assert len(ours) == len(lambdas) == steps // accumulate
    for step, (a, b) in enumerate(zip(ours, lambdas, strict=True)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=f"λ differs at step {step}")
    for p, q in zip(module.net.parameters(), net.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=1e-12)
    assert "training_step" not in module.__dict__, "the wrapper is removed at teardown"

    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as handle:
        rows_logged = [r for r in csv.DictReader(handle) if r.get("constraints/lambda/mean_pred/0")]
    last = rows_logged[-1]
    for key in [
        "task_loss_step",
        "constraints/lagrangian",
        "constraints/g/mean_pred/0",
        "constraints/g/norm/0",
    ]:
        assert last[key] != "", key
    assert float(last["constraints/lambda/mean_pred/0"]) == pytest.approx(float(lambdas[-1][0]), rel=1e-6)
    assert float(last["constraints/lambda/norm/0"]) == pytest.approx(float(lambdas[-1][1]), rel=1e-6)


def _bert_rows(n: int = 24) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 97, (n, 12), generator=g)
    labels = torch.randint(0, 2, (n,), generator=g)
    return [
        {"input_ids": ids[i], "attention_mask": torch.ones(12, dtype=torch.long), "labels": labels[i]}
        for i in range(n)
    ]


def test_layerwise_descent_on_a_module_that_returns_the_model_loss() -> None:
    """The callback reads the per-layer losses of ``module.model`` and replaces the model's loss by f_L + Σλĝ."""

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_bert(layers=2, hidden=16, seed=0)

        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    steps = 4
    constraint = dl.LayerwiseDescent(num_layers=2, alpha=0.5, dual_lr=0.5)
    module, record = Classifier(), Record(constraint)
    _trainer(max_steps=steps, callbacks=[ConstraintCallback(constraint), record]).fit(
        module, _loader(_bert_rows())
    )

    model, ref = (
        tiny_bert(layers=2, hidden=16, seed=0),
        dl.LayerwiseDescent(num_layers=2, alpha=0.5, dual_lr=0.5),
    )
    optimizer = dl.PrimalDual(torch.optim.AdamW(model.parameters(), lr=1e-2), ref)
    model.train()
    for batch in list(_loader(_bert_rows()))[:steps]:
        ref.lagrangian(dl.layer_losses(model, batch)).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert float(ref.multipliers.min()) > 0
    torch.testing.assert_close(record.lambdas[-1], ref.multipliers, rtol=0, atol=1e-12)
    for p, q in zip(module.model.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)


def _acdc_factory(module, optimizer) -> dl.ACDC:
    # dense [0, 2), compressed [2, 5), decompressed [5, 6), compressed [6, 8): step 4 is mid-compressed
    schedule = dl.ACDCSchedule(total=8, warmup=2, phase=3, last_decompressed=1, final=2)
    select = Selection(module_types=(nn.Linear,), blocks_only=False)
    return dl.ACDC(module.net, optimizer, sparsity=0.5, schedule=schedule, select=select)


def _resumable(epochs: int, ckpt_path=None):
    cs = _constraints()
    module, record = Regressor("adamw"), Record(cs)
    acdc = ACDCCallback(_acdc_factory)
    trainer = _trainer(max_epochs=epochs, callbacks=[ConstraintCallback(cs), acdc, record])
    trainer.fit(module, _loader(_rows(4 * BATCH)), ckpt_path=ckpt_path)  # 4 optimizer steps an epoch
    return module, cs, acdc, record, trainer


def test_checkpoint_carries_masks_and_multipliers_and_resume_equals_one_run(tmp_path) -> None:
    whole, whole_cs, whole_acdc, _, _ = _resumable(epochs=2)
    assert whole_acdc.controller.step_count == 8 and whole_acdc.controller.compressed

    _, first_cs, first_acdc, _, trainer = _resumable(epochs=1)
    assert first_acdc.controller.step_count == 4 and first_acdc.controller.compressed
    path = tmp_path / "epoch1.ckpt"
    trainer.save_checkpoint(str(path))
    saved = torch.load(path, weights_only=False, map_location="cpu")
    masks = saved[ACDC_KEY]["masks"]
    assert saved[ACDC_KEY]["step_count"] == 4 and masks is not None
    for name, mask in first_acdc.controller.masks.items():
        assert torch.equal(masks[name], mask.cpu()), name
    (state,) = [s for k, s in saved["callbacks"].items() if k.startswith("ConstraintCallback")]
    lam = torch.cat([state["constraint"]["constraints"][n]["multiplier"] for n in ("mean_pred", "norm")])
    assert torch.equal(lam, torch.cat(list(first_cs.multipliers.values())))
    assert float(lam.abs().min()) > 0, f"both multipliers must have moved, got {lam}"

    resumed, resumed_cs, resumed_acdc, record, _ = _resumable(epochs=2, ckpt_path=str(path))
    assert torch.equal(record.at_start, lam), "λ must come back bit for bit"
    assert len(record.lambdas) == 4  # only the second epoch ran
    assert resumed_acdc.controller.step_count == 8
    for name, mask in whole_acdc.controller.masks.items():
        assert torch.equal(resumed_acdc.controller.masks[name], mask), name
    for name in ("mean_pred", "norm"):
        torch.testing.assert_close(
            resumed_cs[name].multipliers, whole_cs[name].multipliers, rtol=0, atol=1e-12
        )
    for p, q in zip(resumed.parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
    zeros = sum(
        int((p == 0).sum()) for p in (resumed.net[0].weight, resumed.net[2].weight, resumed.net[4].weight)
    )
    assert zeros >= (64 + 256 + 16) // 2  # sparsity 0.5 over the selected weights, held at the end


def test_a_nan_gradient_stops_before_the_step_with_a_plain_optimizer() -> None:
    class Poisoned(Regressor):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            out["loss"] = out["loss"] * torch.tensor(float("nan"), dtype=torch.float64)
            return out

    cs = _constraints()
    module = Poisoned()
    before = [p.detach().clone() for p in module.parameters()]
    with pytest.raises(NumericalError, match="non-finite"):
        _trainer(max_steps=1, callbacks=[ConstraintCallback(cs)]).fit(module, _loader(_rows(2 * BATCH)))
    assert all(torch.equal(p, q) for p, q in zip(module.parameters(), before, strict=True))
    assert all(float(v.abs().max()) == 0.0 for v in cs.multipliers.values())


def test_a_step_without_constraint_values_says_what_to_return() -> None:
    class LossOnly(Regressor):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch, batch_idx)["loss"]

    with pytest.raises(ConfigError, match="named after the constraints"):
        _trainer(max_steps=1, callbacks=[ConstraintCallback(_constraints())]).fit(
            LossOnly(), _loader(_rows(8))
        )
