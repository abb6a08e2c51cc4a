"""Layer-wise descent constraints, HORST and AC/DC inside a Hugging Face ``Trainer``: swap in ``DescentTrainer``.

A BERT classifier built from a ``transformers`` config (random weights, nothing downloaded) is trained on a
synthetic ``datasets.Dataset``. Everything but the three ``DescentTrainer`` arguments marked below is an
ordinary Trainer script. Per-layer losses, λ and the sparsity go through Trainer's logging; λ, the slacks and
the AC/DC masks are saved in Trainer's checkpoints and restored by ``train(resume_from_checkpoint=True)``.

    python examples/hf_trainer.py --tiny --out /tmp/descentlab-trainer    # a few steps: seconds
    python examples/hf_trainer.py                                          # a larger model, 300 steps
"""

from __future__ import annotations

import argparse

import torch
from datasets import Dataset
from transformers import BertConfig, BertForSequenceClassification, TrainingArguments

import descentlab as dl
from descentlab.integrations.hf import DescentTrainer

VOCAB = 64


def synthetic_dataset(n: int, length: int, seed: int) -> Dataset:
    """Token sequences; the label says whether most tokens come from the lower half of the vocabulary."""
    ids = torch.randint(1, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))
    labels = ((ids < VOCAB // 2).float().mean(dim=1) > 0.5).long()
    return Dataset.from_dict(
        {
            "input_ids": ids.tolist(),
            "attention_mask": torch.ones_like(ids).tolist(),
            "labels": labels.tolist(),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few steps on a tiny model (seconds)")
    parser.add_argument("--out", default="out/hf_trainer", help="Trainer's output_dir (checkpoints)")
    args = parser.parse_args()
    steps, hidden, layers = (6, 32, 2) if args.tiny else (300, 128, 4)

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
    )
    model = BertForSequenceClassification(config)
    training_args = TrainingArguments(
        output_dir=args.out,
        max_steps=steps,
        per_device_train_batch_size=32,
        per_device_eval_batch_size=64,
        logging_steps=max(1, steps // 5),
        save_steps=steps,
        report_to=[],
        use_cpu=True,
    )
    trainer = DescentTrainer(
        model=model,
        args=training_args,
        train_dataset=synthetic_dataset(32 * steps, 16, seed=0),
        eval_dataset=synthetic_dataset(256, 16, seed=1),
        # the descentlab part:
        constraint=dl.LayerwiseDescent(num_layers=layers, alpha=0.05, dual_lr=0.05),
        optimizer_cls_and_kwargs=(dl.HORST, {"lr": 1e-3, "alpha": 1.0}),
        sparsity=lambda model, optimizer: dl.ACDC(model, optimizer, sparsity=0.5, total_steps=steps),
    )
    trainer.train()
    metrics = trainer.evaluate()  # per-layer losses and whether each constraint holds on held-out data
    print({k: round(v, 4) for k, v in metrics.items() if k.startswith(("eval_loss", "eval_constraints_met"))})
    last = [entry for entry in trainer.state.log_history if "descent/lambda/1" in entry][-1]
    print({k: round(v, 4) for k, v in last.items() if k.startswith(("descent/lambda", "sparsity/global"))})


if __name__ == "__main__":
    main()
