"""text-robustness's run: data -> each constrained method's setting chosen on validation (tuning seed) ->
every (method, seed) job -> the cell store and the arrays the report reads -> results.

The plan is :func:`~descentlab.study.tuning.tune_then_replicate`'s: one search round over the grids of the
methods with several candidates (``selection.candidates``, trained from ``tune_seed`` and scored on
validation only; ERM's run on that seed gives the clean-accuracy margin and the ``alpha_from=erm``
reference profile), then every method afresh on every evaluation seed at its chosen setting: no tuning run
is reported. A method that follows another (``selection.follow``) takes its choice. The choice and its
reason go into the protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict, replace
from functools import partial
from typing import Any

import numpy as np

from descentlab.config import config_to_dict
from descentlab.data.text_batches import Prepared, prepare_data
from descentlab.evaluation import EmbeddingGeometry, mean_sequence_tokens
from descentlab.experiments.text_robustness import report
from descentlab.experiments.text_robustness.config import CORRECT, ERM, LOSS, TextRobustnessConfig, design
from descentlab.experiments.text_robustness.jobs import (
    Job,
    Outcome,
    Setting,
    decode_output,
    load_model,
    train_job,
)
from descentlab.report.results import Results
from descentlab.study.cells import CellStore
from descentlab.study.jobs import JobRunner
from descentlab.study.tuning import Round, TuningConfig, tune_then_replicate
from descentlab.study.tuning_rules import candidate_methods, settings_diff, with_reference
from descentlab.train.rundir import RunDir

NAME = "text-robustness"


def run(cfg: TextRobustnessConfig, run: RunDir) -> dict:
    # 1. data; with the local-DP kinds, the Gaussian mechanism's clip C from the pretrained model unless given
    data = prepare_data(cfg.data, cfg.model)
    geometry = None
    if cfg.evaluation.ldp_kinds:
        geometry = EmbeddingGeometry.of(load_model(cfg, data.num_labels))
        clip = cfg.evaluation.clip if cfg.evaluation.clip is not None else geometry.max_norm
        cfg = replace(cfg, evaluation=replace(cfg.evaluation, clip=clip))

    with JobRunner(train_job, workers=cfg.workers, cache_dir=run.path / "jobs", decode=decode_output) as jobs:
        submit = partial(submit_job, jobs, cfg, data, run)
        # 2. ERM on the tuning seed (validation only), when a candidate is chosen or a setting takes ERM's
        # per-layer validation profile (alpha_from=erm); its evaluation runs are queued beside it
        erm_clean, reference = erm_tuning_run(cfg, submit)
        # 3. every method with several candidates tuned on validation (tuning seed), then every method on
        # every evaluation seed at its chosen setting; a follower takes its leader's choice, so one whose
        # leader is tuned runs once that choice is known
        plan, follow = tuning_plan(cfg, reference), followers(cfg)
        tuned_arms = {arm for rnd in plan.rounds for arm in rnd.arms}
        first = [m for m in cfg.methods if follow.get(m) not in tuned_arms]
        start = {m: candidates(cfg, m, {}, reference=reference)[0] for m in first}
        pick = partial(choose, cfg, erm_clean)
        tuned = tune_then_replicate(start, plan, submit, pick)
        late = {
            m: candidates(cfg, m, tuned.chosen, reference=reference)[0] for m in cfg.methods if m not in start
        }
        after = tune_then_replicate(late, TuningConfig(cfg.seeds, cfg.tune_seed), submit, pick)
    outcome = Outcome(
        chosen={m: (tuned.chosen | after.chosen)[m] for m in cfg.methods},
        outputs={m: (tuned.per_seed | after.per_seed)[m] for m in cfg.methods},
        tried={m: r for m, r in tuned.results.items() if r},
        erm_clean=erm_clean,
        reference=reference,
        sizes={"n_train": len(data.train), "n_val": sum(len(b["labels"]) for b in data.val)},
        geometry=geometry,
        tokens=mean_sequence_tokens(data.test) if geometry is not None else None,
    )

    # 4. the cell store (the runner judges the claims from it) and the arrays the report reads
    cell_store(cfg, outcome).save(run.path, writer=run.writer)
    for name, arrays in report.side_arrays(cfg, outcome).items():
        if arrays:
            run.save_arrays(name, **arrays)
    return Results(
        experiment=NAME,
        config=config_to_dict(cfg),
        protocol=protocol(cfg, outcome),
        **report.summarise(cfg, outcome),
    ).to_dict()


def followers(cfg: TextRobustnessConfig) -> dict[str, str]:
    """``follower -> leader`` for the methods that take another's chosen spec (``selection.follow``)."""
    follow = cfg.selection.follow
    return {m: follow[m] for m in cfg.methods if follow.get(m) in cfg.methods}


def candidates(
    cfg: TextRobustnessConfig,
    arm: str,
    chosen: Mapping[str, Setting],
    *,
    reference: list[float] | None = None,
) -> list[Setting]:
    """The settings ``arm`` tries: each override spec of its grid applied to its own constraint, with
    ``alpha_from=erm`` resolved against ``reference`` (ERM's validation profile; None: left unresolved).

    The grid is ``selection.candidates[arm]``; a follower's is its leader's chosen spec (``chosen``), or,
    before that choice, its leader's grid; a method frozen at λ ≡ 0 has one, its own setting.
    """
    sel, leader = cfg.selection, followers(cfg).get(arm)
    if leader is not None:
        specs = [chosen[leader].spec] if leader in chosen else sel.candidates.get(leader, [""])
    else:
        specs = [""] if arm in cfg.frozen_zero else sel.candidates.get(arm, [""])
    method, settings = cfg.resolved_methods()[arm], []
    for i, spec in enumerate(specs):
        (own,) = candidate_methods(arm, method, replace(sel, candidates={arm: [spec]}))
        own = with_reference(own, reference) if reference is not None else own
        settings.append(Setting(own, spec, i if len(specs) > 1 else None))
    return settings


def tuning_plan(cfg: TextRobustnessConfig, reference: list[float] | None = None) -> TuningConfig:
    """One search round over the methods, not followers, with several candidates (none: no round)."""
    follow = followers(cfg)
    arms = tuple(m for m in cfg.methods if m not in follow and len(candidates(cfg, m, {})) > 1)
    rounds = [Round(arms, partial(candidates, cfg, reference=reference))] if arms else []
    return TuningConfig(cfg.seeds, cfg.tune_seed, rounds)


def erm_tuning_run(
    cfg: TextRobustnessConfig, submit: Callable[[str, Setting, int], Future]
) -> tuple[float | None, list[float] | None]:
    """ERM's clean validation accuracy and per-layer validation loss profile on the tuning seed (the
    ``alpha_from=erm`` reference); ``(None, None)`` when nothing needs them: no method is tuned and no
    setting the run may train takes the profile. ERM's evaluation runs, which need nothing from it, are
    queued beside it so the other workers keep busy (the planner's later submission of the same job gets
    the same Future: JobRunner keys)."""
    grids = [s.method for m in cfg.methods for s in candidates(cfg, m, {})]
    takes_profile = any(
        c.constrained and c.constraint.alpha_from == ERM and c.constraint.alpha_reference is None
        for c in grids
    )
    if ERM not in cfg.methods or not (tuning_plan(cfg).rounds or takes_profile):
        return None, None
    erm = candidates(cfg, ERM, {})[0]
    tuning = submit(ERM, erm, cfg.tune_seed)
    for seed in cfg.seeds:
        submit(ERM, erm, seed)
    scores = tuning.result()
    return scores["clean"], scores["val_profile"]


def choose(cfg: TextRobustnessConfig, erm_clean: float | None, arm: str, results: Sequence[Any]) -> int:
    """The candidate ``arm`` picks from its validation scores (:func:`.report.selection`)."""
    return report.selection(cfg, erm_clean, arm, results)[0]


def submit_job(
    jobs: JobRunner,
    cfg: TextRobustnessConfig,
    data: Prepared,
    run: RunDir,
    label: str,
    setting: Setting,
    seed: int,
) -> Future:
    """Queue one job under the key ``<tag>-<split>``: on the tuning seed a validation run, tagged
    ``<label>-cand<i>-seed<seed>`` for candidate i of a tuned label's grid; otherwise the test evaluation,
    ``<label>-seed<seed>``."""
    split = "validation" if seed == cfg.tune_seed else "test"
    cand = f"-cand{setting.candidate}" if split == "validation" and setting.candidate is not None else ""
    job = Job(label, setting.method, seed, f"{label}{cand}-seed{seed}", split)
    return jobs.submit(f"{job.tag}-{job.split}", cfg, job, data, run)


def cell_store(cfg: TextRobustnessConfig, outcome: Outcome) -> CellStore:
    """The claims' cells (:mod:`.claims`): each method's per-review correctness per noise kind and its
    per-layer clean loss ``[seed, L+1, example]``, under the design record with the number of reviews and
    ERM's validation profile (the monotone claim is untestable when that profile never rises)."""
    curves, record = outcome.curves(), design(cfg)
    first = curves[cfg.methods[0]].examples
    if first is None:
        raise ValueError("the accuracy curves kept no per-example values (keep_examples=True)")
    if outcome.reference is not None:
        record.extra["erm_val_profile"] = [float(v) for v in outcome.reference]
    store = CellStore(replace(record, examples=int(next(iter(first.values())).shape[-1])))
    for m, losses in outcome.losses().items():
        for kind, correct in (curves[m].examples or {}).items():
            store.put(CORRECT, m, kind, np.asarray(correct, dtype=np.float32))
        store.put(LOSS, m, None, np.asarray(losses, dtype=np.float32))
    return store


def protocol(cfg: TextRobustnessConfig, outcome: Outcome) -> dict[str, Any]:
    """The run's ``protocol``: what ``config.json`` does not say (the split, the sizes, how the noise and
    the per-layer loss are measured, each method's selection and why, the ε accounting)."""
    sel, methods, follow = cfg.selection, cfg.resolved_methods(), followers(cfg)
    rule = f"candidates trained from the tuning seed {cfg.tune_seed} (never an evaluation seed; not reported)"
    if sel.min_binding is not None:
        rule += (
            "; eligible only if its constraint binds on its tuning run: the time-average of Σ_l λ_l over the "
            f"second half of training > {sel.min_binding:g} (if none binds, among all)"
        )
    selection = {}
    for m, setting in outcome.chosen.items():
        if m in follow:
            why = f"follows {follow[m]}: {setting.spec or '(defaults)'!r}"
        elif m in outcome.tried:
            why = report.selection(cfg, outcome.erm_clean, m, outcome.tried[m])[2]
        elif methods[m].constrained and m not in cfg.frozen_zero:
            why = f"only candidate {setting.spec or '(defaults)'!r}"
        else:
            continue
        diff = settings_diff(asdict(setting.method.constraint), asdict(methods[m].constraint))
        selection[m] = (
            f"{why}; candidates {sel.candidates.get(m, [''])}; settings differ from the base in: {diff}; {rule}"
        )
    scored = "test" if cfg.evaluate_on == "test" else "validation (a search: no test example is scored)"
    out = {
        "split": f"{scored}; constraint settings selected on validation (tuning seed {cfg.tune_seed})",
        "n_train": outcome.sizes["n_train"],
        "n_eval": int(outcome.curves()[cfg.methods[0]].protocol["n_eval"]),
        "n_val": outcome.sizes["n_val"],
        "seeds": list(cfg.seeds),
        "noise": "added to the input-embedding output, per-coordinate variance (γ σ_E)², σ_E = RMS of the "
        "embedding matrix; keyed by example content, so all methods see the same noise",
        "layer_loss": "test mean of the per-example cross-entropy read out at layers 0..L through the "
        "model's own pooling and head, clean; mean over seeds",
        "selection": selection,
    }
    if outcome.geometry is not None:
        out["ldp"] = {
            "kinds": list(cfg.evaluation.ldp_kinds),
            "clip": cfg.evaluation.clip,
            "sequence_tokens": outcome.tokens,
            "mechanisms": "metric_ldp: e + z, p(z) ∝ exp(-ε‖z‖) (E‖z‖ = d/ε); gaussian_mechanism: clip_C(e) + "
            "N(0, σ²I), σ from the analytic Gaussian mechanism at (ε, δ) with Δ = 2C; both on the "
            "word-embedding output, every position, keyed by content; ε is absolute, the same for every model",
        }
    return out
