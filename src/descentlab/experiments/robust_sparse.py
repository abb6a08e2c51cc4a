"""robust-sparse: layer-wise descent constraints with HORST as the primal optimizer, then magnitude pruning.

Robust and sparse at once. Each method fine-tunes a pretrained encoder classifier with an objective (ERM,
hard constraints or their resilient relaxation) and a primal optimizer (HORST, or AdamW as the baseline),
optionally under AC/DC. The trained model is then pruned one-shot by magnitude at every requested sparsity
s, each time from the trained weights and with no fine-tuning after pruning, and every pruned copy is
evaluated for accuracy against the embedding-noise level γ (noise of variance (γ σ_E)² on the embedding
output, keyed to content, so every method and sparsity sees the same noisy inputs).

Methods are :class:`~descentlab.train.recipe.MethodConfig` s: one base (``method``) edited by each label's
override spec in ``specs``; ``methods`` lists the labels to run.

Evaluation is over the whole test split under any launcher: each rank evaluates its share of the batches
and the counts are all-reduced (:mod:`descentlab.distributed`), so a ``torchrun`` run reports the same
numbers as one process.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from descentlab.constrained.config import DescentConfig
from descentlab.data.text_batches import Prepared, TextDataConfig, prepare_data
from descentlab.distributed import sharded_curve, sharded_layer_profile
from descentlab.errors import ConfigError
from descentlab.optim.config import OptimizerConfig
from descentlab.report.results import Curve, MethodResult
from descentlab.report.robust_sparse import accuracy_tables, summary_notes
from descentlab.report.stats import column_mean_std, mean_std
from descentlab.robustness import RobustnessCurves
from descentlab.robustness.config import NoiseEvalConfig
from descentlab.train.jobs import JobRunner
from descentlab.train.loop import TrainConfig, fit, seed_everything
from descentlab.train.recipe import MethodConfig, build_recipe, methods_from_specs
from descentlab.train.rundir import RunDir

SCOPES = ("layer", "global")

# AdamW has no mirror step: the base's HORST strengths are dropped, not silently ignored
_ADAMW = "optimizer.name=adamw optimizer.alpha=null optimizer.beta=null"
_CONSTRAINED = "objective=constrained"
_RESILIENT = "objective=constrained constraint.resilient=true"

# label -> override spec of the base ``method`` (dotted MethodConfig keys, see train/recipe.py)
METHOD_SPECS: dict[str, str] = {
    "erm-horst": "",
    "constrained-horst": _CONSTRAINED,
    "resilient-horst": _RESILIENT,
    "erm-adamw": _ADAMW,
    "constrained-adamw": f"{_CONSTRAINED} {_ADAMW}",
    "resilient-adamw": f"{_RESILIENT} {_ADAMW}",
}


def base_method() -> MethodConfig:
    """ERM with HORST (α = 1, β = 0) on every tensor's decay; the constraint a constrained spec switches on."""
    return MethodConfig(
        objective="erm",
        optimizer=OptimizerConfig(
            name="horst", lr=5e-5, weight_decay=0.01, alpha=1.0, beta=0.0, decay="all", mirror="matrices"
        ),
        # no divergence guard: the final multipliers are part of the results, however large they grow
        constraint=DescentConfig(max_multiplier=None),
    )


@dataclass
class PruningSweep:
    """One-shot magnitude pruning of the trained weights at each sparsity (each from the trained weights)."""

    sparsities: list[float] = field(default_factory=lambda: [0.0, 0.3, 0.5, 0.7])
    scope: str = "layer"  # one threshold per matrix ("layer") or one over all block Linears ("global")


@dataclass
class RobustSparseConfig:
    model: str = "minilm"  # offline MiniLM-L6; or any HF encoder classifier id / local dir
    method: MethodConfig = field(default_factory=base_method)
    specs: dict[str, str] = field(default_factory=lambda: dict(METHOD_SPECS))
    methods: list[str] = field(
        default_factory=lambda: ["erm-horst", "constrained-horst", "erm-adamw", "constrained-adamw"]
    )
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    data: TextDataConfig = field(default_factory=TextDataConfig)
    pruning: PruningSweep = field(default_factory=PruningSweep)
    evaluation: NoiseEvalConfig = field(
        default_factory=lambda: NoiseEvalConfig(kinds=["gaussian"], gammas=[0.0, 0.5, 1.0, 2.0, 3.0], draws=2)
    )
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=2, batch_size=32, log_every=10))
    workers: int = 1  # >1: run the (method, seed) jobs in that many 1-thread processes (same numbers)

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in self.specs]
        if not self.methods or unknown:
            raise ConfigError(
                f"methods must list labels of specs ({sorted(self.specs)}), got {self.methods}; define a new "
                "one with specs.NAME='objective=constrained optimizer.alpha=10' and add NAME to methods"
            )
        self.method_configs()  # a bad spec fails here, before a run directory exists
        if not self.seeds:
            raise ConfigError("seeds must list at least one training seed")
        p = self.pruning
        if not p.sparsities or any(not 0.0 <= s < 1.0 for s in p.sparsities):
            raise ConfigError(f"pruning.sparsities must be values in [0, 1), got {p.sparsities}")
        if p.scope not in SCOPES:
            raise ConfigError(f"pruning.scope must be one of {SCOPES}, got {p.scope!r}")
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")

    def method_configs(self) -> dict[str, MethodConfig]:
        """The methods to run, in order: ``{label: base method edited by specs[label]}``."""
        return methods_from_specs(self.method, {m: self.specs[m] for m in self.methods})


CONFIG = RobustSparseConfig

PRESETS = {
    "quick": {
        "methods": ["erm-horst", "constrained-horst"],
        "seeds": [0],
        "method.optimizer.lr": 1e-4,
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
        "workers": 2,  # 1-thread processes; the numbers do not depend on it
    },
}


@dataclass
class SweepPoint:
    """One pruned copy of a trained model: requested and reached sparsity, its curves and layer profile."""

    requested: float
    reached: float
    curve: RobustnessCurves
    profile: list[float]


@dataclass
class JobResult:
    """What one (method, seed) job hands back: its sweep, and the final λ of a constrained method."""

    points: list[SweepPoint]
    multipliers: list[float] | None


def encode_job(result: JobResult) -> dict[str, Any]:
    """JSON-able form for the job cache (float64 values survive the JSON round trip exactly)."""
    points = [
        {"requested": p.requested, "reached": p.reached, "curve": p.curve.to_dict(), "profile": p.profile}
        for p in result.points
    ]
    return {"points": points, "multipliers": result.multipliers}


def decode_job(data: dict[str, Any]) -> JobResult:
    points = [
        SweepPoint(p["requested"], p["reached"], RobustnessCurves.from_dict(p["curve"]), p["profile"])
        for p in data["points"]
    ]
    return JobResult(points, data["multipliers"])


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

    def restore() -> None:
        with torch.no_grad():
            for t, w in zip(tensors, trained, strict=True):
                t.param.copy_(w)

    points = []
    try:
        for s in cfg.pruning.sparsities:
            restore()
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
            profile = sharded_layer_profile(model, batches)
            points.append(SweepPoint(s, float(report.global_sparsity), curve, profile))
    finally:
        restore()
    return points


def train_and_sweep(cfg: RobustSparseConfig, label: str, seed: int, data: Prepared, run: RunDir) -> JobResult:
    """One job: a fresh pretrained encoder + head (seeded), trained by method ``label``, then swept."""
    from descentlab.data import load_encoder_classifier

    method = cfg.method_configs()[label]
    seed_everything(seed)
    model, _ = load_encoder_classifier(cfg.model, num_labels=data.num_labels)
    recipe = build_recipe(method, model, total_steps=cfg.train.total_steps(len(data.train)))
    fit(
        model,
        data.train,
        cfg=replace(cfg.train, seed=seed, progress=cfg.train.progress and cfg.workers == 1),
        collate_fn=data.collate,
        run=run,
        tag=f"{label}-seed{seed}",
        **recipe.fit_kwargs(),
    )
    points = sparsity_sweep(cfg, model.eval(), data.test, seed)
    for point in points:
        clean = point.curve.curves()[cfg.evaluation.kinds[0]]["mean"][0]
        run.log(tag=f"eval-{label}-seed{seed}", sparsity=point.reached, clean_accuracy=clean)
    multipliers = recipe.constraint.multipliers.tolist() if recipe.constraint is not None else None
    return JobResult(points, multipliers)


def method_result(
    per_seed: list[JobResult], levels: list[float], ev: NoiseEvalConfig
) -> tuple[MethodResult, list[RobustnessCurves]]:
    """One method's block (and its curves per level, seeds joined): a γ-curve per sparsity, and accuracy
    against the sparsity reached at γ = 0 and every γ >= 1.

    Metrics: clean accuracy and the mean over the γ grid at every level (``accuracy@s=0.5``,
    ``gaussian_mean_over_grid@s=0.5``); std is over (seed, draw) pairs (ddof 0, numpy, as the tables).
    """
    joined = [RobustnessCurves.concat([job.points[i].curve for job in per_seed]) for i in range(len(levels))]
    reached = [
        mean_std([job.points[i].reached for job in per_seed], ddof=0, impl="numpy")[0]
        for i in range(len(levels))
    ]
    result = MethodResult()
    for s, curve in zip(levels, joined, strict=True):
        for kind, block in curve.curves().items():
            result.curves[f"{kind}@s={s:g}"] = Curve.from_dict(block)
        clean = curve.values[ev.kinds[0]][:, 0, 0]  # [seeds]: every draw is the clean input at γ = 0
        result.metrics[f"accuracy@s={s:g}"] = mean_std(clean, ddof=0, impl="numpy")[0]
        for kind, over_grid in curve.summary().items():
            result.metrics[f"{kind}_mean_over_grid@s={s:g}"] = over_grid
    result.metrics["accuracy"] = result.metrics[f"accuracy@s={levels[0]:g}"]
    for kind in ev.kinds:
        for gamma in [0.0, *[g for g in ev.gammas if g >= 1.0]]:
            g = list(ev.gammas).index(gamma)
            stats = [mean_std(c.values[kind][..., g].reshape(-1), ddof=0, impl="numpy") for c in joined]
            result.curves[f"{kind}@gamma={gamma:g}_vs_sparsity"] = Curve(
                "sparsity", reached, "accuracy", [m for m, _ in stats], [sd for _, sd in stats]
            )
    result.layer_loss = {
        f"clean@s={s:g}": column_mean_std([job.points[i].profile for job in per_seed], impl="numpy")[0]
        for i, s in enumerate(levels)
    }
    result.sparsity = {
        "global": reached[-1],
        **{f"reached@s={s:g}": r for s, r in zip(levels, reached, strict=True)},
    }
    multipliers = [job.multipliers for job in per_seed if job.multipliers is not None]
    if multipliers:
        result.extra["multipliers"] = column_mean_std(multipliers, impl="numpy")[0]
    return result, joined


def erm_baselines(methods: dict[str, MethodConfig]) -> list[tuple[str, str]]:
    """``(method, baseline)`` pairs: each non-ERM method against the first ERM method that differs from it
    in the objective only (same optimizer, same AC/DC)."""
    pairs = []
    for label, m in methods.items():
        if m.objective == "erm":
            continue
        same = [
            b
            for b, e in methods.items()
            if e.objective == "erm" and (e.optimizer, e.acdc) == (m.optimizer, m.acdc)
        ]
        if same:
            pairs.append((label, same[0]))
    return pairs


def run(cfg: RobustSparseConfig, run: RunDir) -> dict:
    d, ev, p = cfg.data, cfg.evaluation, cfg.pruning
    data = prepare_data(d, cfg.model)
    methods = cfg.method_configs()

    # 1. every (method, seed): train, prune at every sparsity, evaluate; finished jobs come from run/jobs
    with JobRunner(
        train_and_sweep,
        workers=cfg.workers,
        cache_dir=run.path / "jobs",
        encode=encode_job,
        decode=decode_job,
    ) as jobs:
        futures = {
            (label, seed): jobs.submit(f"{label}-seed{seed}", cfg, label, seed, data, run)
            for seed in cfg.seeds
            for label in methods
        }
        done = {label: [futures[label, seed].result() for seed in cfg.seeds] for label in methods}

    # 2. results in the DESIGN shape; tables pair each constrained method with ERM on the same optimizer
    levels, kind = list(p.sparsities), ev.kinds[0]
    blocks = {label: method_result(done[label], levels, ev) for label in methods}
    methods_out = {label: result.to_dict() for label, (result, _) in blocks.items()}
    values = {label: [c.values[kind] for c in joined] for label, (_, joined) in blocks.items()}
    tables = accuracy_tables(methods_out, values, erm_baselines(methods), levels, kind, ev.gammas)
    train, opt = cfg.train, cfg.method.optimizer
    acdc = {label: asdict(m.acdc) for label, m in methods.items() if m.acdc is not None}
    protocol = {
        "dataset": d.name,
        "model": cfg.model,
        "split": "test",
        "n_train": len(data.train),
        "n_eval": int(done[cfg.methods[0]][0].points[0].curve.protocol["n_eval"]),
        "seeds": list(cfg.seeds),
        "draws": ev.draws,
        "kinds": list(ev.kinds),
        "gammas": list(ev.gammas),
        "noise": "on the input-embedding output, variance (γ σ_E)² per coordinate, σ_E = RMS of the embedding "
        "matrix; content-keyed, identical across methods and sparsities",
        "noise_seed": ev.noise_seed,
        "budget": f"{train.epochs} epoch(s) (max_steps={train.max_steps}), batch {train.batch_size}, "
        f"lr {opt.lr}, weight decay {opt.weight_decay}, max_length {d.max_length}",
        "methods": {label: cfg.specs[label] or "(the base method)" for label in methods},
        "optimizer": asdict(opt),
        "constraint": asdict(cfg.method.constraint),
        "constraint_selection": "fixed settings (no validation search here; text-robustness selects them)",
        "pruning": f"one-shot magnitude pruning, scope={p.scope}, of the Linear weights inside the encoder blocks "
        "(embeddings, pooler and head stay dense), each level from the trained weights, no fine-tuning after",
        "acdc": acdc or None,
        "evaluation": "whole test split; under torchrun each rank evaluates a share and counts are all-reduced",
    }
    return {
        "protocol": protocol,
        "methods": methods_out,
        "tables": tables,
        "notes": summary_notes(methods_out, levels, kind),
    }
