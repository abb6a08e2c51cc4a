"""robust-sparse's jobs: train one (method, seed), prune its weights one-shot at every sparsity, evaluate each
pruned copy; and the JSON form in which a finished job is cached (``run/jobs``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from descentlab.data.text_batches import Prepared
from descentlab.distributed import sharded_curve, sharded_layer_profile
from descentlab.evaluation import RobustnessCurves
from descentlab.experiments.robust_sparse.config import RobustSparseConfig
from descentlab.train.loop import fit, seed_everything
from descentlab.train.objectives import EmbeddingNoise
from descentlab.train.recipe import build_recipe
from descentlab.train.rundir import RunDir


@dataclass
class SweepPoint:
    """One pruned copy of a trained model: requested and reached sparsity, its curves (with per-example
    correctness ``[1, draw, γ, example]``) and its clean per-layer loss profile."""

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
                keep_examples=True,
            )
            profile = sharded_layer_profile(model, batches)
            points.append(SweepPoint(s, float(report.global_sparsity), curve, profile))
    finally:
        restore()
    return points


def train_job(cfg: RobustSparseConfig, label: str, seed: int, data: Prepared, run: RunDir) -> JobResult:
    """One job: a fresh pretrained encoder + head (seeded), trained by method ``label`` (on Gaussian embedding
    noise if ``label`` is in ``cfg.train_noise``), then swept."""
    from descentlab.data import load_encoder_classifier

    method = cfg.method_configs()[label]
    seed_everything(seed)
    model, _ = load_encoder_classifier(cfg.model, num_labels=data.num_labels, pooling=cfg.pooling)
    recipe = build_recipe(method, model, total_steps=cfg.train.total_steps(len(data.train)))
    kwargs = recipe.fit_kwargs()
    if label in cfg.train_noise:
        kwargs["objective"] = EmbeddingNoise(recipe.objective, cfg.train_noise[label], seed=seed)
    fit(
        model,
        data.train,
        cfg=replace(cfg.train, seed=seed, progress=cfg.train.progress and cfg.workers == 1),
        collate_fn=data.collate,
        run=run,
        tag=f"{label}-seed{seed}",
        **kwargs,
    )
    points = sparsity_sweep(cfg, model.eval(), data.test, seed)
    for point in points:
        clean = point.curve.curves()[cfg.evaluation.kinds[0]]["mean"][0]
        run.log(tag=f"eval-{label}-seed{seed}", sparsity=point.reached, clean_accuracy=clean)
    multipliers = recipe.constraint.multipliers.tolist() if recipe.constraint is not None else None
    return JobResult(points, multipliers)
