"""video-denoising's run: the classical baselines; every (architecture, method) grid on the tuning seed,
the candidate of lowest validation RMSE at γ = 1 chosen and trained on every evaluation seed (only those
runs are reported); the controls that need a choice (:class:`FollowUps`); then every test sequence's error
into the cell store (keyed as :mod:`.claims` reads it) and the results.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from descentlab.config import config_to_dict
from descentlab.data.video_data import load_denoising_data
from descentlab.errors import NumericalError
from descentlab.experiments.video_denoising import report
from descentlab.experiments.video_denoising.config import (
    LAYER_MSE,
    MSE,
    VideoDenoisingConfig,
    arch_of,
    budget_name,
    design,
    label_of,
)
from descentlab.experiments.video_denoising.jobs import BudgetKey, Outcome, at_steps, job, job_key
from descentlab.io import load_arrays
from descentlab.report.results import Results
from descentlab.study.cells import CellStore, cell_key
from descentlab.study.jobs import JobRunner
from descentlab.study.tuning import Round, Tuned, TuningConfig, check_equal_budgets, tune_then_replicate
from descentlab.train.rundir import RunDir


def run(cfg: VideoDenoisingConfig, run: RunDir) -> dict:
    # 1. data: disjoint time ranges of each clip; the sample frames at γ = 1 and the largest γ
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    sample_gammas = sorted({1.0, max(cfg.gammas)})
    data, sample_clean, data_protocol = load_denoising_data(**asdict(cfg.data), sample_gammas=sample_gammas)
    base_steps = cfg.train.total_steps(len(data["train"]))

    # 2. the baselines, then every (architecture, method) grid on the tuning seed and its choice on every
    # evaluation seed (tuning_plan); the controls that need a choice go out as each method finishes
    # (FollowUps); finished jobs come from the job cache on resume
    with JobRunner(
        job, workers=cfg.workers, cache_dir=run.path / "jobs", threads=max(cfg.torch_threads, 1)
    ) as runner:
        baselines = runner.submit("baselines", "baselines", cfg, data, run) if cfg.baselines else None
        follow = FollowUps(cfg, partial(submit_job, runner, cfg, data, run), base_steps)
        tuned = tune_then_replicate(
            {arm: 0 for arm in arms(cfg, cfg.trained_labels)},
            tuning_plan(cfg),
            submit=follow.submit,
            choose=choose,
            then=follow.then,
        )
        outcome = follow.outcome(tuned, baselines.result() if baselines is not None else {})

    # 3. the arrays: the cell store, and the sample frames every reported method and baseline denoised
    jobs_dir = run.path / "jobs"
    cell_store(cfg, jobs_dir, outcome).save(run.path, writer=run.writer)
    denoised = [
        load_arrays(jobs_dir / f"{outcome.jobs[arm][0]}-frames.npz")["denoised"] for arm in outcome.per_seed
    ]
    denoised += [load_arrays(jobs_dir / f"baselines-{b}.npz")["denoised"] for b in outcome.baselines]
    run.save_arrays(
        report.SAMPLE_FRAMES,
        clean=sample_clean,
        noisy=data["sample_noisy"],
        gammas=np.asarray(sample_gammas),
        seed=np.asarray(cfg.seeds[0]),
        methods=np.asarray([*outcome.per_seed, *outcome.baselines]),
        denoised=np.stack(denoised),
    )
    return Results(
        experiment="video-denoising",
        config=config_to_dict(cfg),
        protocol=protocol(cfg, data_protocol, base_steps),
        **report.summarise(cfg, outcome),
    ).to_dict()


def arms(cfg: VideoDenoisingConfig, labels: Sequence[str] | None = None) -> list[str]:
    """``<architecture>-<label>`` of every architecture and label (default: every method), in report order."""
    return [f"{a}-{lab}" for a in cfg.architectures for lab in (cfg.labels if labels is None else labels)]


def tuning_plan(cfg: VideoDenoisingConfig) -> TuningConfig:
    """One round: every trained (architecture, method) with more than one candidate tries its whole grid on
    the tuning seed; a method with one candidate has nothing to choose and trains on the evaluation seeds
    only. The compared methods' grids are of one size (checked by the config)."""
    tuned = tuple(arm for arm in arms(cfg, cfg.trained_labels) if len(cfg.candidates(label_of(arm))) > 1)
    return TuningConfig(cfg.seeds, cfg.tune_seed, [Round(tuned, partial(candidates, cfg))] if tuned else [])


def candidates(cfg: VideoDenoisingConfig, arm: str, chosen: Mapping[str, int]) -> range:
    """The candidates of ``arm``: the indices of its label's grid (:meth:`VideoDenoisingConfig.candidates`)."""
    return range(len(cfg.candidates(label_of(arm))))


def choose(arm: str, results: Sequence[Mapping[str, Any]]) -> int:
    """The candidate of lowest final validation RMSE at γ = 1, the first on ties; a failed one (NaN) ranks
    last."""
    return min(
        range(len(results)), key=lambda i: (math.isnan(results[i]["val_rmse"]), results[i]["val_rmse"])
    )


def submit_job(
    runner: JobRunner,
    cfg: VideoDenoisingConfig,
    data: dict,
    run: RunDir,
    arm: str,
    candidate: int,
    seed: int,
    *,
    job_label: str = "",
    lam: list[float] | None = None,
    steps: int | None = None,
) -> Future:
    """Queue one training job of ``arm`` at grid candidate ``candidate`` from ``seed``, under
    :func:`job_key`. A follow-up (``job_label``: a frozen control or a longer budget) runs the chosen
    candidate under its own label, keyed without the candidate index."""
    arch, label = arch_of(arm), label_of(arm)
    key = job_key(arch, job_label or label, None if job_label else candidate, seed)
    spec = cfg.candidates(label)[candidate]
    return runner.submit(key, "train", cfg, arch, label, spec, seed, data, run, key, lam, steps)


@dataclass
class FollowUps:
    """The jobs that need a method's choice, queued by :meth:`then` once its evaluation runs are done:
    ERM's budget check, the budget curve (first evaluation seed) and the frozen-λ controls (every seed,
    from that seed's final multipliers)."""

    cfg: VideoDenoisingConfig
    submit: Callable[..., Future]  # submit_job with its runner bound
    base_steps: int
    budget: dict[str, Future] = field(default_factory=dict)
    curve: dict[BudgetKey, Future] = field(default_factory=dict)
    frozen: dict[tuple[str, int], Future] = field(default_factory=dict)

    def then(self, arm: str, candidate: int, per_seed: list[dict]) -> None:
        """The tuning planner's follow-up hook; NumericalError when the chosen candidate failed on a seed."""
        cfg, arch, label, seed0 = self.cfg, arch_of(arm), label_of(arm), self.cfg.seeds[0]
        if failed := [ev["failed"] for ev in per_seed if "failed" in ev]:
            raise NumericalError(f"{arm}: the chosen candidate failed on an evaluation seed: {failed[0]}")
        if label == "erm" and cfg.budget_check:
            steps = round(cfg.budget_check * self.base_steps)
            flag = f"erm-budget{cfg.budget_check:g}x"
            self.budget[arch] = self.submit(arm, candidate, seed0, job_label=flag, steps=steps)
        for n in cfg.budget_curve if label in cfg.budget_labels else ():
            self.curve[arch, label, n] = self.submit(
                arm, candidate, seed0, job_label=at_steps(label, n), steps=n
            )
        for frozen in (f for f in cfg.labels if cfg.frozen.get(f) == label):
            for s, ev in zip(cfg.seeds, per_seed, strict=True):
                self.frozen[f"{arch}-{frozen}", s] = self.submit(
                    arm, candidate, s, job_label=frozen, lam=ev["lambda"]
                )

    def outcome(self, tuned: Tuned, baselines: dict[str, Any]) -> Outcome:
        """Every result, once the jobs are done. A point of the budget curve at the base budget is the first
        evaluation seed's run, any other (and that one, when the curve retrains it) its own run; a diverged
        run has no point. A frozen control's jobs are keyed by its own label, without a grid index."""
        cfg, seed0 = self.cfg, self.cfg.seeds[0]
        frozen = {arm: [self.frozen[arm, s].result() for s in cfg.seeds] for arm, _ in self.frozen}
        per_seed = {arm: tuned.per_seed.get(arm) or frozen[arm] for arm in arms(cfg)}
        jobs = {
            arm: [job_key(arch_of(arm), label_of(arm), tuned.chosen.get(arm), s) for s in cfg.seeds]
            for arm in arms(cfg)
        }
        steps = round(cfg.budget_check * self.base_steps)
        budget = {
            a: {"steps": steps, "base_steps": self.base_steps, **f.result()} for a, f in self.budget.items()
        }
        curve = {}
        for arch, label, _ in self.curve:
            arm = f"{arch}-{label}"
            curve[arch, label, self.base_steps] = per_seed[arm][0]
            jobs[budget_name(arm, self.base_steps)] = jobs[arm][:1]
        for (arch, label, n), future in self.curve.items():
            if "failed" not in (ev := future.result()):
                curve[arch, label, n] = ev
                jobs[budget_name(f"{arch}-{label}", n)] = [job_key(arch, at_steps(label, n), None, seed0)]
        return Outcome(tuned, per_seed, baselines, budget, curve, jobs)


def cell_store(cfg: VideoDenoisingConfig, jobs_dir: Path, outcome: Outcome) -> CellStore:
    """The run's cells from the errors its jobs saved under ``jobs_dir`` (``example_mse`` ``[G, L+1, N]``
    per job): per learned arm and budget-curve point (``[1, ...]``: not through :meth:`CellStore.put`, which
    asks for every seed) ``mse`` of the final estimate and ``layer_mse`` at γ = 1; per baseline ``mse``
    (``[S, G, N]``)."""
    one = cfg.gammas.index(1.0)
    arrays = {}
    for name, keys in outcome.jobs.items():
        e = np.stack([load_arrays(jobs_dir / f"{k}-errors.npz")["example_mse"] for k in keys])
        arrays |= {cell_key(MSE, name): e[:, :, -1], cell_key(LAYER_MSE, name): e[:, one]}
    for b in outcome.baselines:
        arrays[cell_key(MSE, b)] = load_arrays(jobs_dir / f"baselines-{b}.npz")["example_mse"]
    # the design the runner recorded from the config; a budget point whose run diverged saved no cells
    record = replace(design(cfg), examples=int(next(iter(arrays.values())).shape[-1]))
    for name in [*outcome.jobs, *outcome.baselines]:
        record.require(name)
    return CellStore(record, arrays)


def protocol(cfg: VideoDenoisingConfig, data_protocol: Mapping[str, Any], steps: int) -> dict[str, Any]:
    """The protocol record of ``results.json``: what ``config.json`` does not say (the data as loaded, the
    steps, the noise and the selection rule)."""
    return {
        **data_protocol,
        "gammas": list(cfg.gammas),  # the figures' axis
        "steps": steps,
        "selection": "per (architecture, method): the candidate of lowest final validation RMSE at gamma = 1, "
        f"trained from the tuning seed {cfg.tune_seed} (never an evaluation seed; its runs are not reported); "
        f"{check_equal_budgets(cfg.compared_grids)} candidates per compared method (one: not tuned)"
        + "".join(f"; {b}: {len(cfg.candidates(b))}" for b in cfg.blind if b in cfg.trained_labels),
        "noise": "additive Gaussian on pixels in [0, 1], test level gamma * sigma_train",
    }
