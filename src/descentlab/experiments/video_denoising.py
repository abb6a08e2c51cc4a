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
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from descentlab.config import config_to_dict
from descentlab.constrained.config import DescentConfig
from descentlab.data.video import NoisyClips, noisy_val_clips
from descentlab.data.video import noisy_test_clips as noisy_levels
from descentlab.data.video_data import VideoDataConfig, load_denoising_data
from descentlab.errors import ConfigError, NumericalError
from descentlab.models.denoisers import UnrolledConfig, build_denoiser, final_mse
from descentlab.optim.config import OptimizerConfig
from descentlab.report.results import Results
from descentlab.report.video_claims import NOTES, load_job_arrays, summarise
from descentlab.report.video_denoising import SAMPLE_FRAMES
from descentlab.robustness.video import ValidationCurve, denoise_frames, evaluate_denoiser
from descentlab.robustness.video_baselines import BASELINES, run_baselines
from descentlab.train.jobs import JobRunner
from descentlab.train.loop import TrainConfig, fit, seed_everything
from descentlab.train.recipe import MethodConfig, build_frozen_recipe, build_recipe, with_overrides
from descentlab.train.rundir import RunDir
from descentlab.train.tuning import tune_and_replicate

__all__ = ["CONFIG", "PRESETS", "VideoDenoisingConfig", "build_model", "final_mse", "noisy_test_clips", "run"]

ARCHITECTURES = ("ut", "dust")
# "deep-supervision" is a control: the mean of the per-layer losses f_1..f_L, i.e. the same per-layer signal
# as the constrained objective with fixed, equal weights instead of multipliers. "blind" is ERM on a range of
# noise levels (see `blind`).
SPECS = {
    "erm": "",
    "constrained": "objective=constrained",
    "resilient": "objective=constrained constraint.resilient=true",
    "deep-supervision": "objective=deep-supervision",
    "blind": "",
}
# the frozen-λ control: label -> the constrained label whose final multipliers it holds fixed
FROZEN = {"frozen-lambda": "constrained"}


def _base_method() -> MethodConfig:
    return MethodConfig(
        optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.0, decay="all", schedule="cosine"),
        constraint=DescentConfig(
            dual_lr=0.05,
            # MSE shrinks by orders of magnitude across layers: the ratio form is scale-free
            form="ratio",
            # Without it the constraint raises f_0 (UT's f_0 grew 6x in 20 steps in a pilot): f_0 has weight
            # -(1 - α) λ_1 in the Lagrangian. Detached, every constraint only pushes its own layer down.
            detach_prev=True,
            constrain_first=True,
            penalty=1.0,  # resilient methods only
            slack_lr=None,  # 1/penalty
        ),
    )


@dataclass
class VideoDenoisingConfig:
    data: VideoDataConfig = field(default_factory=VideoDataConfig)
    model: UnrolledConfig = field(default_factory=UnrolledConfig)
    method: MethodConfig = field(default_factory=_base_method)  # the base every method's spec edits
    specs: dict[str, str] = field(default_factory=lambda: dict(SPECS))  # label -> MethodConfig overrides
    # the labels of `specs` and `frozen` to train, in order
    methods: list[str] = field(default_factory=lambda: [*SPECS, *FROZEN])
    # label -> [γ_low, γ_high]: ERM trained on σ ~ U(γ_low, γ_high)·σ_train per example (positive control)
    blind: dict[str, list[float]] = field(default_factory=lambda: {"blind": [0.0, 3.0]})
    # label -> the constrained label whose final λ (same architecture and seed) it holds fixed
    frozen: dict[str, str] = field(default_factory=lambda: dict(FROZEN))
    lr_grid: list[float] = field(default_factory=lambda: [1e-3, 3e-3])  # every method's candidates
    constraint_grid: list[str] = field(  # crossed with lr_grid for constrained methods
        default_factory=lambda: ["constraint.dual_lr=0.05", "constraint.dual_lr=0.5"]
    )
    # label -> its own candidates (override specs), replacing lr_grid x constraint_grid for that label
    grid: dict[str, list[str]] = field(default_factory=dict)
    val_every: int = 50  # steps between validation points
    # Has ERM converged? Its chosen setting retrains (first seed) for this many times the steps, the cosine
    # schedule stretched to match; the gain in validation RMSE is reported (report.video_claims). 0: off.
    budget_check: float = 2.0
    baselines: list[str] = field(default_factory=lambda: list(BASELINES))
    baseline_grid: dict[str, dict[str, list]] = field(default_factory=dict)  # name -> replaces grid entries
    id_margin: float = 0.01  # claim 3: RMSE at γ = 1 at most this fraction above ERM's
    n_boot: int = 2000
    # α per architecture. DUST starts as ISTA from x̂_0 = 0, whose layers already cut the MSE by ~50 % each,
    # so α = 0.1 never binds there; UT starts at x̂_0 ≈ y, and (1 - α)^L must stay above f_L / f_0 ≈ 0.4.
    alpha: dict[str, float] = field(default_factory=lambda: {"ut": 0.1, "dust": 0.5})
    architectures: list[str] = field(default_factory=lambda: list(ARCHITECTURES))
    seeds: list[int] = field(default_factory=lambda: [0])
    gammas: list[float] = field(default_factory=lambda: [0.5, 1.0, 1.5, 2.0, 3.0])
    eval_batch_size: int = 250
    # Tiny models gain nothing from intra-op threads, and on a shared machine extra threads slow every step
    # many-fold (measured: 0.13 s vs 3.3 s per step with 2 threads on a loaded 2-core machine). 0: torch default.
    torch_threads: int = 1
    workers: int = 1  # jobs run in this many spawned processes (1: inline); results do not depend on it
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(max_steps=400, batch_size=64, log_every=25, progress=False)
    )

    def __post_init__(self) -> None:
        bad = [a for a in self.architectures if a not in ARCHITECTURES]
        if bad or not self.architectures:
            raise ConfigError(f"unknown or empty architectures {bad}; choose from {list(ARCHITECTURES)}")
        missing = [a for a in self.architectures if a not in self.alpha]
        if missing:
            raise ConfigError(f"alpha has no value for {missing}; set alpha.<arch>=0.1")
        known = [*self.specs, *self.frozen]
        unknown = [m for m in self.labels if m not in known]
        if unknown or not self.labels or "erm" not in self.labels:
            raise ConfigError(
                f"methods {unknown or self.labels} must name entries of specs or frozen {known}, "
                "erm included (every claim compares with it)"
            )
        for label, source in self.frozen.items():
            if label in self.labels and (source not in self.labels or source in self.frozen):
                raise ConfigError(f"frozen.{label}={source!r} must name a trained constrained label")
        if self.budget_check < 0 or 0 < self.budget_check <= 1:
            raise ConfigError(f"budget_check must be 0 (off) or > 1, got {self.budget_check}")
        if not self.lr_grid or not self.constraint_grid:
            raise ConfigError("lr_grid and constraint_grid need an entry each (constraint_grid: [''])")
        for arch in self.architectures:  # a bad spec or α fails here, before any run directory is made
            for label in self.trained_labels:
                for spec in self.candidates(label):
                    with_overrides(self.method_config(arch, label), spec)
            for label, source in self.frozen.items():
                if label in self.labels and not self.method_config(arch, source).constrained:
                    raise ConfigError(f"frozen.{label}: {source!r} is not a constrained method")
        if not self.seeds or 1.0 not in self.gammas or not any(g > 1.0 for g in self.gammas):
            raise ConfigError("need a seed, and gammas with 1.0 and a value above it, e.g. gammas=[1.0,2.0]")
        if self.data.crop % self.model.patch_size:
            raise ConfigError(f"data.crop={self.data.crop} must be a multiple of model.patch_size")
        if not self.data.val_frac > 0:
            raise ConfigError("data.val_frac must be > 0: every setting is chosen on validation")
        if bad := [k for k, v in self.grid.items() if k not in self.trained_labels or not v]:
            raise ConfigError(f"grid.{bad[0]}: needs a trained label of methods and at least one candidate")
        if unknown_b := [b for b in self.baselines if b not in BASELINES]:
            raise ConfigError(f"unknown baselines {unknown_b}; choose from {list(BASELINES)}")

    @property
    def labels(self) -> list[str]:
        return list(self.methods)

    @property
    def trained_labels(self) -> list[str]:
        """The labels with their own grid search (the frozen controls take their source's setting)."""
        return [label for label in self.labels if label not in self.frozen]

    def method_config(self, arch: str, label: str) -> MethodConfig:
        """The base method with this architecture's α, edited by the label's spec."""
        base = replace(self.method, constraint=replace(self.method.constraint, alpha=self.alpha[arch]))
        return with_overrides(base, self.specs[label])

    def candidates(self, label: str) -> list[str]:
        """The grid of ``label``: override specs applied after its method spec, in grid order."""
        if label in self.grid:
            return list(self.grid[label])
        constrained = with_overrides(self.method, self.specs[label]).constrained
        extra = self.constraint_grid if constrained else [""]
        return [f"optimizer.lr={lr:g} {c}".strip() for lr in self.lr_grid for c in extra]


CONFIG = VideoDenoisingConfig

PRESETS = {
    "quick": {
        "data.size": 72,
        "data.n_train": 2000,
        "data.n_val": 200,
        "data.n_test": 300,
        "model.depth": 4,
        "model.num_atoms": 144,
        "train.max_steps": 150,
        "train.batch_size": 32,
        "lr_grid": [3e-3],
        "constraint_grid": ["constraint.dual_lr=0.05"],
        "baseline_grid": {"nl-means": {"h": [0.1]}, "gaussian": {"sigma_t": [0.5, 1.0]}},
        "n_boot": 500,
        "budget_check": 0,
    },
    # see docs/results/video-denoising.md for its cost
    "full": {
        "seeds": [0, 1, 2],
        "model.depth": 4,
        "train.max_steps": 2000,
        "lr_grid": [1e-3, 3e-3, 1e-2, 3e-2],
        "workers": 2,
        "val_every": 100,
    },
}


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

        frozen_jobs, budget_jobs, base_steps = {}, {}, cfg.train.total_steps(len(data["train"]))
        long_steps = round(cfg.budget_check * base_steps)

        def then(group: tuple[str, str], i: int, per_seed: list[dict]) -> None:  # jobs needing a choice
            a, lab = group
            if failed := [ev["failed"] for ev in per_seed if "failed" in ev]:
                raise NumericalError(f"{a}-{lab}: the candidate chosen on validation failed: {failed[0]}")
            if lab == "erm" and cfg.budget_check:
                fl = f"erm-budget{cfg.budget_check:g}x"
                budget_jobs[a] = train(a, lab, None, cfg.candidates(lab)[i], seed0, fl=fl, steps=long_steps)
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
        extra={k: body[k] for k in ("claims", "baselines", "selection", "versus_baselines", "budget_check")},
    )
    return results.to_dict()
