"""llm-robustness's run: data -> reference profile -> ERM's tuning run -> noise grid -> selection on validation
-> fine-tunes on every evaluation seed -> evaluation -> arrays.

Every step is a job of one :class:`~descentlab.train.jobs.JobRunner` (:mod:`.jobs`), cached in ``jobs/``,
so an interrupted run resumes. A :class:`~.graph.JobGraph` submits each job once its inputs are done, the
tuning round first, so that the selection's critical path never waits behind the other fine-tunes.
:func:`plan` lays the graph out; each job's arguments come from module-level builders bound with
``functools.partial``, and a method's choice (:func:`.selection.choose`) is a step of the graph whose
follow-up adds that method's evaluation fine-tunes, so nothing outside the graph changes while it runs.

Why not :func:`descentlab.study.tuning.tune_then_replicate`: its jobs are independent futures submitted
eagerly, in FIFO order, while here a candidate's score needs a chain of jobs (reference -> fine-tune, and
ERM's tuning fine-tune -> noise grid -> validation) and the evaluation runs need the grid.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from descentlab.data import load_causal_lm
from descentlab.data.causal_lm import prepare_causal_lm_data
from descentlab.experiments.llm_robustness.clusters import passage_chapters, save_clusters
from descentlab.experiments.llm_robustness.config import LlmRobustnessConfig
from descentlab.experiments.llm_robustness.graph import (
    CHOSEN_TRAIN,
    EVALUATION,
    OTHER_TRAIN,
    TUNING,
    JobGraph,
)
from descentlab.experiments.llm_robustness.headtohead import claim_store, conditions, summarise
from descentlab.experiments.llm_robustness.jobs import (
    grid_levels,
    job,
    model_for,
    run_tag,
    validation_examples,
    validation_levels,
)
from descentlab.experiments.llm_robustness.judged import (
    JUDGED_ARRAYS,
    judged_arrays,
    judged_table,
    run_generative_judge,
)
from descentlab.experiments.llm_robustness.protocol import protocol
from descentlab.experiments.llm_robustness.selection import (
    candidate_tags,
    choose,
    selection_record,
    tuned_methods,
)
from descentlab.io import save_arrays
from descentlab.train.jobs import JobRunner
from descentlab.train.rundir import RunDir

__all__ = ["Inputs", "plan", "run"]


def run(cfg: LlmRobustnessConfig, run: RunDir) -> dict:
    """Run the study in ``run`` (resuming its cached jobs); the results body with its protocol."""
    started = time.perf_counter()
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    # 1. data: training windows, a validation set for every choice, the held-out examples
    tok = tokenizer_for(cfg)
    train, held, data_protocol = prepare_causal_lm_data(cfg.data, tok)
    val, train = validation_examples(cfg, tok, train)

    # 2-4. the job graph: the reference profile, ERM's tuning run and the noise grid, each tuned method's
    # candidates and choice on validation, then every method on every evaluation seed, evaluated
    with JobRunner(
        job, workers=cfg.workers, cache_dir=run.path / "jobs", threads=max(1, cfg.torch_threads)
    ) as jobs:
        graph = JobGraph(jobs, cfg.workers)
        plan(graph, Inputs(cfg, run, train, val, held))
        done = graph.run()

    # 5. the judged outcomes the claims read (likelihood judge, of record), then the generate-then-judge
    # phase: under several processes (FSDP2) every rank would load the judge, so it runs afterwards in one
    # process (resume=RUN_DIR)
    ref, grid, levels = done["reference"], done["grid"], grid_levels(cfg, done["grid"])
    facts = {m: [done[f"train-{run_tag(m, s)}"] for s in cfg.seeds] for m in cfg.methods}
    evaluations = {m: [done[f"eval-{run_tag(m, s)}"] for s in cfg.seeds] for m in cfg.methods}
    conds = conditions(levels, derived_levels(cfg, grid))
    if run.writer:
        save_cells(cfg, run, tok, evaluations, conds)
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    judged = run_generative_judge(cfg, held, conds, run, tok) if cfg.generative.model and world == 1 else None
    if judged and run.writer:
        save_arrays(run.path / JUDGED_ARRAYS, **judged_arrays(judged["verdicts"]))

    # 6. the curves, tables and protocol of results.json
    examples = min(cfg.selection_examples, len(val))
    selection = selection_record(cfg, done, examples)
    body = summarise(
        evaluations=evaluations,
        facts=facts,
        reference=ref,
        grid=grid,
        levels=levels,
        baseline=cfg.baseline,
        profile="{}@{:g}".format(*profile_condition(cfg, grid)),
        seeds=list(cfg.seeds),
        selection=selection,
        draws=cfg.grid.draws,
        tol=cfg.eval.tie_tol,
    )
    counts = {"n_train_examples": len(train), "n_val": len(val), "n_eval": len(held)}
    record = protocol(
        cfg,
        data=data_protocol,
        counts={**counts, "selection_examples": examples},
        chosen=selection.get("chosen", {}),
        levels=levels,
        conds=conds,
        sigma_e=ref["sigma_e"],
        facts=facts,
        judged=judged,
        world=world,
        wall_seconds=time.perf_counter() - started,
    )
    if judged:
        body["tables"].append(judged_table(judged, cfg.baseline, str(cfg.generative.model)))
    return {"protocol": record, **body}


@dataclass(frozen=True)
class Inputs:
    """What the jobs of one run read: the config, the run directory and the three example sets."""

    cfg: LlmRobustnessConfig
    run: RunDir
    train: list[dict]
    val: list[dict]
    held: list[dict]


def tokenizer_for(cfg: LlmRobustnessConfig) -> Any:
    """The model's tokenizer. Inline (one worker) the model loads here once, for every job; with workers
    it loads once inside each worker process, so only the tokenizer is kept."""
    if cfg.workers <= 1:
        return model_for(cfg)[1]
    model, tok = load_causal_lm(cfg.model.name)
    del model
    return tok


def profile_condition(cfg: LlmRobustnessConfig, grid: Mapping[str, Any]) -> tuple[str, float]:
    """The noisy layer profile's condition: ``grid.profile_kind`` at ``grid.profile_ratio``'s level."""
    g = cfg.grid
    level = grid["kinds"][g.profile_kind]["levels"][g.ratios_of(g.profile_kind).index(g.profile_ratio)]
    return g.profile_kind, level


def derived_levels(cfg: LlmRobustnessConfig, grid: Mapping[str, Any]) -> dict[str, dict[float, float]]:
    """kind -> (ratio -> level) of the levels the grid search found."""
    g = cfg.grid
    return {
        kind: dict(zip(g.ratios_of(kind), grid["kinds"][kind]["levels"], strict=True))
        for kind in grid_levels(cfg, grid)
    }


def save_cells(cfg: LlmRobustnessConfig, run: RunDir, tok: Any, evaluations: Mapping, conds: Mapping) -> None:
    """The claims' cell store (``arrays/cells.npz`` and its design record): every arm's outcomes
    ``[seed, draw, example]`` against ERM of the same seed; on Austen, each held-out passage's chapter
    (passages of one chapter are not independent)."""
    g = cfg.grid
    store = claim_store(
        evaluations, baseline=cfg.baseline, conds=conds, seeds=cfg.seeds, draws=g.draws, tol=cfg.eval.tie_tol
    )
    store.save(run.path)
    if cfg.data.source == "austen":
        save_clusters(run.path, passage_chapters(tok, cfg.data))


def plan(graph: JobGraph, inputs: Inputs) -> None:
    """Add every job of the study to ``graph``: the reference profile; ERM's tuning run and the noise grid
    from it; each tuned method's candidates on the tuning seed, validated, and its choice (which adds the
    chosen candidate on every evaluation seed); the untuned methods on every evaluation seed, ERM first."""
    cfg = inputs.cfg
    erm_tune = run_tag(cfg.baseline, cfg.tune_seed)
    tuned = tuned_methods(cfg)
    graph.add("reference", "reference", partial(_reference_args, inputs))
    add_train(graph, inputs, cfg.baseline, cfg.tune_seed, cfg.candidates(cfg.baseline)[0], TUNING)
    graph.add("grid", "grid", partial(_grid_args, inputs, erm_tune), deps=[f"train-{erm_tune}"])
    if tuned:
        add_validate(graph, inputs, erm_tune)
    for m in tuned:
        tags = candidate_tags(cfg, m)
        for i, spec in enumerate(cfg.candidates(m)):
            add_train(graph, inputs, m, cfg.tune_seed, spec, TUNING, candidate=i)
        for tag in tags:
            add_validate(graph, inputs, tag)
        deps = [f"validate-{t}" for t in tags] + [f"train-{t}" for t in tags] + [f"validate-{erm_tune}"]
        graph.add(
            f"choose-{m}",
            None,
            partial(choose, cfg, m),
            deps=deps,
            then=partial(_replicate_choice, graph, inputs, m),
        )
    for seed in cfg.seeds:
        for m in [cfg.baseline, *(m for m in cfg.methods if m != cfg.baseline)]:
            if m not in tuned:
                add_replicate(graph, inputs, m, seed, cfg.candidates(m)[0], OTHER_TRAIN)


def add_train(
    graph: JobGraph,
    inputs: Inputs,
    label: str,
    seed: int,
    spec: str,
    priority: int,
    candidate: int | None = None,
) -> str:
    """Add ``label``'s fine-tune from ``seed`` with candidate ``spec``; its run tag."""
    tag = run_tag(label, seed, candidate)
    args = partial(_train_args, inputs, label, seed, spec, tag)
    graph.add(f"train-{tag}", "train", args, deps=["reference"], priority=priority)
    return tag


def add_validate(graph: JobGraph, inputs: Inputs, tag: str) -> None:
    """Add the validation of run ``tag`` at the validation levels (the selection's scores)."""
    deps = [f"train-{tag}", "grid"]
    graph.add(f"validate-{tag}", "validate", partial(_validate_args, inputs, tag), deps=deps, priority=TUNING)


def add_replicate(graph: JobGraph, inputs: Inputs, label: str, seed: int, spec: str, priority: int) -> None:
    """Add ``label``'s fine-tune from evaluation seed ``seed`` and its held-out evaluation."""
    tag = add_train(graph, inputs, label, seed, spec, priority)
    deps = [f"train-{tag}", "grid"]
    graph.add(f"eval-{tag}", "eval", partial(_eval_args, inputs, tag), deps=deps, priority=EVALUATION)


def _replicate_choice(graph: JobGraph, inputs: Inputs, label: str, choice: Mapping[str, Any]) -> None:
    """The follow-up of ``label``'s choice: its chosen candidate trains afresh on every evaluation seed."""
    for seed in inputs.cfg.seeds:
        add_replicate(graph, inputs, label, seed, choice["spec"], CHOSEN_TRAIN)


# each job's arguments from the finished jobs ``done``
def _reference_args(inputs: Inputs, done: Mapping[str, Any]) -> tuple:
    return inputs.cfg, inputs.val, inputs.held


def _grid_args(inputs: Inputs, erm_tune: str, done: Mapping[str, Any]) -> tuple:
    return inputs.cfg, inputs.val, inputs.run, erm_tune


def _train_args(inputs: Inputs, label: str, seed: int, spec: str, tag: str, done: Mapping[str, Any]) -> tuple:
    profile = done["reference"]["val_profile"]
    return inputs.cfg, label, inputs.train, profile, inputs.run, seed, spec, tag, inputs.val


def _validate_args(inputs: Inputs, tag: str, done: Mapping[str, Any]) -> tuple:
    return inputs.cfg, tag, inputs.val, validation_levels(inputs.cfg, done["grid"]), inputs.run


def _eval_args(inputs: Inputs, tag: str, done: Mapping[str, Any]) -> tuple:
    grid = done["grid"]
    cond = list(profile_condition(inputs.cfg, grid))
    return inputs.cfg, tag, inputs.held, grid_levels(inputs.cfg, grid), cond, inputs.run
