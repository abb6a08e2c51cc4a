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

The run saves every test sequence's error in its cell store (``arrays/cells.npz`` and ``arrays/design.json``,
:mod:`.cells`), which :mod:`.claims` judges.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
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
from descentlab.experiments.video_denoising.cells import budget_name, cell_store, design
from descentlab.experiments.video_denoising.config import VideoDenoisingConfig
from descentlab.experiments.video_denoising.figures import SAMPLE_FRAMES
from descentlab.experiments.video_denoising.jobs import at_steps, job, job_key
from descentlab.experiments.video_denoising.summary import (
    NOTES,
    arch_of,
    label_of,
    load_job_arrays,
    summarise,
)
from descentlab.io import load_arrays
from descentlab.report.results import Results
from descentlab.study.tuning import Round, TuningConfig, check_equal_budgets, tune_then_replicate
from descentlab.train.jobs import JobRunner
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
        submit = partial(submit_train, runner, cfg, data, run)
        follow = FollowUps(cfg, submit, base_steps)
        tuned = tune_then_replicate(
            {arm: 0 for arm in arms(cfg, cfg.trained_labels)},
            tuning_plan(cfg),
            submit=submit,
            choose=lowest_val_rmse,
            then=follow.then,
        )
        base = baselines.result() if baselines is not None else {}
        per_seed = {arm: tuned.per_seed.get(arm) or follow.frozen_results(arm) for arm in arms(cfg)}
        budget = follow.budget_results()
        curve = follow.curve_results(per_seed)

    # 3. the arrays: sample frames, every reported run's per-sequence errors and the budget points
    keys = job_keys(cfg, tuned.chosen)
    errors, base_errors, denoised = load_job_arrays(run.path / "jobs", keys, list(base))
    run.save_arrays(
        SAMPLE_FRAMES,
        clean=sample_clean,
        noisy=data["sample_noisy"],
        gammas=np.asarray(sample_gammas),
        seed=np.asarray(cfg.seeds[0]),
        methods=np.asarray([*keys, *base]),
        denoised=denoised,
    )
    points = budget_errors(run.path / "jobs", cfg.seeds[0], curve, follow.long_results(), errors)
    record = design(
        methods=list(keys),
        baselines=list(base),
        gammas=cfg.gammas,
        seeds=cfg.seeds,
        budget_steps={n for *_, n in curve},
        budget_arms=list(points),
        examples=int(next(iter(errors.values())).shape[-1]),
    )
    cell_store(record, {**errors, **points}, base_errors).save(run.path, writer=run.writer)

    # 4. results: the methods' blocks and tables, the budget check and curve
    grids = {
        arm: (cfg.candidates(label_of(arm)), tuned.picks[arm], tuned.results[arm]) for arm in tuned.picks
    }
    body = summarise(
        per_seed=per_seed, grids=grids, baselines=base, gammas=cfg.gammas, tune_seed=cfg.tune_seed
    )
    if checks := budget_checks(budget, per_seed, cfg.gammas):
        body["budget_check"] = checks
        body["tables"].append(budget_table(checks).to_dict())
    if curve:
        body["budget_curve"] = budget_curve(curve)
        body["tables"].append(budget_curve_table(body["budget_curve"], cfg.gammas).to_dict())
    return Results(
        experiment="video-denoising",
        config=config_to_dict(cfg),
        protocol=protocol(cfg, data_protocol, base_steps),
        methods=body["methods"],
        tables=body["tables"],
        notes=NOTES,
        extra={
            k: body[k]
            for k in ("baselines", "selection", "versus_baselines", "budget_check", "budget_curve")
            if k in body
        },
    ).to_dict()


def arms(cfg: VideoDenoisingConfig, labels: Sequence[str] | None = None) -> list[str]:
    """``<architecture>-<label>`` of every architecture and label (default: every method), in report order."""
    return [f"{a}-{lab}" for a in cfg.architectures for lab in (cfg.labels if labels is None else labels)]


def tuning_plan(cfg: VideoDenoisingConfig) -> TuningConfig:
    """One round: every trained (architecture, method) with more than one candidate tries its whole grid on
    the tuning seed; a method with one candidate has nothing to choose and trains on the evaluation seeds
    only. The compared methods' grids are of one size (checked by the config)."""
    tuned = tuple(arm for arm in arms(cfg, cfg.trained_labels) if len(cfg.candidates(label_of(arm))) > 1)
    return TuningConfig(cfg.seeds, cfg.tune_seed, [Round(tuned, partial(grid_indices, cfg))] if tuned else [])


def grid_indices(cfg: VideoDenoisingConfig, arm: str, chosen: Mapping[str, int]) -> range:
    """The candidates of ``arm``: the indices of its label's grid (:meth:`VideoDenoisingConfig.candidates`)."""
    return range(len(cfg.candidates(label_of(arm))))


def lowest_val_rmse(arm: str, results: Sequence[Mapping[str, Any]]) -> int:
    """The candidate of lowest final validation RMSE at γ = 1, the first on ties; a failed one (NaN) ranks
    last."""
    return min(
        range(len(results)), key=lambda i: (math.isnan(results[i]["val_rmse"]), results[i]["val_rmse"])
    )


def submit_train(
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
    submit: Any  # submit_train with its runner bound
    base_steps: int
    budget: dict[str, Future] = field(default_factory=dict)
    curve: dict[tuple[str, str, int], Future] = field(default_factory=dict)
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

    def frozen_results(self, arm: str) -> list[dict]:
        return [self.frozen[arm, s].result() for s in self.cfg.seeds]

    def budget_results(self) -> dict[str, dict]:
        """architecture -> ERM's budget-check run, with its ``steps`` and the ``base_steps``."""
        steps = round(self.cfg.budget_check * self.base_steps)
        return {
            a: {"steps": steps, "base_steps": self.base_steps, **f.result()} for a, f in self.budget.items()
        }

    def long_results(self) -> dict[tuple[str, str, int], dict]:
        """(architecture, label, steps) -> the budget curve's own run at ``steps`` (a diverged one is left out)."""
        return {k: ev for k, f in self.curve.items() if "failed" not in (ev := f.result())}

    def curve_results(self, per_seed: Mapping[str, list[dict]]) -> dict[tuple[str, str, int], dict]:
        """Every point of the budget curve: at the base budget the first evaluation seed's run, at the
        others (and at the base budget, when the curve retrains it) their own runs."""
        out = {(a, lab, self.base_steps): per_seed[f"{a}-{lab}"][0] for a, lab, _ in self.curve}
        return out | self.long_results()


def job_keys(cfg: VideoDenoisingConfig, chosen: Mapping[str, int]) -> dict[str, list[str]]:
    """arm -> the job keys of its reported runs, one per evaluation seed (a frozen control is keyed by its
    own label, without a grid index)."""
    return {
        arm: [
            job_key(arch_of(arm), label, None if label in cfg.frozen else chosen[arm], s) for s in cfg.seeds
        ]
        for arm in arms(cfg)
        for label in [label_of(arm)]
    }


def budget_errors(
    jobs_dir: Path,
    seed0: int,
    curve: Mapping[tuple[str, str, int], Any],
    long: Mapping[tuple[str, str, int], Any],
    errors: Mapping[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """:func:`budget_name` -> ``[1, G, L+1, N]`` errors of every budget-curve point (first evaluation seed):
    a point with its own run (``long``) from that job's saved errors, the base budget's from the method's."""
    out = {}
    for arch, label, n in curve:
        arm = f"{arch}-{label}"
        if (arch, label, n) not in long:
            out[budget_name(arm, n)] = errors[arm][:1]
        else:
            path = jobs_dir / f"{job_key(arch, at_steps(label, n), None, seed0)}-errors.npz"
            out[budget_name(arm, n)] = load_arrays(path)["example_mse"][None]
    return out


def protocol(cfg: VideoDenoisingConfig, data_protocol: Mapping[str, Any], steps: int) -> dict[str, Any]:
    """The protocol record of ``results.json``: the data, the noise, the seeds and the selection rule."""
    return {
        **data_protocol,
        "gammas": list(cfg.gammas),
        "seeds": list(cfg.seeds),
        "draws": 1,
        "steps": steps,
        "batch_size": cfg.train.batch_size,
        "selection": "per (architecture, method): the candidate of lowest final validation RMSE at gamma = 1, "
        f"trained from the tuning seed {cfg.tune_seed} (never an evaluation seed; its runs are not reported); "
        f"{check_equal_budgets(cfg.compared_grids)} candidates per compared method (one: not tuned)"
        + "".join(f"; {b}: {len(cfg.candidates(b))}" for b in cfg.blind if b in cfg.trained_labels),
        "noise": "additive Gaussian on pixels in [0, 1], test level gamma * sigma_train",
        **{k: {m: v for m, v in getattr(cfg, k).items() if m in cfg.labels} for k in ("blind", "frozen")},
    }
