"""llm-robustness's run: every step a job of one :class:`~descentlab.study.jobs.JobRunner` (:mod:`.jobs`),
cached in ``jobs/`` so an interrupted run resumes, submitted by a :class:`JobGraph` as its inputs finish.

1. Data: training windows, a validation set for every choice, held-out examples (Austen: passages of
   *Persuasion*, never trained on, each a prompt and its reference continuation).
2. ``reference``: the pretrained model's logit-lens profile on validation; the constraints come from it.
3. ERM's tuning run (``tune_seed``, never an evaluation seed) and ``grid``: the levels where its validation
   perplexity grows by each of ``grid.ratios``, and the fixed ``grid.extra``.
4. Each constrained method's candidates on the tuning seed, scored on validation (:func:`choose`).
5. ``train`` and ``eval``: every method (a tuned one at its choice) on every evaluation seed, then on the
   held-out examples at every level; the judged outcomes (:func:`claim_store`) and curves (:func:`summarise`).

Why not :func:`descentlab.study.tuning.tune_then_replicate`: its jobs are independent futures submitted
eagerly, in FIFO order, while here a candidate's score needs a chain of jobs (reference -> fine-tune, and
ERM's tuning fine-tune -> noise grid -> validation) and the evaluation runs need the grid.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from descentlab.data import load_causal_lm
from descentlab.data.causal_lm import prepare_causal_lm_data
from descentlab.data.instructions import example_prompt
from descentlab.errors import ConfigError
from descentlab.evaluation.causal_lm import noise_key
from descentlab.experiments.llm_robustness.claims import LEVEL, NULL, PERPLEXITY_RATIO, WIN, condition_name
from descentlab.experiments.llm_robustness.clusters import passage_chapters, save_clusters
from descentlab.experiments.llm_robustness.config import LlmRobustnessConfig
from descentlab.experiments.llm_robustness.jobs import (
    grid_levels,
    job,
    model_for,
    run_tag,
    validation_examples,
    validation_levels,
)
from descentlab.experiments.llm_robustness.report import judged_table, tables
from descentlab.io import save_arrays
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import paired_interval
from descentlab.study.cells import CellStore, Design
from descentlab.study.jobs import JobGraph, JobRunner
from descentlab.study.tuning_rules import CandidateSelection, binding_level, choose_candidate
from descentlab.train.rundir import RunDir

JUDGED_ARRAYS = "arrays/judged.npz"
# job priorities, lower first: the tuning round, the chosen candidates' (longest) fine-tunes, the others, evals
TUNING, CHOSEN_TRAIN, OTHER_TRAIN, EVALUATION = 0, 1, 2, 3


def run(cfg: LlmRobustnessConfig, run: RunDir) -> dict:
    """Run the study in ``run`` (resuming its cached jobs); the results body with its protocol."""
    started = time.perf_counter()
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    tok = tokenizer_for(cfg)
    train, held, data_protocol = prepare_causal_lm_data(cfg.data, tok)
    val, train = validation_examples(cfg, tok, train)

    with JobRunner(
        job, workers=cfg.workers, cache_dir=run.path / "jobs", threads=max(1, cfg.torch_threads)
    ) as jobs:
        graph = JobGraph(jobs, cfg.workers)
        plan(graph, Inputs(cfg, run, train, val, held))
        done = graph.run()

    grid, levels = done["grid"], grid_levels(cfg, done["grid"])
    facts = {m: [done[f"train-{run_tag(m, s)}"] for s in cfg.seeds] for m in cfg.methods}
    evaluations = {m: [done[f"eval-{run_tag(m, s)}"] for s in cfg.seeds] for m in cfg.methods}
    conds = conditions(cfg, grid)
    if run.writer:
        g = cfg.grid
        store = claim_store(evaluations, cfg.baseline, conds, cfg.seeds, draws=g.draws, tol=cfg.eval.tie_tol)
        store.save(run.path)
        if cfg.data.source == "austen":  # passages of one chapter are not independent (clusters.py)
            save_clusters(run.path, passage_chapters(tok, cfg.data))
    # generate then judge: under several processes (FSDP2) every rank would load the judge, so it runs in
    # one process only (resume=RUN_DIR)
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    judged = run_generative_judge(cfg, held, conds, run, tok) if cfg.generative.model and world == 1 else None
    if judged and run.writer:
        save_arrays(run.path / JUDGED_ARRAYS, **judged_arrays(judged["verdicts"]))

    examples = min(cfg.selection_examples, len(val))
    selection = selection_record(cfg, done, examples)
    body = summarise(
        cfg,
        evaluations=evaluations,
        facts=facts,
        reference=done["reference"],
        grid=grid,
        levels=levels,
        selection=selection,
    )
    record = protocol(
        cfg,
        {**data_protocol, "n_train_examples": len(train), "n_val": len(val), "n_eval": len(held)},
        selection_examples=examples,
        levels=levels,
        conds=conds,
        sigma_e=done["reference"]["sigma_e"],
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
    return model_for(cfg)[1] if cfg.workers <= 1 else load_causal_lm(cfg.model.name)[1]


def profile_condition(cfg: LlmRobustnessConfig, grid: Mapping[str, Any]) -> tuple[str, float]:
    """The noisy layer profile's condition: ``grid.profile_kind`` at ``grid.profile_ratio``'s level."""
    g = cfg.grid
    level = grid["kinds"][g.profile_kind]["levels"][g.ratios_of(g.profile_kind).index(g.profile_ratio)]
    return g.profile_kind, level


def conditions(cfg: LlmRobustnessConfig, grid: Mapping[str, Any]) -> dict[str, tuple[str, float]]:
    """Condition name -> (kind, level) for every level evaluated (:func:`.jobs.grid_levels`), a level the
    grid search found for a ratio named ``<kind>-x<ratio>`` (:func:`.claims.condition_name`)."""
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
    cond = list(profile_condition(inputs.cfg, done["grid"]))
    return inputs.cfg, tag, inputs.held, grid_levels(inputs.cfg, done["grid"]), cond, inputs.run


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

    def win_rate(level: float) -> float:
        p = seed_outcomes(
            [mine], [erm], cfg.grid.profile_kind, level, draws=cfg.selection.draws, tol=cfg.eval.tie_tol
        )
        return float(p.mean())

    trace = facts.get("lambda_trace")
    return {
        "clean": win_rate(0.0),
        "robust": float(np.mean([win_rate(x) for x in levels if x > 0])),
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
    best, rows, _ = choose_candidate(label, specs, scores, 0.5, **rule)
    reason = selection_reason(label, specs, rows, best, sel)
    return {"best": best, "spec": specs[best], "scores": scores, "rows": rows, "reason": reason}


def selection_reason(
    label: str, specs: list[str], rows: list[list[Any]], best: int, sel: CandidateSelection
) -> str:
    """Why ``specs[best]`` was chosen, in win-rate words (``choose_candidate``'s own reason speaks of
    accuracy); ``rows``: its rows ``[method, spec, clean, robust, binding, chosen]``."""
    floor, margin = sel.min_binding, sel.max_clean_drop
    binds = [r for r in rows if floor is None or (isinstance(r[4], int | float) and r[4] > floor)]
    pool = binds or rows
    within = [r for r in pool if r[2] >= 0.5 - margin]
    what = (
        "win rate under noise (mean over the gaussian levels)"
        if sel.criterion == "robust"
        else "clean win rate"
    )
    parts = [
        f"{label}: {len(within)} of {len(pool)} candidates within {100 * margin:g} points of ERM's clean 50 %"
    ]
    if floor is not None:
        bound = f"{len(binds)} of {len(rows)} candidates bind" if binds else "no candidate binds"
        cmp, tail = (">", "") if binds else ("<=", ", so all take part")
        parts.insert(0, f"{label}: {bound} (Σλ over the second half {cmp} {floor:g}){tail}")
    rule = f"the highest validation {what} among them" if within else f"none is, so the highest {what} of all"
    return "; ".join(parts) + f"; {rule}: {specs[best] or '(as configured)'!r}"


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


# -- head to head: the judged outcomes (the claims' cells, :mod:`.claims`) and the curves -------------------
# Against ERM of the same seed, per cell (seed, draw, example) of one condition, with r the reference NLL and
# n its tokens: outcome 1[r_M < r_B - tol] + 1/2 · 1[|r_M - r_B| <= tol], ΔNLL (r_M - r_B) / n. Each curve
# point carries the seed-level interval of paired_interval; ERM's own curves are the null control.


def _per_draw(ev: Mapping[str, Any], what: str, kind: str, level: float, draws: int) -> np.ndarray:
    """``ev[what]`` (``nll``: ``[draws, N]``; ``perplexity``: ``[draws]``) at one condition; clean is one draw."""
    n = 1 if level == 0 else draws
    return np.asarray([ev[what][noise_key(kind, level, d)] for d in range(n)], dtype=np.float64)


def outcomes(nll_m: np.ndarray, nll_b: np.ndarray, tol: float = 1e-6) -> np.ndarray:
    """The judged outcome of M against B per cell: 1 (lower NLL), 0, or 1/2 within ``tol`` nats."""
    return np.where(nll_m < nll_b - tol, 1.0, np.where(nll_m > nll_b + tol, 0.0, 0.5))


def shifted(evs: Sequence[Any]) -> list[Any]:
    """``evs`` (one per evaluation seed) shifted by one seed, cyclically: the null control's other arm."""
    return [evs[(i + 1) % len(evs)] for i in range(len(evs))]


def seed_outcomes(
    evs_m: Sequence[Mapping],
    evs_b: Sequence[Mapping],
    kind: str,
    level: float,
    *,
    draws: int,
    tol: float = 1e-6,
) -> np.ndarray:
    """``[seeds, draws, examples]`` outcomes of M against B, seed by seed (``evs_m[s]`` against ``evs_b[s]``)."""
    if len(evs_m) != len(evs_b):
        raise ValueError(f"paired by seed: {len(evs_m)} evaluations against {len(evs_b)}")
    nll = partial(_per_draw, what="nll", kind=kind, level=level, draws=draws)
    return np.stack([outcomes(nll(m), nll(b), tol) for m, b in zip(evs_m, evs_b, strict=True)])


def head_to_head(
    evs_m: Sequence[Mapping],
    evs_b: Sequence[Mapping],
    kind: str,
    level: float,
    *,
    draws: int,
    tol: float = 1e-6,
) -> dict[str, Any]:
    """Win rate and per-token ΔNLL of M against B at one condition, paired by seed, each with its
    seed-level 95 % interval, and the win rate of every seed."""
    p = seed_outcomes(evs_m, evs_b, kind, level, draws=draws, tol=tol)
    a, b = (np.stack([_per_draw(e, "nll", kind, level, draws) for e in evs]) for evs in (evs_m, evs_b))
    n = np.asarray(evs_m[0]["ref_tokens"], dtype=np.float64)[None, None, :]
    win, delta = paired_interval(p, np.full_like(p, 0.5)), paired_interval(a / n, b / n)
    return {
        "outcomes": p,
        "win_rate": float(p.mean()),
        "win_ci": [0.5 + win.low, 0.5 + win.high],
        "per_seed": p.mean(axis=(1, 2)).tolist(),
        "wins": int((p == 1).sum()),
        "ties": int((p == 0.5).sum()),
        "losses": int((p == 0).sum()),
        "delta_nll": delta.mean,
        "delta_ci": [delta.low, delta.high],
    }


def seed_perplexity(evs: Sequence[Mapping[str, Any]], kind: str, level: float, draws: int) -> np.ndarray:
    """``[seeds]``: each seed's perplexity at one condition, the mean over its draws."""
    return np.asarray([_per_draw(ev, "perplexity", kind, level, draws).mean() for ev in evs])


def claim_store(
    evaluations: Mapping[str, Sequence[Mapping[str, Any]]],
    baseline: str,
    conds: Mapping[str, tuple[str, float]],
    seeds: Sequence[int],
    *,
    draws: int,
    tol: float = 1e-6,
) -> CellStore:
    """The cell store :mod:`.claims` reads (``evaluations[m][s]``: method m on evaluation seed s): every
    arm's outcomes against ``baseline`` of the same seed (the baseline's own: 1/2 on every cell), the null
    control (two seeds or more), and the baseline's level and perplexity growth at every condition."""
    base = evaluations[baseline]
    null = [NULL] if len(base) > 1 else []
    examples = len(nll) if (nll := next(iter(base[0].get("nll", {}).values()), None)) is not None else None
    store = CellStore(Design((*evaluations, *null), tuple(conds), tuple(seeds), examples))
    clean = seed_perplexity(base, next(iter(conds.values()))[0], 0.0, draws)
    for name, (kind, x) in conds.items():
        store.put(LEVEL, baseline, name, np.full(len(base), float(x)))
        store.put(PERPLEXITY_RATIO, baseline, name, seed_perplexity(base, kind, x, draws) / clean)
        for m, evs in evaluations.items():
            store.put(WIN, m, name, seed_outcomes(evs, base, kind, x, draws=draws, tol=tol))
        if null:
            store.put(WIN, NULL, name, seed_outcomes(base, shifted(base), kind, x, draws=draws, tol=tol))
    return store


def _h2h_curves(
    evs_m: Sequence[Mapping], evs_b: Sequence[Mapping], kind: str, xs: Sequence[float], **kw: Any
) -> dict[str, Curve]:
    """The ``win_rate@<kind>`` and ``delta_nll@<kind>`` curves of M against B (:func:`head_to_head` at each
    level of ``xs``); ``kw``: ``draws``, ``tol`` and ``against`` (whom M is compared with, in words)."""
    against = kw.pop("against")
    h = [head_to_head(evs_m, evs_b, kind, x, **kw) for x in xs]

    def col(key: str) -> list[Any]:
        return [r[key] for r in h]

    def ci(key: str) -> dict[str, list[float]]:
        return {"ci_low": [lo for lo, _ in col(key)], "ci_high": [hi for _, hi in col(key)]}

    win = {**ci("win_ci"), "per_seed": col("per_seed"), "against": against}
    win |= {k: col(k) for k in ("wins", "ties", "losses")}
    return {
        f"win_rate@{kind}": Curve("gamma", list(xs), "win_rate", col("win_rate"), extra=win),
        f"delta_nll@{kind}": Curve(
            "gamma",
            list(xs),
            "delta_nll_per_token",
            col("delta_nll"),
            extra={**ci("delta_ci"), "against": against},
        ),
    }


def summarise(
    cfg: LlmRobustnessConfig,
    *,
    evaluations: Mapping[str, Sequence[Mapping[str, Any]]],
    facts: Mapping[str, Sequence[Mapping[str, Any]]],
    reference: Mapping[str, Any],
    grid: Mapping[str, Any],
    levels: Mapping[str, Sequence[float]],
    selection: Mapping[str, Any],
) -> dict[str, Any]:
    """The results body: per method its perplexity, win-rate and ΔNLL curves with seed-level intervals and
    its fine-tunes of every seed (``evaluations[m]``, ``facts[m]``: one entry per evaluation seed); the
    selection, tables and notes. The claims are not here: the runner judges them from the cell store."""
    baseline, seeds, draws, tol = cfg.baseline, list(cfg.seeds), cfg.grid.draws, cfg.eval.tie_tol
    base = evaluations[baseline]
    methods: dict[str, Any] = {}
    for m, evs in evaluations.items():
        curves: dict[str, Curve] = {}
        metrics: dict[str, Any] = {"perplexity": float(np.mean([ev["perplexity"]["clean"] for ev in evs]))}
        for kind, xs in levels.items():
            ppl = [float(np.mean([_per_draw(ev, "perplexity", kind, x, draws) for ev in evs])) for x in xs]
            extra = {"per_seed": [seed_perplexity(evs, kind, x, draws).tolist() for x in xs]}
            curves[f"perplexity@{kind}"] = Curve("gamma", list(xs), "perplexity", ppl, extra=extra)
            metrics.update({f"perplexity@{kind}{x:g}": v for x, v in zip(xs, ppl, strict=True) if x > 0})
            if m != baseline:
                against = f"{baseline}, same seed"
                curves.update(_h2h_curves(evs, base, kind, xs, draws=draws, tol=tol, against=against))
                metrics.setdefault(
                    "win_rate", curves[f"win_rate@{kind}"].mean[0]
                )  # clean: every kind's first
            elif len(evs) > 1:  # the null control
                against = f"{m}, the next seed"
                curves.update(_h2h_curves(evs, shifted(evs), kind, xs, draws=draws, tol=tol, against=against))
        runs = list(facts.get(m, []))
        for k in ("train_seconds", "seconds_per_step", "steps"):
            if values := [x[k] for x in runs if x.get(k) is not None]:
                metrics[k] = float(np.mean(values))
        metrics["eval_seconds"] = float(np.mean([ev.get("eval_seconds", float("nan")) for ev in evs]))
        profiles = {
            k: np.mean([ev["layer_loss"][k] for ev in evs], axis=0).tolist() for k in evs[0]["layer_loss"]
        }
        extra = {"seeds": seeds, "train": [dict(x) for x in runs]}
        methods[m] = MethodResult(metrics=metrics, curves=curves, layer_loss=profiles, extra=extra).to_dict()
    body: dict[str, Any] = {
        "methods": methods,
        "grid": dict(grid),
        "reference": dict(reference),
        "profile_condition": "{}@{:g}".format(*profile_condition(cfg, grid)),
        "seeds": seeds,
        "selection": dict(selection),
    }
    body["tables"] = tables(body, baseline)
    n = len(seeds)
    body["notes"] = [
        "Win rate: likelihood judge, ties count half, 50 % is parity; each method is compared with ERM of the "
        f"same evaluation seed ({n} seed{'s' if n > 1 else ''}: {seeds}). The curves' 95 % intervals are "
        "paired_interval over (seeds, noise draws, held-out examples), the seed the unit of replication"
        + ("." if n > 1 else "; with one seed they count examples only.")
        + " The paper's 50 % -> 69.93 % is Llama 3.1 8B judged on AlpacaEval.",
        f"The null control ({baseline}'s own win-rate rows): {baseline} on seed s_i against {baseline} on the "
        "next seed s_(i+1 mod S); its interval is the spread between ERM seeds every win rate is read against"
        + (" (it needs two seeds; this run has one)." if n < 2 else "."),
        "delta_nll: (method - ERM) reference NLL per token, nats; negative favours the method.",
        "Levels: gaussian in units of sigma_E; neftune is NEFTune's alpha (noise alpha / sqrt(n d)). They come "
        "from ERM's fine-tune on the tuning seed (validation only), as every other choice.",
        "Per-example NLLs of every method, seed and condition are in jobs/eval-<method>-seed<s>.json; the "
        "judged outcomes the claims read are in arrays/cells.npz (design record: arrays/design.json).",
    ]
    return body


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


# -- the protocol record --------------------------------------------------------------------------------------


def protocol(
    cfg: LlmRobustnessConfig,
    counts: Mapping[str, Any],
    *,
    selection_examples: int,
    levels: Mapping[str, list[float]],
    conds: Mapping[str, tuple[str, float]],
    sigma_e: float,
    judged: Mapping[str, Any] | None,
    world: int,
    wall_seconds: float,
) -> dict[str, Any]:
    """The ``protocol`` of ``results.json``: what this run measured (the data loader's record, the example
    counts, the conditions' noise levels, σ_E, the wall time) and the selection rule in words built from the
    config. Every setting is in ``config.json``; the choices, layers and α in ``selection`` and ``methods``."""
    sel, gen, tuned = cfg.selection, cfg.generative, tuned_methods(cfg)
    rule = "nothing to choose (one candidate per method)"
    if tuned:
        candidates = {m: cfg.candidates(m) for m in tuned}
        rule = (
            f"on the tuning seed {cfg.tune_seed}, {selection_examples} validation examples: the highest "
            f"{sel.criterion} win rate against ERM's tuning run (mean over the {cfg.grid.profile_kind} levels) "
            f"among the candidates {candidates} whose clean win rate is >= 50 % - {sel.max_clean_drop:g}"
        )
        if sel.min_binding is not None:
            rule += f", binding (Σλ over the second half > {sel.min_binding:g}) first"
    record = {
        **counts,
        "model": cfg.model.name,
        "seeds": list(cfg.seeds),
        "tune_seed": cfg.tune_seed,
        "selection": rule,
        "draws": cfg.grid.draws,
        "levels": levels,
        "conditions": {name: [kind, x] for name, (kind, x) in conds.items()},
        "sigma_e": sigma_e,
        "wall_seconds": wall_seconds,
    }
    if gen.model:
        record["generative_judge"] = (
            f"{gen.model}: {judged['examples']} held-out prompts at {judged['conditions']}, both orders"
            if judged
            else f"skipped under {world} processes: resume=RUN_DIR in one process runs it"
        )
    return record
