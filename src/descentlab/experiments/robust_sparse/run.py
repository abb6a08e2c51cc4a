"""robust-sparse: layer-wise descent constraints with HORST as the primal optimizer, then magnitude pruning.

Robust and sparse at once? Each method fine-tunes a pretrained encoder classifier (mean pooling, as
text-robustness) with an objective (ERM, hard constraints or their resilient relaxation) and a primal
optimizer (HORST, or AdamW as the baseline), optionally under AC/DC. The trained model is then pruned
one-shot by magnitude at every requested sparsity s, each time from the trained weights and with no
fine-tuning after pruning, and every pruned copy is evaluated for accuracy against the embedding-noise level
γ (noise of variance (γ σ_E)² on the embedding output, keyed to content, so every method and sparsity sees
the same noisy inputs). ``erm-noise-horst`` (ERM on Gaussian embedding noise, ``train_noise``) is the
positive control of robustness.

The run saves the per-review correctness in its cell store (``correct/<method>/<s>``, with the design
record: :mod:`descentlab.study.cells`); the claims engine judges ``claims.py``'s claims from it (the runner does that after ``run`` returns, and ``descentlab report`` does it again).

Methods are :class:`~descentlab.train.recipe.MethodConfig` s: one base (``config.base_method``) edited by
each label's override spec in ``specs``; ``methods`` lists the labels to run.

Evaluation is over the whole test split under any launcher: each rank evaluates its share of the batches
and the counts (and per-review values) are gathered (:mod:`descentlab.distributed`), so a ``torchrun`` run
reports the same numbers as one process.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from descentlab.data.text_batches import prepare_data
from descentlab.experiments.robust_sparse.claims import CORRECT
from descentlab.experiments.robust_sparse.config import RobustSparseConfig
from descentlab.experiments.robust_sparse.jobs import JobResult, decode_job, encode_job, train_and_sweep
from descentlab.experiments.robust_sparse.tables import accuracy_tables, summary_notes
from descentlab.report.results import Curve, MethodResult, Results
from descentlab.report.stats import column_mean_std, mean_std
from descentlab.robustness import RobustnessCurves
from descentlab.robustness.config import NoiseEvalConfig
from descentlab.study.cells import CellStore, Design
from descentlab.train.jobs import JobRunner
from descentlab.train.recipe import MethodConfig
from descentlab.train.rundir import RunDir


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


def cell_store(
    correct: dict[str, list[np.ndarray]], levels: list[float], seeds: list[int], gammas: list[float]
) -> CellStore:
    """The claims' cells: ``correct/<method>/<s>`` -> 0/1 correctness ``[seed, draw, γ, example]`` as uint8
    (exact, small), under the design record (methods, sparsities, seeds, reviews, γ grid)."""
    examples = int(np.asarray(next(iter(correct.values()))[0]).shape[-1])
    design = Design(tuple(correct), tuple(levels), tuple(seeds), examples, {"gammas": list(gammas)})
    store = CellStore(design)
    for label, per_level in correct.items():
        for s, values in zip(levels, per_level, strict=True):
            store.put(CORRECT, label, s, np.asarray(values).astype(np.uint8))
    return store


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
    correct = {label: [c.examples[kind] for c in joined] for label, (_, joined) in blocks.items()}
    tables = accuracy_tables(methods_out, correct, erm_baselines(methods), levels, kind, ev.gammas)

    # 3. the per-review correctness the claims are judged from (claims.py; judged by the runner)
    cell_store(correct, levels, list(cfg.seeds), list(ev.gammas)).save(run.path, writer=run.writer)
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
        "alpha = 3 fixed before the run (sparse-lm's validation choice); nothing tuned here",
        "pooling": cfg.pooling,
        "train_noise": dict(cfg.train_noise),
        "claims": "the claims engine over per-review correctness (arrays/cells.npz): seed-level intervals, "
        "robust accuracy = mean over gamma >= 1; primary: constrained-horst - erm-horst at the highest sparsity",
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
        notes=summary_notes(methods_out, levels, kind),
    ).to_dict()
