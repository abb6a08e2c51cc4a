"""video-denoising: UT and DUST trained with ERM, layer-wise descent constraints and controls, against classical
denoisers, every setting chosen on a validation split.

Protocol: grayscale clips (opencv's vtest.avi by default) cut into T-frame crop × crop sequences; train,
validation and test are disjoint time ranges of each clip. Per (architecture, method) a grid (``grid``, else
``lr_grid`` × ``constraint_grid``, or ``unconstrained_lr_grid`` for a method without a constraint; the same
number of candidates for every method) trains with ``tune_seed``, never an evaluation seed; the candidate of
lowest validation RMSE at γ = 1 then trains with every seed of ``seeds``, and only those runs are reported (a
method with one candidate is not tuned). Controls: ``blind`` (ERM on a γ range: the positive control), ``frozen`` (a constrained
run's final multipliers held fixed), ``budget_check`` (ERM retrained for longer: has it converged?) and
``budget_curve`` (ERM and the constrained model at longer budgets: is a gain a budget effect?), both on the
first evaluation seed.

The run saves every test sequence's error in ``arrays/claims.npz``, which :mod:`.claims` judges.
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from descentlab.config import config_to_dict
from descentlab.data.video_data import load_denoising_data
from descentlab.errors import NumericalError
from descentlab.experiments.video_denoising.budget import (
    budget_checks,
    budget_curve,
    budget_curve_table,
    budget_table,
)
from descentlab.experiments.video_denoising.claims import budget_name
from descentlab.experiments.video_denoising.config import VideoDenoisingConfig
from descentlab.experiments.video_denoising.figures import SAMPLE_FRAMES
from descentlab.experiments.video_denoising.jobs import at_steps, job, job_key
from descentlab.experiments.video_denoising.summary import NOTES, load_job_arrays, summarise
from descentlab.io import load_arrays
from descentlab.report.results import Results
from descentlab.train.jobs import JobRunner
from descentlab.train.rundir import RunDir
from descentlab.train.tuning import check_equal_budgets, tune_and_replicate

CLAIM_ARRAYS = "arrays/claims.npz"


def claim_arrays(
    errors: dict[str, np.ndarray], baseline_errors: dict[str, np.ndarray], gammas: list[float], **extra: Any
) -> dict[str, Any]:
    """What :mod:`.claims` reads: per method ``final/<name>`` (``[S, G, N]``: the final estimate's MSE per
    test sequence) and ``layers/<name>`` (``[S, L+1, N]`` at γ = 1), per baseline ``final/<name>``, and the
    names and γ levels (``errors``: name -> ``[S, G, L+1, N]``)."""
    one = gammas.index(1.0)
    out: dict[str, Any] = {"gammas": np.asarray(gammas)}
    for name, e in errors.items():
        out[f"final/{name}"] = e[:, :, -1]
        out[f"layers/{name}"] = e[:, one]
    out |= {f"final/{b}": e for b, e in baseline_errors.items()}
    return {**out, **extra}


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
            k = job_key(a, fl or lab, i, s)
            return runner.submit(k, "train", cfg, a, lab, spec, s, data, run, k, lam, steps)

        frozen_jobs, budget_jobs, curve_jobs = {}, {}, {}
        base_steps = cfg.train.total_steps(len(data["train"]))
        long_steps = round(cfg.budget_check * base_steps)

        def then(group: tuple[str, str], i: int, per_seed: list[dict]) -> None:  # jobs needing a choice
            a, lab = group
            if failed := [ev["failed"] for ev in per_seed if "failed" in ev]:
                raise NumericalError(
                    f"{a}-{lab}: the chosen candidate failed on an evaluation seed: {failed[0]}"
                )
            if lab == "erm" and cfg.budget_check:
                fl = f"erm-budget{cfg.budget_check:g}x"
                budget_jobs[a] = train(a, lab, None, cfg.candidates(lab)[i], seed0, fl=fl, steps=long_steps)
            for n in cfg.budget_curve if lab in cfg.budget_labels else ():
                curve_jobs[a, lab, n] = train(
                    a, lab, None, cfg.candidates(lab)[i], seed0, fl=at_steps(lab, n), steps=n
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
            tune_seed=cfg.tune_seed,
        )
        for a in archs:
            for lab in frozen:
                evs[a, lab] = [frozen_jobs[a, lab, s].result() for s in cfg.seeds]
        base = baselines.result() if baselines is not None else {}
        budget = {
            a: {"steps": long_steps, "base_steps": base_steps, **f.result()} for a, f in budget_jobs.items()
        }
        # the base budget's point is the first evaluation seed's run; a diverged long run is left out
        curve_evs = {(a, lab, base_steps): evs[a, lab][0] for a, lab, _ in curve_jobs}
        long_evs = {k: ev for k, f in curve_jobs.items() if "failed" not in (ev := f.result())}

    order = [(a, lab) for a in archs for lab in cfg.labels]
    cand = {(a, lab): None if lab in cfg.frozen else chosen[a, lab] for a, lab in order}
    keys = {f"{a}-{lab}": [job_key(a, lab, cand[a, lab], s) for s in cfg.seeds] for a, lab in order}
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
    per_seed = {f"{a}-{lab}": evs[a, lab] for a, lab in order}
    body = summarise(
        per_seed=per_seed,
        grids={
            f"{a}-{lab}": (cfg.candidates(lab), chosen[a, lab], runs)
            for (a, lab), runs in grid.items()
            if runs
        },
        baselines=base,
        gammas=list(cfg.gammas),
        tune_seed=cfg.tune_seed,
    )
    if checks := budget_checks(budget, per_seed, cfg.gammas):
        body["budget_check"] = checks
        body["tables"].append(budget_table(checks))
    # the budget curve's points (first evaluation seed): the base budget is its run, the others their own jobs
    curve_err = {budget_name(f"{a}-{lab}", n): errors[f"{a}-{lab}"][:1] for a, lab, n in curve_evs}
    for a, lab, n in long_evs:
        path = run.path / "jobs" / f"{job_key(a, at_steps(lab, n), None, seed0)}-errors.npz"
        curve_err[budget_name(f"{a}-{lab}", n)] = load_arrays(path)["example_mse"][None]
    if curve_jobs:
        body["budget_curve"] = budget_curve({**curve_evs, **long_evs})
        body["tables"].append(budget_curve_table(body["budget_curve"], cfg.gammas))
    run.save_arrays(
        CLAIM_ARRAYS,
        **claim_arrays(
            {**errors, **curve_err},
            base_errors,
            list(cfg.gammas),
            methods=np.asarray(list(keys)),
            baselines=np.asarray(list(base)),
            budget_steps=np.asarray(sorted({n for *_, n in [*curve_evs, *long_evs]}), dtype=np.int64),
        ),
    )
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
            "selection": "per (architecture, method): the candidate of lowest final validation RMSE at gamma = 1, "
            f"trained from the tuning seed {cfg.tune_seed} (never an evaluation seed; its runs are not reported); "
            f"{check_equal_budgets(cfg.compared_grids)} candidates per compared method (one: not tuned)"
            + "".join(f"; {b}: {len(cfg.candidates(b))}" for b in cfg.blind if b in cfg.trained_labels),
            "noise": "additive Gaussian on pixels in [0, 1], test level gamma * sigma_train",
            **{k: {m: v for m, v in getattr(cfg, k).items() if m in cfg.labels} for k in ("blind", "frozen")},
        },
        methods=body["methods"],
        tables=body["tables"],
        notes=NOTES,
        extra={
            k: body[k]
            for k in ("baselines", "selection", "versus_baselines", "budget_check", "budget_curve")
            if k in body
        },
    )
    return results.to_dict()
