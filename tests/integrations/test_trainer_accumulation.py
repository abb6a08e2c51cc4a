"""DescentTrainer with ``gradient_accumulation_steps=2`` equals accumulation 1 at twice the batch (issue 31, 4).

Trainer divides a per-batch loss by the accumulation steps only under rules that changed across releases;
the adapter tells it the Lagrangian is a per-batch mean (``loss_is_scaled_for_ga = False`` from 5.19, a
model without loss kwargs before). The optimizer is SGD: Adam's update is nearly invariant to a constant
factor on the gradients, so it would hide a loss scaled k times too large or too small.

A Llama built from a config takes loss kwargs (Trainer passes it the accumulated token count), which is the
case the old class attribute got wrong for plain ERM; a BERT classifier does not. Every sequence has the
same length and no padding, so each micro-batch has the same number of targets: the mean over the two
halves is then exactly the mean over the whole batch, for the model's loss, for f and for ĝ (hence λ).
"""

from __future__ import annotations

import pytest
import torch
from transformers import TrainingArguments

import descentlab as dl
from descentlab.integrations.hf import DescentTrainer
from descentlab.readout import CausalLMReadout
from tiny_models import classification_rows, lm_rows, tiny_bert, tiny_llama

STEPS = 3
BATCH = 8


def _cls_rows(n: int = STEPS * BATCH) -> list[dict[str, torch.Tensor]]:
    return classification_rows(n, seed=1)


def _train(tmp_path, family: str, constrained: bool, accum: int) -> tuple[torch.nn.Module, DescentTrainer]:
    model, rows = (
        (tiny_llama(layers=2), lm_rows(STEPS * BATCH))
        if family == "llama"
        else (tiny_bert(layers=2), _cls_rows())
    )
    args = TrainingArguments(
        output_dir=str(tmp_path / f"{family}-{constrained}-{accum}"),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH // accum,
        gradient_accumulation_steps=accum,
        learning_rate=0.5,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,  # no clipping: it would rescale a wrongly scaled gradient
        report_to=[],
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
        dataloader_num_workers=0,
    )
    constraint = dl.LayerwiseDescent(num_layers=2, alpha=0.5, dual_lr=1.0) if constrained else None
    # the exact readout: the default's token subsample is drawn per micro-batch, so two halves would not
    # read the rows the whole batch reads
    readout = CausalLMReadout(sample_tokens=None) if family == "llama" else None
    trainer = DescentTrainer(
        model=model,
        args=args,
        train_dataset=rows,
        constraint=constraint,
        readout=readout,
        optimizer_cls_and_kwargs=(torch.optim.SGD, {"lr": 0.5}),
    )
    trainer.train()
    return model, trainer


@pytest.mark.parametrize(
    ("family", "constrained"),
    [("llama", True), ("llama", False), ("bert", True)],
    ids=["llama-constrained", "llama-erm", "bert-constrained"],
)
def test_accumulation_2_equals_accumulation_1_at_twice_the_batch(tmp_path, family, constrained) -> None:
    whole, trainer_whole = _train(tmp_path, family, constrained, accum=1)
    halves, trainer_halves = _train(tmp_path, family, constrained, accum=2)
    start = tiny_llama(layers=2) if family == "llama" else tiny_bert(layers=2)
    moved = max(
        float((a - b).abs().max()) for a, b in zip(whole.parameters(), start.parameters(), strict=True)
    )
    assert moved > 1e-2, "SGD barely moved the weights: the comparison would not see a k-fold gradient"
    for (name, a), b in zip(whole.named_parameters(), halves.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
    if constrained:
        lam = trainer_whole.constraint.multipliers
        assert (lam > 0).any(), "the duals never moved: the test would not see a lost or doubled ĝ"
        torch.testing.assert_close(trainer_halves.constraint.multipliers, lam, rtol=1e-5, atol=1e-7)
    # Trainer's logged loss (the Lagrangian with a constraint) is the whole batch's too
    logged = [
        [e["loss"] for e in t.state.log_history if "loss" in e] for t in (trainer_whole, trainer_halves)
    ]
    assert len(logged[0]) == STEPS
    assert logged[1] == pytest.approx(logged[0], rel=1e-4)


def test_a_constraint_refuses_compute_loss_func(tmp_path) -> None:
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_steps=1)
    with pytest.raises(dl.errors.ConfigError, match="compute_loss_func"):
        DescentTrainer(
            model=tiny_bert(layers=2),
            args=args,
            train_dataset=_cls_rows(8),
            constraint=dl.LayerwiseDescent(num_layers=2, alpha=0.1, dual_lr=0.1),
            compute_loss_func=lambda outputs, labels, num_items_in_batch=None: outputs.loss,
        )
