"""text-robustness's run: data -> selection of each constrained method's settings on validation (tuning
seed) -> every (method, seed) job on test -> the arrays the claims and figures read -> results.

Every method is one :class:`~descentlab.train.recipe.MethodConfig` (:mod:`.config`). The
:class:`~descentlab.constrained.config.DescentConfig` of each constrained method is chosen among a small
grid of candidates on the *validation* split, trained from ``tune_seed`` (never an evaluation seed), never on
test; ERM's run on that seed gives the clean-accuracy margin and the ``alpha_from=erm`` reference profile.
The chosen settings then train afresh on every evaluation seed: no tuning run is reported. A method with one
candidate is not tuned, and without tuning or ``alpha_from=erm`` there is no tuning run at all. The choice
and the reason go into the protocol. Test evaluation: clean accuracy, accuracy against γ for each noise kind (``draws``
realisations per model, content-keyed so that every method sees the same noisy inputs), the per-layer test
loss clean and at γ = ``profile_gamma``, and clean accuracy on optional dataset-shift sets; with
``evaluation.ldp_kinds``, accuracy against the local-DP ε and its privacy accounting.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

import numpy as np

from descentlab.config import config_to_dict
from descentlab.data import load_encoder_classifier
from descentlab.data.text_batches import prepare_data
from descentlab.experiments.text_robustness import arrays, ldp, tables
from descentlab.experiments.text_robustness.claims import ERM
from descentlab.experiments.text_robustness.config import TextRobustnessConfig
from descentlab.experiments.text_robustness.jobs import Job, decode_output, run_job
from descentlab.report.results import Results
from descentlab.robustness import EmbeddingGeometry, RobustnessCurves, mean_sequence_tokens
from descentlab.train.jobs import JobRunner
from descentlab.train.recipe import MethodConfig
from descentlab.train.rundir import RunDir
from descentlab.train.tuning import (
    Selection,
    candidate_methods,
    choose_candidate,
    settings_diff,
    with_reference,
)

NAME = "text-robustness"


def run(cfg: TextRobustnessConfig, run: RunDir) -> dict:
    d, ev, sel, tune_seed = cfg.data, cfg.evaluation, cfg.selection, cfg.tune_seed
    data = prepare_data(cfg.data, cfg.model)
    methods = cfg.resolved_methods()
    geometry = None
    if ev.ldp_kinds:  # the Gaussian mechanism's C: fixed from the pretrained model unless given
        geometry = EmbeddingGeometry.of(load_encoder_classifier(cfg.model, num_labels=data.num_labels)[0])
        ev = replace(ev, clip=ev.clip if ev.clip is not None else geometry.max_norm)
        cfg = replace(cfg, evaluation=ev)

    # constrained labels: their candidates (leaders), or the leader's choice (followers)
    followers = {m: sel.follow[m] for m in methods if m in sel.follow and sel.follow[m] in methods}
    tuned = [
        m for m, mc in methods.items() if mc.constrained and m not in followers and m not in cfg.frozen_zero
    ]
    specs = {m: sel.candidates.get(m, [""]) for m in tuned}
    chosen = dict.fromkeys(tuned, 0)
    selection_rows: list[list[Any]] = []
    reasons = {m: f"only candidate {specs[m][0] or '(defaults)'!r}" for m in tuned}
    reference: list[float] | None = None  # ERM's validation profile, tuning seed (alpha_from=erm)
    resolved: dict[str, list[MethodConfig]] = {}

    def candidates(label: str) -> list[MethodConfig]:
        if label not in resolved:
            if label in followers:
                leader = followers[label]
                spec = specs[leader][chosen[leader]]
                cands = candidate_methods(label, methods[label], replace(sel, candidates={label: [spec]}))
            else:
                cands = candidate_methods(label, methods[label], sel)
            resolved[label] = [with_reference(c, reference) for c in cands]
        return resolved[label]

    def job(label: str, seed: int, split: str = "test", cand: int | None = None) -> Job:
        if label not in tuned:
            if label in followers:
                return Job(label, candidates(label)[0], seed, f"{label}-seed{seed}", split)
            return Job(label, with_reference(methods[label], reference), seed, f"{label}-seed{seed}", split)
        if cand is None:  # an evaluation run of the chosen candidate, trained afresh
            return Job(label, candidates(label)[chosen[label]], seed, f"{label}-seed{seed}", split)
        return Job(label, candidates(label)[cand], seed, f"{label}-cand{cand}-seed{seed}", split)

    with JobRunner(run_job, workers=cfg.workers, cache_dir=run.path / "jobs", decode=decode_output) as jobs:

        def submit(j: Job) -> Any:
            return jobs.submit(f"{j.tag}-{j.split}", cfg, j, data, run)

        plain = [m for m in cfg.methods if m not in tuned and m not in followers]
        order = [(m, s) for s in cfg.seeds for m in plain]
        pending: dict[tuple[str, int], Any] = {}
        # 1. ERM on the tuning seed (validation numbers only), when a candidate is chosen or one takes ERM's
        # profile; ERM's evaluation runs, which need nothing from it, keep the other workers busy meanwhile
        selecting = any(len(specs[m]) > 1 for m in tuned)
        erm_clean = None
        if ERM in plain and (selecting or _takes_erm_profile(methods, tuned, followers, specs, sel)):
            erm_tuning = submit(job(ERM, tune_seed, "validation"))
            pending.update({(ERM, s): submit(job(ERM, s)) for s in cfg.seeds})
            erm_scores = erm_tuning.result()
            erm_clean, reference = erm_scores["clean"], erm_scores["val_profile"]
        val_futures = {
            m: [submit(job(m, tune_seed, "validation", i)) for i in range(len(specs[m]))]
            for m in tuned
            if len(specs[m]) > 1
        }
        pending.update({o: submit(job(*o)) for o in order if o not in pending})
        val_scores: dict[str, list[dict]] = {}
        for m, futures in val_futures.items():
            val_scores[m] = [f.result() for f in futures]
            chosen[m], rows, reasons[m] = choose_candidate(
                m, specs[m], val_scores[m], erm_clean,
                criterion=sel.criterion, max_clean_drop=sel.max_clean_drop, min_binding=sel.min_binding,
            )  # fmt: skip
            selection_rows += rows
        for m, leader in followers.items():
            reasons[m] = f"follows {leader}: {specs[leader][chosen[leader]] or '(defaults)'!r}"
        # 2. test evaluation of every (method, seed) with the chosen settings
        pending.update({(m, s): submit(job(m, s)) for s in cfg.seeds for m in [*tuned, *followers]})
        outputs = {m: [pending[(m, s)].result() for s in cfg.seeds] for m in cfg.methods}

    # 3. the arrays the claims and figures read (the runner judges the claims from them), then results
    joined = {m: RobustnessCurves.concat([o["curves"] for o in outs]) for m, outs in outputs.items()}
    run.save_arrays(arrays.ACCURACY, **arrays.accuracy_arrays(joined))
    correct = {m: dict(c.examples) for m, c in joined.items() if c.examples is not None}
    run.save_arrays(arrays.EXAMPLES, **arrays.example_arrays(correct, ev.gammas))
    losses = {m: np.asarray([o["layer_examples"] for o in outs]) for m, outs in outputs.items()}
    run.save_arrays(arrays.LAYER_LOSS, **{m: v.astype(np.float32) for m, v in losses.items()})
    lam = arrays.lambda_arrays(outputs, cfg.frozen_zero)
    if lam:
        run.save_arrays(arrays.LAMBDA, **lam)
    if reference is not None:  # the monotone claim is untestable when ERM's own profile never rises
        run.save_arrays(arrays.ERM_VAL_PROFILE, profile=np.asarray(reference, dtype=np.float64))
    tuning_lam = arrays.selection_lambda_arrays(val_scores)
    if tuning_lam:
        run.save_arrays(arrays.LAMBDA_SELECTION, **tuning_lam)
    ldp_joined, ldp_tables, ldp_protocol = {}, [], {}  # type: ignore[var-annotated]
    if geometry is not None:
        ldp_joined, ldp_tables, ldp_protocol = ldp.summarise(
            outputs, geometry, ev, mean_sequence_tokens(data.test)
        )
        run.save_arrays(arrays.LDP, **arrays.ldp_arrays(ldp_joined))
    blocks = {}
    for m, outs in outputs.items():
        profiles = {k: [o["profiles"][k] for o in outs] for k in outs[0]["profiles"]}
        extra = {k: [o["extra"][k] for o in outs] for k in outs[0]["extra"]}
        lams = [o["multipliers"] for o in outs if o["multipliers"] is not None and m not in cfg.frozen_zero]
        blocks[m] = tables.method_block(joined[m], profiles, extra, lams, ev.kinds[0])
        blocks[m].extra["layer_loss_ci"] = tables.layer_loss_ci(losses[m])
        if methods[m].constrained:
            blocks[m].extra["constraint"] = asdict(job(m, cfg.seeds[0]).method.constraint)
        ldp.add_ldp_curves(blocks[m], ldp_joined.get(m))  # no-op without the ε kinds
    protocol = tables.protocol(
        cfg,
        n_train=len(data.train),
        n_eval=int(joined[cfg.methods[0]].protocol["n_eval"]),
        n_val=sum(len(b["labels"]) for b in data.val),
        selection={
            m: f"{why}; candidates {sel.candidates.get(m, [''])}; settings differ from the base in: "
            f"{settings_diff(asdict(job(m, cfg.seeds[0]).method.constraint), asdict(methods[m].constraint))}"
            for m, why in reasons.items()
        },
    )
    if geometry is not None:
        protocol["ldp"] = ldp_protocol
    results = Results(
        experiment=NAME,
        config=config_to_dict(cfg),
        protocol=protocol,
        methods=blocks,
        tables=[
            *tables.extra_tables(joined, blocks, selection_rows, list(d.shift), tune_seed=tune_seed),
            *ldp_tables,
        ],
        notes=[*tables.notes(blocks, len(cfg.seeds)), *tables.lambda_notes(lam)],
    )
    return results.to_dict()


def _takes_erm_profile(
    methods: dict[str, MethodConfig],
    tuned: list[str],
    followers: dict[str, str],
    specs: dict[str, list[str]],
    sel: Selection,
) -> bool:
    """Whether any setting the run may train takes ERM's validation profile (``alpha_from=erm``): a tuned
    method's candidates, a follower with each of its leader's candidates, or a method as configured."""
    settings = [c for m in tuned for c in candidate_methods(m, methods[m], sel)]
    for m, leader in followers.items():
        for spec in specs.get(leader, [""]):
            settings += candidate_methods(m, methods[m], replace(sel, candidates={m: [spec]}))
    settings += [mc for m, mc in methods.items() if m not in tuned and m not in followers]
    return any(
        c.constrained and c.constraint.alpha_from == ERM and c.constraint.alpha_reference is None
        for c in settings
    )
