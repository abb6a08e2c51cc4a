"""The jobs of the video-denoising experiment: train one (architecture, method, setting, seed), and run the
classical baselines. Both are top-level functions (they run in spawned worker processes) and return JSON-able
dicts; their arrays (every test clip's MSE, sample frames) go to ``jobs/<key>-*.npz`` in the run directory.

A trained job also records its validation curve: the RMSE at γ = 1 on the validation clips every
``cfg.val_every`` steps; the final point is what the grid search compares.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from descentlab.data.video import NoisyClips, add_noise
from descentlab.models.dust import DUST
from descentlab.models.unrolled import UnrolledTransformer
from descentlab.robustness.video import denoise_frames, evaluate_denoiser
from descentlab.robustness.video_baselines import BASELINES, choose_on_validation, denoise_tiles
from descentlab.train.loop import fit, seed_everything
from descentlab.train.recipe import build_recipe, with_overrides
from descentlab.train.rundir import RunDir

# a dual step every this many optimizer steps: never, within any budget (the frozen-λ control)
NEVER = 10**12


def rank(val_rmse: float) -> tuple[bool, float]:
    """Sort key of a candidate: a diverged (NaN) validation RMSE ranks last."""
    return (math.isnan(val_rmse), val_rmse)


def job_key(arch: str, label: str, candidate: int | None, seed: int) -> str:
    return f"{arch}-{label}" + ("" if candidate is None else f"@{candidate}") + f"-seed{seed}"


def build_model(arch: str, cfg: Any) -> nn.Module:
    m, d = cfg.model, cfg.data
    shared = {
        "image_size": d.crop,
        "num_frames": d.num_frames,
        "patch_size": m.patch_size,
        "depth": m.depth,
        "width": m.width,
        "heads": m.heads,
    }
    if arch == "ut":
        return UnrolledTransformer(**shared, mlp_ratio=m.mlp_ratio)
    return DUST(**shared, num_atoms=m.num_atoms, causal=m.causal, threshold_init=m.threshold_init)


def final_mse(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """ERM's loss: the MSE of the final estimate."""
    return nn.functional.mse_loss(model(batch["noisy"]).final, batch["target"])


def noisy_test_clips(test: Tensor, cfg: Any, seed: int) -> list[Tensor]:
    """The noisy test clips at each γ: level i is drawn from a generator seeded by ``(seed, i)``."""
    return [
        add_noise(test, g * cfg.data.sigma_train, generator=torch.Generator().manual_seed(10_007 * seed + i))
        for i, g in enumerate(cfg.gammas)
    ]


def noisy_val_clips(val: Tensor, cfg: Any) -> Tensor:
    """The validation clips at σ_train, one fixed draw shared by every method and baseline."""
    return add_noise(val, cfg.data.sigma_train, generator=torch.Generator().manual_seed(4242))


def _val_rmse(model: nn.Module, clean: Tensor, noisy: Tensor, batch_size: int) -> float:
    rmse = evaluate_denoiser(model, clean, [noisy], batch_size=batch_size)["rmse"][0]
    model.train()
    return rmse


def train_and_evaluate(
    cfg: Any,
    arch: str,
    label: str,
    spec: str,
    seed: int,
    data: dict[str, Tensor],
    run: RunDir,
    key: str,
    lam: list[float] | None = None,
) -> dict:
    """Train ``arch`` with method ``label`` edited by ``spec`` from ``seed``; validate while training; test.

    ``lam`` (the frozen-λ control): the constraint's multipliers start at ``lam`` and never take a dual step.
    A label of ``cfg.blind`` trains on noise levels drawn uniformly from its γ range times σ_train.
    """
    seed_everything(seed)  # the same initialisation for every method of an architecture
    model = build_model(arch, cfg)
    sigma = cfg.data.sigma_train
    lo_hi = cfg.blind.get(label)
    train = (
        NoisyClips(data["train"], sigma)
        if lo_hi is None
        else NoisyClips(data["train"], lo_hi[0] * sigma, sigma_max=lo_hi[1] * sigma)
    )
    train_cfg = replace(cfg.train, seed=seed)
    method = with_overrides(cfg.method_config(arch, label), spec)
    if lam is not None:
        method = replace(method, constraint=replace(method.constraint, dual_every=NEVER))
    total = train_cfg.total_steps(len(train))
    recipe = build_recipe(method, model, total_steps=total, loss_fn=final_mse)
    if lam is not None:  # no dual step at all: dual_every=NEVER, and η_λ = 0 for the epoch-end flush too
        recipe.constraint.duals.lam = torch.tensor(lam, dtype=torch.float64)
        recipe.constraint.duals.lr = 0.0
    val_clean, val_noisy = data["val"], noisy_val_clips(data["val"], cfg)
    curve: dict[str, list] = {
        "step": [0],
        "rmse": [_val_rmse(model, val_clean, val_noisy, cfg.eval_batch_size)],
    }

    def validate(step: int, m: nn.Module, _logs: dict[str, float]) -> None:
        if step % cfg.val_every == 0 or step == total:
            curve["step"].append(step)
            curve["rmse"].append(_val_rmse(m, val_clean, val_noisy, cfg.eval_batch_size))

    start = time.perf_counter()
    fit(model, train, cfg=train_cfg, run=run, tag=key, callbacks=[validate], **recipe.fit_kwargs())
    train_seconds = time.perf_counter() - start
    ev = evaluate_denoiser(
        model,
        data["test"],
        noisy_test_clips(data["test"], cfg, seed),
        batch_size=cfg.eval_batch_size,
        per_example=True,
    )
    run.save_arrays(f"jobs/{key}-errors.npz", example_mse=ev.pop("example_mse").numpy())
    ev.update(train_seconds=train_seconds, val_curve=curve, val_rmse=curve["rmse"][-1], spec=spec)
    if recipe.constraint is not None:
        ev["lambda"] = recipe.constraint.duals.lam.tolist()
    run.log(tag=key, eval_rmse=ev["rmse"], gammas=cfg.gammas, val_rmse=ev["val_rmse"])
    if seed == cfg.seeds[0]:
        frames = torch.stack([denoise_frames(model, y, cfg.data.crop) for y in data["sample_noisy"]])
        run.save_arrays(f"jobs/{key}-frames.npz", denoised=frames)
    return ev


def run_baselines(cfg: Any, data: dict[str, Tensor], run: RunDir, key: str = "baselines") -> dict:
    """Choose every classical baseline's parameters on validation at σ_train, then test it at every γ.

    Each seed's test noise is the one the learned models of that seed see. Saves ``jobs/<key>-<name>.npz``
    with ``example_mse [seeds, levels, N]`` and the sample frames ``denoised [levels, T, h, w]``.
    """
    sigma = cfg.data.sigma_train
    val_clean, val_noisy = data["val"], noisy_val_clips(data["val"], cfg)
    out: dict[str, Any] = {}
    for name in cfg.baselines:
        fn, grid = BASELINES[name]
        grid = {**grid, **cfg.baseline_grid.get(name, {})}
        fixed = {"sigma": sigma} if name == "nl-means" else {}
        start = time.perf_counter()
        params, scores = choose_on_validation(fn, grid, val_clean, val_noisy, **fixed)
        per_seed, examples = [], []
        for seed in cfg.seeds:
            levels = noisy_test_clips(data["test"], cfg, seed)
            mse = torch.stack(
                [(fn(y, **params, **fixed) - data["test"]).pow(2).flatten(1).mean(1) for y in levels]
            )
            examples.append(mse.numpy())
            per_seed.append([math.sqrt(float(v)) for v in mse.double().mean(1)])
        frames = torch.stack(
            [denoise_tiles(partial(fn, **params, **fixed), y, cfg.data.crop) for y in data["sample_noisy"]]
        )
        run.save_arrays(f"jobs/{key}-{name}.npz", example_mse=np.stack(examples), denoised=frames.numpy())
        out[name] = {
            "params": params,
            "val_grid": scores,
            "val_rmse": min(s["val_rmse"] for s in scores),
            "rmse": per_seed,
            "seconds": time.perf_counter() - start,
        }
    return out


def job(kind: str, *args: Any) -> dict:
    """The experiment's one job function: ``"train"`` -> :func:`train_and_evaluate`, ``"baselines"`` ->
    :func:`run_baselines` (one :class:`~descentlab.train.jobs.JobRunner` runs both)."""
    return {"train": train_and_evaluate, "baselines": run_baselines}[kind](*args)
