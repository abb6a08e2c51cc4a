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
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from descentlab.config import config_to_dict
from descentlab.data.text_batches import Prepared, prepare_data
from descentlab.evaluation import EmbeddingGeometry, RobustnessCurves, mean_sequence_tokens
from descentlab.experiments.text_robustness import report
from descentlab.experiments.text_robustness.claims import CONTROL, CORRECT, ERM, LOSS, SEP
from descentlab.experiments.text_robustness.config import TextRobustnessConfig
from descentlab.experiments.text_robustness.jobs import Job, decode_output, load_model, run_job
from descentlab.report.results import Results
from descentlab.study.cells import CellStore, Design
from descentlab.study.jobs import JobRunner
from descentlab.study.tuning import Round, Tuned, TuningConfig, tune_then_replicate
from descentlab.study.tuning_rules import (
    CandidateSelection,
    candidate_methods,
    choose_candidate,
    settings_diff,
    with_reference,
)
from descentlab.train.recipe import MethodConfig
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
    methods, sel = cfg.resolved_methods(), cfg.selection
    leaders, followers = selection_roles(cfg, methods)
    specs = {m: sel.candidates.get(m, [""]) for m in leaders}

    with JobRunner(run_job, workers=cfg.workers, cache_dir=run.path / "jobs", decode=decode_output) as jobs:
        submit = partial(submit_job, jobs, cfg, data, run)
        # 2. ERM on the tuning seed (validation only), when a candidate is chosen or a setting takes ERM's
        # per-layer validation profile (alpha_from=erm); its evaluation runs are queued beside it
        erm_clean, reference = erm_tuning_run(cfg, methods, leaders, followers, submit)
        grids = {  # each leader's candidate settings, alpha_from=erm resolved
            m: [
                Setting(with_reference(c, reference), i)
                for i, c in enumerate(candidate_methods(m, methods[m], sel))
            ]
            for m in leaders
        }
        # 3. every leader with several candidates tuned on validation (tuning seed), then every arm on every
        # evaluation seed at its chosen setting; a follower takes its leader's choice, so one whose leader
        # is tuned runs once that choice is known
        settings = {
            m: Setting(with_reference(methods[m], reference)) for m in cfg.methods if m not in followers
        }
        settings |= {m: g[0] for m, g in grids.items()}
        selecting = tuple(m for m in leaders if len(grids[m]) > 1)
        early = {m: ld for m, ld in followers.items() if ld not in selecting}
        rounds = [Round(selecting, partial(grid_of, grids))] if selecting else []
        choose = partial(pick, sel, specs, erm_clean)
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
    outputs = {m: (tuned.per_seed | after.per_seed)[m] for m in cfg.methods}

    # 4. the cell store (the runner judges the claims from it) and the arrays the report reads
    joined = {m: RobustnessCurves.concat([o["curves"] for o in outs]) for m, outs in outputs.items()}
    losses = {m: np.asarray([o["layer_examples"] for o in outs]) for m, outs in outputs.items()}
    cell_store(cfg, joined, losses, reference).save(run.path, writer=run.writer)
    ldp_joined, ldp_tables, protocol = {}, [], {}  # type: ignore[var-annotated]
    if geometry is not None:
        tokens = mean_sequence_tokens(data.test)
        ldp_joined, privacy, protocol["ldp"] = report.privacy(outputs, geometry, cfg.evaluation, tokens)
        ldp_tables = [privacy.to_dict()]
    tried = {m: r for m, r in tuned.results.items() if m in grids and r}
    lam = save_arrays(run, cfg, outputs, tried, ldp_joined)

    # 5. results: the method blocks, the protocol with each method's selection, the tables and notes
    blocks = {
        m: method_block(cfg, m, outs, joined[m], losses[m], chosen[m], ldp_joined.get(m))
        for m, outs in outputs.items()
    }
    rows, selection = selection_outcome(cfg, specs, tuned, followers, erm_clean, chosen)
    sizes = {
        "n_train": len(data.train),
        "n_eval": int(joined[cfg.methods[0]].protocol["n_eval"]),
        "n_val": sum(len(b["labels"]) for b in data.val),
    }
    tables = report.tables(joined, blocks, rows, list(cfg.data.shift), tune_seed=cfg.tune_seed)
    return Results(
        experiment=NAME,
        config=config_to_dict(cfg),
        protocol=protocol_record(cfg, sizes, selection) | protocol,
        methods=blocks,
        tables=tables + ldp_tables,
        notes=report.notes(blocks, len(cfg.seeds), lam),
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


def follower_settings(
    followers: Mapping[str, str],
    methods: Mapping[str, MethodConfig],
    sel: CandidateSelection,
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


def leader_spec(sel: CandidateSelection, chosen: Mapping[str, Setting], leader: str) -> str:
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
    submission of the same job gets the same Future: JobRunner keys). The profile is needed when a setting
    the run may train takes it (``alpha_from=erm``): a leader's candidates, a follower with each of its
    leader's candidates, or a method as configured."""
    sel = cfg.selection
    settings = [c for m in leaders for c in candidate_methods(m, methods[m], sel)]
    for m, leader in followers.items():
        for spec in sel.candidates.get(leader, [""]):
            settings += candidate_methods(m, methods[m], replace(sel, candidates={m: [spec]}))
    settings += [mc for m, mc in methods.items() if m not in leaders and m not in followers]
    takes_profile = any(
        c.constrained and c.constraint.alpha_from == ERM and c.constraint.alpha_reference is None
        for c in settings
    )
    selecting = any(len(sel.candidates.get(m, [""])) > 1 for m in leaders)
    if ERM not in methods or not (selecting or takes_profile):
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


def selection_rule(
    sel: CandidateSelection,
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


def grid_of(grids: Mapping[str, list[Setting]], arm: str, chosen: Mapping[str, Setting]) -> list[Setting]:
    """The tuning round's candidates of ``arm``: its whole grid (one round, nothing depends on ``chosen``)."""
    return grids[arm]


def pick(
    sel: CandidateSelection,
    specs: Mapping[str, list[str]],
    erm_clean: float | None,
    arm: str,
    results: Sequence[Any],
) -> int:
    """The candidate ``arm`` picks from its validation scores (:func:`selection_rule`)."""
    return selection_rule(sel, specs, erm_clean, arm, results)[0]


def selection_outcome(
    cfg: TextRobustnessConfig,
    specs: Mapping[str, list[str]],
    tuned: Tuned[Setting],
    followers: Mapping[str, str],
    erm_clean: float | None,
    chosen: Mapping[str, MethodConfig],
) -> tuple[list[list[Any]], dict[str, str]]:
    """The selection table's rows and, per leader and follower, the reason for its setting, its candidates
    and where its chosen constraint differs from its own."""
    rows: list[list[Any]] = []
    reasons = {m: f"only candidate {specs[m][0] or '(defaults)'!r}" for m in specs}
    for m, results in tuned.results.items():
        if m in specs and results:
            _, found, reasons[m] = selection_rule(cfg.selection, specs, erm_clean, m, results)
            rows += found
    for m, leader in followers.items():
        spec = leader_spec(cfg.selection, tuned.chosen, leader)
        reasons[m] = f"follows {leader}: {spec or '(defaults)'!r}"
    methods = cfg.resolved_methods()
    for m in reasons:
        diff = settings_diff(asdict(chosen[m].constraint), asdict(methods[m].constraint))
        reasons[m] += (
            f"; candidates {cfg.selection.candidates.get(m, [''])}; settings differ from the base in: {diff}"
        )
    return rows, reasons


def protocol_record(
    cfg: TextRobustnessConfig, sizes: Mapping[str, int], selection: Mapping[str, str]
) -> dict[str, Any]:
    """The run's ``protocol``: what ``config.json`` does not say (the split, the sizes, how the noise and
    the per-layer loss are measured, the controls, each method's selection)."""
    sel = cfg.selection
    criterion = (
        "accuracy averaged over the gaussian γ grid" if sel.criterion == "robust" else "clean accuracy"
    )
    rule = (
        f"rule: highest validation {criterion} among candidates within {sel.max_clean_drop} clean validation "
        f"accuracy of ERM, every run trained from the tuning seed {cfg.tune_seed} (never an evaluation seed; "
        "its runs are not reported)"
    )
    if sel.min_binding is not None:
        rule += (
            f"; eligible only if the candidate's constraint binds on its tuning run: the time-average of "
            f"Σ_l λ_l over the second half of training > {sel.min_binding:g} (if none binds, among all)"
        )
    scored = "test" if cfg.evaluate_on == "test" else "validation (a search: no test example is scored)"
    return {
        "dataset": cfg.data.name,
        "split": f"{scored}; constraint settings selected on validation (tuning seed {cfg.tune_seed})",
        **sizes,
        "seeds": list(cfg.seeds),
        "noise": "added to the input-embedding output, per-coordinate variance (γ σ_E)², σ_E = RMS of the "
        "embedding matrix; keyed by example content, so all methods see the same noise",
        "layer_loss": "test mean of the per-example cross-entropy read out at layers 0..L through the "
        "model's own pooling and head, clean; mean over seeds",
        "controls": {
            CONTROL: "trained through the per-layer readout with λ frozen at 0 (frozen_zero)",
            "deep-supervision": "fixed equal weights (1/L) Σ_l f_l, no multipliers",
            "erm-noise": f"ERM on gaussian embedding noise, γ_train = {cfg.train_noise} (positive control)",
        },
        "selection": {m: f"{why}; {rule}" for m, why in selection.items()},
        "shift_sets": list(cfg.data.shift)
        or "none: no second offline text set with the fresh/rotten label space installs "
        "(descentlab.data.ASSETS)",
    }


def cell_store(
    cfg: TextRobustnessConfig,
    curves: Mapping[str, RobustnessCurves],
    losses: Mapping[str, np.ndarray],
    erm_val_profile: Sequence[float] | None,
) -> CellStore:
    """The claims' cells (:mod:`.claims`): each method's per-review correctness per noise kind and its
    per-layer clean loss ``[seed, L+1, example]``, under the design record."""
    first = curves[cfg.methods[0]]
    if first.examples is None:
        raise ValueError("the accuracy curves kept no per-example values (keep_examples=True)")
    extra: dict[str, Any] = {"gammas": [float(g) for g in first.gammas]}
    if erm_val_profile is not None:  # the monotone claim is untestable when ERM's own profile never rises
        extra["erm_val_profile"] = [float(v) for v in erm_val_profile]
    examples = int(next(iter(first.examples.values())).shape[-1])
    store = CellStore(Design(tuple(curves), tuple(first.examples), tuple(cfg.seeds), examples, extra))
    for m, c in curves.items():
        for kind, correct in (c.examples or {}).items():
            store.put(CORRECT, m, kind, np.asarray(correct, dtype=np.float32))
        store.put(LOSS, m, None, np.asarray(losses[m], dtype=np.float32))
    return store


def save_arrays(
    run: RunDir,
    cfg: TextRobustnessConfig,
    outputs: Mapping[str, list[dict[str, Any]]],
    tried: Mapping[str, list[dict[str, Any]]],
    ldp: Mapping[str, RobustnessCurves],
) -> dict[str, np.ndarray]:
    """The arrays beside the cell store (:mod:`.report`): λ of the evaluation runs (returned; seeds cut to
    the shortest trace) and of each candidate's tuning run (``tried``: method -> each candidate's
    validation scores), and the local-DP correctness."""
    lam = {}
    for m, outs in outputs.items():
        traces = [o["lambda_trace"] for o in outs]
        if m not in cfg.frozen_zero and all(t and t["steps"] for t in traces):
            n = min(len(t["steps"]) for t in traces)
            lam[f"{m}{SEP}steps"] = np.asarray(traces[0]["steps"][:n], dtype=np.float64)
            lam[m] = np.asarray([t["lambda"][:n] for t in traces], dtype=np.float64)
    tuning = {
        f"{m}{SEP}cand{i}{suffix}": np.asarray(trace[key], dtype=np.float64)
        for m, cands in tried.items()
        for i, s in enumerate(cands)
        if (trace := s.get("lambda_trace")) and trace["steps"]
        for suffix, key in ((f"{SEP}steps", "steps"), ("", "lambda"))
    }
    for name, arrays in ((report.LAMBDA, lam), (report.LAMBDA_SELECTION, tuning)):
        if arrays:
            run.save_arrays(name, **arrays)
    if ldp:
        if any(c.examples is None for c in ldp.values()):
            raise ValueError("the ε curves kept no per-example values (keep_examples=True)")
        epsilons = np.asarray(next(iter(ldp.values())).gammas, dtype=np.float64)
        correct = {
            f"{m}{SEP}{k}": v.astype(np.float32)
            for m, c in ldp.items()
            for k, v in (c.examples or {}).items()
        }
        run.save_arrays(report.LDP, epsilons=epsilons, **correct)
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
    """One method's results block from its per-seed outputs (:func:`.report.method_block`), with the
    seed-level interval of its per-layer loss, its constraint and its local-DP curves."""
    profiles = {k: [o["profiles"][k] for o in outs] for k in outs[0]["profiles"]}
    extra = {k: [o["extra"][k] for o in outs] for k in outs[0]["extra"]}
    lams = [o["multipliers"] for o in outs if o["multipliers"] is not None and label not in cfg.frozen_zero]
    block = report.method_block(curves, profiles, extra, lams, cfg.evaluation.kinds[0])
    block.extra["layer_loss_ci"] = report.layer_loss_ci(losses)
    if setting.constrained:
        block.extra["constraint"] = asdict(setting.constraint)
    report.add_ldp_curves(block, ldp_curves)  # no-op without the ε kinds
    return block
