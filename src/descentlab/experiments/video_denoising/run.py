"""video-denoising's run: the classical baselines; every (architecture, method) grid on the tuning seed,
the candidate of lowest validation RMSE at γ = 1 chosen and trained on every evaluation seed (only those
runs are reported); the controls that need a choice (:class:`FollowUps`); then every test sequence's error
into the cell store (keyed as :mod:`.claims` reads it) and the results.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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
from descentlab.experiments.video_denoising.claims import LAYER_MSE, MSE, arch_of, budget_name, label_of
from descentlab.experiments.video_denoising.config import VideoDenoisingConfig, design
from descentlab.experiments.video_denoising.jobs import at_steps, job, job_key
from descentlab.io import load_arrays
from descentlab.report.results import Results
from descentlab.study.cells import CellStore, Design, cell_key
from descentlab.study.jobs import JobRunner
from descentlab.study.tuning import Round, TuningConfig, check_equal_budgets, tune_then_replicate
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
        report.SAMPLE_FRAMES,
        clean=sample_clean,
        noisy=data["sample_noisy"],
        gammas=np.asarray(sample_gammas),
        seed=np.asarray(cfg.seeds[0]),
        methods=np.asarray([*keys, *base]),
        denoised=denoised,
    )
    points = budget_errors(run.path / "jobs", cfg.seeds[0], curve, follow.long_results(), errors)
    # the design the runner recorded from the config; a budget point whose run diverged saved no cells
    examples = int(next(iter(errors.values())).shape[-1])
    record = replace(design(cfg), examples=examples)
    cell_store(record, {**errors, **points}, base_errors).save(run.path, writer=run.writer)

    # 4. results: the methods' blocks and tables, the budget check and curve (report.summarise)
    grids = {
        arm: (cfg.candidates(label_of(arm)), tuned.picks[arm], tuned.results[arm]) for arm in tuned.picks
    }
    body = report.summarise(per_seed, grids, base, cfg.gammas, cfg.tune_seed, budget=budget, curve=curve)
    return Results(
        experiment="video-denoising",
        config=config_to_dict(cfg),
        protocol=protocol(cfg, data_protocol, base_steps),
        methods=body["methods"],
        tables=body["tables"],
        notes=report.NOTES,
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


def load_job_arrays(
    jobs_dir: Path, keys: Mapping[str, Sequence[str]], baselines: Sequence[str]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """The arrays the jobs saved under ``jobs_dir``: per method (its job keys, one per seed), ``errors`` stacks
    ``<key>-errors.npz``'s ``example_mse`` over seeds (``[S, G, L+1, N]``); per baseline,
    ``baselines-<name>.npz``'s ``example_mse`` (``[S, G, N]``); ``denoised`` stacks the first key's
    ``<key>-frames.npz`` of every method, then every baseline's frames, in that order."""
    runs = {
        name: [load_arrays(jobs_dir / f"{k}-errors.npz")["example_mse"] for k in ks]
        for name, ks in keys.items()
    }
    base = {b: load_arrays(jobs_dir / f"baselines-{b}.npz") for b in baselines}
    frames = [load_arrays(jobs_dir / f"{ks[0]}-frames.npz")["denoised"] for ks in keys.values()]
    denoised = np.stack(frames + [base[b]["denoised"] for b in baselines])
    return {k: np.stack(v) for k, v in runs.items()}, {b: base[b]["example_mse"] for b in baselines}, denoised


def cell_store(
    record: Design, errors: Mapping[str, np.ndarray], baseline_errors: Mapping[str, np.ndarray]
) -> CellStore:
    """The run's cells: per learned arm (``errors``: name -> ``[S, G, L+1, N]``) ``mse`` and ``layer_mse``
    at γ = 1, per baseline (``[S, G, N]``) ``mse``. Budget points keep their one seed (``[1, ...]``: not
    through :meth:`CellStore.put`, which asks for every seed)."""
    one = record.extra["gammas"].index(1.0)
    arrays = {}
    for name, e in errors.items():
        arrays |= {cell_key(MSE, name): e[:, :, -1], cell_key(LAYER_MSE, name): e[:, one]}
    arrays |= {cell_key(MSE, b): e for b, e in baseline_errors.items()}
    for name in [*errors, *baseline_errors]:
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
