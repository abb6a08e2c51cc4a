"""llm-robustness's run: data -> reference profile -> ERM's tuning run -> noise grid -> selection on validation
-> fine-tunes on every evaluation seed -> evaluation -> arrays.

Every step is a job of one :class:`~descentlab.train.jobs.JobRunner` (:mod:`.jobs`), cached in ``jobs/``,
so an interrupted run resumes. :class:`JobGraph` submits each job once its inputs are done, the tuning
round first, so that the selection's critical path never waits behind the other fine-tunes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from descentlab.data import load_causal_lm
from descentlab.data.causal_lm import prepare_causal_lm_data
from descentlab.experiments.llm_robustness.claims import CLAIM_ARRAYS
from descentlab.experiments.llm_robustness.clusters import passage_chapters, save_clusters
from descentlab.experiments.llm_robustness.config import LlmRobustnessConfig
from descentlab.experiments.llm_robustness.headtohead import (
    claim_cells,
    conditions,
    seed_outcomes,
    summarise,
)
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
from descentlab.io import save_arrays
from descentlab.train.jobs import JobRunner
from descentlab.train.rundir import RunDir
from descentlab.train.tuning import binding_level, choose_candidate

# job priorities (lower first): the tuning round, then the constrained methods' fine-tunes (the longest),
# then the others, then the evaluations
TUNING, CHOSEN_TRAIN, OTHER_TRAIN, EVALUATION = 0, 1, 2, 3


@dataclass(order=True)
class _Task:
    priority: int
    order: int
    key: str = field(compare=False)
    kind: str | None = field(compare=False)  # a job kind of jobs.job; None: a step run here
    args: Callable[[Mapping[str, Any]], tuple] = field(compare=False)
    deps: tuple[str, ...] = field(compare=False)
    then: Callable[[Any], None] | None = field(compare=False)


class JobGraph:
    """Jobs with dependencies on one :class:`JobRunner`: each is submitted once every job it depends on is
    done, the lowest priority first, and never more than ``slots`` at a time, so the pool's FIFO queue stays
    empty and a ready job of the critical path never waits behind filler.

    ``add(key, kind, args, deps, priority, then)``: ``args(done)`` builds the job's arguments from the
    results of the finished jobs (``done[key]``); ``then(result)`` runs here when it finishes and may add
    more jobs. ``kind=None`` adds a step that runs here, not in a worker (e.g. a choice between candidates).
    """

    def __init__(self, jobs: JobRunner, slots: int) -> None:
        self.jobs, self.slots = jobs, max(1, slots)
        self.done: dict[str, Any] = {}
        self._pending: list[_Task] = []
        self._running: dict[Future, _Task] = {}
        self._order = 0

    def add(
        self,
        key: str,
        kind: str | None,
        args: Callable[[Mapping[str, Any]], tuple] = lambda done: (),
        deps: Iterable[str] = (),
        priority: int = 0,
        then: Callable[[Any], None] | None = None,
    ) -> None:
        known = {t.key for t in self._pending} | {t.key for t in self._running.values()} | set(self.done)
        if key in known:
            raise ValueError(f"job {key!r} was added twice")
        self._order += 1
        self._pending.append(_Task(priority, self._order, key, kind, args, tuple(deps), then))

    def _finish(self, task: _Task, result: Any) -> None:
        self.done[task.key] = result
        if task.then is not None:
            task.then(result)

    def run(self) -> dict[str, Any]:
        """Run every job (and the ones their ``then`` adds); the results by key. A failed job raises."""
        while self._pending or self._running:
            ready = sorted(t for t in self._pending if all(d in self.done for d in t.deps))
            if not ready and not self._running:
                missing = sorted({d for t in self._pending for d in t.deps if d not in self.done})
                raise RuntimeError(f"jobs wait for {missing}, which no job provides")
            progressed = False
            for task in ready:
                if task.kind is not None and len(self._running) >= self.slots:
                    continue
                self._pending.remove(task)
                if task.kind is None:
                    self._finish(task, task.args(self.done))
                    progressed = True
                    break  # a step may add jobs: sort again
                future = self.jobs.submit(task.key, task.kind, *task.args(self.done))
                if future.done():  # cached, or run inline
                    self._finish(task, future.result())
                    progressed = True
                    break
                self._running[future] = task
            if progressed or not self._running:
                continue
            finished, _ = wait(list(self._running), return_when=FIRST_COMPLETED)
            for future in finished:
                self._finish(self._running.pop(future), future.result())
        return self.done


def _selection_reason(
    label: str,
    specs: list[str],
    rows: list[list[Any]],
    best: int,
    *,
    criterion: str,
    margin: float,
    min_binding: float | None,
) -> str:
    """Why :func:`~descentlab.train.tuning.choose_candidate` chose ``specs[best]``, in win-rate words (its
    own reason speaks of accuracy). ``rows``: its selection rows ``[method, spec, clean, robust, binding,
    chosen]``, the scores being validation win rates against ERM's tuning run."""
    binds = [r for r in rows if min_binding is None or (isinstance(r[4], int | float) and r[4] > min_binding)]
    pool = binds or rows
    within = [r for r in pool if r[2] >= 0.5 - margin]
    what = (
        "win rate under noise (mean over the gaussian levels)" if criterion == "robust" else "clean win rate"
    )
    parts = [
        f"{label}: {len(within)} of {len(pool)} candidates within {100 * margin:g} points of ERM's clean 50 %"
    ]
    if min_binding is not None:
        parts.insert(
            0,
            f"{label}: {len(binds)} of {len(rows)} candidates bind (Σλ over the second half > {min_binding:g})"
            if binds
            else f"{label}: no candidate binds (Σλ over the second half <= {min_binding:g}), so all take part",
        )
    rule = f"the highest validation {what} among them" if within else f"none is, so the highest {what} of all"
    return "; ".join(parts) + f"; {rule}: {specs[best] or '(as configured)'!r}"


def run(cfg: LlmRobustnessConfig, run: RunDir) -> dict:
    started = time.perf_counter()
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    # 1. data (with workers, the model loads once inside each worker process)
    if cfg.workers <= 1:
        _, tok = model_for(cfg)
    else:
        model, tok = load_causal_lm(cfg.model.name)
        del model
    train, held, data_protocol = prepare_causal_lm_data(cfg.data, tok)
    val, train = validation_examples(cfg, tok, train)

    labels, base, seeds, tune = list(cfg.methods), cfg.baseline, list(cfg.seeds), cfg.tune_seed
    g, sel = cfg.grid, cfg.selection
    specs = {m: cfg.candidates(m) for m in labels}
    tuned = [m for m in labels if len(specs[m]) > 1]
    chosen = dict.fromkeys(labels, 0)
    selection: dict[str, Any] = {
        "tune_seed": tune,
        "examples": min(cfg.selection_examples, len(val)),
        "candidates": {m: specs[m] for m in tuned},
        "chosen": {},
        "reasons": {},
        "scores": {},
        "rows": [],
    }
    erm_tune = run_tag(base, tune)

    def profile_of(grid: Mapping[str, Any]) -> list:
        """The noisy layer profile's condition: ``grid.profile_kind`` at ``grid.profile_ratio``'s level."""
        level = grid["kinds"][g.profile_kind]["levels"][g.ratios_of(g.profile_kind).index(g.profile_ratio)]
        return [g.profile_kind, level]

    with JobRunner(
        job, workers=cfg.workers, cache_dir=run.path / "jobs", threads=max(1, cfg.torch_threads)
    ) as jobs:
        graph = JobGraph(jobs, cfg.workers)
        graph.add("reference", "reference", lambda d: (cfg, val, held))

        def profile(d: Mapping[str, Any]) -> list[float]:
            return d["reference"]["val_profile"]

        def add_train(m: str, seed: int, cand: int | None, priority: int) -> str:
            tag = run_tag(m, seed, cand)
            spec = specs[m][chosen[m] if cand is None else cand]
            graph.add(
                f"train-{tag}",
                "train",
                lambda d: (cfg, m, train, profile(d), run, seed, spec, tag, val),
                deps=["reference"],
                priority=priority,
            )
            return tag

        def add_eval(tag: str, priority: int = EVALUATION) -> None:
            graph.add(
                f"eval-{tag}",
                "eval",
                lambda d: (cfg, tag, held, grid_levels(cfg, d["grid"]), profile_of(d["grid"]), run),
                deps=[f"train-{tag}", "grid"],
                priority=priority,
            )

        def add_validate(tag: str) -> None:
            graph.add(
                f"validate-{tag}",
                "validate",
                lambda d: (cfg, tag, val, validation_levels(cfg, d["grid"]), run),
                deps=[f"train-{tag}", "grid"],
                priority=TUNING,
            )

        # 2. ERM on the tuning seed (validation only): the noise levels and the candidates' clean reference
        add_train(base, tune, None, TUNING)
        graph.add("grid", "grid", lambda d: (cfg, val, run, erm_tune), deps=[f"train-{erm_tune}"])
        # 3. each constrained method's candidates on the tuning seed, scored on validation against ERM there
        if tuned:
            add_validate(erm_tune)
        for m in tuned:
            tags = [add_train(m, tune, i, TUNING) for i in range(len(specs[m]))]
            for tag in tags:
                add_validate(tag)

            def choose(d: Mapping[str, Any], m: str = m, tags: list[str] = tags) -> dict:
                levels_v = validation_levels(cfg, d["grid"])
                kind = g.profile_kind
                erm_val = d[f"validate-{erm_tune}"]
                scores = []
                for tag in tags:
                    mine = d[f"validate-{tag}"]

                    def rate(x: float, mine: Mapping = mine) -> float:
                        p = seed_outcomes([mine], [erm_val], kind, x, draws=sel.draws, tol=cfg.eval.tie_tol)
                        return float(p.mean())

                    trace = d[f"train-{tag}"].get("lambda_trace")
                    scores.append(
                        {
                            "clean": rate(0.0),
                            "robust": float(np.mean([rate(x) for x in levels_v[kind] if x > 0])),
                            "binding": binding_level(trace["steps"], trace["lambda"]) if trace else 0.0,
                        }
                    )
                best, rows, _ = choose_candidate(
                    m, specs[m], scores, 0.5,
                    criterion=sel.criterion, max_clean_drop=sel.max_clean_drop, min_binding=sel.min_binding,
                )  # fmt: skip
                chosen[m] = best
                selection["chosen"][m] = specs[m][best]
                selection["scores"][m] = scores
                selection["rows"] += rows
                selection["reasons"][m] = _selection_reason(
                    m, specs[m], rows, best,
                    criterion=sel.criterion, margin=sel.max_clean_drop, min_binding=sel.min_binding,
                )  # fmt: skip
                for s in seeds:  # the chosen candidate trains afresh on every evaluation seed
                    add_eval(add_train(m, s, None, CHOSEN_TRAIN))
                return {"chosen": best}

            deps = [f"validate-{t}" for t in tags] + [f"train-{t}" for t in tags] + [f"validate-{erm_tune}"]
            graph.add(f"choose-{m}", None, choose, deps=deps)
        # 4. the methods with nothing to choose, on every evaluation seed (ERM first)
        for s in seeds:
            for m in [base, *[m for m in labels if m != base]]:
                if m not in tuned:
                    add_eval(add_train(m, s, None, OTHER_TRAIN))

        done = graph.run()

    ref, grid = done["reference"], done["grid"]
    levels = grid_levels(cfg, grid)
    profile_level = profile_of(grid)[1]
    facts = {m: [done[f"train-{run_tag(m, s)}"] for s in seeds] for m in labels}
    evaluations = {m: [done[f"eval-{run_tag(m, s)}"] for s in seeds] for m in labels}
    selection["erm_tuning_run"] = done[f"train-{erm_tune}"]
    selection["candidate_runs"] = {
        m: [done[f"train-{run_tag(m, tune, i)}"] for i in range(len(specs[m]))] for m in tuned
    }

    # 5. the judged outcomes the claims read, then the curves and tables
    derived = {
        kind: dict(zip(g.ratios_of(kind), grid["kinds"][kind]["levels"], strict=True)) for kind in levels
    }
    conds = conditions(levels, derived)
    if run.writer:
        cells = claim_cells(evaluations, baseline=base, conds=conds, draws=g.draws, tol=cfg.eval.tie_tol)
        save_arrays(run.path / CLAIM_ARRAYS, **cells)
        if cfg.data.source == "austen":  # passages of one chapter are not independent: label them
            save_clusters(run.path, passage_chapters(tok, cfg.data))
    judged = None
    # generate then judge (AlpacaEval-style); the likelihood judge stays of record. Under several processes
    # (FSDP2) every rank would load the judge: that phase runs afterwards in one process, resume=RUN_DIR
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    if cfg.generative.model and world == 1:
        judged = run_generative_judge(cfg, held, conds, run, tok)
        if run.writer:
            save_arrays(run.path / JUDGED_ARRAYS, **judged_arrays(judged["verdicts"]))
    body = summarise(
        evaluations=evaluations,
        facts=facts,
        reference=ref,
        grid=grid,
        levels=levels,
        baseline=base,
        profile=f"{g.profile_kind}@{profile_level:g}",
        seeds=seeds,
        selection=selection if tuned else {"tune_seed": tune, "erm_tuning_run": selection["erm_tuning_run"]},
        draws=g.draws,
        tol=cfg.eval.tie_tol,
    )
    d = cfg.data
    protocol = {
        **data_protocol,
        "model": cfg.model.name,
        "n_train_examples": len(train),
        "n_val": len(val),
        "n_eval": len(held),
        "train_steps": cfg.train.max_steps,
        "batch_size": cfg.train.batch_size,
        "seq_len": d.seq_len,
        "seeds": seeds,
        "tune_seed": tune,
        "seed_pairing": "each method on evaluation seed s against ERM on seed s (claims cells [seed, draw, "
        "example], the seed the unit of replication); the null control: ERM on seed s_i against ERM on "
        "s_(i+1 mod S)",
        "selection": (
            f"on the tuning seed {tune} and {selection['examples']} validation examples (never an evaluation "
            f"seed, never the held-out set): ERM's run gives the levels and the clean reference; candidates "
            f"{ {m: specs[m] for m in tuned} } (equal budgets); rule: the highest {sel.criterion} validation "
            f"win rate against ERM's tuning run (mean over the {g.profile_kind} levels) among candidates whose "
            f"clean win rate is >= 50 % - {sel.max_clean_drop:g}"
            + (
                f", binding (Σλ over the second half > {sel.min_binding:g}) first"
                if sel.min_binding is not None
                else ""
            )
            + "; the chosen candidate trains afresh on every evaluation seed"
            if tuned
            else f"nothing to choose (one candidate per method); ERM's run on the tuning seed {tune} gives the "
            "noise levels"
        ),
        "chosen": selection.get("chosen", {}),
        "draws": g.draws,
        "levels": levels,
        "conditions": {name: [kind, x] for name, (kind, x) in conds.items()},
        "level_search": "ERM's validation perplexity ratio, bisection on log level "
        f"(descentlab.robustness.levels) for ratios { {k: g.ratios_of(k) for k in g.kinds} } on "
        f"{g.val_examples} validation examples",
        "noise": "added to the input-embedding output, keyed by example content (every model sees the same "
        "draws). gaussian: std gamma * sigma_E; neftune: uniform, alpha / sqrt(n d) (n real tokens, d width)",
        "sigma_e": ref["sigma_e"],
        "noisy_training": {k: v for k, v in cfg.noisy_training.items() if k in labels},
        "constraints": {
            "select": cfg.constraints.select,
            "per method": {
                m: {
                    **{k: facts[m][0].get(k) for k in ("constrained_layers", "alphas")},
                    "candidate": facts[m][0].get("candidate") or "(as configured)",
                }
                for m in labels
                if "constrained_layers" in facts[m][0]
            },
            "detach_prev": cfg.method.constraint.detach_prev,
            "dual_lr": cfg.method.constraint.dual_lr,
        },
        **(
            {
                "convergence": f"validation loss every {cfg.val_every} steps on {cfg.val_curve_examples} "
                "validation examples; converged: |change over the last doubling of steps| < 2 %"
            }
            if cfg.val_every
            else {}
        ),
        "readout": f"logit lens, {cfg.readout.sample_tokens or 'all'} sampled targets at the read layers "
        f"(l and l-1 of each constrained l), every target at layer L",
        "judge": "likelihood: lower NLL of the reference continuation wins, ties split",
        **(
            {
                "generative_judge": f"{cfg.generative.model}: greedy answers of up to "
                f"{cfg.generative.max_new_tokens} tokens to {judged['examples']} held-out prompts at "
                f"{judged['conditions']}, each pair judged in both orders; win rate raw and length-controlled "
                "(logistic length term, AlpacaEval 2.0 without its instruction term); a table, not a claim"
            }
            if judged
            else {
                "generative_judge": f"skipped under {world} processes: resume=RUN_DIR in one process runs it"
            }
            if cfg.generative.model
            else {}
        ),
        "workers": cfg.workers,
        "torch_threads": cfg.torch_threads,
        "wall_seconds": time.perf_counter() - started,
    }
    if judged:
        body["tables"].append(judged_table(judged, base, str(cfg.generative.model)))
    return {"protocol": protocol, **body}
