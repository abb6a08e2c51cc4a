"""The jobs of the video-denoising study, each run inline or in a one-thread worker (``study.jobs``): train
one (architecture, method, candidate, seed) and evaluate it on validation and test, or run every classical
baseline. Each job saves its per-sequence test errors under ``jobs/`` in the run directory. :class:`Outcome`
is what the run gathers from them."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from descentlab.constrained.trace import LambdaTrace
from descentlab.data.video import NoisyClips, noisy_val_clips
from descentlab.data.video import noisy_test_clips as noisy_levels
from descentlab.errors import NumericalError
from descentlab.evaluation.video import ValidationCurve, denoise_frames, evaluate_denoiser
from descentlab.evaluation.video_baselines import run_baselines
from descentlab.experiments.video_denoising.config import VideoDenoisingConfig
from descentlab.models.denoisers import build_denoiser, final_mse
from descentlab.study.tuning import Tuned
from descentlab.train.loop import fit, seed_everything
from descentlab.train.recipe import build_frozen_recipe, build_recipe, with_overrides
from descentlab.train.rundir import RunDir


def at_steps(label: str, steps: int) -> str:
    """The job label of ``label`` retrained for ``steps`` (the budget curve)."""
    return f"{label}-steps{steps}"


def job_key(arch: str, label: str, candidate: int | None, seed: int) -> str:
    return f"{arch}-{label}" + ("" if candidate is None else f"@{candidate}") + f"-seed{seed}"


def build_model(arch: str, cfg: VideoDenoisingConfig) -> nn.Module:
    return build_denoiser(arch, image_size=cfg.data.crop, num_frames=cfg.data.num_frames, **asdict(cfg.model))


def noisy_test_clips(test: Tensor, cfg: VideoDenoisingConfig, seed: int) -> list[Tensor]:
    """The noisy test clips of ``seed`` at each γ of ``cfg.gammas`` (the same for every method)."""
    return noisy_levels(test, gammas=cfg.gammas, sigma=cfg.data.sigma_train, seed=seed)


def train_job(
    cfg: VideoDenoisingConfig,
    arch: str,
    label: str,
    spec: str,
    seed: int,
    data: dict[str, Tensor],
    run: RunDir,
    key: str,
    lam: list[float] | None = None,
    steps: int | None = None,
) -> dict:
    """Train ``arch`` with method ``label`` edited by ``spec`` from ``seed``; validate while training; test.

    The validation curve is the RMSE at γ = 1 on the validation clips every ``cfg.val_every`` steps; its final
    point is what the grid search compares. ``lam`` (the frozen-λ control): the constraint's multipliers
    start at ``lam`` and never take a dual step. A label of ``cfg.blind`` trains on noise levels drawn
    uniformly from its γ range times σ_train. ``steps`` replaces the budget (the budget check and curve).
    A constrained method also returns ``lambda_trace`` (λ at step 1 and every ``cfg.val_every`` steps).
    Saves ``jobs/<key>-errors.npz`` (``example_mse [G, L+1, N]``: every test sequence's MSE at every γ and
    layer) and, for the first seed, ``jobs/<key>-frames.npz`` (the denoised sample frames).
    """
    seed_everything(seed)  # the same initialisation for every method of an architecture
    model = build_model(arch, cfg)
    sigma = cfg.data.sigma_train
    lo, hi = cfg.blind.get(label, (1.0, None))  # a blind label: σ ~ U(lo, hi)·σ_train per example
    train = NoisyClips(data["train"], lo * sigma, sigma_max=None if hi is None else hi * sigma)
    train_cfg = replace(cfg.train, seed=seed, max_steps=cfg.train.max_steps if steps is None else steps)
    method = with_overrides(cfg.method_config(arch, label), spec)
    total = train_cfg.total_steps(len(train))
    build = build_recipe if lam is None else partial(build_frozen_recipe, lam=lam)
    recipe = build(method, model, total_steps=total, loss_fn=final_mse)
    val_noisy = noisy_val_clips(data["val"], sigma=sigma)
    curve = ValidationCurve(
        model, data["val"], val_noisy, every=cfg.val_every, total=total, batch_size=cfg.eval_batch_size
    )
    callbacks: list = [curve]
    if recipe.constraint is not None:  # λ_l(t) at the validation points: does each constraint bind, and when
        trace = LambdaTrace(recipe.constraint, every=cfg.val_every, last=total)
        callbacks.append(trace)
    start = time.perf_counter()
    try:
        fit(model, train, cfg=train_cfg, run=run, tag=key, callbacks=callbacks, **recipe.fit_kwargs())
    except NumericalError as e:  # a diverged or infeasible candidate ranks last in its grid (see `run`)
        run.log(tag=key, failed=str(e))
        return {"failed": str(e), "spec": spec, "val_rmse": math.nan}
    train_seconds = time.perf_counter() - start
    test_noisy = noisy_test_clips(data["test"], cfg, seed)
    ev = evaluate_denoiser(model, data["test"], test_noisy, batch_size=cfg.eval_batch_size, per_example=True)
    run.save_arrays(f"jobs/{key}-errors.npz", example_mse=ev.pop("example_mse").numpy())
    ev.update(
        train_seconds=train_seconds, val_curve=curve.points, val_rmse=curve.points["rmse"][-1], spec=spec
    )
    if recipe.constraint is not None:
        ev["lambda"] = recipe.constraint.duals.lam.tolist()
        ev["lambda_trace"] = {"steps": trace.steps, "lambda": trace.lam}
    run.log(tag=key, eval_rmse=ev["rmse"], gammas=cfg.gammas, val_rmse=ev["val_rmse"])
    if seed == cfg.seeds[0]:
        frames = torch.stack([denoise_frames(model, y, cfg.data.crop) for y in data["sample_noisy"]])
        run.save_arrays(f"jobs/{key}-frames.npz", denoised=frames)
    return ev


def baselines_job(cfg: VideoDenoisingConfig, data: dict, run: RunDir) -> dict:
    """Every classical baseline, chosen on validation at σ_train and tested on each seed's test noise (the
    learned models' of that seed); saves ``jobs/baselines-<name>.npz`` (``example_mse``, ``denoised``)."""
    sigma = cfg.data.sigma_train
    results, arrays = run_baselines(
        cfg.baselines,
        val_clean=data["val"],
        val_noisy=noisy_val_clips(data["val"], sigma=sigma),
        test_clean=data["test"],
        test_noisy=[noisy_test_clips(data["test"], cfg, seed) for seed in cfg.seeds],
        sample_noisy=data["sample_noisy"],
        sigma=sigma,
        tile=cfg.data.crop,
        grids=cfg.baseline_grid,
    )
    for name, arr in arrays.items():
        run.save_arrays(f"jobs/baselines-{name}.npz", **arr)
    return results


def job(kind: str, *args: Any) -> dict:
    """The one top-level job function of the :class:`~descentlab.study.jobs.JobRunner` (both kinds)."""
    return {"train": train_job, "baselines": baselines_job}[kind](*args)


BudgetKey = tuple[str, str, int]  # a point of the budget curve: (architecture, label, steps)


@dataclass
class Outcome:
    """What the run gathered from its jobs: the input of :func:`.report.summarise`.

    Attributes:
        tuned: the tuning planner's record: every tuned arm's grid results on the tuning seed and its pick.
        per_seed: arm -> its evaluation runs, one per seed (the frozen controls' included), in report order.
        baselines: the classical baselines' job result ({} when none ran).
        budget: architecture -> ERM's budget-check run, with its ``steps`` and ``base_steps``.
        curve: every point of the budget curve -> its run (first evaluation seed).
        jobs: every arm and budget-curve point (:func:`.config.budget_name`) -> the keys of the jobs that
            saved its errors, one per seed.
    """

    tuned: Tuned
    per_seed: dict[str, list[dict]]
    baselines: dict[str, Any]
    budget: dict[str, dict]
    curve: dict[BudgetKey, dict]
    jobs: dict[str, list[str]]
