"""The jobs of the llm-robustness experiment: fine-tune, find the noise grid, evaluate (one process each).

Each job takes the study's config (:class:`.config.LlmRobustnessConfig`, read by attribute) and runs in a
worker process of a :class:`~descentlab.train.jobs.JobRunner`; the model is loaded once per process and
reset to the pretrained weights at the start of every job.

* :func:`reference_job`: the pretrained model's logit-lens profile on validation (where the constraints
  come from) and on the held-out examples;
* :func:`train_job`: fine-tune one method from one seed, with one selection candidate (constraints chosen
  from the profile by :func:`constrained_method`, training noise for the positive control), λ recorded over
  training (:class:`LambdaTrace`) and, when asked, the validation loss (:class:`ValidationCurve`);
* :func:`grid_job`: the levels where the baseline's validation perplexity grows by each factor
  (:func:`descentlab.robustness.levels.levels_for_ratios`), on ERM's tuning run;
* :func:`validate_job`: a tuning-seed model's per-example NLLs on validation at the selection's levels;
* :func:`eval_job`: one fine-tuned model on the held-out examples at every level
  (:func:`descentlab.robustness.lm_eval.evaluate_levels`).

Every fine-tune is named by :func:`run_tag` (``<label>-seed<s>``, ``<label>-cand<i>-seed<s>`` for a
candidate's tuning run); its final weights stay in ``checkpoints/<tag>``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch

from descentlab.constrained.descent import profile_constraints
from descentlab.constrained.trace import LambdaTrace
from descentlab.data import load_causal_lm
from descentlab.data.instructions import CausalCollator, austen_examples, collate_causal
from descentlab.errors import ConfigError
from descentlab.models.checkpointing import enable_activation_checkpointing
from descentlab.robustness.judge import Noise, score_examples
from descentlab.robustness.levels import levels_for_ratios
from descentlab.robustness.lm_eval import evaluate_levels, layer_profile
from descentlab.robustness.perturb import embedding_rms, input_embedding_module
from descentlab.sparsity.sharded import is_sharded
from descentlab.train.checkpoint import load_latest
from descentlab.train.loop import fit, seed_everything
from descentlab.train.objectives import EmbeddingNoise
from descentlab.train.recipe import MethodConfig, build_recipe
from descentlab.train.rundir import RunDir

# -- jobs (run in worker processes: each loads the model once) ---------------------------------------------
_WORKER: dict[str, Any] = {}


def model_for(cfg: Any) -> tuple[torch.nn.Module, Any]:
    """This process's model, reset to the pretrained weights (loaded once per process)."""
    if (_WORKER.get("name"), _WORKER.get("dtype")) != (cfg.model.name, cfg.model.dtype):
        model, tok = load_causal_lm(cfg.model.name, dtype=cfg.model.torch_dtype)
        if cfg.model.gradient_checkpointing:
            enable_activation_checkpointing(model)
        pretrained = {k: v.detach().clone() for k, v in model.state_dict().items()}
        _WORKER.update(
            name=cfg.model.name, dtype=cfg.model.dtype, model=model, tok=tok, pretrained=pretrained
        )
    model = _WORKER["model"]
    if any(is_sharded(p) for p in model.parameters()):
        # FSDP2 (accelerate launch): the first fine-tune sharded the model in place; every rank loads the
        # whole pretrained tensors into its own rows (load_state_dict would copy a tensor into a DTensor)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, _WORKER["pretrained"], options=StateDictOptions(full_state_dict=True))
    else:
        model.load_state_dict(_WORKER["pretrained"])
    return model, _WORKER["tok"]


def _profile(cfg: Any, model: torch.nn.Module, examples: list[dict], noise: Noise) -> list[float]:
    e = cfg.eval
    return layer_profile(
        model,
        examples,
        pad_token_id=int(_WORKER["tok"].pad_token_id),
        collate_fn=collate_causal,
        noise=noise,
        all_tokens=e.perplexity_on == "all",
        chunk=e.layer_chunk,
    )


def reference_job(cfg: Any, val: list[dict], held: list[dict]) -> dict:
    """The pretrained model: its profile on validation (the constraints' source) and on the held-out set."""
    model, _ = model_for(cfg)
    started = time.perf_counter()
    val_profile = _profile(cfg, model, val[: cfg.constraints.val_examples], Noise())
    held_profile = _profile(cfg, model, held[: cfg.eval.layer_examples], Noise())
    sigma = embedding_rms(input_embedding_module(model))
    return {
        "val_profile": val_profile,
        "held_profile": held_profile,
        "sigma_e": sigma,
        "hidden_size": int(model.config.hidden_size),
        "seconds": time.perf_counter() - started,
    }


def run_tag(label: str, seed: int, candidate: int | None = None) -> str:
    """The name of one fine-tune: its checkpoint folder and job keys."""
    return f"{label}-seed{seed}" if candidate is None else f"{label}-cand{candidate}-seed{seed}"


def constrained_method(cfg: Any, label: str, val_profile: list[float], candidate: str = "") -> MethodConfig:
    """``label``'s method, with the selection ``candidate`` (DescentConfig overrides) applied, and its
    constraints chosen from the pretrained validation profile."""
    method = cfg.constraint_candidate(label, candidate)
    c = cfg.constraints
    if not method.constrained or c.select == "config":
        return method
    k = method.constraint
    layers, alphas = profile_constraints(
        val_profile, alpha_scale=k.alpha_fraction, min_drop=c.min_drop, alpha_max=k.alpha_cap
    )
    return replace(method, constraint=replace(method.constraint, layers=layers, layer_alphas=alphas))


def read_layers(method: MethodConfig, num_layers: int) -> list[int]:
    """The layers 0..L-1 a constrained method reads out: l and l-1 of every constrained l."""
    mask = method.constraint.build(num_layers).mask.tolist()
    need = {i for i, on in enumerate(mask, start=1) if on} | {
        i - 1 for i, on in enumerate(mask, start=1) if on
    }
    return sorted(i for i in need if i < num_layers)


class StepTimer:
    """fit callback: wall time per optimizer step, from the end of step 1 to the last (no start-up, no
    checkpoint writing)."""

    def __init__(self) -> None:
        self.first: tuple[int, float] | None = None
        self.last: tuple[int, float] | None = None

    def __call__(self, step: int, model: torch.nn.Module, logs: dict[str, float]) -> None:
        now = (step, time.perf_counter())
        if self.first is None:
            self.first = now
        self.last = now

    @property
    def seconds_per_step(self) -> float | None:
        if self.first is None or self.last is None or self.last[0] == self.first[0]:
            return None
        return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])


class ValidationCurve:
    """fit callback: the validation loss every ``every`` steps and at step ``last`` (the convergence check).

    The loss is the mean NLL per token over every predicted token of ``examples``,
    ``Σ_i nll_i / Σ_i n_i``, the log of their perplexity, scored clean in eval mode (no RNG drawn, so the
    training run is the same with or without it). It syncs with the host only at those steps.
    """

    def __init__(self, examples: list[dict], pad_token_id: int, batch_size: int, every: int, last: int):
        self.examples, self.pad_token_id, self.batch_size = examples, pad_token_id, batch_size
        self.every, self.last = every, last
        self.steps: list[int] = []
        self.loss: list[float] = []

    def __call__(self, step: int, model: torch.nn.Module, logs: dict[str, float]) -> None:
        if step % self.every and step != self.last:
            return
        s = score_examples(
            model,
            self.examples,
            pad_token_id=self.pad_token_id,
            batch_size=self.batch_size,
            collate_fn=collate_causal,
        )
        self.steps.append(step)
        self.loss.append(float(s.all_nll.sum()) / max(1, int(s.all_tokens.sum())))


def last_doubling_change(steps: list[int], loss: list[float]) -> float | None:
    """The relative change of a validation-loss curve over its last doubling of steps,
    ``(L(T) − L(t)) / L(t)`` with T the last step and t the last recorded step <= T/2 (None if there is none).

    Negative: the loss still fell. A fine-tune counts as converged when |change| < 2 %.
    """
    if not steps:
        return None
    half = [i for i, t in enumerate(steps) if 0 < t <= steps[-1] / 2]
    if not half:
        return None
    before = loss[half[-1]]
    return (loss[-1] - before) / before


def train_job(
    cfg: Any,
    label: str,
    train: list[dict],
    val_profile: list[float],
    run: RunDir,
    seed: int,
    candidate: str = "",
    tag: str | None = None,
    val: list[dict] | None = None,
) -> dict:
    """Fine-tune ``label`` (with the selection ``candidate``) from the pretrained weights and ``seed`` (data
    order, readout sample, training noise); the final weights stay in ``checkpoints/<tag>``."""
    tag = tag or run_tag(label, seed)
    model, tok = model_for(cfg)
    num_layers = int(model.config.num_hidden_layers)
    method = constrained_method(cfg, label, val_profile, candidate)
    readout = cfg.readout.build(read_layers(method, num_layers)) if method.constrained else None
    seed_everything(seed)
    train_cfg = replace(cfg.train, seed=seed)
    total = train_cfg.total_steps(len(train))
    recipe = build_recipe(method, model, total_steps=total, readout=readout)
    objective = recipe.objective
    if label in cfg.noisy_training:
        kind, level = cfg.noisy_training[label]
        objective = EmbeddingNoise(objective, float(level), kind, seed=seed + 1)
    timer = StepTimer()
    callbacks: list[Any] = [timer]
    trace = None
    if recipe.constraint is not None:
        trace = LambdaTrace(recipe.constraint, cfg.lambda_every)
        callbacks.append(trace)
    curve = None
    if cfg.val_every > 0 and val:
        curve = ValidationCurve(
            val[: cfg.val_curve_examples],
            int(tok.pad_token_id),
            cfg.eval.batch_size,
            every=cfg.val_every,
            last=total,
        )
        callbacks.append(curve)
    kwargs = {**recipe.fit_kwargs(), "objective": objective}
    started = time.perf_counter()
    result = fit(
        model,
        train,
        cfg=train_cfg,
        collate_fn=CausalCollator(int(tok.pad_token_id)),
        run=run,
        tag=tag,
        callbacks=callbacks,
        **kwargs,
    )
    facts: dict[str, Any] = {
        "label": label,
        "tag": tag,
        "candidate": candidate,
        "steps": result.steps,
        "train_seconds": time.perf_counter() - started,
        "seconds_per_step": timer.seconds_per_step,
        "final_train_loss": result.last_logs.get("loss"),
        "noisy_training": cfg.noisy_training.get(label),
        "seed": seed,
    }
    if curve is not None:
        facts["val_curve"] = {
            "steps": curve.steps,
            "loss": curve.loss,
            "last_doubling_change": last_doubling_change(curve.steps, curve.loss),
        }
    if recipe.constraint is not None:
        c = recipe.constraint
        facts["constrained_layers"] = [i + 1 for i, on in enumerate(c.mask.tolist()) if on]
        facts["alphas"] = c.alpha.tolist()
        facts["multipliers"] = c.multipliers.tolist()
        facts["read_layers"] = read_layers(method, num_layers)
        if c.slacks is not None:
            facts["slacks"] = c.slacks.tolist()
        facts["lambda_trace"] = trace.to_dict()
    return facts


def _load_trained(cfg: Any, tag: str, run: RunDir) -> tuple[torch.nn.Module, Any]:
    """This process's model with the final weights of the fine-tune ``tag`` (:func:`run_tag`)."""
    model, tok = model_for(cfg)
    ckpt = load_latest(run.checkpoint_dir(tag))
    if ckpt is None:
        raise ConfigError(
            f"no checkpoint of {tag!r} in {run.checkpoint_dir(tag)}; its train job did not finish"
        )
    ckpt.load_model_(model)
    return model, tok


def grid_job(cfg: Any, val: list[dict], run: RunDir, tag: str) -> dict:
    """ERM's perplexity ratio on validation against each kind's level; the levels of ``grid.ratios``.

    ``tag``: ERM's fine-tune on the tuning seed, so that no evaluation seed takes part in any choice.
    """
    model, tok = _load_trained(cfg, tag, run)
    g, examples = cfg.grid, val[: cfg.grid.val_examples]

    def perplexity(noise: Noise) -> float:
        s = score_examples(
            model,
            examples,
            pad_token_id=int(tok.pad_token_id),
            batch_size=cfg.eval.batch_size,
            noise=noise,
            collate_fn=collate_causal,
        )
        return s.perplexity(cfg.eval.perplexity_on)

    started = time.perf_counter()
    clean = perplexity(Noise())
    out: dict[str, Any] = {"clean_perplexity": clean, "kinds": {}}
    for kind in g.kinds:
        search = levels_for_ratios(
            lambda x, kind=kind: perplexity(Noise(kind, x, seed=g.noise_seed)) / clean,
            g.ratios_of(kind),
            start=g.start[kind],
            iters=g.iters,
        )
        out["kinds"][kind] = {**search.to_dict(), "levels": [float(f"{x:.4g}") for x in search.levels]}
    out["seconds"] = time.perf_counter() - started
    return out


def grid_levels(cfg: Any, grid: dict) -> dict[str, list[float]]:
    """Per kind, the sorted levels evaluated: 0, the ERM-derived ones, the fixed extras."""
    return {
        kind: sorted({0.0, *grid["kinds"][kind]["levels"], *cfg.grid.extra.get(kind, [])})
        for kind in cfg.grid.kinds
    }


def validation_levels(cfg: Any, grid: dict) -> dict[str, list[float]]:
    """The conditions a candidate is scored at on validation: clean and every ERM-derived level of
    ``grid.profile_kind`` (gaussian: the kind of the primary endpoint)."""
    kind = cfg.grid.profile_kind
    return {kind: sorted({0.0, *grid["kinds"][kind]["levels"]})}


def validate_job(cfg: Any, tag: str, val: list[dict], levels: dict, run: RunDir) -> dict:
    """A tuning-seed fine-tune's per-example NLLs on the first ``selection_examples`` validation examples,
    clean and at ``levels`` (``selection.draws`` noise draws each): the selection's inputs."""
    model, tok = _load_trained(cfg, tag, run)
    started = time.perf_counter()
    ev = evaluate_levels(
        model,
        val[: cfg.selection_examples],
        levels,
        pad_token_id=int(tok.pad_token_id),
        collate_fn=collate_causal,
        draws=cfg.selection.draws,
        noise_seed=cfg.grid.noise_seed,
        batch_size=cfg.eval.batch_size,
        perplexity_on=cfg.eval.perplexity_on,
    )
    return {"nll": ev["nll"], "perplexity": ev["perplexity"], "seconds": time.perf_counter() - started}


def eval_job(cfg: Any, tag: str, held: list[dict], levels: dict, profile: list, run: RunDir) -> dict:
    """The fine-tune ``tag`` on the held-out examples at every level (and its layer profiles)."""
    model, tok = _load_trained(cfg, tag, run)
    e = cfg.eval
    started = time.perf_counter()
    ev = evaluate_levels(
        model,
        held,
        levels,
        pad_token_id=int(tok.pad_token_id),
        collate_fn=collate_causal,
        draws=cfg.grid.draws,
        noise_seed=cfg.grid.noise_seed,
        batch_size=e.batch_size,
        perplexity_on=e.perplexity_on,
        layer_examples=e.layer_examples,
        layer_chunk=e.layer_chunk,
        profiles=[tuple(profile)],
    )
    return {**ev, "eval_seconds": time.perf_counter() - started}


def job(kind: str, *args: Any) -> dict:
    """The experiment's one job function (top level: it runs in spawned workers)."""
    jobs = {
        "reference": reference_job,
        "train": train_job,
        "grid": grid_job,
        "validate": validate_job,
        "eval": eval_job,
    }
    return jobs[kind](*args)


def validation_examples(cfg: Any, tok: Any, train: list[dict]) -> tuple[list[dict], list[dict]]:
    """(validation examples, training examples left): Austen's validation split, or a cut of an Alpaca file's
    training records."""
    d = cfg.data
    if d.source == "alpaca":
        if len(train) <= cfg.val_n:
            raise ConfigError(f"the instruction file leaves {len(train)} training records, fewer than val_n")
        return train[-cfg.val_n :], train[: -cfg.val_n]
    _, val = austen_examples(
        tok,
        seq_len=d.seq_len,
        n_train=1,
        prompt_tokens=d.prompt_tokens,
        continuation_tokens=d.continuation_tokens,
        n_eval=cfg.val_n,
        eval_split="validation",
        max_chars=d.max_chars,
        seed=d.seed,
    )
    return val, train


__all__ = [
    "LambdaTrace",
    "StepTimer",
    "ValidationCurve",
    "constrained_method",
    "eval_job",
    "grid_job",
    "grid_levels",
    "job",
    "last_doubling_change",
    "read_layers",
    "reference_job",
    "run_tag",
    "train_job",
    "validate_job",
    "validation_examples",
    "validation_levels",
]
