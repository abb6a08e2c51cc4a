"""robust-sparse: layer-wise descent constraints with HORST as the primal optimizer, then magnitude pruning.

Robust and sparse at once. Each method fine-tunes a pretrained encoder classifier (text-robustness's data,
tokenization and constraint settings, reused by import) with an objective (ERM, hard constraints or their
resilient relaxation) and a primal optimizer (HORST, or AdamW as the baseline), optionally under AC/DC.
The trained model is then pruned one-shot by magnitude at every requested sparsity, with no fine-tuning
after pruning, and each pruned copy is evaluated for accuracy against the embedding-noise level γ.

Evaluation is over the whole test split under any launcher: each rank evaluates its share of the batches
and the counts are all-reduced (:mod:`descentlab.distributed`), so a ``torchrun`` run reports the same
numbers as one process.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from descentlab.data.text_batches import TextDataConfig as TextData
from descentlab.data.text_batches import encode, eval_batches
from descentlab.distributed import is_main_process, sharded_curve, sharded_layer_profile
from descentlab.errors import ConfigError
from descentlab.experiments.base import seed_everything
from descentlab.experiments.robust_sparse_results import (
    accuracy_figure,
    accuracy_tables,
    method_block,
    summary_notes,
)
from descentlab.experiments.text_robustness import ConstraintSettings, Evaluation, build_constraint
from descentlab.robustness import RobustnessCurves
from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import ERM, Constrained
from descentlab.train.rundir import RunDir

OBJECTIVES = ("erm", "constrained", "resilient")
OPTIMIZERS = ("horst", "adamw")
SCOPES = ("layer", "global")


@dataclass
class HorstSettings:
    alpha: float = 1.0  # strength of the mirror (L1) step
    beta: float = 0.0  # extra multiplicative decay


@dataclass
class Pruning:
    sparsities: list[float] = field(default_factory=lambda: [0.0, 0.3, 0.5, 0.7])
    scope: str = "layer"  # one threshold per matrix ("layer") or one over all block Linears ("global")
    acdc: bool = False  # train under AC/DC at acdc_sparsity (global magnitude), then prune one-shot further
    acdc_sparsity: float = 0.5
    acdc_reset_moments: bool = False


@dataclass
class RobustSparseConfig:
    model: str = "minilm"  # offline MiniLM-L6; or any HF encoder classifier id / local dir
    # "<objective>-<optimizer>", objective in erm|constrained|resilient, optimizer in horst|adamw
    methods: list[str] = field(
        default_factory=lambda: ["erm-horst", "constrained-horst", "erm-adamw", "constrained-adamw"]
    )
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    lr: float = 5e-5
    weight_decay: float = 0.01
    horst: HorstSettings = field(default_factory=HorstSettings)
    data: TextData = field(default_factory=TextData)
    constraint: ConstraintSettings = field(default_factory=ConstraintSettings)
    pruning: Pruning = field(default_factory=Pruning)
    evaluation: Evaluation = field(
        default_factory=lambda: Evaluation(kinds=["gaussian"], gammas=[0.0, 0.5, 1.0, 2.0, 3.0], draws=2)
    )
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=2, batch_size=32, log_every=10))

    def __post_init__(self) -> None:
        if not self.methods:
            raise ConfigError("methods must list at least one '<objective>-<optimizer>' pair")
        for method in self.methods:
            split_method(method)
        if not self.seeds:
            raise ConfigError("seeds must list at least one training seed")
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        p = self.pruning
        if not p.sparsities or any(not 0.0 <= s < 1.0 for s in p.sparsities):
            raise ConfigError(f"pruning.sparsities must be values in [0, 1), got {p.sparsities}")
        if p.scope not in SCOPES:
            raise ConfigError(f"pruning.scope must be one of {SCOPES}, got {p.scope!r}")
        if p.acdc and not 0.0 < p.acdc_sparsity < 1.0:
            raise ConfigError(f"pruning.acdc_sparsity must lie in (0, 1), got {p.acdc_sparsity}")
        if 0.0 not in self.evaluation.gammas:
            raise ConfigError("evaluation.gammas must contain 0 (the clean point)")


CONFIG = RobustSparseConfig

PRESETS = {
    "quick": {
        "methods": ["erm-horst", "constrained-horst"],
        "seeds": [0],
        "lr": 1e-4,
        "data.n_train": 600,
        "data.n_eval": 200,
        "train.epochs": 1,
        "evaluation.gammas": [0.0, 1.0, 2.0, 3.0],
        "evaluation.draws": 1,
        "pruning.sparsities": [0.0, 0.5, 0.7],
    },
    "full": {
        "seeds": [0, 1, 2],
        "data.n_train": 2000,
        "data.n_eval": 600,
        "train.epochs": 2,
        "pruning.sparsities": [0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8],
    },
}


def split_method(method: str) -> tuple[str, str]:
    """``"constrained-horst"`` -> ("constrained", "horst"), validated."""
    objective, _, optimizer = method.partition("-")
    if objective not in OBJECTIVES or optimizer not in OPTIMIZERS:
        raise ConfigError(
            f"method {method!r} must be '<objective>-<optimizer>' with objective in {OBJECTIVES} and "
            f"optimizer in {OPTIMIZERS}, e.g. 'constrained-horst'"
        )
    return objective, optimizer


def make_optimizer(cfg: RobustSparseConfig, name: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    """HORST (mirror step on tensors with ndim >= 2) or AdamW, with the same lr and weight decay."""
    if name == "horst":
        from descentlab.optim.horst import HORST

        return HORST(
            model.parameters(),
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            alpha=cfg.horst.alpha,
            beta=cfg.horst.beta,
        )
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def total_steps(train: TrainConfig, n_train: int) -> int:
    """Optimizer steps ``fit`` will take: ``max_steps`` or ``epochs`` passes over ``n_train`` examples."""
    return train.max_steps if train.max_steps is not None else train.epochs * -(-n_train // train.batch_size)


def train_model(
    cfg: RobustSparseConfig,
    method: str,
    seed: int,
    train_set: list,
    collate: Any,
    num_labels: int,
    run: RunDir,
) -> tuple[torch.nn.Module, Any]:
    """A fresh pretrained encoder + head (seeded), trained by ``method`` (and AC/DC when enabled)."""
    from descentlab.constrained.primal_dual import PrimalDual
    from descentlab.data import load_encoder_classifier
    from descentlab.sparsity.acdc import ACDC

    objective_name, optimizer_name = split_method(method)
    seed_everything(seed)
    model, _ = load_encoder_classifier(cfg.model, num_labels=num_labels)
    optimizer = make_optimizer(cfg, optimizer_name, model)
    constraint, objective = None, ERM()
    if objective_name != "erm":
        layers = model.config.num_hidden_layers
        constraint = build_constraint(cfg.constraint, layers, resilient=objective_name == "resilient")
        optimizer = PrimalDual(optimizer, constraint)
        objective = Constrained(constraint)
    acdc = None
    if cfg.pruning.acdc:
        acdc = ACDC(
            model,
            optimizer,
            sparsity=cfg.pruning.acdc_sparsity,
            total_steps=total_steps(cfg.train, len(train_set)),
            reset_moments=cfg.pruning.acdc_reset_moments,
        )
    fit(
        model,
        train_set,
        objective=objective,
        optimizer=optimizer,
        cfg=replace(cfg.train, seed=seed),
        collate_fn=collate,
        sparsity=acdc,
        run=run,
        tag=f"{method}-seed{seed}",
    )
    return model.eval(), constraint


@dataclass
class SweepPoint:
    """One pruned copy of a trained model: requested and reached sparsity, its curves and layer profile."""

    requested: float
    reached: float
    curve: RobustnessCurves
    profile: list[float]


def sparsity_sweep(
    cfg: RobustSparseConfig, model: torch.nn.Module, batches: list, seed: int
) -> list[SweepPoint]:
    """Prune the trained weights one-shot at every sparsity (each from the trained weights) and evaluate.

    The model is left with its trained weights restored.
    """
    from descentlab.sparsity import prune_magnitude, select_prunable, sparsity_report

    ev = cfg.evaluation
    tensors = select_prunable(model)
    trained = [t.param.detach().clone() for t in tensors]
    points = []
    try:
        for s in cfg.pruning.sparsities:
            with torch.no_grad():
                for t, w in zip(tensors, trained, strict=True):
                    t.param.copy_(w)
            report = prune_magnitude(model, s, scope=cfg.pruning.scope) if s > 0 else sparsity_report(model)
            curve = sharded_curve(
                model,
                batches,
                kinds=list(ev.kinds),
                gammas=list(ev.gammas),
                draws=ev.draws,
                seed=ev.noise_seed,
                model_seeds=[seed],
            )
            points.append(SweepPoint(s, report.global_sparsity, curve, sharded_layer_profile(model, batches)))
    finally:
        with torch.no_grad():
            for t, w in zip(tensors, trained, strict=True):
                t.param.copy_(w)
    return points


def run(cfg: RobustSparseConfig, run: RunDir) -> dict:
    from transformers import DataCollatorWithPadding

    from descentlab.data import load_encoder_classifier, load_text_classification

    d, ev, p = cfg.data, cfg.evaluation, cfg.pruning
    splits = load_text_classification(
        d.name, seed=d.split_seed, max_train=d.n_train, max_eval=d.n_eval, text_fields=d.text_fields
    )
    num_labels = int(max(splits["train"]["label"])) + 1
    _, tokenizer = load_encoder_classifier(cfg.model, num_labels=num_labels)
    collate = DataCollatorWithPadding(tokenizer, return_tensors="pt")
    train_set = encode(splits["train"], tokenizer, d.max_length)
    test = eval_batches(encode(splits["test"], tokenizer, d.max_length), collate, d.eval_batch_size)

    # 1. train every method for every seed; prune each trained model at every sparsity and evaluate
    sweeps: dict[str, list[list[SweepPoint]]] = {m: [] for m in cfg.methods}
    multipliers: dict[str, list[list[float]]] = {m: [] for m in cfg.methods}
    for seed in cfg.seeds:
        for method in cfg.methods:
            model, constraint = train_model(cfg, method, seed, train_set, collate, num_labels, run)
            sweeps[method].append(sparsity_sweep(cfg, model, test, seed))
            if constraint is not None:
                multipliers[method].append(constraint.multipliers.tolist())
            for point in sweeps[method][-1]:
                run.log(
                    tag=f"eval-{method}-seed{seed}",
                    sparsity=point.reached,
                    clean_accuracy=point.curve.curves()[ev.kinds[0]]["mean"][0],
                )
            del model

    # 2. results in the DESIGN shape, tables (constrained minus ERM paired per optimizer), figure
    levels, kind = list(p.sparsities), ev.kinds[0]
    methods_out = {
        m: method_block(sweeps[m], levels, ev.kinds, ev.gammas, multipliers[m]) for m in cfg.methods
    }
    pairs = []
    for method in cfg.methods:
        objective, optimizer = split_method(method)
        if objective != "erm" and f"erm-{optimizer}" in sweeps:
            pairs.append((method, f"erm-{optimizer}"))
    tables = accuracy_tables(methods_out, sweeps, pairs, levels, kind, ev.gammas)
    figures = []
    if is_main_process():
        accuracy_figure(run.figure("accuracy_vs_gamma_by_sparsity"), methods_out, kind, levels)
        figures.append(
            {
                "path": "figures/accuracy_vs_gamma_by_sparsity.png",
                "caption": f"Test accuracy against γ ({kind}), one line per one-shot sparsity; band = ± std",
            }
        )

    protocol = {
        "dataset": d.name,
        "model": cfg.model,
        "split": "test",
        "n_train": len(train_set),
        "n_eval": int(sweeps[cfg.methods[0]][0][0].curve.protocol["n_eval"]),
        "seeds": list(cfg.seeds),
        "draws": ev.draws,
        "kinds": list(ev.kinds),
        "gammas": list(ev.gammas),
        "noise": "on the input-embedding output, variance (γ σ_E)² per coordinate, σ_E = RMS of the embedding "
        "matrix; content-keyed, identical across methods and sparsities",
        "noise_seed": ev.noise_seed,
        "budget": f"{cfg.train.epochs} epoch(s) (max_steps={cfg.train.max_steps}), batch {cfg.train.batch_size}, "
        f"lr {cfg.lr}, weight decay {cfg.weight_decay}, max_length {d.max_length}",
        "horst": asdict(cfg.horst),
        "constraint": asdict(cfg.constraint),
        "constraint_selection": "fixed settings (no validation search here; text-robustness selects them)",
        "pruning": f"one-shot magnitude pruning, scope={p.scope}, of the Linear weights inside the encoder blocks "
        "(embeddings, pooler and head stay dense), each level from the trained weights, no fine-tuning after",
        "acdc": asdict(p) if p.acdc else None,
        "evaluation": "whole test split; under torchrun each rank evaluates a share and counts are all-reduced",
    }
    notes = summary_notes(methods_out, levels, kind)
    return {
        "protocol": protocol,
        "methods": methods_out,
        "tables": tables,
        "figures": figures,
        "notes": notes,
    }
