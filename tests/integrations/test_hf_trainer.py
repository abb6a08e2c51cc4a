"""DescentTrainer: constraints + HORST + AC/DC through HF Trainer, with exact checkpoint/resume."""

from __future__ import annotations

import pytest
import torch
from transformers import BertForSequenceClassification, TrainingArguments

import descentlab as dl
from descentlab.data import load_encoder_classifier, load_text_classification
from descentlab.integrations.hf import SPARSITY_FILE, DescentTrainer
from tiny_models import tiny_bert


@pytest.fixture(scope="module")
def dataset():
    try:
        _, tokenizer = load_encoder_classifier("minilm")
        splits = load_text_classification("rotten_tomatoes", max_train=64, max_eval=32)
    except dl.errors.AssetMissingError as exc:  # type: ignore[attr-defined]
        pytest.skip(str(exc))

    def encode(batch):
        return tokenizer(batch["text"], truncation=True, max_length=32, padding="max_length")

    return (
        splits.map(encode, batched=True)
        .rename_column("label", "labels")
        .with_format("torch", columns=["input_ids", "attention_mask", "labels"])
    )


def _model() -> BertForSequenceClassification:
    # MiniLM's WordPiece vocabulary; BertConfig's default dropout (0.1), which resume must replay exactly
    return tiny_bert(layers=3, hidden=32, vocab=30522, positions=64, num_labels=2, dropout=0.1, seed=0)


def _trainer(out, dataset, max_steps: int) -> DescentTrainer:
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        save_steps=4,
        logging_steps=2,
        report_to=[],
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return DescentTrainer(
        model=_model(),
        args=args,
        train_dataset=dataset["train"],
        constraint=dl.LayerwiseDescent(num_layers=3, alpha=0.05, dual_lr=0.5),
        optimizer_cls_and_kwargs=(dl.HORST, {"lr": 1e-3, "alpha": 1.0}),
        sparsity=lambda model, opt: dl.ACDC(
            model,
            opt,
            sparsity=0.5,
            total_steps=8,
            schedule=dl.ACDCSchedule(warmup=2, phase=3, last_decompressed=0, final=3),
        ),
    )


def test_trainer_trains_logs_and_resumes_exactly(tmp_path, dataset) -> None:
    full = _trainer(tmp_path / "full", dataset, 8)
    full.train()
    assert isinstance(full.optimizer.optimizer, dl.PrimalDual)
    assert isinstance(full.optimizer.optimizer.optimizer, dl.HORST)
    logged = [entry for entry in full.state.log_history if "loss" in entry]
    assert (
        logged and any(k.startswith("descent/lambda") for k in logged[-1]) and "sparsity/global" in logged[-1]
    )
    lam = full.constraint.multipliers.clone()
    assert (lam > 0).any(), "the duals never moved: the test would not see a lost λ"
    assert (tmp_path / "full" / "checkpoint-4" / SPARSITY_FILE).is_file()

    # a fresh trainer resumes from the mid-run checkpoint, as after a crash: λ, u, masks and weights come back
    resumed = _trainer(tmp_path / "resumed", dataset, 8)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-4"))
    assert torch.equal(resumed.constraint.multipliers, lam)
    assert (
        resumed.sparsity_controller.state_dict()["step_count"]
        == full.sparsity_controller.state_dict()["step_count"]
        == 8
    )
    for (name, a), b in zip(
        full.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    zeros = dl.sparsity_report(resumed.model).global_sparsity
    assert zeros == pytest.approx(0.5, abs=0.01)
