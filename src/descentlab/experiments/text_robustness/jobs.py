"""text-robustness's (method, seed) job: train one model (or resume it from the run's checkpoint), then
evaluate it on the validation split (selection numbers only) or on test (the full evaluation); and the
:class:`Outcome` of a run, what the report is drawn from."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from descentlab.constrained.trace import LambdaTrace
from descentlab.data import load_encoder_classifier
from descentlab.data.text_batches import Prepared
from descentlab.errors import ConfigError
from descentlab.evaluation import EmbeddingGeometry, RobustnessCurves
from descentlab.evaluation.layer_profile import layer_loss_examples
from descentlab.evaluation.text import evaluate_classifier, validation_scores
from descentlab.experiments.text_robustness.config import ERM, TextRobustnessConfig
from descentlab.models.checkpointing import enable_activation_checkpointing
from descentlab.study.tuning_rules import binding_level
from descentlab.train.loop import fit, seed_everything
from descentlab.train.objectives import EmbeddingNoise
from descentlab.train.recipe import MethodConfig, build_frozen_recipe, build_recipe
from descentlab.train.rundir import RunDir


@dataclass(frozen=True)
class Setting:
    """What one arm trains: its method, the spec that edited the arm's own constraint into it, and for a
    tuned arm's candidate its index (two specs may give one method: each is still its own tuning run)."""

    method: MethodConfig
    spec: str = ""
    candidate: int | None = None


@dataclass(frozen=True)
class Job:
    """Train (or resume from the run's checkpoint) one model, then evaluate it on ``split``."""

    label: str
    method: MethodConfig
    seed: int
    tag: str  # the checkpoint folder; a job's cache key is "<tag>-<split>"
    # "validation": selection numbers only (ERM's with its validation profile); "test": the full evaluation
    split: str


def load_model(cfg: TextRobustnessConfig, num_labels: int) -> Any:
    """The pretrained encoder under a fresh head (``cfg.pooling``), cut to its first ``cfg.model_layers``.

    transformers would fill layers beyond the checkpoint's depth with fresh weights, without a word: that
    is refused here.
    """
    k = cfg.model_layers
    layers = {} if k is None else {"num_hidden_layers": k}
    model, _ = load_encoder_classifier(cfg.model, num_labels=num_labels, pooling=cfg.pooling, **layers)
    if k is not None:
        from transformers import AutoConfig

        depth = AutoConfig.from_pretrained(model.config.name_or_path, local_files_only=True).num_hidden_layers
        if k > depth:
            raise ConfigError(f"model_layers={k}, but {cfg.model} has only {depth} pretrained layers")
    return model


def train_model(cfg: TextRobustnessConfig, job: Job, data: Prepared, run: RunDir) -> tuple[Any, Any, dict]:
    """Fresh pretrained encoder + head (head initialised from the seed), trained by the job's method.

    ``fit`` resumes from the newest checkpoint under the job's tag, so a finished fit only reloads. Returns
    the model, its constraint (or None) and the λ trace ``{"steps", "lambda"}`` (kept beside the checkpoint).
    """
    seed_everything(job.seed)
    model = load_model(cfg, data.num_labels)
    if cfg.activation_checkpointing:  # mean pooling wraps the HF encoder: checkpoint its blocks
        hf = hasattr(model, "gradient_checkpointing_enable")
        enable_activation_checkpointing(model if hf else model.base_model)
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
    constraint = recipe.constraint
    # λ at step 1, every log_every steps and at the last (a host copy per record, not per step)
    recorder = (
        LambdaTrace(constraint, every=train_cfg.log_every, last=total) if constraint is not None else None
    )
    fit(
        model,
        data.train,
        cfg=train_cfg,
        collate_fn=data.collate,
        run=run,
        tag=job.tag,
        callbacks=[recorder] if recorder is not None else [],
        **kwargs,
    )
    trace = recorder.to_dict() if recorder is not None else {"steps": [], "lambda": []}
    path = run.path / "lambda" / f"{job.tag}.json"
    if trace["steps"]:
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(trace))
    elif path.is_file():  # a finished fit that only reloaded its checkpoint records nothing
        trace = json.loads(path.read_text())
    return model.eval(), constraint, trace


def train_job(cfg: TextRobustnessConfig, job: Job, data: Prepared, run: RunDir) -> dict[str, Any]:
    """One job end to end; returns JSON-able numbers (the JobRunner caches them under ``jobs/``)."""
    model, constraint, trace = train_model(cfg, job, data, run)
    if job.split == "validation":
        scores: dict[str, Any] = validation_scores(
            model, data.val, cfg.evaluation, job.seed, cfg.selection.draws
        )
        if job.label == ERM:  # the reference profile of alpha_from=erm: mean validation loss per layer
            scores["val_profile"] = layer_loss_examples(model, data.val).mean(1).tolist()
        if constraint is not None:  # eligible only if its constraint binds (CandidateSelection)
            scores["binding"] = binding_level(trace["steps"], trace["lambda"])
            scores["lambda_trace"] = trace
        return scores
    # a search (evaluate_on=validation) scores validation in place of test, and no shift set
    scored, shift = (data.test, data.shift) if cfg.evaluate_on == "test" else (data.val, {})
    out = evaluate_classifier(model, scored, data.val, shift, cfg.evaluation, job.seed)
    run.log(tag=f"eval-{job.tag}", clean_accuracy=out["extra"]["accuracy"])
    out["multipliers"] = constraint.multipliers.tolist() if constraint is not None else None
    out["lambda_trace"] = trace
    return out


def decode_output(out: dict[str, Any]) -> dict[str, Any]:
    for key in ("curves", "ldp_curves"):
        if out.get(key) is not None:
            out = {**out, key: RobustnessCurves.from_dict(out[key])}
    return out


@dataclass
class Outcome:
    """What a run gathered, per method in the order of ``cfg.methods``."""

    chosen: dict[str, Setting]  # the setting each method trained on the evaluation seeds
    outputs: dict[str, list[dict[str, Any]]]  # train_job's output on each evaluation seed
    tried: dict[str, list[dict[str, Any]]]  # a tuned method -> each candidate's validation scores
    # ERM's clean validation accuracy and per-layer validation loss on the tuning seed (the clean margin
    # and the alpha_from=erm profile); None when ERM did not train on it
    erm_clean: float | None
    reference: list[float] | None
    sizes: dict[str, int] = field(default_factory=dict)  # n_train, n_val
    geometry: EmbeddingGeometry | None = None  # the pretrained embeddings (the ε kinds only)
    tokens: int | None = None  # the mean test sequence length (the ε kinds only)

    def curves(self, key: str = "curves") -> dict[str, RobustnessCurves]:
        """Each method's curves joined over seeds (``key``: ``curves``, or ``ldp_curves`` for the ε kinds)."""
        return {m: RobustnessCurves.concat([o[key] for o in outs]) for m, outs in self.outputs.items()}

    def losses(self) -> dict[str, np.ndarray]:
        """Each method's clean per-review loss at every layer, ``[seed, L+1, example]``."""
        return {m: np.asarray([o["layer_examples"] for o in outs]) for m, outs in self.outputs.items()}
