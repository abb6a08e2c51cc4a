"""Layer-wise descent constraints in a plain PyTorch loop.

A DistilBERT classifier built from a ``transformers`` config (random weights, nothing downloaded) is trained
on a synthetic task with ``LayerwiseDescent`` + ``PrimalDual`` around AdamW: the loss read out after every
layer must fall by at least ``alpha`` (relative) from the layer before, enforced with Lagrange multipliers λ.

    python examples/plain_loop.py --tiny     # a few steps on a tiny model: seconds
    python examples/plain_loop.py            # a larger model, 300 steps

For your own model and data: ``model, tokenizer = descentlab.data.load_encoder_classifier("minilm")`` (or
any Hugging Face id) and batches of ``tokenizer(...)`` output with ``labels``; the loop stays the same.
"""

from __future__ import annotations

import argparse

import torch
from transformers import DistilBertConfig, DistilBertForSequenceClassification

import descentlab as dl

VOCAB = 64


def synthetic_batch(gen: torch.Generator, batch_size: int, length: int) -> dict[str, torch.Tensor]:
    """Token sequences; the label says whether most tokens come from the lower half of the vocabulary."""
    ids = torch.randint(1, VOCAB, (batch_size, length), generator=gen)
    labels = ((ids < VOCAB // 2).float().mean(dim=1) > 0.5).long()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few steps on a tiny model (seconds)")
    args = parser.parse_args()
    steps, dim, layers = (6, 32, 2) if args.tiny else (300, 128, 4)

    torch.manual_seed(0)
    config = DistilBertConfig(
        vocab_size=VOCAB, dim=dim, n_layers=layers, n_heads=2, hidden_dim=2 * dim, max_position_embeddings=64
    )
    model = DistilBertForSequenceClassification(config)

    constraint = dl.LayerwiseDescent(num_layers=config.num_hidden_layers, alpha=0.05, dual_lr=0.05)
    optimizer = dl.PrimalDual(torch.optim.AdamW(model.parameters(), lr=1e-3), constraint)

    gen = torch.Generator().manual_seed(0)
    model.train()
    for step in range(steps):
        batch = synthetic_batch(gen, batch_size=32, length=16)
        f = dl.layer_losses(model, batch)  # [L+1]: the loss read out at the embeddings and after every layer
        loss = constraint.lagrangian(f)  # f_L + Σ_l λ_l ĝ_l
        loss.backward()
        optimizer.step()  # the primal step (AdamW), then the dual step on λ
        optimizer.zero_grad()
        if step % max(1, steps // 5) == 0 or step == steps - 1:
            print(f"step {step:4d}  f_L {f[-1].item():.4f}  per-layer f {[round(v, 3) for v in f.tolist()]}")

    model.eval()
    with torch.no_grad():
        test = synthetic_batch(torch.Generator().manual_seed(1), batch_size=256, length=16)
        accuracy = (model(**test).logits.argmax(-1) == test["labels"]).float().mean().item()
    print(f"test accuracy {accuracy:.3f}")
    print("lambda", [round(v, 4) for v in constraint.multipliers.tolist()])  # also in optimizer.state_dict()


if __name__ == "__main__":
    main()
