"""robust-sparse: layer-wise descent constraints with HORST as the primal optimizer, then magnitude pruning.

Robust and sparse at once? Each method (``config.py``: one base method edited by each label's spec)
fine-tunes a pretrained encoder classifier with an objective (ERM, hard constraints or their resilient
relaxation) and a primal optimizer (HORST, or AdamW as the baseline), optionally under AC/DC; the trained
model is pruned one-shot by magnitude at every requested sparsity, each time from the trained weights with
no fine-tuning after, and every pruned copy is scored against the embedding-noise level γ (``jobs.py``).
``erm-noise-horst`` (ERM on Gaussian embedding noise) is the positive control of robustness. The
per-review correctness goes to the cell store (``correct/<method>/<s>``), which ``claims.py`` reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import numpy as np

from descentlab.data.text_batches import Prepared, prepare_data
from descentlab.evaluation import RobustnessCurves
from descentlab.experiments.robust_sparse.claims import CORRECT
from descentlab.experiments.robust_sparse.config import HORST_ALPHA, RobustSparseConfig, base_method
from descentlab.experiments.robust_sparse.jobs import JobResult, decode_job, encode_job, train_job
from descentlab.experiments.robust_sparse.report import summarise
from descentlab.report.results import Results
from descentlab.study.cells import CellStore, Design
from descentlab.study.jobs import JobRunner
from descentlab.train.rundir import RunDir


def run(cfg: RobustSparseConfig, run: RunDir) -> dict:
    data = prepare_data(cfg.data, cfg.model)

    # 1. every (method, seed): train, prune at every sparsity, evaluate; finished jobs come from run/jobs
    with JobRunner(
        train_job, workers=cfg.workers, cache_dir=run.path / "jobs", encode=encode_job, decode=decode_job
    ) as jobs:
        futures = {
            (label, seed): jobs.submit(f"{label}-seed{seed}", cfg, label, seed, data, run)
            for seed in cfg.seeds
            for label in cfg.methods
        }
        outcome = {label: [futures[label, seed].result() for seed in cfg.seeds] for label in cfg.methods}

    # 2. the per-review correctness the claims are judged from (claims.py; judged by the runner)
    cell_store(cfg, outcome).save(run.path, writer=run.writer)

    # 3. results in the DESIGN shape
    return Results(
        experiment="robust-sparse", protocol=protocol(cfg, data, outcome), **summarise(cfg, outcome)
    ).to_dict()


def cell_store(cfg: RobustSparseConfig, outcome: Mapping[str, list[JobResult]]) -> CellStore:
    """The claims' cells: ``correct/<method>/<s>`` -> 0/1 correctness ``[seed, draw, γ, example]`` as uint8
    (exact, small), under the design record (methods, sparsities, seeds, reviews, γ grid)."""
    levels, kind = list(cfg.pruning.sparsities), cfg.evaluation.kinds[0]
    correct = {
        label: [
            RobustnessCurves.concat([job.points[i].curve for job in runs]).examples[kind]
            for i in range(len(levels))
        ]
        for label, runs in outcome.items()
    }
    examples = int(np.asarray(next(iter(correct.values()))[0]).shape[-1])
    design = Design(
        tuple(correct), tuple(levels), tuple(cfg.seeds), examples, {"gammas": list(cfg.evaluation.gammas)}
    )
    store = CellStore(design)
    for label, per_level in correct.items():
        for s, values in zip(levels, per_level, strict=True):
            store.put(CORRECT, label, s, np.asarray(values).astype(np.uint8))
    return store


def protocol(
    cfg: RobustSparseConfig, data: Prepared, outcome: Mapping[str, list[JobResult]]
) -> dict[str, Any]:
    """What ``config.json`` does not say: the split and sizes, how the noise is drawn, where the settings come
    from, how the pruning and the evaluation run."""
    alpha = cfg.method.optimizer.alpha
    why_alpha = " (sparse-lm's validation choice)" if alpha == HORST_ALPHA else ""
    constraint = (
        "text-robustness's constraint (chosen there on validation, same data)"
        if cfg.method.constraint == base_method().constraint
        else "the config's constraint (method.constraint, not the default)"
    )
    thresholds = {"layer": "one threshold per matrix", "global": "one threshold over all of them"}
    acdc = {label: asdict(m.acdc) for label, m in cfg.method_configs().items() if m.acdc is not None}
    return {
        "split": "test",
        "n_train": len(data.train),
        "n_eval": int(outcome[cfg.methods[0]][0].points[0].curve.protocol["n_eval"]),
        "noise": "on the input-embedding output, variance (γ σ_E)² per coordinate, σ_E = RMS of the embedding "
        "matrix; content-keyed, identical across methods and sparsities",
        "constraint_selection": f"{constraint}; HORST alpha = {alpha:g} fixed before the run{why_alpha}; "
        "nothing tuned here",
        "claims": "the claims engine over per-review correctness (arrays/cells.npz): seed-level intervals, "
        "robust accuracy = mean over gamma >= 1; primary: constrained-horst - erm-horst at the highest sparsity",
        "pruning": "one-shot magnitude pruning of the Linear weights inside the encoder blocks "
        f"({thresholds[cfg.pruning.scope]}; embeddings, pooler and head stay dense), each level from the "
        "trained weights, no fine-tuning after",
        "acdc": acdc or None,
        "evaluation": "whole test split; under torchrun each rank evaluates a share, and counts and per-review "
        "values are gathered",
    }
