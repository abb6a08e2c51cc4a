"""robust-sparse: layer-wise descent constraints with HORST as the primal optimizer, then magnitude pruning.

Robust and sparse at once? Each method fine-tunes a pretrained encoder classifier (mean pooling, as
text-robustness) with an objective (ERM, hard constraints or their resilient relaxation) and a primal
optimizer (HORST, or AdamW as the baseline), optionally under AC/DC. The trained model is then pruned
one-shot by magnitude at every requested sparsity s, each time from the trained weights and with no
fine-tuning after pruning, and every pruned copy is evaluated for accuracy against the embedding-noise level
γ (noise of variance (γ σ_E)² on the embedding output, keyed to content, so every method and sparsity sees
the same noisy inputs). ``erm-noise-horst`` (ERM on Gaussian embedding noise, ``train_noise``) is the
positive control of robustness.

The claims (``report.robust_sparse_claims``) are paired bootstrap CIs over (seed, draw, review) cells of the
per-review correctness, which the run saves in ``arrays/examples.npz``.

Methods are :class:`~descentlab.train.recipe.MethodConfig` s: one base (``method``) edited by each label's
override spec in ``specs``; ``methods`` lists the labels to run.

Evaluation is over the whole test split under any launcher: each rank evaluates its share of the batches
and the counts (and per-review values) are gathered (:mod:`descentlab.distributed`), so a ``torchrun`` run
reports the same numbers as one process.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from descentlab.constrained.config import DescentConfig
from descentlab.data.text_batches import TextDataConfig, prepare_data
from descentlab.errors import ConfigError
from descentlab.experiments._robust_sparse_jobs import JobResult, decode_job, encode_job, train_and_sweep
from descentlab.optim.config import OptimizerConfig
from descentlab.report import robust_sparse_claims as claims_report
from descentlab.report.results import Curve, MethodResult, Results
from descentlab.report.robust_sparse import accuracy_tables, summary_notes
from descentlab.report.stats import column_mean_std, mean_std
from descentlab.robustness import RobustnessCurves
from descentlab.robustness.config import NoiseEvalConfig
from descentlab.train.jobs import JobRunner
from descentlab.train.loop import TrainConfig
from descentlab.train.recipe import MethodConfig, methods_from_specs
from descentlab.train.rundir import RunDir

SCOPES = ("layer", "global")
EXAMPLE_ARRAYS = "arrays/examples.npz"  # "<method>__s=<s>": correctness [seed, draw, γ, example]; "gammas"

# AdamW has no mirror step: the base's HORST strengths are dropped, not silently ignored
_ADAMW = "optimizer.name=adamw optimizer.alpha=null optimizer.beta=null"
_CONSTRAINED = "objective=constrained"
_RESILIENT = "objective=constrained constraint.resilient=true"

# label -> override spec of the base ``method`` (dotted MethodConfig keys, see train/recipe.py);
# "erm-noise-horst" is ERM on Gaussian embedding noise (``train_noise``): the positive control of robustness
METHOD_SPECS: dict[str, str] = {
    "erm-horst": "",
    "constrained-horst": _CONSTRAINED,
    "resilient-horst": _RESILIENT,
    "erm-adamw": _ADAMW,
    "constrained-adamw": f"{_CONSTRAINED} {_ADAMW}",
    "resilient-adamw": f"{_RESILIENT} {_ADAMW}",
    "erm-noise-horst": "",
}


def base_method() -> MethodConfig:
    """ERM with HORST (α = 3, β = 0) on every tensor's decay, and the constraint a constrained spec turns on.

    α = 3: at |θ| ~ 0.03-0.05, α = 1 adds only 3-5 % to AdamW's step, too little for the L1 bias to show
    (METHODS.md §4.2); 3 is what sparse-lm's validation search chose (its grid {1, 3, 10}). Fixed before the
    full run, not tuned here: a quick-preset run at α = 10 (19 steps) scored 14 points below AdamW. The
    constraint is text-robustness's (chosen there on
    validation, on the same data): ``detach_prev`` (every loss weight >= 0, nothing met by making an earlier
    layer worse), layer 1 unconstrained (the layer-0 readout of a BERT encoder is nearly input-independent),
    α_l = 0.03 (feasible over 6 layers), dual step 0.1, no λ ceiling (METHODS.md §4.1).
    """
    return MethodConfig(
        objective="erm",
        optimizer=OptimizerConfig(
            name="horst", lr=5e-5, weight_decay=0.01, alpha=3.0, beta=0.0, decay="all", mirror="matrices"
        ),
        constraint=DescentConfig(
            alpha=0.03, dual_lr=0.1, detach_prev=True, constrain_first=False, max_multiplier=None, penalty=1.0
        ),
    )


@dataclass
class PruningSweep:
    """One-shot magnitude pruning of the trained weights at each sparsity (each from the trained weights)."""

    sparsities: list[float] = field(default_factory=lambda: [0.0, 0.3, 0.5, 0.6, 0.7])
    scope: str = "layer"  # one threshold per matrix ("layer") or one over all block Linears ("global")


@dataclass
class RobustSparseConfig:
    model: str = "minilm"  # offline MiniLM-L6; or any HF encoder classifier id / local dir
    pooling: str = "mean"  # "mean" (all-MiniLM's pre-training pooling + linear head) or "cls" (BERT's pooler)
    method: MethodConfig = field(default_factory=base_method)
    specs: dict[str, str] = field(default_factory=lambda: dict(METHOD_SPECS))
    methods: list[str] = field(
        default_factory=lambda: [
            "erm-horst", "constrained-horst", "erm-adamw", "constrained-adamw", "erm-noise-horst"
        ]
    )  # fmt: skip
    # label -> γ_train: trained on Gaussian embedding noise at that level (fresh noise every step)
    train_noise: dict[str, float] = field(default_factory=lambda: {"erm-noise-horst": 1.0})
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    data: TextDataConfig = field(default_factory=lambda: TextDataConfig(n_train=2000, n_eval=800))
    pruning: PruningSweep = field(default_factory=PruningSweep)
    evaluation: NoiseEvalConfig = field(
        default_factory=lambda: NoiseEvalConfig(kinds=["gaussian"], gammas=[0.0, 1.0, 2.0], draws=2)
    )
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(epochs=2, batch_size=32, log_every=10, group_by_length=50)
    )
    n_boot: int = 2000
    workers: int = 1  # >1: run the (method, seed) jobs in that many 1-thread processes (same numbers)

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in self.specs]
        if not self.methods or unknown:
            raise ConfigError(
                f"methods must list labels of specs ({sorted(self.specs)}), got {self.methods}; define a new "
                "one with specs.NAME='objective=constrained optimizer.alpha=10' and add NAME to methods"
            )
        self.method_configs()  # a bad spec fails here, before a run directory exists
        if self.pooling not in ("cls", "mean"):
            raise ConfigError(f"pooling must be 'cls' or 'mean', got {self.pooling!r}")
        bad_noise = {k: v for k, v in self.train_noise.items() if not v > 0}
        if bad_noise:
            raise ConfigError(f"train_noise levels must be > 0, got {bad_noise}")
        if not self.seeds:
            raise ConfigError("seeds must list at least one training seed")
        p = self.pruning
        if not p.sparsities or any(not 0.0 <= s < 1.0 for s in p.sparsities):
            raise ConfigError(f"pruning.sparsities must be values in [0, 1), got {p.sparsities}")
        if p.sparsities[0] != 0.0:
            raise ConfigError(f"pruning.sparsities must start at 0 (the dense model), got {p.sparsities}")
        if p.scope not in SCOPES:
            raise ConfigError(f"pruning.scope must be one of {SCOPES}, got {p.scope!r}")
        if not any(g >= 1.0 for g in self.evaluation.gammas):
            raise ConfigError(
                f"evaluation.gammas needs a level >= 1 (robust accuracy), got {self.evaluation.gammas}"
            )
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if self.n_boot < 100:
            raise ConfigError(f"n_boot must be >= 100 bootstrap replicates, got {self.n_boot}")

    def method_configs(self) -> dict[str, MethodConfig]:
        """The methods to run, in order: ``{label: base method edited by specs[label]}``."""
        return methods_from_specs(self.method, {m: self.specs[m] for m in self.methods})


CONFIG = RobustSparseConfig

PRESETS = {
    "quick": {
        "methods": ["erm-horst", "constrained-horst", "erm-adamw"],
        "seeds": [0],
        "method.optimizer.lr": 1e-4,
        "data.n_train": 600,
        "data.n_eval": 200,
        "train.epochs": 1,
        "evaluation.draws": 1,
        "pruning.sparsities": [0.0, 0.5, 0.7],
        "n_boot": 500,
        "workers": 2,
    },
    # 5 methods x 3 seeds on 2,000 / 800 reviews, 2 epochs, 5 sparsities x γ {0, 1, 2} x 2 draws; <= 60 min
    # on 2 idle cores (a pilot job on one thread: 1 min 41 s of training, 3 min 39 s of evaluation)
    "full": {
        "workers": 2,  # 1-thread processes; the numbers do not depend on it
        "train.progress": False,
    },
}


def method_result(
    per_seed: list[JobResult], levels: list[float], ev: NoiseEvalConfig
) -> tuple[MethodResult, list[RobustnessCurves]]:
    """One method's block (and its curves per level, seeds joined): a γ-curve per sparsity, and accuracy
    against the sparsity reached at γ = 0 and every γ >= 1.

    Metrics: clean accuracy and the mean over the γ grid at every level (``accuracy@s=0.5``,
    ``gaussian_mean_over_grid@s=0.5``); std is over (seed, draw) pairs (ddof 0, numpy, as the tables).
    """
    joined = [RobustnessCurves.concat([job.points[i].curve for job in per_seed]) for i in range(len(levels))]
    reached = [
        mean_std([job.points[i].reached for job in per_seed], ddof=0, impl="numpy")[0]
        for i in range(len(levels))
    ]
    result = MethodResult()
    for s, curve in zip(levels, joined, strict=True):
        for kind, block in curve.curves().items():
            result.curves[f"{kind}@s={s:g}"] = Curve.from_dict(block)
        clean = curve.values[ev.kinds[0]][:, 0, 0]  # [seeds]: every draw is the clean input at γ = 0
        result.metrics[f"accuracy@s={s:g}"] = mean_std(clean, ddof=0, impl="numpy")[0]
        for kind, over_grid in curve.summary().items():
            result.metrics[f"{kind}_mean_over_grid@s={s:g}"] = over_grid
    result.metrics["accuracy"] = result.metrics[f"accuracy@s={levels[0]:g}"]
    for kind in ev.kinds:
        for gamma in [0.0, *[g for g in ev.gammas if g >= 1.0]]:
            g = list(ev.gammas).index(gamma)
            stats = [mean_std(c.values[kind][..., g].reshape(-1), ddof=0, impl="numpy") for c in joined]
            result.curves[f"{kind}@gamma={gamma:g}_vs_sparsity"] = Curve(
                "sparsity", reached, "accuracy", [m for m, _ in stats], [sd for _, sd in stats]
            )
    result.layer_loss = {
        f"clean@s={s:g}": column_mean_std([job.points[i].profile for job in per_seed], impl="numpy")[0]
        for i, s in enumerate(levels)
    }
    result.sparsity = {
        "global": reached[-1],
        **{f"reached@s={s:g}": r for s, r in zip(levels, reached, strict=True)},
    }
    multipliers = [job.multipliers for job in per_seed if job.multipliers is not None]
    if multipliers:
        result.extra["multipliers"] = column_mean_std(multipliers, impl="numpy")[0]
    return result, joined


def example_arrays(correct: dict[str, list[np.ndarray]], levels: list[float]) -> dict[str, np.ndarray]:
    """``"<method>__s=<s>"`` -> 0/1 correctness ``[seed, draw, γ, example]`` as uint8 (exact, small)."""
    return {
        f"{label}__s={s:g}": np.asarray(per_level[i]).astype(np.uint8)
        for label, per_level in correct.items()
        for i, s in enumerate(levels)
    }


def erm_baselines(methods: dict[str, MethodConfig]) -> list[tuple[str, str]]:
    """``(method, baseline)`` pairs: each non-ERM method against the first ERM method that differs from it
    in the objective only (same optimizer, same AC/DC)."""
    pairs = []
    for label, m in methods.items():
        if m.objective == "erm":
            continue
        same = [
            b
            for b, e in methods.items()
            if e.objective == "erm" and (e.optimizer, e.acdc) == (m.optimizer, m.acdc)
        ]
        if same:
            pairs.append((label, same[0]))
    return pairs


def run(cfg: RobustSparseConfig, run: RunDir) -> dict:
    d, ev, p = cfg.data, cfg.evaluation, cfg.pruning
    data = prepare_data(d, cfg.model)
    methods = cfg.method_configs()

    # 1. every (method, seed): train, prune at every sparsity, evaluate; finished jobs come from run/jobs
    with JobRunner(
        train_and_sweep,
        workers=cfg.workers,
        cache_dir=run.path / "jobs",
        encode=encode_job,
        decode=decode_job,
    ) as jobs:
        futures = {
            (label, seed): jobs.submit(f"{label}-seed{seed}", cfg, label, seed, data, run)
            for seed in cfg.seeds
            for label in methods
        }
        done = {label: [futures[label, seed].result() for seed in cfg.seeds] for label in methods}

    # 2. results in the DESIGN shape; tables pair each constrained method with ERM on the same optimizer
    levels, kind = list(p.sparsities), ev.kinds[0]
    blocks = {label: method_result(done[label], levels, ev) for label in methods}
    methods_out = {label: result.to_dict() for label, (result, _) in blocks.items()}
    values = {label: [c.values[kind] for c in joined] for label, (_, joined) in blocks.items()}
    tables = accuracy_tables(methods_out, values, erm_baselines(methods), levels, kind, ev.gammas, cfg.n_boot)

    # 3. the claims, from the per-review correctness (saved, so that every interval can be recomputed)
    correct = {label: [c.examples[kind] for c in joined] for label, (_, joined) in blocks.items()}
    run.save_arrays(EXAMPLE_ARRAYS, **example_arrays(correct, levels), gammas=np.asarray(ev.gammas))
    claims = claims_report.evaluate_claims(correct, levels, ev.gammas, n_boot=cfg.n_boot)
    if claims:
        tables.insert(0, claims_report.claims_table(claims))
    train, opt = cfg.train, cfg.method.optimizer
    acdc = {label: asdict(m.acdc) for label, m in methods.items() if m.acdc is not None}
    protocol = {
        "dataset": d.name,
        "model": cfg.model,
        "split": "test",
        "n_train": len(data.train),
        "n_eval": int(done[cfg.methods[0]][0].points[0].curve.protocol["n_eval"]),
        "seeds": list(cfg.seeds),
        "draws": ev.draws,
        "kinds": list(ev.kinds),
        "gammas": list(ev.gammas),
        "noise": "on the input-embedding output, variance (γ σ_E)² per coordinate, σ_E = RMS of the embedding "
        "matrix; content-keyed, identical across methods and sparsities",
        "noise_seed": ev.noise_seed,
        "budget": f"{train.epochs} epoch(s) (max_steps={train.max_steps}), batch {train.batch_size}, "
        f"lr {opt.lr}, weight decay {opt.weight_decay}, max_length {d.max_length}",
        "methods": {label: cfg.specs[label] or "(the base method)" for label in methods},
        "optimizer": asdict(opt),
        "constraint": asdict(cfg.method.constraint),
        "constraint_selection": "text-robustness's constraint (chosen there on validation, same data); HORST "
        "alpha = 3 fixed before the run (sparse-lm's validation choice; METHODS.md 4.2); nothing tuned here",
        "pooling": cfg.pooling,
        "train_noise": dict(cfg.train_noise),
        "claims": f"paired bootstrap over (seed, draw, review) cells, {cfg.n_boot} replicates; robust accuracy "
        "= mean over gamma >= 1; see report/robust_sparse_claims.py",
        "pruning": f"one-shot magnitude pruning, scope={p.scope}, of the Linear weights inside the encoder blocks "
        "(embeddings, pooler and head stay dense), each level from the trained weights, no fine-tuning after",
        "acdc": acdc or None,
        "evaluation": "whole test split; under torchrun each rank evaluates a share, and counts and per-review "
        "values are gathered",
    }
    return Results(
        experiment="robust-sparse",
        protocol=protocol,
        methods={label: result for label, (result, _) in blocks.items()},
        tables=tables,
        notes=[*claims_report.claim_notes(claims), *summary_notes(methods_out, levels, kind)],
        extra={"claims": claims},
    ).to_dict()
