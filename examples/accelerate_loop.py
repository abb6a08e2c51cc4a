"""Layer-wise descent constraints and AC/DC with Hugging Face Accelerate, on one or several processes.

A RoBERTa classifier built from a ``transformers`` config (random weights, nothing downloaded) is trained on a
synthetic task. Prepare the model, the ``PrimalDual`` optimizer and the loader as usual, and register the AC/DC
controller so ``save_state`` / ``load_state`` carry its masks (the optimizer state already carries λ). Under
several processes every rank holds the same λ and the same masks.

    python examples/accelerate_loop.py --tiny --out /tmp/descentlab-accelerate     # seconds
    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_loop.py    # 2 processes (CPU: gloo)

``tests/test_examples.py`` runs the first line; ``tests/integrations/test_accelerate_example.py`` runs the second
with ``--tiny`` on 2 CPU processes and checks both ranks print the same λ.
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import RobertaConfig, RobertaForSequenceClassification

import descentlab as dl

VOCAB = 64


def synthetic_examples(n: int, length: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """Token sequences; the label says whether most tokens come from the lower half of the vocabulary."""
    ids = torch.randint(2, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))
    labels = ((ids < VOCAB // 2).float().mean(dim=1) > 0.5).long()
    return [
        {"input_ids": i, "attention_mask": torch.ones_like(i), "labels": y}
        for i, y in zip(ids, labels, strict=True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few steps on a tiny model (seconds)")
    parser.add_argument("--out", default="out/accelerate", help="folder of accelerator.save_state")
    args = parser.parse_args()
    # tiny: 256 examples, 8 steps on one process, 4 per rank on two (AC/DC needs >= 3 to end compressed)
    n_train, hidden, layers, epochs = (256, 32, 2, 1) if args.tiny else (8192, 128, 4, 2)

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    config = RobertaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
        pad_token_id=1,
    )
    model = RobertaForSequenceClassification(config)
    loader = DataLoader(synthetic_examples(n_train, 16, seed=0), batch_size=32, shuffle=True)

    constraint = dl.LayerwiseDescent(num_layers=layers, alpha=0.05, dual_lr=0.05)
    optimizer = dl.PrimalDual(dl.HORST(model.parameters(), lr=1e-3, alpha=1.0), constraint)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    acdc = dl.ACDC(accelerator.unwrap_model(model), optimizer, sparsity=0.5, total_steps=epochs * len(loader))
    accelerator.register_for_checkpointing(acdc)

    model.train()
    for epoch in range(epochs):
        for batch in loader:
            f = dl.layer_losses(model, batch)  # runs inside DDP's forward, so gradients synchronise
            accelerator.backward(constraint.lagrangian(f))
            acdc.before_optimizer_step()  # pruned weights get no gradient
            optimizer.step()  # primal step (HORST), then the dual step on λ (ĝ averaged over ranks)
            optimizer.zero_grad()
            acdc.step()  # re-zero pruned weights, advance the AC/DC schedule
        accelerator.print(f"epoch {epoch}  f_L {f[-1].item():.4f}  {acdc!r}")
    accelerator.save_state(args.out)  # weights, optimizer with λ, AC/DC masks, RNG states
    # every rank prints its own λ: they are the same (the dual step averages ĝ over the ranks)
    print(f"rank {accelerator.process_index} lambda", [round(v, 6) for v in constraint.multipliers.tolist()])
    accelerator.print(dl.sparsity_report(accelerator.unwrap_model(model)).table(per_tensor=False))


if __name__ == "__main__":
    main()
