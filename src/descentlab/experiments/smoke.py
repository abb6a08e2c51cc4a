"""smoke: a small MLP trained with ERM on real images; exercises data -> train -> evaluate -> report.

It is the framework's own end-to-end check (and the example an experiment author copies): a config
dataclass of component configs plus the experiment's own data and model fields, presets, and a ``run``
that reads top to bottom: data -> for each seed: recipe -> fit -> evaluate -> results.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from descentlab.config import config_to_dict
from descentlab.data.images import ImageSet, load_image_classification
from descentlab.errors import ConfigError
from descentlab.optim.config import OptimizerConfig
from descentlab.report.results import Curve, MethodResult, Results
from descentlab.report.stats import column_mean_std
from descentlab.study.cells import Design
from descentlab.study.jobs import JobRunner
from descentlab.train.loop import TrainConfig, fit, seed_everything
from descentlab.train.recipe import MethodConfig, build_recipe
from descentlab.train.rundir import RunDir

NAME = "smoke"


@dataclass
class SmokeConfig:
    dataset: str = "fashion_mnist"
    n_train: int = 2000
    n_test: int = 1000
    hidden: int = 128
    method: MethodConfig = field(
        default_factory=lambda: MethodConfig(optimizer=OptimizerConfig(name="adamw", lr=1e-3))
    )
    seeds: list[int] = field(default_factory=lambda: [0])
    noise_levels: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 1.0])
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=2, batch_size=64, log_every=10))

    def __post_init__(self) -> None:
        if self.n_train < 1 or self.n_test < 1:
            raise ConfigError("n_train and n_test must be >= 1")
        if not self.seeds:
            raise ConfigError("seeds must list at least one seed")


CONFIG = SmokeConfig


PRESETS = {
    "quick": {"n_train": 1000, "n_test": 500, "train.epochs": 1},
    "full": {"n_train": 20000, "n_test": 5000, "train.epochs": 5, "seeds": [0, 1, 2]},
}


def make_mlp(pixels: int, hidden: int, classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(pixels, hidden), nn.GELU(), nn.Linear(hidden, classes))


def cross_entropy(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch["pixel_values"]), batch["labels"])


@torch.no_grad()
def accuracy(model: nn.Module, data: ImageSet, noise: float, seed: int) -> float:
    """Accuracy under Gaussian pixel noise ``x + noise · ε``, ε ~ N(0, 1) drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    x = data.x + noise * torch.randn(data.x.shape, generator=gen)
    return float((model(x).argmax(-1) == data.y).float().mean())


def train_and_evaluate(
    cfg: SmokeConfig, run: RunDir, train: ImageSet, test: ImageSet, seed: int
) -> list[float]:
    """One seed: the MLP trained by ``cfg.method``; its test accuracy at each noise level."""
    seed_everything(seed)
    model = make_mlp(train.x[0].numel(), cfg.hidden, int(train.y.max()) + 1)
    train_cfg = replace(cfg.train, seed=seed)
    recipe = build_recipe(
        cfg.method, model, total_steps=train_cfg.total_steps(len(train)), loss_fn=cross_entropy
    )
    fit(model, train, cfg=train_cfg, run=run, tag=f"erm-seed{seed}", **recipe.fit_kwargs())
    model.eval()
    return [accuracy(model, test, noise, seed) for noise in cfg.noise_levels]


def run(cfg: SmokeConfig, run: RunDir) -> dict[str, Any]:
    data = load_image_classification(cfg.dataset)
    train = ImageSet(data["train"][0][: cfg.n_train], data["train"][1][: cfg.n_train])
    test = ImageSet(data["test"][0][: cfg.n_test], data["test"][1][: cfg.n_test])

    # inline jobs (the data is passed as is); finished seeds come back from the job cache on resume
    with JobRunner(train_and_evaluate, cache_dir=run.path / "jobs") as jobs:
        per_seed = [jobs.submit(f"erm-seed{s}", cfg, run, train, test, s).result() for s in cfg.seeds]

    mean, std = column_mean_std(per_seed, ddof=1, impl="torch")
    curve = Curve(
        x_name="sigma",
        x=list(cfg.noise_levels),
        metric="accuracy",
        mean=mean,
        std=std,
        extra={"summary": sum(mean) / len(mean)},
    )
    return Results(
        experiment=NAME,
        config=config_to_dict(cfg),
        protocol={
            "dataset": cfg.dataset,
            "split": "test",
            "n_train": len(train),
            "n_eval": len(test),
            "seeds": list(cfg.seeds),
            "draws": 1,
            "noise": "gaussian on pixels in [0, 1]",
        },
        methods={"erm": MethodResult(metrics={"accuracy": mean[0]}, curves={"gaussian": curve})},
    ).to_dict()


def design(cfg: SmokeConfig) -> Design:
    """The design record of a run of ``cfg`` (:mod:`descentlab.study.cells`): one arm (ERM) at every pixel
    noise level (the conditions), on ``seeds``. The run judges no claim; the record says what it measured."""
    return Design(("erm",), tuple(cfg.noise_levels), tuple(cfg.seeds))
