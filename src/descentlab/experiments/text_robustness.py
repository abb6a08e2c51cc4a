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

import shlex
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from descentlab.errors import ConfigError
from descentlab.experiments import text_robustness_results as results
from descentlab.experiments.base import seed_everything
from descentlab.robustness import DEFAULT_GAMMAS, RobustnessCurves, layer_loss_profile, robustness_curve
from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import ERM, Constrained
from descentlab.train.rundir import RunDir

METHODS = ("erm", "constrained", "resilient")


@dataclass
class TextData:
    name: str = "rotten_tomatoes"  # offline default; or an HF hub name / local path (imdb, sst2, mnli, ...)
    text_fields: list[str] | None = None
    split_seed: int = 0
    n_train: int | None = 3000
    n_eval: int | None = 1000  # cap of validation and test (stratified)
    max_length: int = 64
    eval_batch_size: int = 64
    shift: list[str] = field(default_factory=list)  # extra test sets (names/paths), same label space


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
    data: TextData = field(default_factory=TextData)
    constraint: ConstraintSettings = field(default_factory=ConstraintSettings)
    selection: Selection = field(default_factory=Selection)
    evaluation: Evaluation = field(default_factory=Evaluation)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=2, batch_size=32, log_every=10))

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ConfigError(f"methods must be a non-empty subset of {list(METHODS)}, got {self.methods}")
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
    "quick": {
        "seeds": [0],
        "lr": 1e-4,
        "data.n_train": 600,
        "data.n_eval": 300,
        "train.epochs": 1,
        "evaluation.draws": 2,
        "evaluation.gammas": [0.0, 0.5, 1.0, 2.0, 3.0],
    },
    "full": {
        "seeds": [0, 1, 2],
        "data.n_train": 2000,
        "data.n_eval": 600,
        "train.epochs": 2,
        "evaluation.draws": 2,
        "selection.constrained": ["alpha=0.1", "alpha=0.1 early_alpha=0.0 early_layers=4"],
        "selection.resilient": ["penalty=1.0", "penalty=1.0 early_alpha=0.0 early_layers=4"],
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


def encode(split: Any, tokenizer: Any, max_length: int) -> list[dict[str, Any]]:
    """Tokenize a split (``text`` and optional ``text_pair``) into unpadded feature dicts with ``labels``."""
    pairs = list(split["text_pair"]) if "text_pair" in split.column_names else None
    enc = tokenizer(list(split["text"]), pairs, truncation=True, max_length=max_length)
    keys = list(enc.keys())
    return [{**{k: enc[k][i] for k in keys}, "labels": int(y)} for i, y in enumerate(list(split["label"]))]


def eval_batches(features: list[dict[str, Any]], collate: Any, size: int) -> list[dict[str, torch.Tensor]]:
    """Fixed evaluation batches, sorted by length to cut padding (the noise does not depend on batching)."""
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    return [collate([features[i] for i in order[k : k + size]]) for k in range(0, len(order), size)]


def train_model(
    cfg: TextRobustnessConfig,
    method: str,
    settings: ConstraintSettings | None,
    seed: int,
    train_set: list,
    collate: Any,
    num_labels: int,
    run: RunDir,
    tag: str,
) -> tuple[Any, Any]:
    """Fresh pretrained encoder + head (head initialised from ``seed``), trained by ``method``."""
    from descentlab.constrained.primal_dual import PrimalDual
    from descentlab.data import load_encoder_classifier

    seed_everything(seed)
    model, _ = load_encoder_classifier(cfg.model, num_labels=num_labels)
    optimizer: torch.optim.Optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay
    )
    constraint = None
    if method == "erm":
        objective: Any = ERM()
    else:
        constraint = build_constraint(
            settings, model.config.num_hidden_layers, resilient=method == "resilient"
        )
        optimizer = PrimalDual(optimizer, constraint)
        objective = Constrained(constraint)
    fit(
        model,
        train_set,
        objective=objective,
        optimizer=optimizer,
        cfg=replace(cfg.train, seed=seed),
        collate_fn=collate,
        run=run,
        tag=tag,
    )
    return model.eval(), constraint


def selection_summary(settings: ConstraintSettings | None, base: ConstraintSettings) -> str:
    """The chosen settings as the overrides that differ from the base settings ("defaults" if none)."""
    if settings is None:
        return "n/a"
    changed = [f"{k}={v}" for k, v in asdict(settings).items() if getattr(base, k) != v]
    return " ".join(changed) or "nothing"


def evaluate_curves(
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


def select(
    cfg: TextRobustnessConfig,
    method: str,
    candidates: list[str],
    erm_val_clean: float | None,
    train: Any,
    val: list,
) -> tuple[ConstraintSettings, Any, Any, list[list[Any]], str]:
    """Train each candidate on the first seed; keep the best on validation. Returns the winner's model too."""
    rows, best = [], None
    for i, candidate in enumerate(candidates):
        settings = candidate_settings(cfg.constraint, candidate)
        model, constraint = train(method, settings, f"{method}-cand{i}-seed{cfg.seeds[0]}")
        if len(candidates) == 1:
            return (
                settings,
                model,
                constraint,
                [[method, candidate or "(defaults)", "", "", "yes"]],
                f"only candidate {candidate or '(defaults)'!r}",
            )
        curve = evaluate_curves(cfg, model, val, cfg.seeds[0], ["gaussian"], cfg.selection.draws)
        clean, robust = curve.curves()["gaussian"]["mean"][0], curve.summary()["gaussian"]
        eligible = erm_val_clean is None or clean >= erm_val_clean - cfg.selection.max_clean_drop
        score = (eligible, robust if cfg.selection.criterion == "robust" else clean, clean)
        rows.append([method, candidate or "(defaults)", clean, robust, ""])
        if best is None or score > best[0]:
            best = (score, i, settings, model, constraint)
        else:
            del model
    _, index, settings, model, constraint = best
    rows[index][-1] = "yes"
    why = (
        f"highest validation {'mean accuracy over the gaussian γ grid' if cfg.selection.criterion == 'robust' else 'clean accuracy'}"
        f" among candidates within {cfg.selection.max_clean_drop} clean accuracy of ERM: "
        f"{candidates[index] or '(defaults)'!r}"
    )
    return settings, model, constraint, rows, why


def run(cfg: TextRobustnessConfig, run: RunDir) -> dict:
    from transformers import DataCollatorWithPadding

    from descentlab.data import load_encoder_classifier, load_text_classification

    d, ev = cfg.data, cfg.evaluation
    splits = load_text_classification(
        d.name, seed=d.split_seed, max_train=d.n_train, max_eval=d.n_eval, text_fields=d.text_fields
    )
    num_labels = int(max(splits["train"]["label"])) + 1
    _, tokenizer = load_encoder_classifier(cfg.model, num_labels=num_labels)
    collate = DataCollatorWithPadding(tokenizer, return_tensors="pt")
    train_set = encode(splits["train"], tokenizer, d.max_length)
    val = eval_batches(encode(splits["validation"], tokenizer, d.max_length), collate, d.eval_batch_size)
    test = eval_batches(encode(splits["test"], tokenizer, d.max_length), collate, d.eval_batch_size)
    shift = {}
    for name in d.shift:
        shifted = load_text_classification(name, seed=d.split_seed, max_eval=d.n_eval)["test"]
        shift[name] = eval_batches(encode(shifted, tokenizer, d.max_length), collate, d.eval_batch_size)

    def train(method: str, settings: ConstraintSettings | None, tag: str, seed: int | None = None) -> Any:
        seed = cfg.seeds[0] if seed is None else seed
        return train_model(cfg, method, settings, seed, train_set, collate, num_labels, run, tag)

    def accuracy(model: Any, batches: list, seed: int) -> float:
        return evaluate_curves(cfg, model, batches, seed, ["gaussian"], 1, gammas=[0.0]).values["gaussian"][
            0, 0, 0
        ]

    # 1. ERM, then each constrained method's settings chosen on validation (first seed)
    first: dict[str, tuple[Any, Any]] = {}
    chosen: dict[str, ConstraintSettings | None] = {"erm": None}
    selection_rows, reasons = [], {}
    if "erm" in cfg.methods:
        first["erm"] = train("erm", None, f"erm-seed{cfg.seeds[0]}")
    needs_val = any(len(getattr(cfg.selection, m)) > 1 for m in cfg.methods if m != "erm")
    erm_val_clean = accuracy(first["erm"][0], val, cfg.seeds[0]) if "erm" in first and needs_val else None
    for method in (m for m in cfg.methods if m != "erm"):
        candidates = getattr(cfg.selection, method)
        settings, model, constraint, rows, why = select(cfg, method, candidates, erm_val_clean, train, val)
        chosen[method], first[method], reasons[method] = settings, (model, constraint), why
        selection_rows += rows

    # 2. the other seeds; every model is evaluated on test as soon as it exists, then dropped
    curves: dict[str, list[RobustnessCurves]] = {m: [] for m in cfg.methods}
    noisy_key = f"{ev.profile_kind}@{ev.profile_gamma:g}"
    profiles = {m: {"clean": [], noisy_key: []} for m in cfg.methods}
    extra = {m: {} for m in cfg.methods}
    multipliers: dict[str, list[list[float]]] = {m: [] for m in cfg.methods}
    for seed in cfg.seeds:
        for method in cfg.methods:
            if seed == cfg.seeds[0]:
                model, constraint = first.pop(method)
            else:
                model, constraint = train(method, chosen[method], f"{method}-seed{seed}", seed)
            curves[method].append(evaluate_curves(cfg, model, test, seed, list(ev.kinds), ev.draws))
            profiles[method]["clean"].append(layer_loss_profile(model, test))
            profiles[method][noisy_key].append(
                layer_loss_profile(
                    model,
                    test,
                    kind=ev.profile_kind,
                    gamma=ev.profile_gamma,
                    draws=ev.draws,
                    seed=ev.noise_seed,
                )
            )
            extra[method].setdefault("val_accuracy", []).append(accuracy(model, val, seed))
            for name, batches in shift.items():
                extra[method].setdefault(f"shift:{name}", []).append(accuracy(model, batches, seed))
            if constraint is not None:
                multipliers[method].append(constraint.multipliers.tolist())
            run.log(
                tag=f"eval-{method}-seed{seed}",
                clean_accuracy=curves[method][-1].values[ev.kinds[0]][0, 0, 0],
            )
            del model, constraint

    # 3. results in the DESIGN.md shape
    joined = {m: RobustnessCurves.concat(parts) for m, parts in curves.items()}
    methods_out = {
        m: results.method_block(joined[m], profiles[m], extra[m], multipliers[m], ev.kinds[0])
        for m in cfg.methods
    }
    for m, settings in chosen.items():
        if settings is not None:
            methods_out[m]["constraint"] = asdict(settings)
    protocol = {
        "dataset": d.name,
        "model": cfg.model,
        "split": "test; constraint settings selected on validation",
        "n_train": len(train_set),
        "n_eval": int(joined[cfg.methods[0]].protocol["n_eval"]),
        "n_val": sum(len(b["labels"]) for b in val),
        "seeds": list(cfg.seeds),
        "draws": ev.draws,
        "noise": "added to the input-embedding output, per-coordinate variance (γ σ_E)², σ_E = RMS of the "
        "embedding matrix; keyed by example content, so all methods see the same noise",
        "kinds": list(ev.kinds),
        "gammas": list(ev.gammas),
        "noise_seed": ev.noise_seed,
        "budget": f"{cfg.train.epochs} epoch(s), batch {cfg.train.batch_size}, AdamW lr {cfg.lr} "
        f"wd {cfg.weight_decay}, max_length {d.max_length}",
        "layer_loss": f"test mean of the loss read out at layers 0..L, clean and {noisy_key} "
        f"({ev.draws} draws); mean over seeds",
        "selection": {
            m: f"{why} (differs from the base settings in: {selection_summary(chosen[m], cfg.constraint)})"
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
