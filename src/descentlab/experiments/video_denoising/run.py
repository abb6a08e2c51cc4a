"""video-denoising: UT and DUST trained with ERM, layer-wise descent constraints and controls, against classical
denoisers, every setting chosen on a validation split.

Claims under test (METHODS §1.6), trained at noise σ_train and tested at γ·σ_train: the constrained unrolled
model (1) has lower RMSE than ERM at γ > 1, (2) degrades more gracefully (RMSE(γ)/RMSE(1) grows more slowly),
(3) keeps its in-distribution RMSE, and (4) has a monotone per-layer MSE; each gets a paired 95 % CI over
test sequences and seeds and a verdict (``report.video_claims``).

Protocol: grayscale clips (opencv's vtest.avi by default) cut into T-frame crop × crop sequences; train,
validation and test are disjoint time ranges of each clip. Per (architecture, method) a grid (``grid``, else
lr × ``constraint_grid``) trains with the first seed; the candidate of lowest validation RMSE at γ = 1 trains
with the others. Controls: ``blind`` (ERM on a γ range: the positive control), ``frozen`` (a constrained
run's final multipliers held fixed) and ``budget_check`` (ERM retrained for longer: has it converged?).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import Future
from dataclasses import asdict, replace
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from descentlab.config import config_to_dict
from descentlab.data.video import NoisyClips, noisy_val_clips
from descentlab.data.video import noisy_test_clips as noisy_levels
from descentlab.data.video_data import load_denoising_data
from descentlab.errors import NumericalError
from descentlab.experiments._video_config import (
    ARCHITECTURES,
    CONFIG,
    FROZEN,
    PRESETS,
    SPECS,
    VideoDenoisingConfig,
)
from descentlab.io import load_arrays
from descentlab.models.denoisers import build_denoiser, final_mse
from descentlab.report.results import Results
from descentlab.report.video_budget import budget_curve, budget_tables
from descentlab.report.video_claims import NOTES, load_job_arrays, summarise
from descentlab.report.video_denoising import SAMPLE_FRAMES
from descentlab.robustness.video import ValidationCurve, denoise_frames, evaluate_denoiser
from descentlab.robustness.video_baselines import run_baselines
from descentlab.train.jobs import JobRunner
from descentlab.train.loop import fit, seed_everything
from descentlab.train.recipe import build_frozen_recipe, build_recipe, with_overrides
from descentlab.train.rundir import RunDir
from descentlab.train.tuning import tune_and_replicate

__all__ = [
    "ARCHITECTURES",
    "CONFIG",
    "FROZEN",
    "PRESETS",
    "SPECS",
    "VideoDenoisingConfig",
    "build_model",
    "final_mse",
    "noisy_test_clips",
    "run",
]


def _at(label: str, steps: int) -> str:
    """The job label of ``label`` retrained for ``steps`` (the budget curve)."""
    return f"{label}-steps{steps}"


def _key(arch: str, label: str, candidate: int | None, seed: int) -> str:
    return f"{arch}-{label}" + ("" if candidate is None else f"@{candidate}") + f"-seed{seed}"


def build_model(arch: str, cfg: VideoDenoisingConfig) -> nn.Module:
    return build_denoiser(arch, image_size=cfg.data.crop, num_frames=cfg.data.num_frames, **asdict(cfg.model))


def noisy_test_clips(test: Tensor, cfg: VideoDenoisingConfig, seed: int) -> list[Tensor]:
    """The noisy test clips of ``seed`` at each γ of ``cfg.gammas`` (the same for every method)."""
    return noisy_levels(test, gammas=cfg.gammas, sigma=cfg.data.sigma_train, seed=seed)


def train_and_evaluate(
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
    uniformly from its γ range times σ_train. ``steps`` replaces the budget (the budget check).
    """
    seed_everything(seed)  # the same initialisation for every method of an architecture
    model = build_model(arch, cfg)
    sigma = cfg.data.sigma_train
    lo, hi = cfg.blind.get(label, (1.0, None))  # a blind label: σ ~ U(lo, hi)·σ_train per example
    train = NoisyClips(data["train"], lo * sigma, sigma_max=None if hi is None else hi * sigma)
    train_cfg = replace(cfg.train, seed=seed)
    if steps is not None:
        train_cfg = replace(train_cfg, max_steps=steps)
    method = with_overrides(cfg.method_config(arch, label), spec)
    total = train_cfg.total_steps(len(train))
    build = build_recipe if lam is None else partial(build_frozen_recipe, lam=lam)
    recipe = build(method, model, total_steps=total, loss_fn=final_mse)
    val_noisy = noisy_val_clips(data["val"], sigma=sigma)
    curve = ValidationCurve(
        model, data["val"], val_noisy, every=cfg.val_every, total=total, batch_size=cfg.eval_batch_size
    )
    start = time.perf_counter()
    try:
        fit(model, train, cfg=train_cfg, run=run, tag=key, callbacks=[curve], **recipe.fit_kwargs())
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
    run.log(tag=key, eval_rmse=ev["rmse"], gammas=cfg.gammas, val_rmse=ev["val_rmse"])
    if seed == cfg.seeds[0]:
        frames = torch.stack([denoise_frames(model, y, cfg.data.crop) for y in data["sample_noisy"]])
        run.save_arrays(f"jobs/{key}-frames.npz", denoised=frames)
    return ev


def baselines_job(cfg: VideoDenoisingConfig, data: dict, run: RunDir, key: str = "baselines") -> dict:
    """Every classical baseline, chosen on validation at σ_train and tested on each seed's test noise (the
    learned models' of that seed); saves ``jobs/<key>-<name>.npz`` (``example_mse``, ``denoised``)."""
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
        run.save_arrays(f"jobs/{key}-{name}.npz", **arr)
    return results


def job(kind: str, *args: Any) -> dict:
    """The one top-level job function of the :class:`~descentlab.train.jobs.JobRunner` (both kinds)."""
    return {"train": train_and_evaluate, "baselines": baselines_job}[kind](*args)


def run(cfg: VideoDenoisingConfig, run: RunDir) -> dict:
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    sample_gammas = sorted({1.0, max(cfg.gammas)})
    data, sample_clean, data_protocol = load_denoising_data(**asdict(cfg.data), sample_gammas=sample_gammas)

    seed0, archs = cfg.seeds[0], cfg.architectures
    frozen = [label for label in cfg.labels if label in cfg.frozen]
    with JobRunner(
        job, workers=cfg.workers, cache_dir=run.path / "jobs", threads=max(cfg.torch_threads, 1)
    ) as runner:
        baselines = runner.submit("baselines", "baselines", cfg, data, run) if cfg.baselines else None

        def train(a: str, lab: str, i: int | None, spec: str, s: int, lam=None, fl="", steps=None) -> Future:
            k = _key(a, fl or lab, i, s)
            return runner.submit(k, "train", cfg, a, lab, spec, s, data, run, k, lam, steps)

        frozen_jobs, budget_jobs, curve_jobs = {}, {}, {}
        base_steps = cfg.train.total_steps(len(data["train"]))
        long_steps = round(cfg.budget_check * base_steps)

        def then(group: tuple[str, str], i: int, per_seed: list[dict]) -> None:  # jobs needing a choice
            a, lab = group
            if failed := [ev["failed"] for ev in per_seed if "failed" in ev]:
                raise NumericalError(f"{a}-{lab}: the candidate chosen on validation failed: {failed[0]}")
            if lab == "erm" and cfg.budget_check:
                fl = f"erm-budget{cfg.budget_check:g}x"
                budget_jobs[a] = train(a, lab, None, cfg.candidates(lab)[i], seed0, fl=fl, steps=long_steps)
            for n in cfg.budget_curve if lab in cfg.budget_labels else ():
                curve_jobs[a, lab, n] = train(
                    a, lab, None, cfg.candidates(lab)[i], seed0, fl=_at(lab, n), steps=n
                )
            for fl in (f for f in frozen if cfg.frozen[f] == lab):
                for s, ev in zip(cfg.seeds, per_seed, strict=True):
                    frozen_jobs[a, fl, s] = train(a, lab, None, cfg.candidates(lab)[i], s, ev["lambda"], fl)

        grid, chosen, evs = tune_and_replicate(
            {(a, lab): cfg.candidates(lab) for a in archs for lab in cfg.trained_labels},
            cfg.seeds,
            submit=lambda g, i, spec, s: train(*g, i, spec, s),
            score=lambda ev: (math.isnan(ev["val_rmse"]), ev["val_rmse"]),  # failed (NaN) ranks last
            then=then,
        )
        for a in archs:
            for lab in frozen:
                evs[a, lab] = [frozen_jobs[a, lab, s].result() for s in cfg.seeds]
        base = baselines.result() if baselines is not None else {}
        budget = {
            a: {"steps": long_steps, "base_steps": base_steps, **f.result()} for a, f in budget_jobs.items()
        }
        # the base budget's point is the first seed's run of the grid; a diverged long run is left out
        curve_evs = {(a, lab, base_steps): evs[a, lab][0] for a, lab, _ in curve_jobs}
        long_evs = {k: ev for k, f in curve_jobs.items() if "failed" not in (ev := f.result())}

    order = [(a, lab) for a in archs for lab in cfg.labels]
    cand = {(a, lab): None if lab in cfg.frozen else chosen[a, lab] for a, lab in order}
    keys = {f"{a}-{lab}": [_key(a, lab, cand[a, lab], s) for s in cfg.seeds] for a, lab in order}
    errors, base_errors, denoised = load_job_arrays(run.path / "jobs", keys, list(base))
    run.save_arrays(
        SAMPLE_FRAMES,
        clean=sample_clean,
        noisy=data["sample_noisy"],
        gammas=np.asarray(sample_gammas),
        seed=np.asarray(seed0),
        methods=np.asarray([*keys, *base]),
        denoised=denoised,
    )
    body = summarise(
        per_seed={f"{a}-{lab}": evs[a, lab] for a, lab in order},
        grids={f"{a}-{lab}": (cfg.candidates(lab), chosen[a, lab], grid[a, lab]) for a, lab in grid},
        errors=errors,
        baselines=base,
        baseline_errors=base_errors,
        gammas=list(cfg.gammas),
        margin=cfg.id_margin,
        n_boot=cfg.n_boot,
        budget=budget,
    )
    if curve_jobs:
        curve_err = {(a, lab, n): errors[f"{a}-{lab}"][:1] for a, lab, n in curve_evs}
        for a, lab, n in long_evs:
            path = run.path / "jobs" / f"{_key(a, _at(lab, n), None, seed0)}-errors.npz"
            curve_err[a, lab, n] = load_arrays(path)["example_mse"][None]
        body["budget_curve"] = budget_curve(
            {**curve_evs, **long_evs}, curve_err, cfg.gammas, margin=cfg.id_margin, n_boot=cfg.n_boot
        )
        body["tables"] += budget_tables(body["budget_curve"], cfg.gammas)
    results = Results(
        experiment="video-denoising",
        config=config_to_dict(cfg),
        protocol={
            **data_protocol,
            "gammas": list(cfg.gammas),
            "seeds": list(cfg.seeds),
            "draws": 1,
            "steps": cfg.train.total_steps(len(data["train"])),
            "batch_size": cfg.train.batch_size,
            "selection": "per (architecture, method): the candidate of lowest final validation RMSE, seed 0",
            "noise": "additive Gaussian on pixels in [0, 1], test level gamma * sigma_train",
            **{k: {m: v for m, v in getattr(cfg, k).items() if m in cfg.labels} for k in ("blind", "frozen")},
        },
        methods=body["methods"],
        tables=body["tables"],
        notes=NOTES,
        extra={
            k: body[k]
            for k in ("claims", "baselines", "selection", "versus_baselines", "budget_check", "budget_curve")
            if k in body
        },
    )
    return results.to_dict()
