"""The Hugging Face callbacks: any Trainer (plain, TRL's SFTTrainer) trains on the Lagrangian through
``ConstraintCallback`` + ``primal_dual_optimizer``, and AC/DC through ``ACDCCallback``.

The plain-Trainer run is compared with ``DescentTrainer`` (the committed subclass) on the same tiny Llama,
the same exact readout and SGD: the same weights and λ, with gradient accumulation 2 and 1.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Trainer, TrainingArguments

import descentlab as dl
from descentlab.integrations.hf import (
    SPARSITY_FILE,
    ACDCCallback,
    ConstraintCallback,
    DescentTrainer,
    primal_dual_optimizer,
)
from descentlab.readout import CausalLMReadout
from tiny_models import lm_rows, tiny_llama

STEPS, BATCH = 3, 8


def _args(tmp_path, name: str, accum: int = 1, **kw) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(tmp_path / name),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH // accum,
        gradient_accumulation_steps=accum,
        learning_rate=0.5,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        report_to=[],
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
        dataloader_num_workers=0,
        **kw,
    )


def _constraint() -> dl.LayerwiseDescent:
    return dl.LayerwiseDescent(num_layers=2, alpha=0.5, dual_lr=1.0)


@pytest.mark.parametrize("accum", [1, 2])
def test_callback_on_a_plain_trainer_equals_descent_trainer(tmp_path, accum) -> None:
    readout = CausalLMReadout(sample_tokens=None)
    ref_model, ref_c = tiny_llama(layers=2), _constraint()
    DescentTrainer(
        model=ref_model,
        args=_args(tmp_path, "ref"),
        train_dataset=lm_rows(STEPS * BATCH),
        constraint=ref_c,
        readout=readout,
        optimizer_cls_and_kwargs=(torch.optim.SGD, {"lr": 0.5}),
    ).train()

    model, constraint = tiny_llama(layers=2), _constraint()
    trainer = Trainer(
        model=model,
        args=_args(tmp_path, f"cb{accum}", accum=accum),
        train_dataset=lm_rows(STEPS * BATCH),
        callbacks=[ConstraintCallback(constraint, readout=readout)],
        optimizer_cls_and_kwargs=primal_dual_optimizer(constraint, torch.optim.SGD, lr=0.5),
    )
    trainer.train()
    assert isinstance(trainer.optimizer.optimizer, dl.PrimalDual)
    assert (ref_c.multipliers > 0).any()
    torch.testing.assert_close(constraint.multipliers, ref_c.multipliers, rtol=1e-5, atol=1e-7)
    for (name, a), b in zip(ref_model.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
    assert (
        not model._forward_hooks
    )  # the hook is gone after training: later forwards see the model's own loss


def test_callback_refuses_an_optimizer_without_the_duals(tmp_path) -> None:
    trainer = Trainer(
        model=tiny_llama(layers=2),
        args=_args(tmp_path, "bad"),
        train_dataset=lm_rows(STEPS * BATCH),
        callbacks=[ConstraintCallback(_constraint())],
    )
    with pytest.raises(dl.errors.ConfigError, match="primal_dual_optimizer"):
        trainer.train()


def test_sft_trainer_trains_with_constraints_and_acdc(tmp_path) -> None:
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    g = torch.Generator().manual_seed(1)
    data = Dataset.from_list(
        [{"input_ids": torch.randint(1, 97, (12,), generator=g).tolist()} for _ in range(32)]
    )
    from tiny_tokenizers import llama_tokenizer

    tokenizer = llama_tokenizer(["a tiny corpus for a tiny tokenizer"] * 4, tmp_path / "tok", vocab_size=400)
    model = tiny_llama(layers=2, vocab=400)
    # a user constraint on the model's own loss: f_L <= 4.0 (it starts near ln 400 ≈ 6)
    cs = dl.ConstraintSet([dl.Constraint("cap", 1, dual_lr=1.0)])
    acdc = ACDCCallback(lambda m, o: dl.ACDC(m, o, sparsity=0.5, total_steps=6))
    config = trl.SFTConfig(
        output_dir=str(tmp_path / "sft"),
        max_steps=6,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="steps",
        save_steps=3,
        logging_steps=1,
        dataloader_num_workers=0,
        dataset_text_field=None,
        max_length=12,
        packing=False,
    )
    # SFTTrainer computes its own loss from fused log-probabilities (no output.loss for the hook to replace):
    # the callback's loss_func is its compute_loss_func
    callback = ConstraintCallback(cs, values=lambda m, batch, out: {"cap": out["loss"] - 4.0})
    trainer = trl.SFTTrainer(
        model=model,
        args=config,
        processing_class=tokenizer,
        train_dataset=data,
        compute_loss_func=callback.loss_func,
        callbacks=[callback, acdc],
        optimizer_cls_and_kwargs=primal_dual_optimizer(cs, torch.optim.AdamW, lr=1e-2),
    )
    trainer.train()
    assert float(cs["cap"].multipliers) > 0  # the loss starts above 4.0: λ rose
    assert acdc.controller is not None and acdc.controller.step_count == 6  # one step per optimizer step
    state = torch.load(tmp_path / "sft" / "checkpoint-3" / SPARSITY_FILE, weights_only=True)
    assert state["step_count"] == 3  # the controller's state at that checkpoint
    assert "descent" in torch.load(tmp_path / "sft" / "checkpoint-6" / "optimizer.pt", weights_only=False)
