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

from dataclasses import asdict

import numpy as np

from descentlab.data.text_batches import prepare_data
from descentlab.experiments.robust_sparse.claims import CORRECT
from descentlab.experiments.robust_sparse.config import RobustSparseConfig
from descentlab.experiments.robust_sparse.jobs import decode_job, encode_job, train_and_sweep
from descentlab.experiments.robust_sparse.report import (
    accuracy_tables,
    erm_baselines,
    method_result,
    summary_notes,
)
from descentlab.report.results import Results
from descentlab.study.cells import CellStore, Design
from descentlab.study.jobs import JobRunner
from descentlab.train.rundir import RunDir


def run(cfg: RobustSparseConfig, run: RunDir) -> dict:
    ev, p = cfg.evaluation, cfg.pruning
    data = prepare_data(cfg.data, cfg.model)
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
    acdc = {label: asdict(m.acdc) for label, m in methods.items() if m.acdc is not None}
    protocol = {  # what config.json does not say
        "split": "test",
        "n_train": len(data.train),
        "n_eval": int(done[cfg.methods[0]][0].points[0].curve.protocol["n_eval"]),
        "noise": "on the input-embedding output, variance (γ σ_E)² per coordinate, σ_E = RMS of the embedding "
        "matrix; content-keyed, identical across methods and sparsities",
        "constraint_selection": "text-robustness's constraint (chosen there on validation, same data); HORST "
        "alpha = 3 fixed before the run (sparse-lm's validation choice); nothing tuned here",
        "claims": "the claims engine over per-review correctness (arrays/cells.npz): seed-level intervals, "
        "robust accuracy = mean over gamma >= 1; primary: constrained-horst - erm-horst at the highest sparsity",
        "pruning": "one-shot magnitude pruning of the Linear weights inside the encoder blocks (embeddings, "
        "pooler and head stay dense), each level from the trained weights, no fine-tuning after",
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
