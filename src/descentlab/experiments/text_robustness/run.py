"""text-robustness's run: data -> selection of each constrained method's settings on validation (tuning
seed) -> every (method, seed) job on test -> the arrays the claims and figures read -> results.

Every method is one :class:`~descentlab.train.recipe.MethodConfig` (:mod:`.config`). The
:class:`~descentlab.constrained.config.DescentConfig` of each constrained method is chosen among a small
grid of candidates on the *validation* split, trained from ``tune_seed`` (never an evaluation seed), never on
test; ERM's run on that seed gives the clean-accuracy margin and the ``alpha_from=erm`` reference profile.
The chosen settings then train afresh on every evaluation seed: no tuning run is reported. A method with one
candidate is not tuned, and without tuning or ``alpha_from=erm`` there is no tuning run at all; a method
that follows another (``selection.follow``) takes its choice. The plan is
:func:`~descentlab.study.tuning.tune_then_replicate`'s: one search round over the tuned methods' grids, then
every method on every evaluation seed. The choice and the reason go into the protocol. Test evaluation: clean accuracy, accuracy against γ for each noise kind (``draws``
realisations per model, content-keyed so that every method sees the same noisy inputs), the per-layer test
loss clean and at γ = ``profile_gamma``, and clean accuracy on optional dataset-shift sets; with
``evaluation.ldp_kinds``, accuracy against the local-DP ε and its privacy accounting. The claims' per-review
cells go into the run's cell store (:mod:`.arrays`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from descentlab.config import config_to_dict
from descentlab.data import load_encoder_classifier
from descentlab.data.text_batches import Prepared, prepare_data
from descentlab.experiments.text_robustness import arrays, ldp, tables
from descentlab.experiments.text_robustness.claims import ERM
from descentlab.experiments.text_robustness.config import TextRobustnessConfig
from descentlab.experiments.text_robustness.jobs import Job, decode_output, run_job
from descentlab.report.results import Results
from descentlab.robustness import EmbeddingGeometry, RobustnessCurves, mean_sequence_tokens
from descentlab.study.tuning import Round, Tuned, TuningConfig, tune_then_replicate
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
    # 1. data; with the local-DP kinds, the Gaussian mechanism's clip C from the pretrained model unless given
    data = prepare_data(cfg.data, cfg.model)
    geometry = None
    if cfg.evaluation.ldp_kinds:
        geometry = EmbeddingGeometry.of(load_encoder_classifier(cfg.model, num_labels=data.num_labels)[0])
        clip = cfg.evaluation.clip if cfg.evaluation.clip is not None else geometry.max_norm
        cfg = replace(cfg, evaluation=replace(cfg.evaluation, clip=clip))
    methods, sel = cfg.resolved_methods(), cfg.selection
    leaders, followers = selection_roles(cfg, methods)
    specs = {m: sel.candidates.get(m, [""]) for m in leaders}

    with JobRunner(run_job, workers=cfg.workers, cache_dir=run.path / "jobs", decode=decode_output) as jobs:
        submit = partial(submit_job, jobs, cfg, data, run)
        # 2. ERM on the tuning seed (validation only), when a candidate is chosen or a setting takes ERM's
        # per-layer validation profile (alpha_from=erm); its evaluation runs are queued beside it
        erm_clean, reference = erm_tuning_run(cfg, methods, leaders, followers, submit)
        grids = {m: leader_grid(m, methods[m], sel, reference) for m in leaders}
        # 3. every leader with several candidates tuned on validation (tuning seed), then every arm on every
        # evaluation seed at its chosen setting; a follower takes its leader's choice, so one whose leader
        # is tuned runs once that choice is known
        settings = {
            m: Setting(with_reference(methods[m], reference)) for m in cfg.methods if m not in followers
        }
        settings |= {m: g[0] for m, g in grids.items()}
        selecting = tuple(m for m in leaders if len(grids[m]) > 1)
        early = {m: ld for m, ld in followers.items() if ld not in selecting}
        choose = partial(choose_index, sel, specs, erm_clean)
        rounds = [Round(selecting, partial(grid_of, grids))] if selecting else []
        tuned = tune_then_replicate(
            settings | follower_settings(early, methods, sel, settings, reference),
            TuningConfig(cfg.seeds, cfg.tune_seed, rounds),
            submit,
            choose,
        )
        late = {m: ld for m, ld in followers.items() if m not in early}
        after = tune_then_replicate(
            follower_settings(late, methods, sel, tuned.chosen, reference),
            TuningConfig(cfg.seeds, cfg.tune_seed),
            submit,
            choose,
        )
    chosen = {m: s.method for m, s in (tuned.chosen | after.chosen).items()}
    per_seed = tuned.per_seed | after.per_seed
    outputs = {m: per_seed[m] for m in cfg.methods}

    # 4. the cell store and the other arrays (the runner judges the claims from the store), then results
    joined = {m: RobustnessCurves.concat([o["curves"] for o in outs]) for m, outs in outputs.items()}
    losses = {m: np.asarray([o["layer_examples"] for o in outs]) for m, outs in outputs.items()}
    store = arrays.cell_store(joined, losses, seeds=cfg.seeds, erm_val_profile=reference)
    store.save(run.path, writer=run.writer)
    tried = {m: r for m, r in tuned.results.items() if m in grids and r}
    lam = save_arrays(run, cfg, outputs, joined, tried)
    ldp_joined, ldp_tables, ldp_protocol = {}, [], {}  # type: ignore[var-annotated]
    if geometry is not None:
        ldp_joined, ldp_tables, ldp_protocol = ldp.summarise(
            outputs, geometry, cfg.evaluation, mean_sequence_tokens(data.test)
        )
        run.save_arrays(arrays.LDP, **arrays.ldp_arrays(ldp_joined))
    blocks = {
        m: method_block(cfg, m, outs, joined[m], losses[m], chosen[m], ldp_joined.get(m))
        for m, outs in outputs.items()
    }
    rows, reasons = selection_outcome(cfg, specs, tuned, followers, erm_clean)
    protocol = tables.protocol(
        cfg,
        n_train=len(data.train),
        n_eval=int(joined[cfg.methods[0]].protocol["n_eval"]),
        n_val=sum(len(b["labels"]) for b in data.val),
        selection={
            m: f"{why}; {setting_change(sel, m, chosen[m], methods[m])}" for m, why in reasons.items()
        },
    )
    if geometry is not None:
        protocol["ldp"] = ldp_protocol
    return Results(
        experiment=NAME,
        config=config_to_dict(cfg),
        protocol=protocol,
        methods=blocks,
        tables=[
            *tables.extra_tables(joined, blocks, rows, list(cfg.data.shift), tune_seed=cfg.tune_seed),
            *ldp_tables,
        ],
        notes=[*tables.notes(blocks, len(cfg.seeds)), *tables.lambda_notes(lam)],
    ).to_dict()


def selection_roles(
    cfg: TextRobustnessConfig, methods: Mapping[str, MethodConfig]
) -> tuple[list[str], dict[str, str]]:
    """``(leaders, followers)``: the constrained methods that choose among their own candidates (not
    frozen at λ ≡ 0, following no other), and ``follower -> leader`` for those that take another's choice."""
    follow = cfg.selection.follow
    followers = {m: follow[m] for m in methods if m in follow and follow[m] in methods}
    leaders = [
        m for m, mc in methods.items() if mc.constrained and m not in followers and m not in cfg.frozen_zero
    ]
    return leaders, followers


@dataclass(frozen=True)
class Setting:
    """What one arm trains: its method and, for a tuning candidate, its index in the arm's grid (two specs
    may give one method; each is still its own tuning run and row of the selection table)."""

    method: MethodConfig
    candidate: int | None = None


def leader_grid(
    label: str, method: MethodConfig, sel: Selection, reference: list[float] | None
) -> list[Setting]:
    """``label``'s candidate settings, ``alpha_from=erm`` resolved."""
    return [
        Setting(with_reference(c, reference), i) for i, c in enumerate(candidate_methods(label, method, sel))
    ]


def grid_of(grids: Mapping[str, list[Setting]], arm: str, chosen: Mapping[str, Setting]) -> list[Setting]:
    """The tuning round's candidates of ``arm``: its whole grid (one round, nothing depends on ``chosen``)."""
    return grids[arm]


def follower_settings(
    followers: Mapping[str, str],
    methods: Mapping[str, MethodConfig],
    sel: Selection,
    chosen: Mapping[str, Setting],
    reference: list[float] | None,
) -> dict[str, Setting]:
    """Each follower's own constraint edited by the spec its leader chose (the leader's first, or only,
    candidate when the leader is not tuned)."""
    out = {}
    for m, leader in followers.items():
        spec = leader_spec(sel, chosen, leader)
        (own,) = candidate_methods(m, methods[m], replace(sel, candidates={m: [spec]}))
        out[m] = Setting(with_reference(own, reference))
    return out


def leader_spec(sel: Selection, chosen: Mapping[str, Setting], leader: str) -> str:
    """The override spec of ``leader``'s chosen candidate."""
    pick = chosen[leader].candidate if leader in chosen else None
    return sel.candidates.get(leader, [""])[pick or 0]


def erm_tuning_run(
    cfg: TextRobustnessConfig,
    methods: Mapping[str, MethodConfig],
    leaders: Sequence[str],
    followers: Mapping[str, str],
    submit: Callable[[str, Setting, int], Future],
) -> tuple[float | None, list[float] | None]:
    """ERM's clean validation accuracy and per-layer validation loss profile on the tuning seed (the
    ``alpha_from=erm`` reference); ``(None, None)`` when nothing needs them. ERM's evaluation runs, which
    need nothing from it, are queued beside it so the other workers keep busy (the planner's later
    submission of the same job gets the same Future: JobRunner keys)."""
    selecting = any(len(cfg.selection.candidates.get(m, [""])) > 1 for m in leaders)
    if ERM not in methods or not (
        selecting or _takes_erm_profile(methods, leaders, followers, cfg.selection)
    ):
        return None, None
    tuning = submit(ERM, Setting(methods[ERM]), cfg.tune_seed)
    for seed in cfg.seeds:
        submit(ERM, Setting(methods[ERM]), seed)
    scores = tuning.result()
    return scores["clean"], scores["val_profile"]


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


def choose_index(
    sel: Selection,
    specs: Mapping[str, list[str]],
    erm_clean: float | None,
    arm: str,
    results: Sequence[Mapping[str, Any]],
) -> int:
    """The candidate ``arm`` picks from its validation scores (:func:`choose_candidate`)."""
    return selection_rule(sel, specs, erm_clean, arm, results)[0]


def selection_rule(
    sel: Selection,
    specs: Mapping[str, list[str]],
    erm_clean: float | None,
    arm: str,
    results: Sequence[Mapping[str, Any]],
) -> tuple[int, list[list[Any]], str]:
    """:func:`choose_candidate` under the config's selection rule: (pick, selection-table rows, reason)."""
    return choose_candidate(
        arm, specs[arm], results, erm_clean,
        criterion=sel.criterion, max_clean_drop=sel.max_clean_drop, min_binding=sel.min_binding,
    )  # fmt: skip


def selection_outcome(
    cfg: TextRobustnessConfig,
    specs: Mapping[str, list[str]],
    tuned: Tuned[Setting],
    followers: Mapping[str, str],
    erm_clean: float | None,
) -> tuple[list[list[Any]], dict[str, str]]:
    """The selection table's rows and, per leader and follower, the reason for its setting."""
    rows: list[list[Any]] = []
    reasons = {m: f"only candidate {specs[m][0] or '(defaults)'!r}" for m in specs}
    for m, results in tuned.results.items():
        if m in specs and results:
            _, found, reasons[m] = selection_rule(cfg.selection, specs, erm_clean, m, results)
            rows += found
    for m, leader in followers.items():
        spec = leader_spec(cfg.selection, tuned.chosen, leader)
        reasons[m] = f"follows {leader}: {spec or '(defaults)'!r}"
    return rows, reasons


def setting_change(sel: Selection, label: str, chosen: MethodConfig, base: MethodConfig) -> str:
    """The protocol's words on ``label``'s candidates and where its chosen constraint differs from its own."""
    diff = settings_diff(asdict(chosen.constraint), asdict(base.constraint))
    return f"candidates {sel.candidates.get(label, [''])}; settings differ from the base in: {diff}"


def save_arrays(
    run: RunDir,
    cfg: TextRobustnessConfig,
    outputs: Mapping[str, list[dict[str, Any]]],
    joined: Mapping[str, RobustnessCurves],
    tried: Mapping[str, list[dict[str, Any]]],
) -> dict[str, np.ndarray]:
    """The arrays beside the cell store (:mod:`.arrays`): accuracies, λ of the evaluation runs (returned)
    and of each candidate's tuning run."""
    run.save_arrays(arrays.ACCURACY, **arrays.accuracy_arrays(joined))
    lam = arrays.lambda_arrays(outputs, cfg.frozen_zero)
    if lam:
        run.save_arrays(arrays.LAMBDA, **lam)
    if tuning_lam := arrays.selection_lambda_arrays(tried):
        run.save_arrays(arrays.LAMBDA_SELECTION, **tuning_lam)
    return lam


def method_block(
    cfg: TextRobustnessConfig,
    label: str,
    outs: list[dict[str, Any]],
    curves: RobustnessCurves,
    losses: np.ndarray,
    setting: MethodConfig,
    ldp_curves: RobustnessCurves | None,
) -> Any:
    """One method's results block from its per-seed outputs (:func:`.tables.method_block`), with the
    seed-level interval of its per-layer loss, its constraint and its local-DP curves."""
    profiles = {k: [o["profiles"][k] for o in outs] for k in outs[0]["profiles"]}
    extra = {k: [o["extra"][k] for o in outs] for k in outs[0]["extra"]}
    lams = [o["multipliers"] for o in outs if o["multipliers"] is not None and label not in cfg.frozen_zero]
    block = tables.method_block(curves, profiles, extra, lams, cfg.evaluation.kinds[0])
    block.extra["layer_loss_ci"] = tables.layer_loss_ci(losses)
    if setting.constrained:
        block.extra["constraint"] = asdict(setting.constraint)
    ldp.add_ldp_curves(block, ldp_curves)  # no-op without the ε kinds
    return block


def _takes_erm_profile(
    methods: Mapping[str, MethodConfig],
    tuned: Sequence[str],
    followers: Mapping[str, str],
    sel: Selection,
) -> bool:
    """Whether any setting the run may train takes ERM's validation profile (``alpha_from=erm``): a tuned
    method's candidates, a follower with each of its leader's candidates, or a method as configured."""
    settings = [c for m in tuned for c in candidate_methods(m, methods[m], sel)]
    for m, leader in followers.items():
        for spec in sel.candidates.get(leader, [""]):
            settings += candidate_methods(m, methods[m], replace(sel, candidates={m: [spec]}))
    settings += [mc for m, mc in methods.items() if m not in tuned and m not in followers]
    return any(
        c.constrained and c.constraint.alpha_from == ERM and c.constraint.alpha_reference is None
        for c in settings
    )
