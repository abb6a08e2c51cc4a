"""DescentTrainer logs the task loss f_L beside Trainer's ``loss``, which is the Lagrangian."""

from __future__ import annotations

import math

import torch
from transformers import TrainingArguments

import descentlab as dl
from descentlab.integrations.hf import DescentTrainer
from tiny_models import classification_rows, tiny_bert


def _examples(n: int) -> list[dict[str, torch.Tensor]]:
    return classification_rows(n, seed=0)


def test_log_history_has_task_loss_beside_the_lagrangian(tmp_path) -> None:
    # α = 0.5 asks each layer to halve the loss: the constraints are violated, so λ grows from the first step
    constraint = dl.LayerwiseDescent(num_layers=2, alpha=0.5, dual_lr=5.0)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        logging_steps=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        dataloader_num_workers=0,
    )
    trainer = DescentTrainer(
        model=tiny_bert(layers=2), args=args, train_dataset=_examples(32), constraint=constraint
    )
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2 and all("task_loss" in entry for entry in logged)
    last = logged[-1]
    assert math.isfinite(last["task_loss"])
    assert last["descent/lambda_max"] > 0 and last["descent/lambda_mean"] > 0
    assert abs(last["loss"] - last["task_loss"]) > 1e-6, "with λ > 0 the Lagrangian should differ from f_L"
