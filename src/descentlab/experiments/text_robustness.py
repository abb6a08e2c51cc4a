"""text-robustness: fine-tune a pretrained encoder classifier with ERM, hard layer-wise descent constraints
and their resilient relaxation; compare clean accuracy, accuracy under embedding noise, per-layer loss.

METHODS.md §1.5-1.6. Every method is one :class:`~descentlab.train.recipe.MethodConfig`: the shared base
``method`` (optimizer, constraint) edited by its spec in ``specs``, so every method trains on the same split,
with the same optimizer, budget and seeds. The :class:`~descentlab.constrained.config.DescentConfig` of each
constrained method is chosen among a small grid of candidates (override specs) on the *validation* split
(first seed only), never on test; the choice and the reason go into the protocol. Test evaluation: clean
accuracy, accuracy against γ for each noise kind (``draws`` realisations per model, content-keyed so that
every method sees the same noisy inputs), the per-layer test loss clean and at γ = ``profile_gamma``, and
clean accuracy on optional dataset-shift sets; with ``evaluation.ldp_kinds``, accuracy against the local-DP
ε (METHODS.md §4.3) with paired CIs, the privacy accounting and a verdict per ε against ERM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from descentlab.config import config_to_dict
from descentlab.constrained.config import DescentConfig
from descentlab.data import load_encoder_classifier
from descentlab.data.text_batches import Prepared, TextDataConfig, prepare_data
from descentlab.errors import ConfigError
from descentlab.optim.config import OptimizerConfig
from descentlab.report import text_robustness as report
from descentlab.report import text_robustness_ldp as ldp_report
from descentlab.report.results import Results
from descentlab.robustness import (
    EmbeddingGeometry,
    NoiseEvalConfig,
    RobustnessCurves,
    layer_loss_profile,
    mean_sequence_tokens,
    robustness_curve,
)
from descentlab.train.jobs import JobRunner
from descentlab.train.loop import TrainConfig, fit, seed_everything
from descentlab.train.recipe import MethodConfig, build_recipe, with_overrides
from descentlab.train.rundir import RunDir

NAME = "text-robustness"
ERM = report.ERM  # the reference method of the selection margin, the paired gaps and the notes

# each method is the base `method` edited by its spec (dotted MethodConfig keys)
SPECS = {
    "erm": "",
    "constrained": "objective=constrained",
    "resilient": "objective=constrained constraint.resilient=true",
}


def base_method() -> MethodConfig:
    # AdamW decaying every tensor, as `AdamW(model.parameters())` did here; no λ ceiling: this experiment
    # never stopped on a large multiplier, and its numbers were measured without one
    return MethodConfig(
        optimizer=OptimizerConfig(name="adamw", lr=5e-5, weight_decay=0.01, decay="all"),
        constraint=DescentConfig(max_multiplier=None),
    )


@dataclass
class Selection:
    """Validation-split choice of each constrained method's constraint settings (first seed only).

    Attributes:
        candidates: method -> DescentConfig override specs (e.g. ``"alpha=0.05 detach_prev=true"``), applied
            to that method's own constraint; a method without an entry has the one candidate ``""``.
        criterion: ``robust``: validation accuracy averaged over the gaussian γ grid; ``clean``: clean accuracy.
        max_clean_drop: candidates losing more clean validation accuracy than this vs ERM are a last resort.
        draws: noise realisations of the validation curve.
    """

    candidates: dict[str, list[str]] = field(default_factory=dict)
    criterion: str = "robust"
    max_clean_drop: float = 0.01
    draws: int = 1


@dataclass
class TextRobustnessConfig:
    model: str = "minilm"  # offline MiniLM-L6; or any HF encoder classifier id / local dir
    method: MethodConfig = field(default_factory=base_method)
    specs: dict[str, str] = field(default_factory=lambda: dict(SPECS))  # label -> override spec of `method`
    methods: list[str] = field(default_factory=lambda: list(SPECS))  # the labels run, in this order
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    data: TextDataConfig = field(default_factory=TextDataConfig)
    selection: Selection = field(default_factory=Selection)
    evaluation: NoiseEvalConfig = field(default_factory=NoiseEvalConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=2, batch_size=32, log_every=10))
    workers: int = 1  # >1: train/evaluate (method, seed) jobs in that many 1-thread processes

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in self.specs]
        if unknown or not self.methods:
            raise ConfigError(f"methods must be a non-empty subset of {list(self.specs)}, got {self.methods}")
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if not self.seeds:
            raise ConfigError("seeds must list at least one training seed")
        if self.selection.criterion not in ("robust", "clean"):
            raise ConfigError(
                f"selection.criterion must be robust or clean, got {self.selection.criterion!r}"
            )
        # every spec and candidate is checked before anything runs, run or not
        resolved = {label: with_overrides(self.method, spec) for label, spec in self.specs.items()}
        for label in self.selection.candidates:
            if label not in resolved or not resolved[label].constrained:
                raise ConfigError(f"selection.candidates.{label}: only constrained methods have candidates")
        for label, method in resolved.items():
            candidate_methods(label, method, self.selection)

    def resolved_methods(self) -> dict[str, MethodConfig]:
        """The MethodConfig of every label in ``methods``, in order."""
        return {label: with_overrides(self.method, self.specs[label]) for label in self.methods}


CONFIG = TextRobustnessConfig

PRESETS = {
    # `make demo`: about 300 CPU-seconds in all, under 4 minutes on 2 idle cores
    "quick": {
        "seeds": [0],
        "method.optimizer.lr": 1e-4,
        "data.n_train": 600,
        "data.n_eval": 200,
        "train.epochs": 1,
        "train.batch_size": 16,
        "evaluation.draws": 2,
        "evaluation.gammas": [0.0, 0.5, 1.0, 2.0, 3.0],
    },
    # sized for a CPU shared with ~7 other jobs (docs/results/text-robustness.md); two selection candidates
    # per constrained method: the first measurement's setting, and strong-but-feasible constraints
    "full": {
        "seeds": [0, 1, 2],
        "method.optimizer.lr": 1e-4,
        "data.n_train": 640,
        "data.n_eval": 150,
        "train.epochs": 1,
        "train.batch_size": 16,
        "evaluation.draws": 1,
        "evaluation.gammas": [0.0, 0.5, 1.0, 1.5, 2.0, 3.0],
        "workers": 2,
        "selection.candidates": {
            "constrained": ["", "dual_lr=0.5 detach_prev=true early_alpha=0.0 early_layers=4"],
            "resilient": ["", "dual_lr=0.5 detach_prev=true early_alpha=0.0 early_layers=4"],
        },
    },
}


def candidate_methods(label: str, method: MethodConfig, selection: Selection) -> list[MethodConfig]:
    """``method`` with each of its selection candidates applied to its constraint (one, itself, if none)."""
    if not method.constrained:
        return [method]
    out = []
    for spec in selection.candidates.get(label, [""]):
        try:
            out.append(replace(method, constraint=method.constraint.with_overrides(spec)))
        except ConfigError as e:
            raise ConfigError(f"bad selection candidate {spec!r} of {label}: {e}") from None
    return out


def choose_candidate(
    method: str,
    candidates: Sequence[str],
    scores: Sequence[Mapping[str, float]],
    erm_clean: float | None,
    *,
    criterion: str = "robust",
    max_clean_drop: float = 0.01,
) -> tuple[int, list[list[Any]], str]:
    """Pick a candidate from its validation numbers ``{"clean": .., "robust": ..}``.

    Candidates whose clean validation accuracy is within ``max_clean_drop`` of ERM's are eligible; among
    them the highest ``criterion`` score wins (ties: higher clean accuracy, then the earlier candidate). If
    none is eligible, the same order applies to all. Returns (index, selection-table rows, reason).
    """
    key = "robust" if criterion == "robust" else "clean"
    ranked = [
        (erm_clean is None or s["clean"] >= erm_clean - max_clean_drop, s[key], s["clean"], -i)
        for i, s in enumerate(scores)
    ]
    best = max(range(len(ranked)), key=lambda i: ranked[i])
    rows = [
        [method, c or "(defaults)", s["clean"], s["robust"], "yes" if i == best else ""]
        for i, (c, s) in enumerate(zip(candidates, scores, strict=True))
    ]
    what = "mean accuracy over the gaussian γ grid" if key == "robust" else "clean accuracy"
    eligible = "" if ranked[best][0] else " (no candidate was within the clean-accuracy margin)"
    why = (
        f"highest validation {what} among candidates within {max_clean_drop} clean accuracy of ERM"
        f"{eligible}: {candidates[best] or '(defaults)'!r}"
    )
    return best, rows, why


@dataclass(frozen=True)
class Job:
    """Train (or resume from the run's checkpoint) one model, then evaluate it on ``split``."""

    label: str
    method: MethodConfig
    seed: int
    tag: str  # the checkpoint folder; a job's cache key is "<tag>-<split>"
    split: str  # "validation": selection numbers only; "test": the full evaluation


def train_model(cfg: TextRobustnessConfig, job: Job, data: Prepared, run: RunDir) -> tuple[Any, Any]:
    """Fresh pretrained encoder + head (head initialised from the seed), trained by the job's method.

    ``fit`` resumes from the newest checkpoint under the job's tag, so a finished fit only reloads.
    """
    seed_everything(job.seed)
    model, _ = load_encoder_classifier(cfg.model, num_labels=data.num_labels)
    train_cfg = replace(cfg.train, seed=job.seed)
    recipe = build_recipe(job.method, model, total_steps=train_cfg.total_steps(len(data.train)))
    fit(
        model, data.train, cfg=train_cfg, collate_fn=data.collate, run=run, tag=job.tag, **recipe.fit_kwargs()
    )
    return model.eval(), recipe.constraint


def accuracy_curves(
    model: Any, batches: list, ev: NoiseEvalConfig, seed: int, kinds: list[str], draws: int
) -> RobustnessCurves:
    return robustness_curve(
        model,
        batches,
        metric="accuracy",
        kinds=kinds,
        gammas=ev.gammas,
        draws=draws,
        seed=ev.noise_seed,
        model_seeds=[seed],
    )


def clean_accuracy(model: Any, batches: list) -> float:
    curve = robustness_curve(model, batches, kinds=["gaussian"], gammas=[0.0], draws=1)
    return float(curve.values["gaussian"][0, 0, 0])


def run_job(cfg: TextRobustnessConfig, job: Job, data: Prepared, run: RunDir) -> dict[str, Any]:
    """One job end to end; returns JSON-able numbers (the JobRunner caches them under ``jobs/``)."""
    ev = cfg.evaluation
    model, constraint = train_model(cfg, job, data, run)
    if job.split == "validation":
        out: dict[str, Any] = {"clean": clean_accuracy(model, data.val)}
        if job.method.constrained:
            curve = accuracy_curves(model, data.val, ev, job.seed, ["gaussian"], cfg.selection.draws)
            out["robust"] = curve.summary()["gaussian"]
        return out
    curves = accuracy_curves(model, data.test, ev, job.seed, list(ev.kinds), ev.draws)
    ldp = None
    if ev.ldp_kinds:  # ev.clip was resolved by run(): one mechanism for every model
        ldp = robustness_curve(
            model, data.test, kinds=list(ev.ldp_kinds), epsilons=ev.epsilons, draws=ev.draws,
            seed=ev.noise_seed, model_seeds=[job.seed], keep_examples=True,
            perturb_kwargs={"delta": ev.delta, "clip": ev.clip},
        ).to_dict()  # fmt: skip
    noisy = layer_loss_profile(
        model, data.test, kind=ev.profile_kind, gamma=ev.profile_gamma, draws=ev.draws, seed=ev.noise_seed
    )
    extra = {"val_accuracy": clean_accuracy(model, data.val)}
    extra.update({f"shift:{name}": clean_accuracy(model, b) for name, b in data.shift.items()})
    run.log(tag=f"eval-{job.tag}", clean_accuracy=float(curves.values[ev.kinds[0]][0, 0, 0]))
    return {
        "curves": curves.to_dict(),
        "profiles": {"clean": layer_loss_profile(model, data.test), ev.profile_condition: noisy},
        "extra": extra,
        "multipliers": constraint.multipliers.tolist() if constraint is not None else None,
        "ldp_curves": ldp,
        "embedding_max_norm": EmbeddingGeometry.of(model).max_norm,
    }


def decode_output(out: dict[str, Any]) -> dict[str, Any]:
    for key in ("curves", "ldp_curves"):
        if out.get(key) is not None:
            out = {**out, key: RobustnessCurves.from_dict(out[key])}
    return out


def run(cfg: TextRobustnessConfig, run: RunDir) -> dict:
    d, ev, seed0 = cfg.data, cfg.evaluation, cfg.seeds[0]
    data = prepare_data(cfg.data, cfg.model)
    methods = cfg.resolved_methods()
    geometry = None
    if ev.ldp_kinds:  # the Gaussian mechanism's C: fixed from the pretrained model unless given
        geometry = EmbeddingGeometry.of(load_encoder_classifier(cfg.model, num_labels=data.num_labels)[0])
        ev = replace(ev, clip=ev.clip if ev.clip is not None else geometry.max_norm)
        cfg = replace(cfg, evaluation=ev)

    # 1. ERM for every seed, and every candidate of a constrained method on the first seed (validation)
    specs = {m: cfg.selection.candidates.get(m, [""]) for m, mc in methods.items() if mc.constrained}
    candidates = {m: candidate_methods(m, methods[m], cfg.selection) for m in specs}
    chosen = dict.fromkeys(candidates, 0)
    selection_rows: list[list[Any]] = []
    reasons = {m: f"only candidate {specs[m][0] or '(defaults)'!r}" for m in candidates}

    def job(label: str, seed: int, split: str = "test", cand: int | None = None) -> Job:
        if label not in candidates:
            return Job(label, methods[label], seed, f"{label}-seed{seed}", split)
        # the first seed's chosen candidate resumes from its selection checkpoint
        cand = chosen[label] if cand is None else cand
        tag = f"{label}-cand{cand}-seed{seed}" if seed == seed0 else f"{label}-seed{seed}"
        return Job(label, candidates[label][cand], seed, tag, split)

    with JobRunner(run_job, workers=cfg.workers, cache_dir=run.path / "jobs", decode=decode_output) as jobs:

        def submit(j: Job) -> Any:
            return jobs.submit(f"{j.tag}-{j.split}", cfg, j, data, run)

        plain = [m for m in cfg.methods if m not in candidates]
        pending = {(m, s): submit(job(m, s)) for s in cfg.seeds for m in plain}
        val_futures = {
            m: [submit(job(m, seed0, "validation", i)) for i in range(len(cands))]
            for m, cands in candidates.items()
            if len(cands) > 1
        }
        erm_clean = pending[(ERM, seed0)].result()["extra"]["val_accuracy"] if ERM in pending else None
        for m, futures in val_futures.items():
            chosen[m], rows, reasons[m] = choose_candidate(
                m,
                specs[m],
                [f.result() for f in futures],
                erm_clean,
                criterion=cfg.selection.criterion,
                max_clean_drop=cfg.selection.max_clean_drop,
            )
            selection_rows += rows
        # 2. test evaluation of every (method, seed) with the chosen settings
        pending.update({(m, s): submit(job(m, s)) for s in cfg.seeds for m in candidates})
        outputs = {m: [pending[(m, s)].result() for s in cfg.seeds] for m in cfg.methods}

    # 3. results in the DESIGN.md shape; the raw accuracies [seed, draw, γ] feed the paired-gap figure
    joined = {m: RobustnessCurves.concat([o["curves"] for o in outs]) for m, outs in outputs.items()}
    run.save_arrays(report.ACCURACY_ARRAYS, **report.accuracy_arrays(joined))
    ldp_joined, ldp_tables, ldp_protocol = {}, [], {}  # type: ignore[var-annotated]
    if geometry is not None:
        ldp_joined, ldp_tables, ldp_protocol = ldp_report.summarise(
            outputs, geometry, ev, mean_sequence_tokens(data.test)
        )
        run.save_arrays(ldp_report.LDP_ARRAYS, **ldp_report.ldp_arrays(ldp_joined))
    blocks = {}
    for m, outs in outputs.items():
        profiles = {k: [o["profiles"][k] for o in outs] for k in outs[0]["profiles"]}
        extra = {k: [o["extra"][k] for o in outs] for k in outs[0]["extra"]}
        lams = [o["multipliers"] for o in outs if o["multipliers"] is not None]
        blocks[m] = report.method_block(joined[m], profiles, extra, lams, ev.kinds[0])
        if m in candidates:
            blocks[m].extra["constraint"] = asdict(candidates[m][chosen[m]].constraint)
        ldp_report.add_ldp_curves(blocks[m], ldp_joined.get(m))  # no-op without the ε kinds
    opt = cfg.method.optimizer
    protocol = {
        "dataset": d.name,
        "model": cfg.model,
        "split": "test; constraint settings selected on validation",
        "n_train": len(data.train),
        "n_eval": int(joined[cfg.methods[0]].protocol["n_eval"]),
        "n_val": sum(len(b["labels"]) for b in data.val),
        "seeds": list(cfg.seeds),
        "draws": ev.draws,
        "noise": "added to the input-embedding output, per-coordinate variance (γ σ_E)², σ_E = RMS of the "
        "embedding matrix; keyed by example content, so all methods see the same noise",
        "kinds": list(ev.kinds),
        "gammas": list(ev.gammas),
        "noise_seed": ev.noise_seed,
        "budget": f"{cfg.train.epochs} epoch(s), batch {cfg.train.batch_size}, AdamW lr {opt.lr} "
        f"wd {opt.weight_decay}, max_length {d.max_length}",
        "layer_loss": f"test mean of the loss read out at layers 0..L, clean and {ev.profile_condition} "
        f"({ev.draws} draws); mean over seeds",
        "selection": {
            m: f"{why} (differs from the base settings in: "
            f"{settings_diff(asdict(candidates[m][chosen[m]].constraint), asdict(methods[m].constraint))})"
            for m, why in reasons.items()
        },
        "shift_sets": list(d.shift),
    }
    if geometry is not None:
        protocol["ldp"] = ldp_protocol
    results = Results(
        experiment=NAME,
        config=config_to_dict(cfg),
        protocol=protocol,
        methods=blocks,
        tables=report.extra_tables(joined, blocks, selection_rows, list(d.shift)) + ldp_tables,
        notes=report.notes(blocks, len(cfg.seeds)),
    )
    return results.to_dict()


def settings_diff(settings: Mapping[str, Any], base: Mapping[str, Any]) -> str:
    """The entries of ``settings`` that differ from ``base``, as ``key=value`` words ("nothing" if none)."""
    return " ".join(f"{k}={v}" for k, v in settings.items() if base.get(k) != v) or "nothing"
