"""video-denoising: UT and DUST trained with ERM, layer-wise descent constraints, and resilient constraints.

Claim under test (METHODS §1.6): trained at noise σ_train and tested at γ·σ_train, the constrained unrolled
model has lower RMSE at γ >= 1 while its in-distribution (γ = 1) RMSE is kept.

Protocol: grayscale clips (opencv's vtest.avi by default: a static surveillance camera, like UCSD / Avenue)
are resized, cut into sequences of T frames × crop × crop pixels, train and test from disjoint time ranges.
Every (architecture, method) pair trains from the same initialisation, on the same batches and noise
draws, for the same number of steps; every method is tested on the same noisy test clips at each γ.

Methods are one base :class:`MethodConfig` (``method``) edited by the override specs of ``methods``; the
job of (architecture, method label, seed) is named ``<arch>-<label>-seed<seed>``. The constraint's α is
per architecture (``alpha``): it is set on the base before a method's spec is applied, so a spec may still
set ``constraint.alpha`` itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import Tensor, nn

from descentlab.config import config_to_dict
from descentlab.constrained.config import DescentConfig
from descentlab.data.video import NoisyClips, add_noise, load_clips, split_sequences
from descentlab.errors import ConfigError
from descentlab.io import load_arrays
from descentlab.models.dust import DUST
from descentlab.models.unrolled import UnrolledTransformer
from descentlab.optim.config import OptimizerConfig
from descentlab.report.results import Curve, MethodResult, Results
from descentlab.report.stats import column_mean_std
from descentlab.report.video_denoising import SAMPLE_FRAMES, paired_table, rmse_table
from descentlab.robustness.video import denoise_frames, evaluate_denoiser
from descentlab.train.jobs import JobRunner
from descentlab.train.loop import TrainConfig, fit, seed_everything
from descentlab.train.recipe import MethodConfig, build_recipe, with_overrides
from descentlab.train.rundir import RunDir

ARCHITECTURES = ("ut", "dust")
# "deep-supervision" is a control: the mean of the per-layer losses f_1..f_L, i.e. the same per-layer signal
# as the constrained objective with fixed, equal weights instead of multipliers.
METHODS = {
    "erm": "",
    "constrained": "objective=constrained",
    "resilient": "objective=constrained constraint.resilient=true",
    "deep-supervision": "objective=deep-supervision",
}


@dataclass
class VideoDataConfig:
    video: str = "vtest"  # a clip name (vtest, bikes, ...) or a file / folder (UCSD, Avenue, ShanghaiTech)
    size: int = 96  # frame height after resizing (the width keeps the aspect)
    max_frames: int | None = None  # per clip
    max_clips: int | None = None
    num_frames: int = 8  # frames per sequence T
    crop: int = 8  # sequences are crop x crop pixels
    time_stride: int = 4
    test_frac: float = 0.25  # the last quarter of every clip is the test range
    n_train: int | None = 8000  # random subset of the train sequences (None: all)
    n_test: int = 1000
    sigma_train: float = 0.1  # noise std in [0, 1] pixel units (0.1 ≈ 25/255)


@dataclass
class UnrolledConfig:
    depth: int = 6
    width: int = 64
    heads: int = 4
    patch_size: int = 8  # = crop: one token per frame
    mlp_ratio: float = 2.0  # UT
    num_atoms: int = 256  # DUST dictionary size (a perfect square for the DCT initialisation)
    threshold_init: float = 0.02  # DUST
    causal: bool = False  # DUST frame attention


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
    methods: dict[str, str] = field(default_factory=lambda: dict(METHODS))  # label -> MethodConfig overrides
    run_methods: list[str] | None = None  # labels of `methods` to train, in this order (None: all)
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
        unknown = [m for m in self.labels if m not in self.methods]
        if unknown or not self.labels:
            raise ConfigError(
                f"run_methods {unknown or '[]'} must name entries of methods {list(self.methods)}"
            )
        for arch in self.architectures:  # a bad spec or α fails here, before any run directory is made
            for label in self.labels:
                self.method_config(arch, label)
        if not self.seeds or not self.gammas or 1.0 not in self.gammas:
            raise ConfigError(
                "need at least one seed and a gamma grid that contains 1.0, e.g. gammas=[1.0,2.0]"
            )
        if self.data.crop % self.model.patch_size:
            raise ConfigError(f"data.crop={self.data.crop} must be a multiple of model.patch_size")

    @property
    def labels(self) -> list[str]:
        return list(self.methods) if self.run_methods is None else list(self.run_methods)

    def method_config(self, arch: str, label: str) -> MethodConfig:
        """The base method with this architecture's α, edited by the label's spec."""
        base = replace(self.method, constraint=replace(self.method.constraint, alpha=self.alpha[arch]))
        return with_overrides(base, self.methods[label])


CONFIG = VideoDenoisingConfig

PRESETS = {
    "quick": {
        "data.size": 72,
        "data.n_train": 2000,
        "data.n_test": 500,
        "model.depth": 4,
        "model.num_atoms": 144,
        "train.max_steps": 150,
        "train.batch_size": 32,
    },
    "full": {"seeds": [0, 1, 2], "train.max_steps": 400},
}


def build_model(arch: str, cfg: VideoDenoisingConfig) -> nn.Module:
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


def noisy_test_clips(test: Tensor, cfg: VideoDenoisingConfig, seed: int) -> list[Tensor]:
    """The noisy test clips at each γ: level i is drawn from a generator seeded by ``(seed, i)``."""
    return [
        add_noise(test, g * cfg.data.sigma_train, generator=torch.Generator().manual_seed(10_007 * seed + i))
        for i, g in enumerate(cfg.gammas)
    ]


def train_and_evaluate(
    cfg: VideoDenoisingConfig, arch: str, label: str, seed: int, data: dict[str, Tensor], run: RunDir
) -> dict:
    """One job: train ``<arch>-<label>`` with ``seed``, evaluate it at every γ; seed 0's sample frames saved."""
    key = f"{arch}-{label}-seed{seed}"
    seed_everything(seed)  # the same initialisation for every method of an architecture
    model = build_model(arch, cfg)
    train = NoisyClips(data["train"], cfg.data.sigma_train)
    train_cfg = replace(cfg.train, seed=seed)
    recipe = build_recipe(
        cfg.method_config(arch, label),
        model,
        total_steps=train_cfg.total_steps(len(train)),
        loss_fn=final_mse,
    )
    start = time.perf_counter()
    fit(model, train, cfg=train_cfg, run=run, tag=key, **recipe.fit_kwargs())
    train_seconds = time.perf_counter() - start
    ev = evaluate_denoiser(
        model, data["test"], noisy_test_clips(data["test"], cfg, seed), batch_size=cfg.eval_batch_size
    )
    ev["train_seconds"] = train_seconds
    run.log(tag=key, eval_rmse=ev["rmse"], gammas=cfg.gammas)
    if seed == cfg.seeds[0]:
        frames = torch.stack([denoise_frames(model, y, cfg.data.crop) for y in data["sample_noisy"]])
        run.save_arrays(f"jobs/{key}-frames.npz", denoised=frames)
    return ev


def run(cfg: VideoDenoisingConfig, run: RunDir) -> dict:
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    d = cfg.data
    clips = load_clips(d.video, size=d.size, max_frames=d.max_frames, max_clips=d.max_clips)
    splits = split_sequences(
        clips, num_frames=d.num_frames, crop=d.crop, test_frac=d.test_frac, time_stride=d.time_stride
    )
    pick = torch.Generator().manual_seed(1234)
    train = splits["train"][torch.randperm(len(splits["train"]), generator=pick)[: d.n_train]]
    test = splits["test"][torch.randperm(len(splits["test"]), generator=pick)[: d.n_test]]
    # Whole frames from the start of the first clip's test range, for the sample-frame figure.
    cut = round((1.0 - d.test_frac) * clips[0].shape[0])
    sample_clean = clips[0][cut : cut + d.num_frames]
    sample_gammas = [1.0, max(cfg.gammas)]
    gen = torch.Generator().manual_seed(99)
    sample_noisy = torch.stack(
        [add_noise(sample_clean, g * d.sigma_train, generator=gen) for g in sample_gammas]
    )
    data = {"train": train, "test": test, "sample_noisy": sample_noisy}

    jobs = [(seed, arch, label) for seed in cfg.seeds for arch in cfg.architectures for label in cfg.labels]
    per_seed: dict[str, list[dict]] = {}  # method -> per-seed evaluations, in seed order
    threads = max(cfg.torch_threads, 1)
    with JobRunner(
        train_and_evaluate, workers=cfg.workers, cache_dir=run.path / "jobs", threads=threads
    ) as runner:
        futures = [
            (
                f"{arch}-{label}",
                runner.submit(f"{arch}-{label}-seed{seed}", cfg, arch, label, seed, data, run),
            )
            for seed, arch, label in jobs
        ]
        for method, future in futures:
            per_seed.setdefault(method, []).append(future.result())

    methods = {m: _method_result(evs, cfg) for m, evs in per_seed.items()}
    method_dicts = {m: r.to_dict() for m, r in methods.items()}
    noisy_mean, _ = column_mean_std([ev["noisy_rmse"] for ev in next(iter(per_seed.values()))])
    seed0 = cfg.seeds[0]
    run.save_arrays(
        SAMPLE_FRAMES,
        clean=sample_clean,
        noisy=sample_noisy,
        gammas=np.asarray(sample_gammas),
        seed=np.asarray(seed0),
        methods=np.asarray(list(methods)),
        denoised=np.stack(
            [load_arrays(run.path / f"jobs/{m}-seed{seed0}-frames.npz")["denoised"] for m in methods]
        ),
    )
    results = Results(
        experiment="video-denoising",
        config=config_to_dict(cfg),
        protocol={
            "dataset": d.video,
            "frames": f"{len(clips)} clip(s), resized to height {d.size}, {d.num_frames}-frame sequences of "
            f"{d.crop}x{d.crop} pixels",
            "split": f"time: first {1 - d.test_frac:.0%} of each clip train, last {d.test_frac:.0%} test",
            "n_train": len(train),
            "n_eval": len(test),
            "sigma_train": d.sigma_train,
            "gammas": list(cfg.gammas),
            "seeds": list(cfg.seeds),
            "draws": 1,
            "steps": cfg.train.total_steps(len(train)),
            "batch_size": cfg.train.batch_size,
            "noise": "additive Gaussian on pixels in [0, 1], test level gamma * sigma_train",
        },
        methods=methods,
        tables=[
            rmse_table(method_dicts, noisy_mean, cfg.gammas),
            paired_table({m: [ev["rmse"] for ev in evs] for m, evs in per_seed.items()}, cfg.gammas),
        ],
        notes=[
            "RMSE in [0, 1] pixel units over all test pixels; the noisy input's RMSE is gamma * sigma_train.",
            "layer_loss is the test MSE of each layer's estimate (index 0: the initial iterate; DUST's is D·0).",
        ],
    )
    return results.to_dict()


def _method_result(evs: list[dict], cfg: VideoDenoisingConfig) -> MethodResult:
    """Mean ± std over seeds of one method's RMSE curve; per-layer MSE at γ = 1 and at the largest γ."""
    mean, std = column_mean_std([ev["rmse"] for ev in evs], ddof=1, impl="torch")
    one = cfg.gammas.index(1.0)
    ood = [i for i, g in enumerate(cfg.gammas) if g > 1.0]
    layer = {
        f"gamma={gamma:g}": column_mean_std([ev["layer_mse"][i] for ev in evs], ddof=1, impl="torch")[0]
        for i, gamma in enumerate(cfg.gammas)
        if gamma in (1.0, max(cfg.gammas))
    }
    curve = Curve("gamma", list(cfg.gammas), "rmse", mean, std, extra={"summary": sum(mean) / len(mean)})
    return MethodResult(
        metrics={
            "rmse_in_distribution": mean[one],
            "rmse_mean_gamma_gt_1": sum(mean[i] for i in ood) / max(len(ood), 1),
            "train_seconds": sum(ev["train_seconds"] for ev in evs) / len(evs),
        },
        curves={"gaussian": curve},
        layer_loss=layer,
    )
