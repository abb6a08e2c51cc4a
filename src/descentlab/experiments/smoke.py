"""smoke: a small MLP trained with ERM on real images; exercises data -> train -> evaluate -> report.

It is the framework's own end-to-end check (and the example an experiment author copies): a config
dataclass, presets, and a ``run`` that reads top to bottom.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from descentlab.data import load_image_classification
from descentlab.errors import ConfigError
from descentlab.experiments.base import seed_everything
from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import ERM
from descentlab.train.rundir import RunDir


@dataclass
class SmokeConfig:
    dataset: str = "fashion_mnist"
    n_train: int = 2000
    n_test: int = 1000
    hidden: int = 128
    lr: float = 1e-3
    seeds: list[int] = field(default_factory=lambda: [0])
    noise_levels: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 1.0])
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=2, batch_size=64, log_every=10))

    def __post_init__(self) -> None:
        if self.n_train < 1 or self.n_test < 1:
            raise ConfigError("n_train and n_test must be >= 1")
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")


PRESETS = {
    "quick": {"n_train": 1000, "n_test": 500, "train.epochs": 1},
    "full": {"n_train": 20000, "n_test": 5000, "train.epochs": 5, "seeds": [0, 1, 2]},
}


def make_mlp(pixels: int, hidden: int, classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(pixels, hidden), nn.GELU(), nn.Linear(hidden, classes))


class ImageSet(torch.utils.data.Dataset):
    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images = images.float().div(255.0)
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.images[i], "y": self.labels[i]}


def cross_entropy(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch["x"]), batch["y"])


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, noise: float, seed: int) -> float:
    gen = torch.Generator().manual_seed(seed)
    x = images.float().div(255.0)
    x = x + noise * torch.randn(x.shape, generator=gen)
    return float((model(x).argmax(-1) == labels).float().mean())


def run(cfg: SmokeConfig, run: RunDir) -> dict:
    data = load_image_classification(cfg.dataset)
    train_x, train_y = data["train"][0][: cfg.n_train], data["train"][1][: cfg.n_train]
    test_x, test_y = data["test"][0][: cfg.n_test], data["test"][1][: cfg.n_test]
    classes = int(train_y.max()) + 1

    per_seed = []
    for seed in cfg.seeds:
        seed_everything(seed)
        model = make_mlp(train_x[0].numel(), cfg.hidden, classes)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        train_cfg = TrainConfig(**{**vars(cfg.train), "seed": seed})
        fit(
            model,
            ImageSet(train_x, train_y),
            objective=ERM(cross_entropy),
            optimizer=optimizer,
            cfg=train_cfg,
            run=run,
            tag=f"erm-seed{seed}",
        )
        model.eval()
        per_seed.append([accuracy(model, test_x, test_y, g, seed) for g in cfg.noise_levels])

    acc = torch.tensor(per_seed)
    mean, std = (
        acc.mean(0).tolist(),
        (acc.std(0) if len(cfg.seeds) > 1 else torch.zeros_like(acc[0])).tolist(),
    )
    return {
        "protocol": {
            "dataset": cfg.dataset,
            "split": "test",
            "n_train": len(train_y),
            "n_eval": len(test_y),
            "seeds": list(cfg.seeds),
            "draws": 1,
            "noise": "gaussian on pixels in [0, 1]",
        },
        "methods": {
            "erm": {
                "metrics": {"accuracy": mean[0]},
                "curves": {
                    "gaussian": {
                        "x_name": "sigma",
                        "x": list(cfg.noise_levels),
                        "metric": "accuracy",
                        "mean": mean,
                        "std": std,
                        "summary": sum(mean) / len(mean),
                    }
                },
            }
        },
    }
