"""llm-robustness's run: every step a job of one :class:`~descentlab.study.jobs.JobRunner` (:mod:`.jobs`),
cached in ``jobs/`` so an interrupted run resumes, submitted by a :class:`JobGraph` as its inputs finish.

1. Data: training windows, a validation set for every choice, held-out examples (Austen: passages of
   *Persuasion*, never trained on, each a prompt and its reference continuation).
2. ``reference``: the pretrained model's logit-lens profile on validation; the constraints come from it.
3. ERM's tuning run (``tune_seed``, never an evaluation seed) and ``grid``: the levels where its validation
   perplexity grows by each of ``grid.ratios``, and the fixed ``grid.extra``.
4. Each constrained method's candidates on the tuning seed, scored on validation (:func:`choose`).
5. ``train`` and ``eval``: every method (a tuned one at its choice) on every evaluation seed, then on the
   held-out examples at every level; the claims' cells (:func:`cell_store`) and the results body
   (:func:`.report.summarise`).

Why not :func:`descentlab.study.tuning.tune_then_replicate`: its jobs are independent futures submitted
eagerly, in FIFO order, while here a candidate's score needs a chain of jobs (reference -> fine-tune, and
ERM's tuning fine-tune -> noise grid -> validation) and the evaluation runs need the grid.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from descentlab.config import config_to_dict
from descentlab.data import load_causal_lm
from descentlab.data.causal_lm import prepare_causal_lm_data
from descentlab.data.instructions import example_prompt
from descentlab.errors import ConfigError
from descentlab.experiments.llm_robustness import report
from descentlab.experiments.llm_robustness.clusters import passage_chapters, save_clusters
from descentlab.experiments.llm_robustness.config import (
    LEVEL,
    NULL,
    PERPLEXITY_RATIO,
    WIN,
    LlmRobustnessConfig,
    condition_name,
)
from descentlab.experiments.llm_robustness.jobs import (
    Inputs,
    Outcome,
    grid_levels,
    job,
    model_for,
    run_tag,
    validation_examples,
    validation_levels,
)
from descentlab.experiments.llm_robustness.report import seed_outcomes, seed_perplexity, shifted
from descentlab.io import save_arrays
from descentlab.report.results import Results
from descentlab.study.cells import CellStore, Design
from descentlab.study.jobs import JobGraph, JobRunner
from descentlab.study.tuning_rules import binding_level, choose_candidate
from descentlab.train.rundir import RunDir

JUDGED_ARRAYS = "arrays/judged.npz"
# job priorities, lower first: the tuning round, the chosen candidates' (longest) fine-tunes, the others, evals
TUNING, CHOSEN_TRAIN, OTHER_TRAIN, EVALUATION = 0, 1, 2, 3


def run(cfg: LlmRobustnessConfig, run: RunDir) -> dict:
    """Run the study in ``run`` (resuming its cached jobs); the results body with its protocol."""
    started = time.perf_counter()
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    # the tokenizer: inline (one worker) the model loads here once, for every job; with workers it loads once
    # inside each worker process
    tok = model_for(cfg)[1] if cfg.workers <= 1 else load_causal_lm(cfg.model.name)[1]
    train, held, data_protocol = prepare_causal_lm_data(cfg.data, tok)
    val, train = validation_examples(cfg, tok, train)

    with JobRunner(
        job, workers=cfg.workers, cache_dir=run.path / "jobs", threads=max(1, cfg.torch_threads)
    ) as jobs:
        graph = JobGraph(jobs, cfg.workers)
        plan(graph, Inputs(cfg, run, train, val, held))
        done = graph.run()

    facts = {m: [done[f"train-{run_tag(m, s)}"] for s in cfg.seeds] for m in cfg.methods}
    evaluations = {m: [done[f"eval-{run_tag(m, s)}"] for s in cfg.seeds] for m in cfg.methods}
    conds = conditions(cfg, done["grid"])
    if run.writer:
        cell_store(cfg, evaluations, conds).save(run.path)
        if cfg.data.source == "austen":  # passages of one chapter are not independent (clusters.py)
            save_clusters(run.path, passage_chapters(tok, cfg.data))
    # generate then judge: under several processes (FSDP2) every rank would load the judge, so it runs in
    # one process only (resume=RUN_DIR)
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    judged = run_generative_judge(cfg, held, conds, run, tok) if cfg.generative.model and world == 1 else None
    if judged and run.writer:
        save_arrays(run.path / JUDGED_ARRAYS, **judged_arrays(judged["verdicts"]))

    selection = selection_record(cfg, done, examples=min(cfg.selection_examples, len(val)))
    outcome = Outcome(evaluations, facts, done["reference"], done["grid"], selection, judged)
    counts = {**data_protocol, "n_train_examples": len(train), "n_val": len(val), "n_eval": len(held)}
    return Results(
        experiment="llm-robustness",
        config=config_to_dict(cfg),
        protocol=protocol(cfg, outcome, counts, conds, world, time.perf_counter() - started),
        **report.summarise(cfg, outcome),
    ).to_dict()


def conditions(cfg: LlmRobustnessConfig, grid: Mapping[str, Any]) -> dict[str, tuple[str, float]]:
    """Condition name -> (kind, level) for every level evaluated (:func:`.jobs.grid_levels`), a level the
    grid search found for a ratio named ``<kind>-x<ratio>`` (:func:`.config.condition_name`)."""
    out: dict[str, tuple[str, float]] = {}
    for kind, xs in grid_levels(cfg, grid).items():
        ratio_of = dict(zip(grid["kinds"][kind]["levels"], cfg.grid.ratios_of(kind), strict=True))
        for x in xs:
            out.setdefault(condition_name(kind, x, ratio_of.get(x)), (kind, x))
    return out


# -- the plan: every job of the study, as a graph -----------------------------------------------------------


def plan(graph: JobGraph, inputs: Inputs) -> None:
    """Add every job of the study to ``graph``: the reference profile; ERM's tuning run and the noise grid
    from it; each tuned method's candidates on the tuning seed, validated, and its choice (which adds the
    chosen candidate on every evaluation seed); the untuned methods on every evaluation seed, ERM first."""
    cfg = inputs.cfg
    erm_tune = run_tag(cfg.baseline, cfg.tune_seed)
    tuned = tuned_methods(cfg)
    graph.add("reference", "reference", partial(_args, (inputs,), ()))
    add_train(graph, inputs, cfg.baseline, cfg.tune_seed, cfg.candidates(cfg.baseline)[0], TUNING)
    graph.add("grid", "grid", partial(_args, (inputs, erm_tune), ()), deps=[f"train-{erm_tune}"])
    if tuned:
        add_validate(graph, inputs, erm_tune)
    for m in tuned:
        tags = candidate_tags(cfg, m)
        for i, spec in enumerate(cfg.candidates(m)):
            add_train(graph, inputs, m, cfg.tune_seed, spec, TUNING, candidate=i)
        for tag in tags:
            add_validate(graph, inputs, tag)
        deps = [f"validate-{t}" for t in tags] + [f"train-{t}" for t in tags] + [f"validate-{erm_tune}"]
        then = partial(_replicate_choice, graph, inputs, m)
        graph.add(f"choose-{m}", None, partial(choose, cfg, m), deps=deps, then=then)
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
    args = partial(_args, (inputs, label, seed, spec, tag), ("reference",))
    graph.add(f"train-{tag}", "train", args, deps=["reference"], priority=priority)
    return tag


def add_validate(graph: JobGraph, inputs: Inputs, tag: str) -> None:
    """Add the validation of run ``tag`` at the validation levels (the selection's scores)."""
    args, deps = partial(_args, (inputs, tag), ("grid",)), [f"train-{tag}", "grid"]
    graph.add(f"validate-{tag}", "validate", args, deps=deps, priority=TUNING)


def add_replicate(graph: JobGraph, inputs: Inputs, label: str, seed: int, spec: str, priority: int) -> None:
    """Add ``label``'s fine-tune from evaluation seed ``seed`` and its held-out evaluation."""
    tag = add_train(graph, inputs, label, seed, spec, priority)
    deps = [f"train-{tag}", "grid"]
    graph.add(f"eval-{tag}", "eval", partial(_args, (inputs, tag), ("grid",)), deps=deps, priority=EVALUATION)


def _replicate_choice(graph: JobGraph, inputs: Inputs, label: str, choice: Mapping[str, Any]) -> None:
    """The follow-up of ``label``'s choice: its chosen candidate trains afresh on every evaluation seed."""
    for seed in inputs.cfg.seeds:
        add_replicate(graph, inputs, label, seed, choice["spec"], CHOSEN_TRAIN)


def _args(fixed: tuple, needs: tuple[str, ...], done: Mapping[str, Any]) -> tuple:
    """A job's arguments: ``fixed``, then the results of the finished jobs named ``needs``."""
    return (*fixed, *(done[key] for key in needs))


# -- the selection on the tuning seed -----------------------------------------------------------------------


def tuned_methods(cfg: LlmRobustnessConfig) -> list[str]:
    """The methods with more than one candidate, in config order: only these are tuned."""
    return [m for m in cfg.methods if len(cfg.candidates(m)) > 1]


def candidate_tags(cfg: LlmRobustnessConfig, label: str) -> list[str]:
    """The run tags of ``label``'s candidates on the tuning seed, in candidate order."""
    return [run_tag(label, cfg.tune_seed, i) for i in range(len(cfg.candidates(label)))]


def candidate_score(
    cfg: LlmRobustnessConfig, mine: Mapping, erm: Mapping, levels: Sequence[float], facts: Mapping
) -> dict[str, float]:
    """One candidate's validation outcomes ``mine`` against ERM's tuning run ``erm`` (lower reference NLL
    wins, ties split): ``clean``, its win rate w(0); ``robust``, the mean of w(x) over the positive
    ``levels`` of ``grid.profile_kind``; ``binding``, Σλ time-averaged over the second half of its training
    (:func:`~descentlab.study.tuning_rules.binding_level`)."""
    kind, draws, tol = cfg.grid.profile_kind, cfg.selection.draws, cfg.eval.tie_tol
    win = {
        x: float(seed_outcomes([mine], [erm], kind, x, draws=draws, tol=tol).mean()) for x in (0.0, *levels)
    }
    trace = facts.get("lambda_trace")
    return {
        "clean": win[0.0],
        "robust": float(np.mean([w for x, w in win.items() if x > 0])),
        "binding": binding_level(trace["steps"], trace["lambda"]) if trace else 0.0,
    }


def choose(cfg: LlmRobustnessConfig, label: str, done: Mapping[str, Any]) -> dict[str, Any]:
    """``label``'s choice from the finished jobs ``done`` by :func:`~descentlab.study.tuning_rules.choose_candidate`
    (those that bind, with ``selection.min_binding``; of those, the ones whose clean win rate is >= 50 % -
    ``max_clean_drop``; of those, the highest ``selection.criterion`` score): ``{"best", "spec", "scores",
    "rows", "reason"}``."""
    sel, specs = cfg.selection, cfg.candidates(label)
    levels = validation_levels(cfg, done["grid"])[cfg.grid.profile_kind]
    erm = done[f"validate-{run_tag(cfg.baseline, cfg.tune_seed)}"]
    scores = [
        candidate_score(cfg, done[f"validate-{tag}"], erm, levels, done[f"train-{tag}"])
        for tag in candidate_tags(cfg, label)
    ]
    rule = {"criterion": sel.criterion, "min_binding": sel.min_binding, "max_clean_drop": sel.max_clean_drop}
    best, rows, why = choose_candidate(label, specs, scores, 0.5, **rule)
    # choose_candidate words its rule for accuracies; here every score is a win rate against ERM's tuning run
    reason = f"{label}: {why.replace('accuracy', 'win rate')}"
    return {"best": best, "spec": specs[best], "scores": scores, "rows": rows, "reason": reason}


def selection_record(cfg: LlmRobustnessConfig, done: Mapping[str, Any], examples: int) -> dict[str, Any]:
    """The ``selection`` of ``results.json``: ERM's tuning run and, when a method is tuned, every choice
    (its candidates, scores, rows, reason) and every candidate's fine-tune, on ``examples`` validation
    examples."""
    record: dict[str, Any] = {"tune_seed": cfg.tune_seed}
    erm_run = done[f"train-{run_tag(cfg.baseline, cfg.tune_seed)}"]
    if not (tuned := tuned_methods(cfg)):
        return {**record, "erm_tuning_run": erm_run}
    choices = {m: done[f"choose-{m}"] for m in tuned}
    return {
        **record,
        "examples": examples,
        "candidates": {m: cfg.candidates(m) for m in tuned},
        "chosen": {m: c["spec"] for m, c in choices.items()},
        "reasons": {m: c["reason"] for m, c in choices.items()},
        "scores": {m: c["scores"] for m, c in choices.items()},
        "rows": [row for c in choices.values() for row in c["rows"]],
        "erm_tuning_run": erm_run,
        "candidate_runs": {m: [done[f"train-{t}"] for t in candidate_tags(cfg, m)] for m in tuned},
    }


def cell_store(
    cfg: LlmRobustnessConfig,
    evaluations: Mapping[str, list[Mapping[str, Any]]],
    conds: Mapping[str, tuple[str, float]],
) -> CellStore:
    """The cell store :mod:`.claims` reads (``evaluations[m][s]``: method m on evaluation seed s): every
    arm's outcomes against the baseline of the same seed (the baseline's own: 1/2 on every cell), the null
    control (two seeds or more), and the baseline's level and perplexity growth at every condition."""
    base, draws, tol = evaluations[cfg.baseline], cfg.grid.draws, cfg.eval.tie_tol
    null = [NULL] if len(base) > 1 else []
    examples = len(nll) if (nll := next(iter(base[0].get("nll", {}).values()), None)) is not None else None
    store = CellStore(Design((*evaluations, *null), tuple(conds), tuple(cfg.seeds), examples))
    clean = seed_perplexity(base, next(iter(conds.values()))[0], 0.0, draws)
    for name, (kind, x) in conds.items():
        store.put(LEVEL, cfg.baseline, name, np.full(len(base), float(x)))
        store.put(PERPLEXITY_RATIO, cfg.baseline, name, seed_perplexity(base, kind, x, draws) / clean)
        for m, evs in evaluations.items():
            store.put(WIN, m, name, seed_outcomes(evs, base, kind, x, draws=draws, tol=tol))
        if null:
            store.put(WIN, NULL, name, seed_outcomes(base, shifted(base), kind, x, draws=draws, tol=tol))
    return store


# -- generate then judge (``generative``) -------------------------------------------------------------------


def run_generative_judge(
    cfg: LlmRobustnessConfig, held: list[dict], conds: Mapping[str, tuple[str, float]], run: RunDir, tok: Any
) -> dict[str, Any]:
    """Every method on every evaluation seed answers the held-out prompts under each condition of
    ``generative.conditions`` (:func:`.jobs.generate_job`), and a judge LM compares each with the baseline of
    the same seed (:func:`.jobs.judge_job`); both cached in ``jobs/`` (``generate-<tag>``, ``judge``)."""
    g = cfg.generative
    if missing := [c for c in g.conditions if c not in conds]:
        raise ConfigError(
            f"generative.conditions {missing} are not conditions of this run; it has {sorted(conds)}"
        )
    judged = {c: [conds[c][0], float(conds[c][1])] for c in g.conditions}
    examples = held[: g.examples] if g.examples is not None else held
    prompts = [tok.decode(example_prompt(e), skip_special_tokens=True) for e in examples]
    order = [cfg.baseline, *[m for m in cfg.methods if m != cfg.baseline]]
    pairs = {m: [[run_tag(m, s), run_tag(cfg.baseline, s)] for s in cfg.seeds] for m in order[1:]}
    with JobRunner(job, workers=1, cache_dir=run.path / "jobs") as jobs:
        generations = {
            t: jobs.submit(f"generate-{t}", "generate", cfg, t, examples, judged, run).result()
            for t in (run_tag(m, s) for m in order for s in cfg.seeds)
        }
        verdicts = jobs.submit("judge", "judge", cfg, prompts, generations, pairs).result()
    return {"conditions": judged, "examples": len(examples), "generations": generations, **verdicts}


def judged_arrays(verdicts: Mapping[str, Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """``judged/<m>/<c>`` (raw preferences) and ``judged_lc/<m>/<c>`` (length-controlled cells), each
    ``[seeds, 1, examples]`` (one greedy answer per prompt: one draw)."""
    return {
        f"{prefix}/{m}/{c}": np.asarray(v[key], dtype=np.float64)[:, None]
        for m, by_condition in verdicts.items()
        for c, v in by_condition.items()
        for prefix, key in (("judged", "preferences"), ("judged_lc", "adjusted"))
    }


def protocol(
    cfg: LlmRobustnessConfig,
    outcome: Outcome,
    counts: Mapping[str, Any],
    conds: Mapping[str, tuple[str, float]],
    world: int,
    wall_seconds: float,
) -> dict[str, Any]:
    """The ``protocol`` of ``results.json``: what this run measured (the data loader's record, the example
    counts, the levels and the conditions' noise levels, σ_E, the wall time), the model and seeds, and
    whether the generative judge ran. Every setting is in ``config.json``; every choice and its reason in
    ``selection``."""
    record = {
        **counts,
        "model": cfg.model.name,
        "seeds": list(cfg.seeds),
        "levels": grid_levels(cfg, outcome.grid),
        "conditions": {name: [kind, x] for name, (kind, x) in conds.items()},
        "sigma_e": outcome.reference["sigma_e"],
        "wall_seconds": wall_seconds,
    }
    if cfg.generative.model:
        judged = outcome.judged
        record["generative_judge"] = (
            f"{judged['examples']} held-out prompts at {judged['conditions']}, both orders"
            if judged
            else f"skipped under {world} processes: resume=RUN_DIR in one process runs it"
        )
    return record
