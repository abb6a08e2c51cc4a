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

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from descentlab.config import config_to_dict
from descentlab.constrained.config import DescentConfig
from descentlab.data import load_encoder_classifier
from descentlab.data.text_batches import Prepared, TextDataConfig, prepare_data
from descentlab.errors import ConfigError
from descentlab.optim.config import OptimizerConfig
from descentlab.report import text_claims as claims_report
from descentlab.report import text_robustness as report
from descentlab.report import text_robustness_ldp as ldp_report
from descentlab.report.results import Results
from descentlab.robustness import EmbeddingGeometry, NoiseEvalConfig, RobustnessCurves, mean_sequence_tokens
from descentlab.robustness.text_eval import evaluate_classifier, validation_scores
from descentlab.train.jobs import JobRunner
from descentlab.train.loop import TrainConfig, fit, seed_everything
from descentlab.train.objectives import EmbeddingNoise
from descentlab.train.recipe import MethodConfig, build_frozen_recipe, build_recipe, with_overrides
from descentlab.train.rundir import RunDir
from descentlab.train.tuning import (
    Selection,
    candidate_methods,
    choose_candidate,
    settings_diff,
    with_reference,
)

NAME = "text-robustness"
ERM = report.ERM  # the reference method of the selection margin, the paired gaps and the claims

# each method is the base `method` edited by its spec (dotted MethodConfig keys). Controls: "erm-readout"
# trains through the per-layer readout path with λ frozen at 0 (`frozen_zero`), so it differs from ERM only
# by that machinery; "deep-supervision" has the per-layer signal with fixed equal weights, no multipliers;
# "erm-noise" is ERM on Gaussian embedding noise (`train_noise`), the positive control of robustness.
SPECS = {
    "erm": "",
    "erm-readout": "objective=constrained",
    "deep-supervision": "objective=deep-supervision",
    "constrained": "objective=constrained",
    "resilient": "objective=constrained constraint.resilient=true",
    "erm-noise": "",
}


def base_method() -> MethodConfig:
    """AdamW decaying every tensor, and a constraint that cannot be gamed (METHODS.md §4.1):

    * ``detach_prev``: ĝ_l = f_l - (1-α_l) sg(f_{l-1}), so every loss weight is >= 0 (w_l = λ_l, w_L = 1 + λ_L)
      and no constraint is met by making an earlier layer worse;
    * ``constrain_first=False``: in BERT-family encoders the layer-0 readout is (nearly) input-independent
      ([CLS]: exactly; mean pooling: a bag of static token embeddings), so f_0 is no target to descend from;
    * small α and no λ ceiling (the infeasible case is visible in λ, not an exception).
    """
    return MethodConfig(
        optimizer=OptimizerConfig(name="adamw", lr=5e-5, weight_decay=0.01, decay="all"),
        constraint=DescentConfig(  # penalty: resilient methods only (u = λ/a at the fixed point)
            alpha=0.03, dual_lr=0.1, detach_prev=True, constrain_first=False, max_multiplier=None, penalty=1.0
        ),
    )


@dataclass
class TextRobustnessConfig:
    model: str = "minilm"  # offline MiniLM-L6; or any HF encoder id / local dir
    # "mean": attention-masked mean over tokens + linear head (all-MiniLM's pre-training pooling); "cls": the
    # family's own head ([CLS] through BERT's pooler). Training, the per-layer readout and every prediction
    # (ERM's too) go through the same rule: it is the model's forward.
    pooling: str = "mean"
    method: MethodConfig = field(default_factory=base_method)
    specs: dict[str, str] = field(default_factory=lambda: dict(SPECS))  # label -> override spec of `method`
    methods: list[str] = field(default_factory=lambda: list(SPECS))  # the labels run, in this order
    frozen_zero: list[str] = field(default_factory=lambda: ["erm-readout"])  # constrained labels, λ ≡ 0
    # label -> γ_train: trained on gaussian embedding noise at that level (fresh noise every step)
    train_noise: dict[str, float] = field(default_factory=lambda: {"erm-noise": 1.0})
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    data: TextDataConfig = field(default_factory=lambda: TextDataConfig(n_train=3000, n_eval=1000))
    selection: Selection = field(default_factory=Selection)
    evaluation: NoiseEvalConfig = field(
        default_factory=lambda: NoiseEvalConfig(
            kinds=["gaussian", "uniform", "discrete", "substitute"],
            gammas=[0.0, 1.0, 2.0],
            draws=2,
            profile_gamma=0.0,
        )
    )
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(epochs=2, batch_size=32, log_every=5, group_by_length=50)
    )
    margin: float = 0.003  # clean-parity claim: within this accuracy of ERM's (the paper's 0.3 %)
    # the claims are tested against each of these: ERM (the paper's comparison) and the matched control
    # (same readout path, λ ≡ 0), which separates the multipliers' effect from the readout machinery's
    references: list[str] = field(default_factory=lambda: [ERM, "erm-readout"])
    n_boot: int = 2000
    workers: int = 1  # >1: train/evaluate (method, seed) jobs in that many 1-thread processes

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in self.specs]
        if unknown or not self.methods:
            raise ConfigError(f"methods must be a non-empty subset of {list(self.specs)}, got {self.methods}")
        if self.pooling not in ("cls", "mean"):
            raise ConfigError(f"pooling must be 'cls' or 'mean', got {self.pooling!r}")
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if not self.seeds:
            raise ConfigError("seeds must list at least one training seed")
        if self.selection.criterion not in ("robust", "clean"):
            raise ConfigError(
                f"selection.criterion must be robust or clean, got {self.selection.criterion!r}"
            )
        bad_noise = {k: v for k, v in self.train_noise.items() if not v > 0}
        if bad_noise:
            raise ConfigError(f"train_noise levels must be > 0, got {bad_noise}")
        # every spec and candidate is checked before anything runs, run or not
        resolved = {label: with_overrides(self.method, spec) for label, spec in self.specs.items()}
        for label in self.frozen_zero:
            if label in resolved and not resolved[label].constrained:
                raise ConfigError(
                    f"frozen_zero: {label!r} must be a constrained method (objective=constrained)"
                )
        for label in self.selection.candidates:
            if label not in resolved or not resolved[label].constrained:
                raise ConfigError(f"selection.candidates.{label}: only constrained methods have candidates")
        for label, leader in self.selection.follow.items():
            if leader not in resolved or label not in resolved or not resolved[label].constrained:
                raise ConfigError(f"selection.follow.{label}={leader!r}: both must be constrained methods")
        for label, method in resolved.items():
            for cand in candidate_methods(label, method, self.selection):
                if cand.constrained and cand.constraint.alpha_from not in (None, ERM):
                    raise ConfigError(
                        f"{label}: constraint.alpha_from must be null or 'erm', got {cand.constraint.alpha_from!r}"
                    )
                if cand.constrained and cand.constraint.alpha_from == ERM and ERM not in self.methods:
                    raise ConfigError(f"{label}: alpha_from=erm needs erm among the methods")

    def resolved_methods(self) -> dict[str, MethodConfig]:
        """The MethodConfig of every label in ``methods``, in order."""
        return {label: with_overrides(self.method, self.specs[label]) for label in self.methods}


CONFIG = TextRobustnessConfig

# The settings the full study chose on validation (docs/results/text-robustness.md): the quick preset and
# `make demo` use them directly, without a selection round.
CHOSEN = ""  # chosen over "alpha_from=erm" in the full run of 1 December 2026

PRESETS = {
    # `make demo`: six methods, one seed, every noise kind; a few minutes on 2 cores
    "quick": {
        "seeds": [0],
        "method.optimizer.lr": 1e-4,
        "data.n_train": 600,
        "data.n_eval": 200,
        "train.epochs": 1,
        "train.batch_size": 16,
        "evaluation.draws": 2,
        "selection.candidates": {"constrained": [CHOSEN]},
        "n_boot": 500,
        "workers": 2,
    },
    # the protocol of issue 14: 3,000 / 1,000 / 1,000 reviews, 2 epochs, 3 seeds, 2 draws, four kinds; the
    # constraint chosen on validation among `selection.candidates` (the defaults); <= 60 min on 2 idle cores
    "full": {
        "workers": 2,
        "train.progress": False,
    },
}


@dataclass(frozen=True)
class Job:
    """Train (or resume from the run's checkpoint) one model, then evaluate it on ``split``."""

    label: str
    method: MethodConfig
    seed: int
    tag: str  # the checkpoint folder; a job's cache key is "<tag>-<split>"
    split: str  # "validation": selection numbers only; "test": the full evaluation


def train_model(cfg: TextRobustnessConfig, job: Job, data: Prepared, run: RunDir) -> tuple[Any, Any, dict]:
    """Fresh pretrained encoder + head (head initialised from the seed), trained by the job's method.

    ``fit`` resumes from the newest checkpoint under the job's tag, so a finished fit only reloads. Returns
    the model, its constraint (or None) and the λ trace ``{"steps", "lambda"}`` (kept beside the checkpoint).
    """
    seed_everything(job.seed)
    model, _ = load_encoder_classifier(cfg.model, num_labels=data.num_labels, pooling=cfg.pooling)
    train_cfg = replace(cfg.train, seed=job.seed)
    total = train_cfg.total_steps(len(data.train))
    if job.label in cfg.frozen_zero:
        layers = model.config.num_hidden_layers
        recipe = build_frozen_recipe(job.method, model, [0.0] * layers, total_steps=total)
    else:
        recipe = build_recipe(job.method, model, total_steps=total)
    kwargs = recipe.fit_kwargs()
    if job.label in cfg.train_noise:
        kwargs["objective"] = EmbeddingNoise(recipe.objective, cfg.train_noise[job.label], seed=job.seed)
    trace: dict[str, list] = {"steps": [], "lambda": []}
    constraint = recipe.constraint

    def record(step: int, _model: Any, _logs: Any) -> None:
        if constraint is not None and (step % train_cfg.log_every == 0 or step == total):
            trace["steps"].append(step)
            trace["lambda"].append(constraint.multipliers.tolist())

    fit(
        model,
        data.train,
        cfg=train_cfg,
        collate_fn=data.collate,
        run=run,
        tag=job.tag,
        callbacks=[record],
        **kwargs,
    )
    path = run.path / "lambda" / f"{job.tag}.json"
    if trace["steps"]:
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(trace))
    elif path.is_file():
        trace = json.loads(path.read_text())
    return model.eval(), constraint, trace


def run_job(cfg: TextRobustnessConfig, job: Job, data: Prepared, run: RunDir) -> dict[str, Any]:
    """One job end to end; returns JSON-able numbers (the JobRunner caches them under ``jobs/``)."""
    model, constraint, trace = train_model(cfg, job, data, run)
    if job.split == "validation":
        return validation_scores(model, data.val, cfg.evaluation, job.seed, cfg.selection.draws)
    out = evaluate_classifier(model, data.test, data.val, data.shift, cfg.evaluation, job.seed)
    run.log(tag=f"eval-{job.tag}", clean_accuracy=out["extra"]["accuracy"])
    out["multipliers"] = constraint.multipliers.tolist() if constraint is not None else None
    out["lambda_trace"] = trace
    return out


def decode_output(out: dict[str, Any]) -> dict[str, Any]:
    for key in ("curves", "ldp_curves"):
        if out.get(key) is not None:
            out = {**out, key: RobustnessCurves.from_dict(out[key])}
    return out


def run(cfg: TextRobustnessConfig, run: RunDir) -> dict:
    d, ev, seed0, sel = cfg.data, cfg.evaluation, cfg.seeds[0], cfg.selection
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
    reference: list[float] | None = None  # ERM's validation profile, first seed (alpha_from=erm)
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
        # the first seed's chosen candidate resumes from its selection checkpoint
        cand = chosen[label] if cand is None else cand
        tag = f"{label}-cand{cand}-seed{seed}" if seed == seed0 else f"{label}-seed{seed}"
        return Job(label, candidates(label)[cand], seed, tag, split)

    with JobRunner(run_job, workers=cfg.workers, cache_dir=run.path / "jobs", decode=decode_output) as jobs:

        def submit(j: Job) -> Any:
            return jobs.submit(f"{j.tag}-{j.split}", cfg, j, data, run)

        plain = [m for m in cfg.methods if m not in tuned and m not in followers]
        order = [(m, s) for s in cfg.seeds for m in plain]
        pending: dict[tuple[str, int], Any] = {}
        # ERM's first seed (and one more job, for a second worker) before the candidates, which need it
        first = [(ERM, seed0), *[o for o in order if o != (ERM, seed0)][:1]] if ERM in plain else []
        pending.update({o: submit(job(*o)) for o in first})
        erm_clean = None
        if (ERM, seed0) in pending:
            erm0 = pending[(ERM, seed0)].result()
            erm_clean, reference = erm0["extra"]["val_accuracy"], erm0["val_profile"]
        val_futures = {
            m: [submit(job(m, seed0, "validation", i)) for i in range(len(specs[m]))]
            for m in tuned
            if len(specs[m]) > 1
        }
        pending.update({o: submit(job(*o)) for o in order if o not in pending})
        for m, futures in val_futures.items():
            chosen[m], rows, reasons[m] = choose_candidate(
                m, specs[m], [f.result() for f in futures], erm_clean,
                criterion=sel.criterion, max_clean_drop=sel.max_clean_drop,
            )  # fmt: skip
            selection_rows += rows
        for m, leader in followers.items():
            reasons[m] = f"follows {leader}: {specs[leader][chosen[leader]] or '(defaults)'!r}"
        # 2. test evaluation of every (method, seed) with the chosen settings
        pending.update({(m, s): submit(job(m, s)) for s in cfg.seeds for m in [*tuned, *followers]})
        outputs = {m: [pending[(m, s)].result() for s in cfg.seeds] for m in cfg.methods}

    # 3. results in the DESIGN.md shape, the per-example arrays, the claims
    joined = {m: RobustnessCurves.concat([o["curves"] for o in outs]) for m, outs in outputs.items()}
    run.save_arrays(report.ACCURACY_ARRAYS, **report.accuracy_arrays(joined))
    correct = {m: dict(c.examples) for m, c in joined.items() if c.examples is not None}
    run.save_arrays(claims_report.EXAMPLE_ARRAYS, **claims_report.example_arrays(correct, ev.gammas))
    losses = {m: np.asarray([o["layer_examples"] for o in outs]) for m, outs in outputs.items()}
    run.save_arrays(claims_report.LAYER_ARRAYS, **{m: v.astype(np.float32) for m, v in losses.items()})
    lam = claims_report.lambda_arrays(outputs, cfg.frozen_zero)
    if lam:
        run.save_arrays(claims_report.LAMBDA_ARRAYS, **lam)
    claims = [
        row
        for ref in cfg.references
        for row in claims_report.evaluate_claims(
            correct, losses, ev.gammas, margin=cfg.margin, n_boot=cfg.n_boot, reference=ref
        )
    ]
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
        lams = [o["multipliers"] for o in outs if o["multipliers"] is not None and m not in cfg.frozen_zero]
        blocks[m] = report.method_block(joined[m], profiles, extra, lams, ev.kinds[0])
        blocks[m].extra["layer_loss_ci"] = claims_report.layer_loss_ci(losses[m], cfg.n_boot)
        if methods[m].constrained:
            blocks[m].extra["constraint"] = asdict(job(m, seed0).method.constraint)
        ldp_report.add_ldp_curves(blocks[m], ldp_joined.get(m))  # no-op without the ε kinds
    protocol = report.protocol(
        cfg,
        n_train=len(data.train),
        n_eval=int(joined[cfg.methods[0]].protocol["n_eval"]),
        n_val=sum(len(b["labels"]) for b in data.val),
        selection={
            m: f"{why}; candidates {sel.candidates.get(m, [''])}; settings differ from the base in: "
            f"{settings_diff(asdict(job(m, seed0).method.constraint), asdict(methods[m].constraint))}"
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
            claims_report.claims_table(claims),
            *report.extra_tables(joined, blocks, selection_rows, list(d.shift)),
            *ldp_tables,
        ],
        notes=report.notes(blocks, len(cfg.seeds)),
        extra={"claims": claims},
    )
    return results.to_dict()
