"""llm-robustness's jobs (:data:`JOBS`), one process each. Every job takes the config and loads the model once
per worker process, reset to the pretrained weights at its start; a fine-tune is named by :func:`run_tag`
and its final weights stay in ``checkpoints/<tag>``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import torch

from descentlab.constrained.descent import profile_constraints
from descentlab.constrained.trace import LambdaTrace
from descentlab.data import load_causal_lm
from descentlab.data.instructions import CausalCollator, austen_examples, collate_causal, example_prompt
from descentlab.errors import ConfigError
from descentlab.evaluation.causal_lm import evaluate_levels, layer_profile
from descentlab.evaluation.judge import GenerativeJudge, Noise, generate_responses, score_examples
from descentlab.evaluation.length_control import length_controlled
from descentlab.evaluation.levels import levels_for_ratios
from descentlab.models.checkpointing import enable_activation_checkpointing
from descentlab.perturbations.hooks import embedding_rms, input_embedding_module
from descentlab.sparsity.sharded import is_sharded
from descentlab.train.checkpoint import load_latest
from descentlab.train.loop import fit, seed_everything
from descentlab.train.objectives import EmbeddingNoise
from descentlab.train.recipe import MethodConfig, build_recipe
from descentlab.train.rundir import RunDir

_WORKER: dict[str, Any] = {}


@dataclass(frozen=True)
class Inputs:
    """What the jobs of one run read: the config, the run directory and the three example sets."""

    cfg: Any
    run: RunDir
    train: list[dict]
    val: list[dict]
    held: list[dict]


@dataclass
class Outcome:
    """What a run gathered, for :func:`.report.summarise`: per method its held-out evaluations and its
    fine-tunes, one per evaluation seed in the order of ``cfg.seeds``; the pretrained reference profile, the
    noise grid found on ERM's tuning run, the selection record, and the generate-then-judge results (None
    when the judge did not run)."""

    evaluations: dict[str, list[dict]]
    facts: dict[str, list[dict]]
    reference: dict
    grid: dict
    selection: dict
    judged: dict | None = None


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


def reference_job(inputs: Inputs) -> dict:
    """The pretrained model: its clean logit-lens profile on validation (the constraints' source) and on the
    held-out set, and σ_E, the RMS of its input embeddings."""
    cfg, val, held = inputs.cfg, inputs.val, inputs.held
    model, tok = model_for(cfg)
    started = time.perf_counter()
    e = cfg.eval
    kw = {"pad_token_id": int(tok.pad_token_id), "collate_fn": collate_causal, "noise": Noise()}
    profile = partial(layer_profile, model, all_tokens=e.perplexity_on == "all", chunk=e.layer_chunk, **kw)
    return {
        "val_profile": profile(val[: cfg.constraints.val_examples]),
        "held_profile": profile(held[: e.layer_examples]),
        "sigma_e": embedding_rms(input_embedding_module(model)),
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
    constrained = [i for i, on in enumerate(method.constraint.build(num_layers).mask.tolist(), start=1) if on]
    return sorted({j for i in constrained for j in (i - 1, i) if j < num_layers})


class StepTimer:
    """fit callback: wall time per optimizer step, from the end of step 1 to the last (no start-up, no
    checkpoint writing)."""

    def __init__(self) -> None:
        self.first = self.last = (0, 0.0)  # (step, time)

    def __call__(self, step: int, model: torch.nn.Module, logs: dict[str, float]) -> None:
        self.last = (step, time.perf_counter())
        self.first = self.first if self.first[0] else self.last

    @property
    def seconds_per_step(self) -> float | None:
        steps = self.last[0] - self.first[0]
        return (self.last[1] - self.first[1]) / steps if steps else None


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
        kw = {"pad_token_id": self.pad_token_id, "batch_size": self.batch_size, "collate_fn": collate_causal}
        s = score_examples(model, self.examples, **kw)
        self.steps.append(step)
        self.loss.append(float(s.all_nll.sum()) / max(1, int(s.all_tokens.sum())))


def last_doubling_change(steps: list[int], loss: list[float]) -> float | None:
    """The relative change of a validation-loss curve over its last doubling of steps,
    ``(L(T) − L(t)) / L(t)`` with T the last step and t the last recorded step <= T/2 (None if there is none).

    Negative: the loss still fell. A fine-tune counts as converged when |change| < 2 %.
    """
    half = [i for i, t in enumerate(steps) if 0 < t <= steps[-1] / 2] if steps else []
    if not half:
        return None
    before = loss[half[-1]]
    return (loss[-1] - before) / before


def train_job(inputs: Inputs, label: str, seed: int, candidate: str, tag: str, reference: dict) -> dict:
    """Fine-tune ``label`` (with the selection ``candidate``, its constraints from the ``reference`` job's
    validation profile) from the pretrained weights and ``seed`` (data order, readout sample, training
    noise); the final weights stay in ``checkpoints/<tag>``."""
    cfg, train, val = inputs.cfg, inputs.train, inputs.val
    model, tok = model_for(cfg)
    num_layers = int(model.config.num_hidden_layers)
    method = constrained_method(cfg, label, reference["val_profile"], candidate)
    readout = cfg.readout.build(read_layers(method, num_layers)) if method.constrained else None
    seed_everything(seed)
    train_cfg = replace(cfg.train, seed=seed)
    total = train_cfg.total_steps(len(train))
    recipe = build_recipe(method, model, total_steps=total, readout=readout)
    objective = recipe.objective
    if label in cfg.noisy_training:
        kind, level = cfg.noisy_training[label]
        objective = EmbeddingNoise(objective, float(level), kind, seed=seed + 1)
    timer, trace, curve = StepTimer(), None, None
    if recipe.constraint is not None:
        trace = LambdaTrace(recipe.constraint, cfg.lambda_every)
    if cfg.val_every > 0 and val:
        val_set = val[: cfg.val_curve_examples]
        curve = ValidationCurve(val_set, int(tok.pad_token_id), cfg.eval.batch_size, cfg.val_every, total)
    callbacks = [c for c in (timer, trace, curve) if c is not None]
    kwargs = {**recipe.fit_kwargs(), "objective": objective, "callbacks": callbacks}
    started = time.perf_counter()
    collate = CausalCollator(int(tok.pad_token_id))
    result = fit(model, train, cfg=train_cfg, collate_fn=collate, run=inputs.run, tag=tag, **kwargs)
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


def grid_job(inputs: Inputs, tag: str) -> dict:
    """ERM's perplexity ratio on validation against each kind's level; the levels of ``grid.ratios``.

    ``tag``: ERM's fine-tune on the tuning seed, so that no evaluation seed takes part in any choice.
    """
    cfg = inputs.cfg
    model, tok = _load_trained(cfg, tag, inputs.run)
    g, examples = cfg.grid, inputs.val[: cfg.grid.val_examples]
    kw = {
        "pad_token_id": int(tok.pad_token_id),
        "batch_size": cfg.eval.batch_size,
        "collate_fn": collate_causal,
    }

    def perplexity(noise: Noise) -> float:
        return score_examples(model, examples, noise=noise, **kw).perplexity(cfg.eval.perplexity_on)

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


def profile_condition(cfg: Any, grid: Mapping[str, Any]) -> tuple[str, float]:
    """The noisy layer profile's condition: ``grid.profile_kind`` at ``grid.profile_ratio``'s level."""
    kind = cfg.grid.profile_kind
    return kind, grid["kinds"][kind]["levels"][cfg.grid.ratios_of(kind).index(cfg.grid.profile_ratio)]


def validation_levels(cfg: Any, grid: dict) -> dict[str, list[float]]:
    """The conditions a candidate is scored at on validation: clean and every ERM-derived level of
    ``grid.profile_kind`` (gaussian: the kind of the primary endpoint)."""
    kind = cfg.grid.profile_kind
    return {kind: sorted({0.0, *grid["kinds"][kind]["levels"]})}


def validate_job(inputs: Inputs, tag: str, grid: dict) -> dict:
    """A tuning-seed fine-tune's per-example NLLs on the first ``selection_examples`` validation examples,
    clean and at :func:`validation_levels` (``selection.draws`` noise draws each): the selection's inputs."""
    cfg, started = inputs.cfg, time.perf_counter()
    examples, levels = inputs.val[: cfg.selection_examples], validation_levels(cfg, grid)
    ev = _evaluate(cfg, tag, inputs.run, examples, levels, draws=cfg.selection.draws)
    return {"nll": ev["nll"], "perplexity": ev["perplexity"], "seconds": time.perf_counter() - started}


def eval_job(inputs: Inputs, tag: str, grid: dict) -> dict:
    """The fine-tune ``tag`` on the held-out examples at every level of :func:`grid_levels` (and its layer
    profiles, clean and at :func:`profile_condition`)."""
    cfg, started = inputs.cfg, time.perf_counter()
    e, levels = cfg.eval, grid_levels(cfg, grid)
    profiles = [profile_condition(cfg, grid)]
    layers = {"layer_examples": e.layer_examples, "layer_chunk": e.layer_chunk, "profiles": profiles}
    ev = _evaluate(cfg, tag, inputs.run, inputs.held, levels, draws=cfg.grid.draws, **layers)
    return {**ev, "eval_seconds": time.perf_counter() - started}


def _evaluate(cfg: Any, tag: str, run: RunDir, examples: list[dict], levels: dict, **kwargs: Any) -> dict:
    """:func:`~descentlab.evaluation.causal_lm.evaluate_levels` of the fine-tune ``tag``."""
    model, tok = _load_trained(cfg, tag, run)
    return evaluate_levels(
        model,
        examples,
        levels,
        pad_token_id=int(tok.pad_token_id),
        collate_fn=collate_causal,
        noise_seed=cfg.grid.noise_seed,
        batch_size=cfg.eval.batch_size,
        perplexity_on=cfg.eval.perplexity_on,
        **kwargs,
    )


def generate_job(cfg: Any, tag: str, held: list[dict], conditions: Mapping[str, list], run: RunDir) -> dict:
    """The fine-tune ``tag`` answers the held-out prompts under each condition's noise (greedy): per
    condition the decoded answers and their lengths in tokens (the length control's input)."""
    g = cfg.generative
    model, tok = _load_trained(cfg, tag, run)
    model.to(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    prompts = [example_prompt(e) for e in held]
    started = time.perf_counter()
    out: dict[str, Any] = {}
    for name, (kind, level) in conditions.items():
        rows = generate_responses(
            model,
            prompts,
            pad_token_id=int(tok.pad_token_id),
            eos_token_id=tok.eos_token_id,
            max_new_tokens=g.max_new_tokens,
            batch_size=g.batch_size,
            noise=Noise(kind, float(level), seed=cfg.grid.noise_seed),
        )
        texts = [tok.decode(r, skip_special_tokens=True).strip() for r in rows]
        out[name] = {"texts": texts, "tokens": [len(r) for r in rows]}
    return {"conditions": out, "seconds": time.perf_counter() - started}


def judge_job(
    cfg: Any, prompts: list[str], generations: Mapping[str, Mapping], pairs: Mapping[str, list[list[str]]]
) -> dict:
    """The judge LM compares every method's answers with the baseline's of the same seed at every condition,
    both orders (``generations[tag]``: one fine-tune's answers; ``pairs[method]``: ``[tag, baseline tag]``
    per evaluation seed). Per method and condition: per-seed preferences and length-controlled cells
    (:func:`~descentlab.evaluation.length_control.length_controlled`), the mean raw and length-controlled
    win rates, each seed's length coefficient and the mean answer lengths."""
    g = cfg.generative
    _WORKER.clear()  # the judged models leave the device before the judge arrives
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    # on GPUs the judge is spread over every visible device (a 70B judge fits no single one)
    placement = {"device_map": "auto"} if torch.cuda.is_available() else {}
    judge_model, judge_tok = load_causal_lm(g.model, dtype=getattr(torch, g.dtype), **placement)
    judge = GenerativeJudge(
        judge_model,
        judge_tok,
        collate_fn=collate_causal,
        template=g.template,
        soft=g.soft,
        batch_size=g.judge_batch_size,
    )
    started = time.perf_counter()
    out: dict[str, Any] = {}
    for method, seed_pairs in pairs.items():
        runs: dict[str, list[tuple[Any, Any, Any]]] = {}  # condition -> per seed (preferences, LC, tokens)
        for tag, base_tag in seed_pairs:
            for name, mine in generations[tag]["conditions"].items():
                theirs = generations[base_tag]["conditions"][name]
                p = judge.compare_texts(prompts, mine["texts"], theirs["texts"]).double().cpu().numpy()
                lc = length_controlled(p, np.asarray(mine["tokens"]), np.asarray(theirs["tokens"]))
                runs.setdefault(name, []).append((p, lc, (mine["tokens"], theirs["tokens"])))
        out[method] = {
            name: {
                "preferences": [p.tolist() for p, _, _ in rows],
                "adjusted": [lc.adjusted.tolist() for _, lc, _ in rows],
                "win_rate": float(np.mean([lc.raw_rate for _, lc, _ in rows])),
                "lc_win_rate": float(np.mean([lc.rate for _, lc, _ in rows])),
                "length_coefficient": [lc.phi for _, lc, _ in rows],
                "length_controlled": all(lc.fitted for _, lc, _ in rows),
                "mean_tokens": float(np.mean([t for _, _, (mine, _) in rows for t in mine])),
                "baseline_mean_tokens": float(np.mean([t for _, _, (_, theirs) in rows for t in theirs])),
            }
            for name, rows in runs.items()
        }
    del judge, judge_model
    gc.collect()
    return {"verdicts": out, "seconds": time.perf_counter() - started}


JOBS = {
    "reference": reference_job,
    "train": train_job,
    "grid": grid_job,
    "validate": validate_job,
    "eval": eval_job,
    "generate": generate_job,
    "judge": judge_job,
}


def job(kind: str, *args: Any) -> dict:
    """The study's one job function (top level: it runs in spawned workers): ``JOBS[kind](*args)``."""
    return JOBS[kind](*args)


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
