"""HORST with AC/DC sparse training on a small CNN.

HORST is AdamW composed with a hyperbolic-entropy mirror step that pulls weights towards sparse solutions;
AC/DC alternates dense and compressed (magnitude-masked) phases and ends compressed at the target sparsity.
The optimizer comes from an ``OptimizerConfig`` (the same settings as ``method.optimizer.*`` of the
experiments); a CNN has no transformer blocks, so AC/DC is told which weights to prune with a ``Selection``.

    python examples/horst_acdc_cnn.py --tiny    # synthetic images, a few steps: seconds
    python examples/horst_acdc_cnn.py           # Fashion-MNIST (offline Debian package) if installed, 2 epochs
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import descentlab as dl
from descentlab.optim import OptimizerConfig, build_optimizer
from descentlab.sparsity import Selection


def small_cnn(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * width * 7 * 7, 10),
    )


def synthetic_images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """28x28 noise with a bright 7x7 patch whose position (one of 10) is the label."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=gen)
    x = 0.3 * torch.rand(n, 1, 28, 28, generator=gen)
    for i, y in enumerate(labels.tolist()):
        row, col = divmod(y, 5)
        x[i, 0, 7 * row + 3 : 7 * row + 10, 5 * col + 1 : 5 * col + 8] += 1.0
    return x, labels


def load_data(tiny: bool) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    if not tiny and dl.data.available_assets().get("fashion_mnist"):
        data = dl.data.load_image_classification("fashion_mnist")
        (xtr, ytr), (xte, yte) = data["train"], data["test"]
        return (xtr.float().unsqueeze(1) / 255, ytr), (xte.float().unsqueeze(1) / 255, yte)
    n = 256 if tiny else 20_000
    return synthetic_images(n, seed=0), synthetic_images(1000, seed=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="synthetic images, a few steps (seconds)")
    parser.add_argument("--sparsity", type=float, default=0.9)
    args = parser.parse_args()
    (xtr, ytr), (xte, yte) = load_data(args.tiny)
    width, epochs, batch_size = (4, 1, 32) if args.tiny else (16, 2, 128)
    steps = epochs * (len(ytr) // batch_size)

    torch.manual_seed(0)
    model = small_cnn(width)
    cfg = OptimizerConfig(name="horst", lr=2e-3, alpha=1.0, weight_decay=1e-4, decay="matrices")
    optimizer = build_optimizer(cfg, model)  # mirror step on tensors with ndim >= 2 (conv and linear weights)
    select = Selection(module_types=(nn.Conv2d, nn.Linear), blocks_only=False)
    acdc = dl.ACDC(model, optimizer, sparsity=args.sparsity, total_steps=steps, select=select)
    loss_fn = nn.CrossEntropyLoss()

    model.train()
    for step in range(steps):
        i = (step * batch_size) % (len(ytr) - batch_size + 1)
        loss = loss_fn(model(xtr[i : i + batch_size]), ytr[i : i + batch_size])
        loss.backward()
        acdc.before_optimizer_step()  # pruned weights get no gradient while compressed
        optimizer.step()
        optimizer.zero_grad()
        acdc.step()  # re-zero pruned weights, switch phase when due
        if step % max(1, steps // 8) == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  {acdc!r}")

    model.eval()
    with torch.no_grad():
        accuracy = (model(xte).argmax(-1) == yte).float().mean().item()
    print(f"test accuracy {accuracy:.3f} at {dl.sparsity_report(model, select).global_sparsity:.1%} zeros")
    print(dl.sparsity_report(model, select))  # one row per pruned weight, exact zeros counted in the tensors


if __name__ == "__main__":
    main()
