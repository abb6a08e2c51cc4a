"""The Lightning callbacks (ConstraintCallback, ACDCCallback) under ``strategy="ddp"``, under AMP, and their
per-layer logs when the readout samples.

* DDP, 2 gloo CPU processes, a plain module and a plain AdamW (the callback takes the dual step): the
  multipliers after every step are bit-identical on the two ranks, and equal to one process trained on the
  same global batches in a plain PyTorch loop within 1e-12 (float64; the two differ only in the order of the
  gradient all-reduce's sums: 1.1e-16 measured); weights within 1e-12; AC/DC masks identical on both ranks
  and to the one-process run's.
* ``precision="bf16-mixed"`` on the CPU, a BERT classifier from a config with LayerwiseDescent and AC/DC:
  the run trains (f_L falls), λ are finite and off 0, and a checkpoint taken after the first epoch resumes
  to the uninterrupted run's λ, masks, AC/DC step and weights (bit for bit: CPU bf16 autocast is
  deterministic).
* per-layer logs through ``self.log``: with a sampled readout the estimates are logged as
  ``descent/f_sampled/l``, ``descent/g_sampled/l`` with ``descent/g_se/l``; with an exact one as
  ``descent/f/l``, ``descent/g/l``; the same through the ``DescentModule`` mixin.
"""

from __future__ import annotations

import csv
import importlib.util
import warnings
from pathlib import Path

import pytest
import torch

L = pytest.importorskip(
    "lightning", reason="lightning is not installed (pip install 'descentlab[lightning]')"
)

import descentlab as dl  # noqa: E402
from descentlab.integrations.lightning import ACDCCallback, ConstraintCallback, DescentModule  # noqa: E402
from descentlab.readout import CausalLMReadout  # noqa: E402
from lightning_trainer import cpu_trainer  # noqa: E402
from tiny_models import tiny_bert, tiny_llama  # noqa: E402

DDP_SCRIPT = Path(__file__).with_name("lightning_callbacks_ddp_script.py")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*LeafSpec.*")
        yield


# -- DDP -----------------------------------------------------------------------------------------------------
@pytest.mark.distributed
def test_ddp_ranks_hold_the_same_multipliers_and_masks_as_one_process(tmp_path) -> None:
    # the launcher of tests/distributed (one fresh launch after a gloo teardown SIGABRT)
    launcher = importlib.util.spec_from_file_location(
        "descentlab_distributed_launcher", Path(__file__).parents[1] / "distributed" / "conftest.py"
    )
    module = importlib.util.module_from_spec(launcher)
    launcher.loader.exec_module(module)
    ranks, script = module._spawn_ranks(DDP_SCRIPT, tmp_path, timeout=180)
    assert ranks[0]["world_size"] == ranks[1]["world_size"] == 2
    assert torch.equal(ranks[0]["lambdas"], ranks[1]["lambdas"]), "every rank must hold the same λ"
    for name, mask in ranks[0]["masks"].items():
        assert torch.equal(mask, ranks[1]["masks"][name]), name

    model, lambdas, masks = script.one_process()
    assert len(lambdas) == script.STEPS == len(ranks[0]["lambdas"])
    assert float(lambdas[-1][0]) > 0.1 and float(lambdas[-1][1].abs()) > 0.1  # both constraints bind
    torch.testing.assert_close(ranks[0]["lambdas"], torch.stack(lambdas), rtol=0, atol=1e-12)
    for p, q in zip(ranks[0]["weights"], model.parameters(), strict=True):
        torch.testing.assert_close(p, q.detach(), rtol=0, atol=1e-12)
    for name, mask in masks.items():
        assert torch.equal(ranks[0]["masks"][name], mask), name
    assert sum(int(m.sum()) for m in masks.values()) == sum(m.numel() for m in masks.values()) // 2


# -- AMP: bf16-mixed on the CPU ------------------------------------------------------------------------------
def _bert_rows(n: int = 16) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 97, (n, 12), generator=g)
    labels = (ids < 49).float().mean(1).gt(0.5).long()
    return [
        {"input_ids": ids[i], "attention_mask": torch.ones(12, dtype=torch.long), "labels": labels[i]}
        for i in range(n)
    ]


class Classifier(L.LightningModule):
    """Returns the model's own loss; the callback makes it f_L + Σ λ_l ĝ_l."""

    def __init__(self) -> None:
        super().__init__()
        self.model = tiny_bert(layers=2, hidden=32, seed=0)

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class Trace(L.Callback):
    def __init__(self, constraint) -> None:
        self.constraint, self.lambdas, self.losses, self.at_start = constraint, [], [], None

    def on_train_start(self, trainer, module) -> None:
        self.at_start = self.constraint.multipliers.clone()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.lambdas.append(self.constraint.multipliers.clone())
        self.losses.append(float(module.model_loss))


def _bf16_fit(epochs: int, ckpt_path: str | None = None):
    constraint = dl.LayerwiseDescent(num_layers=2, alpha=0.05, dual_lr=0.5)

    class Module(Classifier):
        def training_step(self, batch, batch_idx):
            out = self.model(**batch)
            self.model_loss, self.logits_dtype = out.loss.detach().float(), out.logits.dtype
            return out.loss

    schedule = dl.ACDCSchedule(total=8, warmup=2, phase=3, last_decompressed=1, final=2)
    acdc = ACDCCallback(lambda m, o: dl.ACDC(m.model, o, sparsity=0.5, schedule=schedule))
    module, trace = Module(), Trace(constraint)
    trainer = cpu_trainer(
        max_epochs=epochs, precision="bf16-mixed", callbacks=[ConstraintCallback(constraint), acdc, trace]
    )
    loader = torch.utils.data.DataLoader(_bert_rows(), batch_size=4, shuffle=False)  # 4 steps an epoch
    trainer.fit(module, loader, ckpt_path=ckpt_path)
    return module, constraint, acdc, trace, trainer


def test_bf16_mixed_trains_with_finite_multipliers_and_resumes_exactly(tmp_path) -> None:
    whole, whole_c, whole_acdc, whole_trace, _ = _bf16_fit(epochs=2)
    assert whole.logits_dtype == torch.bfloat16  # the forward ran under bf16 autocast
    lam = whole_c.multipliers
    assert torch.isfinite(lam).all() and float(lam.max()) > 0, lam
    assert whole_acdc.controller.step_count == 8 and whole_acdc.controller.compressed
    first_epoch, second_epoch = whole_trace.losses[:4], whole_trace.losses[4:]
    assert sum(second_epoch) < sum(first_epoch), whole_trace.losses  # it trains

    _, first_c, _, _, trainer = _bf16_fit(epochs=1)
    path = tmp_path / "epoch1.ckpt"
    trainer.save_checkpoint(str(path))
    resumed, resumed_c, resumed_acdc, trace, _ = _bf16_fit(epochs=2, ckpt_path=str(path))
    assert torch.equal(trace.at_start, first_c.multipliers), "λ comes back bit for bit"
    assert len(trace.lambdas) == 4 and resumed_acdc.controller.step_count == 8
    assert torch.equal(resumed_c.multipliers, whole_c.multipliers)
    for name, mask in whole_acdc.controller.masks.items():
        assert torch.equal(resumed_acdc.controller.masks[name], mask), name
    for (name, p), q in zip(resumed.named_parameters(), whole.parameters(), strict=True):
        assert torch.equal(p, q), name


# -- per-layer logs: sampled estimates are labelled ----------------------------------------------------------
def _lm_rows(n: int = 8) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 97, (n, 10), generator=g)
    return [
        {"input_ids": ids[i], "attention_mask": torch.ones(10, dtype=torch.long), "labels": ids[i]}
        for i in range(n)
    ]


def _logged(tmp_path: Path, module, callbacks) -> dict[str, str]:
    logger = L.pytorch.loggers.CSVLogger(str(tmp_path), name="csv", version=0)
    trainer = cpu_trainer(max_steps=2, callbacks=callbacks, logger=logger, log_every_n_steps=1)
    trainer.fit(module, torch.utils.data.DataLoader(_lm_rows(), batch_size=4, shuffle=False))
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    return {k: v for row in rows for k, v in row.items() if v != ""}


class LM(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = tiny_llama(layers=2, seed=0)

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _check_keys(logged: dict[str, str], sampled: bool, layers: int = 2) -> None:
    keys = set(logged)
    assert "descent/f/2" in keys and {"descent/lambda/1", "descent/lambda/2"} <= keys
    if sampled:
        assert {f"descent/f_sampled/{i}" for i in range(layers)} <= keys, sorted(keys)
        assert {f"descent/g_sampled/{i}" for i in range(1, layers + 1)} <= keys
        assert all(float(logged[f"descent/g_se/{i}"]) > 0 for i in range(1, layers + 1))
        assert float(logged["descent/readout/sampled_k"]) == 8
        assert not {"descent/f/0", "descent/f/1", "descent/g/1", "descent/g/2"} & keys, sorted(keys)
    else:
        assert {f"descent/f/{i}" for i in range(layers + 1)} <= keys
        assert {f"descent/g/{i}" for i in range(1, layers + 1)} <= keys
        assert not any("sampled" in k or "g_se" in k for k in keys), sorted(keys)


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "exact"])
def test_callback_logs_label_sampled_estimates(tmp_path, sampled) -> None:
    readout = CausalLMReadout(
        sample_tokens=8 if sampled else None, generator=torch.Generator().manual_seed(0)
    )
    constraint = dl.LayerwiseDescent(num_layers=2, alpha=0.5, dual_lr=0.5)
    logged = _logged(tmp_path, LM(), [ConstraintCallback(constraint, readout=readout)])
    _check_keys(logged, sampled)


def test_descent_module_logs_label_sampled_estimates(tmp_path) -> None:
    class Mixin(DescentModule, L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_llama(layers=2, seed=0)
            self.constraint = dl.LayerwiseDescent(num_layers=2, alpha=0.5, dual_lr=0.5)
            self.readout = CausalLMReadout(sample_tokens=8, generator=torch.Generator().manual_seed(0))

        def configure_optimizers(self):
            return dl.PrimalDual(torch.optim.SGD(self.parameters(), lr=0.1), self.constraint)

    _check_keys(_logged(tmp_path, Mixin(), []), sampled=True)
