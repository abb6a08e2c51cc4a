"""text-robustness: fine-tune a pretrained encoder classifier with ERM, hard layer-wise descent constraints
and their resilient relaxation; compare clean accuracy, accuracy under embedding noise, per-layer loss.

METHODS.md §1.5-1.6. Every method trains on the same split, with the same optimizer, budget and seeds.
The constraint hyper-parameters of each constrained method are chosen among a small grid of candidates on
the *validation* split (first seed only), never on test; the choice and the reason go into the protocol.
Test evaluation: clean accuracy, accuracy against γ for each noise kind (``draws`` realisations per model,
content-keyed so that every method sees the same noisy inputs), the per-layer test loss clean and at
γ = ``profile_gamma``, and clean accuracy on optional dataset-shift sets.
"""

from __future__ import annotations

import json
import multiprocessing
import shlex
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from descentlab.data.text_batches import Prepared, TextDataConfig, prepare_data
from descentlab.errors import ConfigError
from descentlab.experiments import text_robustness_results as results
from descentlab.experiments.base import seed_everything
from descentlab.robustness import DEFAULT_GAMMAS, RobustnessCurves, layer_loss_profile, robustness_curve
from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import ERM, Constrained
from descentlab.train.rundir import RunDir, atomic_write_text

METHODS = ("erm", "constrained", "resilient")


@dataclass
class ConstraintSettings:
    alpha: float = 0.1
    early_alpha: float | None = None  # α of layers 1..early_layers (small α for early layers)
    early_layers: int = 0
    dual_lr: float = 0.05
    detach_prev: bool = False
    constrain_first: bool = True  # constrain layer 1 against the embedding readout
    layers: list[int] | None = None  # constrained layers (1-based); None = all
    penalty: float = 1.0  # resilient method only: slack cost a
    slack_lr: float | None = None  # resilient: η_u (None = 1/a)
    resilience_form: str = "slack"


@dataclass
class Selection:
    # candidates: space-separated ConstraintSettings overrides, e.g. "alpha=0.05 detach_prev=true"
    constrained: list[str] = field(default_factory=lambda: [""])
    resilient: list[str] = field(default_factory=lambda: [""])
    criterion: str = "robust"  # robust: val accuracy averaged over the gaussian γ grid; clean: val accuracy
    max_clean_drop: float = 0.01  # candidates losing more clean val accuracy than this vs ERM are last resort
    draws: int = 1


@dataclass
class Evaluation:
    kinds: list[str] = field(default_factory=lambda: ["gaussian", "uniform", "discrete"])
    gammas: list[float] = field(default_factory=lambda: list(DEFAULT_GAMMAS))
    draws: int = 3
    noise_seed: int = 0
    profile_kind: str = "gaussian"
    profile_gamma: float = 1.0


@dataclass
class TextRobustnessConfig:
    model: str = "minilm"  # offline MiniLM-L6; or any HF encoder classifier id / local dir
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    lr: float = 5e-5
    weight_decay: float = 0.01
    data: TextDataConfig = field(default_factory=TextDataConfig)
    constraint: ConstraintSettings = field(default_factory=ConstraintSettings)
    selection: Selection = field(default_factory=Selection)
    evaluation: Evaluation = field(default_factory=Evaluation)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=2, batch_size=32, log_every=10))
    workers: int = 1  # >1: train/evaluate (method, seed) jobs in that many 1-thread processes

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ConfigError(f"methods must be a non-empty subset of {list(METHODS)}, got {self.methods}")
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if not self.seeds:
            raise ConfigError("seeds must list at least one training seed")
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if self.selection.criterion not in ("robust", "clean"):
            raise ConfigError(
                f"selection.criterion must be robust or clean, got {self.selection.criterion!r}"
            )
        if 0.0 not in self.evaluation.gammas:
            raise ConfigError("evaluation.gammas must contain 0 (the clean point)")
        for method in ("constrained", "resilient"):
            for candidate in getattr(self.selection, method):
                candidate_settings(self.constraint, candidate)


CONFIG = TextRobustnessConfig

PRESETS = {
    # `make demo`: about 300 CPU-seconds in all, under 4 minutes on 2 idle cores
    "quick": {
        "seeds": [0],
        "lr": 1e-4,
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
        "lr": 1e-4,
        "data.n_train": 640,
        "data.n_eval": 150,
        "train.epochs": 1,
        "train.batch_size": 16,
        "evaluation.draws": 1,
        "evaluation.gammas": [0.0, 0.5, 1.0, 1.5, 2.0, 3.0],
        "workers": 2,
        "selection.constrained": ["", "dual_lr=0.5 detach_prev=true early_alpha=0.0 early_layers=4"],
        "selection.resilient": ["", "dual_lr=0.5 detach_prev=true early_alpha=0.0 early_layers=4"],
    },
}


def candidate_settings(base: ConstraintSettings, candidate: str) -> ConstraintSettings:
    """``base`` with a candidate's ``key=value`` overrides applied (typed, validated by OmegaConf)."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(base), OmegaConf.from_dotlist(shlex.split(candidate)))
        return OmegaConf.to_object(merged)
    except (OmegaConfBaseException, ValueError) as e:
        raise ConfigError(f"bad selection candidate {candidate!r}: {e}; use ConstraintSettings keys") from e


def build_constraint(settings: ConstraintSettings, num_layers: int, resilient: bool) -> Any:
    """A LayerwiseDescent with α_l = early_alpha for l <= early_layers, else alpha."""
    from descentlab.constrained.descent import LayerwiseDescent
    from descentlab.constrained.dual import Resilience

    alpha = [
        settings.early_alpha
        if settings.early_alpha is not None and layer <= settings.early_layers
        else settings.alpha
        for layer in range(1, num_layers + 1)
    ]
    resilience = (
        Resilience(penalty=settings.penalty, lr=settings.slack_lr, form=settings.resilience_form)
        if resilient
        else None
    )
    return LayerwiseDescent(
        num_layers,
        alpha,
        settings.dual_lr,
        resilience,
        detach_prev=settings.detach_prev,
        constrain_first=settings.constrain_first,
        layers=settings.layers,
        max_multiplier=None,
    )


@dataclass(frozen=True)
class Job:
    """Train (or resume from the run's checkpoint) one model, then evaluate it on ``split``."""

    method: str
    settings: ConstraintSettings | None
    seed: int
    tag: str
    split: str  # "validation": selection numbers only; "test": the full evaluation


def train_model(cfg: TextRobustnessConfig, job: Job, data: Prepared, run: RunDir) -> tuple[Any, Any]:
    """Fresh pretrained encoder + head (head initialised from the seed), trained by the job's method.

    ``fit`` resumes from the newest checkpoint under the job's tag, so a finished job only reloads.
    """
    from descentlab.constrained.primal_dual import PrimalDual
    from descentlab.data import load_encoder_classifier

    seed_everything(job.seed)
    model, _ = load_encoder_classifier(cfg.model, num_labels=data.num_labels)
    optimizer: torch.optim.Optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay
    )
    constraint = None
    if job.method == "erm":
        objective: Any = ERM()
    else:
        resilient = job.method == "resilient"
        constraint = build_constraint(job.settings, model.config.num_hidden_layers, resilient=resilient)
        optimizer = PrimalDual(optimizer, constraint)
        objective = Constrained(constraint)
    train_cfg = replace(cfg.train, seed=job.seed)
    fit(
        model,
        data.train,
        objective=objective,
        optimizer=optimizer,
        cfg=train_cfg,
        collate_fn=data.collate,
        run=run,
        tag=job.tag,
    )
    return model.eval(), constraint


def accuracy_curves(
    cfg: TextRobustnessConfig,
    model: Any,
    batches: list,
    seed: int,
    kinds: list[str],
    draws: int,
    gammas: list[float] | None = None,
) -> RobustnessCurves:
    ev = cfg.evaluation
    return robustness_curve(
        model,
        batches,
        metric="accuracy",
        kinds=kinds,
        gammas=ev.gammas if gammas is None else gammas,
        draws=draws,
        seed=ev.noise_seed,
        model_seeds=[seed],
    )


def clean_accuracy(model: Any, batches: list) -> float:
    curve = robustness_curve(model, batches, kinds=["gaussian"], gammas=[0.0], draws=1)
    return float(curve.values["gaussian"][0, 0, 0])


def run_job(cfg: TextRobustnessConfig, job: Job, data: Prepared, run: RunDir) -> dict[str, Any]:
    """One job end to end; returns plain numbers (so it can run in a worker process).

    The numbers are also saved under ``jobs/`` in the run directory: a resumed run reuses them instead of
    evaluating again (training itself resumes from the fit checkpoints).
    """
    saved = run.path / "jobs" / f"{job.tag}-{job.split}.json"
    if saved.is_file():
        return decode_output(json.loads(saved.read_text()))
    ev = cfg.evaluation
    model, constraint = train_model(cfg, job, data, run)
    if job.split == "validation":
        out: dict[str, Any] = {"clean": clean_accuracy(model, data.val)}
        if job.method != "erm":
            curve = accuracy_curves(cfg, model, data.val, job.seed, ["gaussian"], cfg.selection.draws)
            out["robust"] = curve.summary()["gaussian"]
    else:
        curves = accuracy_curves(cfg, model, data.test, job.seed, list(ev.kinds), ev.draws)
        noisy = layer_loss_profile(
            model, data.test, kind=ev.profile_kind, gamma=ev.profile_gamma, draws=ev.draws, seed=ev.noise_seed
        )
        extra = {"val_accuracy": clean_accuracy(model, data.val)}
        extra.update({f"shift:{name}": clean_accuracy(model, b) for name, b in data.shift.items()})
        run.log(tag=f"eval-{job.tag}", clean_accuracy=float(curves.values[ev.kinds[0]][0, 0, 0]))
        out = {
            "curves": curves.to_dict(),
            "profiles": {"clean": layer_loss_profile(model, data.test), noisy_condition(ev): noisy},
            "extra": extra,
            "multipliers": constraint.multipliers.tolist() if constraint is not None else None,
        }
    saved.parent.mkdir(exist_ok=True)
    atomic_write_text(saved, json.dumps(out))
    return decode_output(out)


def decode_output(out: dict[str, Any]) -> dict[str, Any]:
    if "curves" in out:
        out = {**out, "curves": RobustnessCurves.from_dict(out["curves"])}
    return out


def noisy_condition(ev: Evaluation) -> str:
    return f"{ev.profile_kind}@{ev.profile_gamma:g}"


def _worker_init(threads: int) -> None:
    torch.set_num_threads(threads)


@contextmanager
def job_pool(cfg: TextRobustnessConfig, data: Prepared, run: RunDir) -> Iterator[Callable[[Job], Future]]:
    """``submit(job) -> Future``: inline when ``workers=1`` (runs at once), else in spawned 1-thread workers."""
    if cfg.workers <= 1:

        def submit_inline(job: Job) -> Future:
            future: Future = Future()
            future.set_result(run_job(cfg, job, data, run))
            return future

        yield submit_inline
        return
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(cfg.workers, mp_context=context, initializer=_worker_init, initargs=(1,))
    try:
        yield lambda job: pool.submit(run_job, cfg, job, data, run)
    except BaseException:
        # a failed job (or Ctrl-C) must not wait for the queued ones; finished fits stay checkpointed, so
        # `resume=RUN_DIR` picks up from there
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def run(cfg: TextRobustnessConfig, run: RunDir) -> dict:
    d, ev, seed0 = cfg.data, cfg.evaluation, cfg.seeds[0]
    data = prepare_data(cfg.data, cfg.model)

    # 1. ERM for every seed, and every candidate of a constrained method on the first seed (validation)
    candidates = {
        m: [candidate_settings(cfg.constraint, c) for c in getattr(cfg.selection, m)]
        for m in cfg.methods
        if m != "erm"
    }
    to_select = [m for m, c in candidates.items() if len(c) > 1]
    chosen: dict[str, int] = {m: 0 for m in candidates}
    selection_rows: list[list[Any]] = []
    reasons = {m: f"only candidate {getattr(cfg.selection, m)[0] or '(defaults)'!r}" for m in candidates}

    def job(method: str, seed: int) -> Job:
        if method == "erm":
            return Job("erm", None, seed, f"erm-seed{seed}", "test")
        # the first seed's chosen candidate resumes from its selection checkpoint
        tag = f"{method}-cand{chosen[method]}-seed{seed}" if seed == seed0 else f"{method}-seed{seed}"
        return Job(method, candidates[method][chosen[method]], seed, tag, "test")

    with job_pool(cfg, data, run) as submit:
        pending = {("erm", s): submit(job("erm", s)) for s in cfg.seeds if "erm" in cfg.methods}
        val_futures = {
            m: [
                submit(Job(m, c, seed0, f"{m}-cand{i}-seed{seed0}", "validation"))
                for i, c in enumerate(cands)
            ]
            for m, cands in candidates.items()
            if m in to_select
        }
        erm_clean = (
            pending[("erm", seed0)].result()["extra"]["val_accuracy"] if "erm" in cfg.methods else None
        )
        for m, futures in val_futures.items():
            chosen[m], rows, reasons[m] = results.choose_candidate(
                m,
                getattr(cfg.selection, m),
                [f.result() for f in futures],
                erm_clean,
                criterion=cfg.selection.criterion,
                max_clean_drop=cfg.selection.max_clean_drop,
            )
            selection_rows += rows
        # 2. test evaluation of every (method, seed) with the chosen settings
        pending.update({(m, s): submit(job(m, s)) for s in cfg.seeds for m in candidates})
        outputs = {m: [pending[(m, s)].result() for s in cfg.seeds] for m in cfg.methods}

    # 3. results in the DESIGN.md shape
    joined = {m: RobustnessCurves.concat([o["curves"] for o in outs]) for m, outs in outputs.items()}
    methods_out = {}
    for m, outs in outputs.items():
        profiles = {k: [o["profiles"][k] for o in outs] for k in outs[0]["profiles"]}
        extra = {k: [o["extra"][k] for o in outs] for k in outs[0]["extra"]}
        lams = [o["multipliers"] for o in outs if o["multipliers"] is not None]
        methods_out[m] = results.method_block(joined[m], profiles, extra, lams, ev.kinds[0])
        if m in candidates:
            methods_out[m]["constraint"] = asdict(candidates[m][chosen[m]])
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
        "budget": f"{cfg.train.epochs} epoch(s), batch {cfg.train.batch_size}, AdamW lr {cfg.lr} "
        f"wd {cfg.weight_decay}, max_length {d.max_length}",
        "layer_loss": f"test mean of the loss read out at layers 0..L, clean and {noisy_condition(ev)} "
        f"({ev.draws} draws); mean over seeds",
        "selection": {
            m: f"{why} (differs from the base settings in: "
            f"{results.settings_diff(asdict(candidates[m][chosen[m]]), asdict(cfg.constraint))})"
            for m, why in reasons.items()
        },
        "shift_sets": list(d.shift),
    }
    return {
        "protocol": protocol,
        "methods": methods_out,
        "tables": results.extra_tables(joined, methods_out, selection_rows, list(d.shift)),
        "figures": [],
        "notes": results.notes(methods_out, len(cfg.seeds)),
    }
