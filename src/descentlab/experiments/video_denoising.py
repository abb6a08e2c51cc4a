"""video-denoising: UT and DUST trained with ERM, layer-wise descent constraints, and resilient constraints.

Claim under test (METHODS §1.6): trained at noise σ_train and tested at γ·σ_train, the constrained unrolled
model has lower RMSE at γ >= 1 while its in-distribution (γ = 1) RMSE is kept.

Protocol: grayscale clips (opencv's vtest.avi by default: a static surveillance camera, like UCSD / Avenue)
are resized, cut into sequences of T frames × crop × crop pixels, train and test from disjoint time ranges.
Every (architecture, objective) pair trains from the same initialisation, on the same batches and noise
draws, for the same number of steps; every method is tested on the same noisy test clips at each γ.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from descentlab.constrained.descent import LayerwiseDescent
from descentlab.constrained.dual import Resilience
from descentlab.constrained.primal_dual import PrimalDual
from descentlab.data.video import NoisyClips, add_noise, load_clips, split_sequences
from descentlab.errors import ConfigError
from descentlab.experiments.base import seed_everything
from descentlab.experiments.video_denoising_figures import plot_layer_profiles, plot_relative, plot_samples
from descentlab.models.dust import DUST
from descentlab.models.unrolled import UnrolledOutput, UnrolledTransformer
from descentlab.readout import layer_losses
from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import ERM, Constrained
from descentlab.train.rundir import RunDir

ARCHITECTURES = ("ut", "dust")
# "deep-supervision" is a control: ERM on the mean of the per-layer losses f_1..f_L, i.e. the same per-layer
# signal as the constrained objective with fixed, equal weights instead of multipliers.
OBJECTIVES = ("erm", "constrained", "resilient", "deep-supervision")


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


@dataclass
class ConstraintConfig:
    # α per architecture. DUST starts as ISTA from x̂_0 = 0, whose layers already cut the MSE by ~50 % each,
    # so α = 0.1 never binds there; UT starts at x̂_0 ≈ y, and (1 - α)^L must stay above f_L / f_0 ≈ 0.4.
    alpha: dict[str, float] = field(default_factory=lambda: {"ut": 0.1, "dust": 0.5})
    dual_lr: float = 0.05
    form: str = "ratio"  # MSE shrinks by orders of magnitude across layers: the ratio form is scale-free
    # Without it the constraint raises f_0 (UT's f_0 grew 6x in 20 steps in a pilot): f_0 has weight
    # -(1 - α) λ_1 in the Lagrangian. Detached, every constraint only pushes its own layer down.
    detach_prev: bool = True
    constrain_first: bool = True
    resilience_penalty: float = 1.0
    resilience_lr: float | None = None  # None: 1/penalty


@dataclass
class VideoDenoisingConfig:
    data: VideoDataConfig = field(default_factory=VideoDataConfig)
    model: UnrolledConfig = field(default_factory=UnrolledConfig)
    constraint: ConstraintConfig = field(default_factory=ConstraintConfig)
    architectures: list[str] = field(default_factory=lambda: list(ARCHITECTURES))
    objectives: list[str] = field(default_factory=lambda: list(OBJECTIVES))
    lr: float = 3e-3
    weight_decay: float = 0.0
    seeds: list[int] = field(default_factory=lambda: [0])
    gammas: list[float] = field(default_factory=lambda: [0.5, 1.0, 1.5, 2.0, 3.0])
    eval_batch_size: int = 250
    # Tiny models gain nothing from intra-op threads, and on a shared machine extra threads slow every step
    # many-fold (measured: 0.13 s vs 3.3 s per step with 2 threads on a loaded 2-core machine). 0: torch default.
    torch_threads: int = 1
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(max_steps=400, batch_size=64, log_every=25, progress=False)
    )

    def __post_init__(self) -> None:
        missing = [a for a in self.architectures if a not in self.constraint.alpha]
        if missing:
            raise ConfigError(f"constraint.alpha has no value for {missing}; set constraint.alpha.<arch>=0.1")
        bad = [a for a in self.architectures if a not in ARCHITECTURES]
        bad += [o for o in self.objectives if o not in OBJECTIVES]
        if bad or not self.architectures or not self.objectives:
            raise ConfigError(
                f"unknown or empty architectures/objectives {bad}; choose from {ARCHITECTURES} and {OBJECTIVES}"
            )
        if self.lr <= 0 or not self.seeds or not self.gammas or 1.0 not in self.gammas:
            raise ConfigError("need lr > 0, at least one seed, and a gamma grid that contains 1.0")
        if self.data.crop % self.model.patch_size:
            raise ConfigError(f"data.crop={self.data.crop} must be a multiple of model.patch_size")


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
    if arch == "ut":
        return UnrolledTransformer(
            image_size=d.crop,
            num_frames=d.num_frames,
            patch_size=m.patch_size,
            depth=m.depth,
            width=m.width,
            heads=m.heads,
            mlp_ratio=m.mlp_ratio,
        )
    return DUST(
        image_size=d.crop,
        num_frames=d.num_frames,
        patch_size=m.patch_size,
        num_atoms=m.num_atoms,
        depth=m.depth,
        width=m.width,
        heads=m.heads,
        causal=m.causal,
        threshold_init=m.threshold_init,
    )


def final_mse(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    return nn.functional.mse_loss(model(batch["noisy"]).final, batch["target"])


def mean_layer_mse(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    return layer_losses(model, batch)[1:].mean()


def make_training(arch: str, objective: str, model: nn.Module, cfg: VideoDenoisingConfig):
    """The objective and optimizer of one method; every method uses AdamW with the same settings."""
    adamw = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    if objective == "erm":
        return ERM(final_mse), adamw
    if objective == "deep-supervision":
        return ERM(mean_layer_mse), adamw
    c = cfg.constraint
    resilience = None
    if objective == "resilient":
        resilience = Resilience(penalty=c.resilience_penalty, lr=c.resilience_lr)
    constraint = LayerwiseDescent(
        num_layers=model.num_layers,
        alpha=c.alpha[arch],
        dual_lr=c.dual_lr,
        resilience=resilience,
        form=c.form,
        detach_prev=c.detach_prev,
        constrain_first=c.constrain_first,
    )
    return Constrained(constraint), PrimalDual(adamw, constraint)


@torch.no_grad()
def evaluate(
    model: nn.Module, clean: Tensor, gammas: list[float], sigma: float, seed: int, batch_size: int
) -> dict[str, list]:
    """RMSE of the final estimate and the MSE at every layer, at each noise level γσ.

    The noise of level index i is drawn from a generator seeded by ``(seed, i)``, so every method sees the
    same noisy test clips.
    """
    model.eval()
    rmse, noisy_rmse, layer_mse = [], [], []
    for i, gamma in enumerate(gammas):
        noisy = add_noise(clean, gamma * sigma, generator=torch.Generator().manual_seed(10_007 * seed + i))
        sse = None
        for s in range(0, len(clean), batch_size):
            out: UnrolledOutput = model(noisy[s : s + batch_size])
            err = (out.layer_estimates - clean[s : s + batch_size]).pow(2).flatten(1).sum(1)
            sse = err if sse is None else sse + err
        per_layer = (sse / clean.numel()).tolist()
        layer_mse.append(per_layer)
        rmse.append(math.sqrt(per_layer[-1]))
        noisy_rmse.append(float((noisy - clean).pow(2).mean().sqrt()))
    return {"rmse": rmse, "noisy_rmse": noisy_rmse, "layer_mse": layer_mse}


def _mean_std(rows: list[list[float]]) -> tuple[list[float], list[float]]:
    t = torch.tensor(rows, dtype=torch.float64)
    std = t.std(0) if len(rows) > 1 else torch.zeros(t.shape[1], dtype=torch.float64)
    return t.mean(0).tolist(), std.tolist()


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
    gamma_one = cfg.gammas.index(1.0)

    # Whole frames from the start of the first clip's test range, for the sample-frame figure.
    cut = round((1.0 - d.test_frac) * clips[0].shape[0])
    sample_clean = clips[0][cut : cut + d.num_frames]
    sample_gammas = [1.0, max(cfg.gammas)]
    gen = torch.Generator().manual_seed(99)
    sample_noisy = [add_noise(sample_clean, g * d.sigma_train, generator=gen) for g in sample_gammas]

    results: dict[str, list[dict[str, list]]] = {}  # method -> per-seed evaluations
    samples: dict[str, Tensor] = {}  # method -> [len(sample_gammas), T, H, W]
    for seed in cfg.seeds:
        for arch in cfg.architectures:
            for objective in cfg.objectives:
                method = f"{arch}-{objective}"
                seed_everything(seed)  # the same initialisation for every objective of an architecture
                model = build_model(arch, cfg)
                loss_fn, optimizer = make_training(arch, objective, model, cfg)
                steps = cfg.train.max_steps or cfg.train.epochs * math.ceil(len(train) / cfg.train.batch_size)
                scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
                start = time.perf_counter()
                fit(
                    model,
                    NoisyClips(train, d.sigma_train),
                    objective=loss_fn,
                    optimizer=optimizer,
                    cfg=TrainConfig(**{**vars(cfg.train), "seed": seed}),
                    scheduler=scheduler,
                    run=run,
                    tag=f"{method}-seed{seed}",
                )
                train_seconds = time.perf_counter() - start
                ev = evaluate(model, test, cfg.gammas, d.sigma_train, seed, cfg.eval_batch_size)
                ev["train_seconds"] = train_seconds
                run.log(tag=f"{method}-seed{seed}", eval_rmse=ev["rmse"], gammas=cfg.gammas)
                results.setdefault(method, []).append(ev)
                if seed == cfg.seeds[0]:
                    samples[method] = torch.stack([denoise_frames(model, y, d.crop) for y in sample_noisy])

    methods = {m: _method_block(evs, cfg) for m, evs in results.items()}
    noisy_mean, _ = _mean_std([ev["noisy_rmse"] for ev in next(iter(results.values()))])
    figures = [
        plot_relative(
            methods, cfg.architectures, cfg.objectives, cfg.gammas, run.figure("rmse-relative-to-erm")
        ),
        plot_layer_profiles(methods, ARCHITECTURES, run.figure("layer-mse-log")),
        plot_samples(
            samples,
            sample_clean,
            sample_noisy,
            sample_gammas,
            cfg.architectures,
            cfg.objectives,
            cfg.seeds[0],
            run.figure("sample-frames"),
        ),
    ]
    return {
        "protocol": {
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
            "steps": cfg.train.max_steps,
            "batch_size": cfg.train.batch_size,
            "noise": "additive Gaussian on pixels in [0, 1], test level gamma * sigma_train",
        },
        "methods": methods,
        "tables": [_rmse_table(methods, noisy_mean, cfg), _paired_table(results, cfg, gamma_one)],
        "figures": figures,
        "notes": [
            "RMSE in [0, 1] pixel units over all test pixels; the noisy input's RMSE is gamma * sigma_train.",
            "layer_loss is the test MSE of each layer's estimate (index 0: the initial iterate; DUST's is D·0).",
        ],
    }


@torch.no_grad()
def denoise_frames(model: nn.Module, noisy: Tensor, tile: int) -> Tensor:
    """Denoise whole frames ``[T, H, W]`` tile by tile (non-overlapping ``tile x tile`` sequences).

    H and W are cropped to multiples of ``tile``.
    """
    model.eval()
    t, h, w = noisy.shape
    nh, nw = h // tile, w // tile
    x = noisy[:, : nh * tile, : nw * tile].reshape(t, nh, tile, nw, tile).permute(1, 3, 0, 2, 4)
    out = model(x.reshape(nh * nw, t, tile, tile)).final
    return out.reshape(nh, nw, t, tile, tile).permute(2, 0, 3, 1, 4).reshape(t, nh * tile, nw * tile)


def _method_block(evs: list[dict[str, list]], cfg: VideoDenoisingConfig) -> dict:
    mean, std = _mean_std([ev["rmse"] for ev in evs])
    one = cfg.gammas.index(1.0)
    ood = [i for i, g in enumerate(cfg.gammas) if g > 1.0]
    layer = {}
    for i, gamma in enumerate(cfg.gammas):
        if gamma in (1.0, max(cfg.gammas)):
            layer[f"gamma={gamma:g}"], _ = _mean_std([ev["layer_mse"][i] for ev in evs])
    return {
        "metrics": {
            "rmse_in_distribution": mean[one],
            "rmse_mean_gamma_gt_1": sum(mean[i] for i in ood) / max(len(ood), 1),
            "train_seconds": sum(ev["train_seconds"] for ev in evs) / len(evs),
        },
        "curves": {
            "gaussian": {
                "x_name": "gamma",
                "x": list(cfg.gammas),
                "metric": "rmse",
                "mean": mean,
                "std": std,
                "summary": sum(mean) / len(mean),
            }
        },
        "layer_loss": layer,
    }


def _rmse_table(methods: dict, noisy: list[float], cfg: VideoDenoisingConfig) -> dict:
    rows = [["noisy input", *[f"{v:.4f}" for v in noisy]]]
    for m, block in methods.items():
        c = block["curves"]["gaussian"]
        rows.append([m, *[f"{a:.4f} ± {s:.4f}" for a, s in zip(c["mean"], c["std"], strict=True)]])
    return {
        "title": "Test RMSE vs gamma (mean ± std over seeds)",
        "columns": ["method", *map(str, cfg.gammas)],
        "rows": rows,
    }


def _paired_table(results: dict, cfg: VideoDenoisingConfig, one: int) -> dict:
    """RMSE(method) - RMSE(ERM) of the same architecture and seed; negative = better than ERM."""
    rows = []
    for arch in cfg.architectures:
        base = results.get(f"{arch}-erm")
        for objective in cfg.objectives:
            evs = results.get(f"{arch}-{objective}")
            if base is None or evs is None or objective == "erm":
                continue
            diffs = [
                [a - b for a, b in zip(e["rmse"], r["rmse"], strict=True)]
                for e, r in zip(evs, base, strict=True)
            ]
            mean, std = _mean_std(diffs)
            wins = [sum(d[i] < 0 for d in diffs) for i in range(len(cfg.gammas))]
            rows.append(
                [
                    f"{arch}-{objective}",
                    *[
                        f"{m:+.4f} ± {s:.4f} ({w}/{len(diffs)})"
                        for m, s, w in zip(mean, std, wins, strict=True)
                    ],
                ]
            )
    return {
        "title": "Paired RMSE difference to ERM of the same architecture and seed (negative = lower RMSE; "
        "in brackets: seeds where it beats ERM)",
        "columns": ["method", *map(str, cfg.gammas)],
        "rows": rows,
    }
