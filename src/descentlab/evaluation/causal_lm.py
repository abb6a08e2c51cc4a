r"""Causal LMs under embedding noise: per-example NLLs, perplexity curves and head-to-head win rates.

Per model (:func:`evaluate_lm`), for every condition of a
:class:`~descentlab.evaluation.config.NoiseEvalConfig` grid, one batched pass over the held-out examples
(:func:`~descentlab.evaluation.judge.score_examples`) gives

    perplexity = exp(Σ_i nll_i / Σ_i n_i)        and each example's reference NLL  r_i,

plus logit-lens loss profiles (clean and at the grid's profile condition) and, on request, greedy
generations for a generate-then-judge comparison. The clean point (γ = 0) is one pass shared by every kind.
Noise is keyed by example content, so every model sees the same noisy embeddings and comparisons are paired.

Across models, one evaluation per training seed (``evals[s]``): perplexity curves
(:func:`perplexity_curves`), the likelihood judge's win rate of A over B (:func:`win_rate_curves`: lower
r_i wins, ties within ``tol`` nats count half) and the generative judge's (:func:`judged_win_rate_curves`).
Every curve is mean ± std over (seed, draw) pairs (:class:`~descentlab.evaluation.curves.RobustnessCurves`).

Data code stays outside: callers pass ``collate_fn(examples, pad_token_id)`` (e.g.
``descentlab.data.instructions.collate_causal``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn

from descentlab.evaluation.config import NoiseEvalConfig
from descentlab.evaluation.curves import RobustnessCurves
from descentlab.evaluation.judge import (
    Collate,
    Example,
    GenerativeJudge,
    Noise,
    generate_responses,
    score_examples,
)
from descentlab.evaluation.winrate import WinRate, win_rate
from descentlab.readout import CausalLMReadout, layer_losses

Evaluation = dict[str, Any]  # one model's evaluate_lm output (JSON-able)


def noise_key(kind: str, gamma: float, draw: int) -> str:
    """Name of one noise condition; every kind shares the one clean pass."""
    return "clean" if gamma == 0 else f"{kind}@{gamma:g}#{draw}"


def noise_conditions(grid: NoiseEvalConfig) -> list[tuple[str, Noise]]:
    """Every distinct (key, :class:`Noise`) of the grid, kinds outermost, the clean pass once."""
    out: dict[str, Noise] = {}
    for kind in grid.kinds:
        for gamma in grid.gammas:
            for draw in range(1 if gamma == 0 else grid.draws):
                out.setdefault(
                    noise_key(kind, gamma, draw), Noise(kind, gamma, seed=grid.noise_seed, draw=draw)
                )
    return list(out.items())


def prompt_ids(example: Example) -> list[int]:
    """The prompt token ids of an encoded example (``input_ids[:prompt_length]``), what a model continues."""
    return list(example["input_ids"][: example["prompt_length"][0]])


@torch.no_grad()
def layer_profile(
    model: nn.Module,
    examples: Sequence[Example],
    *,
    pad_token_id: int,
    collate_fn: Collate,
    noise: Noise,
    all_tokens: bool,
    chunk: int,
    batch_size: int = 4,
) -> list[float]:
    """Token-weighted mean logit-lens loss at layers 0..L over ``examples`` (every layer, every target).

    ``profile[l] = Σ_b n_b f_l(b) / Σ_b n_b`` with n_b the predicted tokens of batch b: the reference tokens,
    or every real token when ``all_tokens``.
    """
    model.eval()
    readout = CausalLMReadout(chunk_size=chunk, sample_tokens=None)
    device = next(model.parameters()).device
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    with noise.apply(model, pad_token_id=pad_token_id):
        for s in range(0, len(examples), batch_size):
            batch = collate_fn(examples[s : s + batch_size], pad_token_id)
            if all_tokens:
                batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
            n = int((batch["labels"][:, 1:] != -100).sum())
            f = layer_losses(model, {k: v.to(device) for k, v in batch.items()}, readout=readout)
            total, count = total + f.double() * n, count + n
    return (total / count).tolist()


def _score_into(
    out: Evaluation,
    model: nn.Module,
    examples: Sequence[Example],
    pad_token_id: int,
    collate_fn: Collate,
    batch_size: int,
    perplexity_on: str,
    key: str,
    noise: Noise,
) -> Any:
    """Score ``examples`` under ``noise``; record its perplexity and per-example NLL under ``key``."""
    s = score_examples(
        model, examples, pad_token_id=pad_token_id, batch_size=batch_size, noise=noise, collate_fn=collate_fn
    )
    out["perplexity"][key] = s.perplexity(perplexity_on)
    out["nll"][key] = s.reference_nll.tolist()
    return s


def evaluate_lm(
    model: nn.Module,
    examples: Sequence[Example],
    grid: NoiseEvalConfig,
    *,
    pad_token_id: int,
    collate_fn: Collate,
    batch_size: int = 8,
    perplexity_on: str = "all",
    layer_examples: int = 32,
    layer_chunk: int = 1024,
    generate_examples: int = 0,
    eos_token_id: int | None = None,
    max_new_tokens: int = 48,
) -> Evaluation:
    """One model on ``examples`` under every condition of ``grid`` (module docstring).

    Args:
        perplexity_on: ``"all"`` tokens of each example or the ``"reference"`` tokens only (also picks the
            tokens the layer profiles average over).
        layer_examples: the first this many examples give the layer profiles (0: none).
        generate_examples: greedy generations from the first this many prompts at draw 0 (0: none).

    Returns:
        ``{"perplexity": {key: float}, "nll": {key: [r_i]}, "layer_loss": {condition: [f_0..f_L]},
        "generations": {key: [[token ids]]}}`` keyed by :func:`noise_key`.
    """
    out: Evaluation = {"perplexity": {}, "nll": {}, "layer_loss": {}, "generations": {}}
    prompts = [prompt_ids(x) for x in examples[:generate_examples]]
    score = partial(_score_into, out, model, examples, pad_token_id, collate_fn, batch_size, perplexity_on)
    for key, noise in noise_conditions(grid):
        score(key, noise)
        if prompts and noise.draw == 0:
            out["generations"][key] = generate_responses(
                model,
                prompts,
                pad_token_id=pad_token_id,
                eos_token_id=eos_token_id,
                max_new_tokens=max_new_tokens,
                noise=noise,
            )
    sub = examples[:layer_examples]
    if not sub:
        return out
    kw = {"pad_token_id": pad_token_id, "collate_fn": collate_fn, "all_tokens": perplexity_on == "all"}
    out["layer_loss"]["clean"] = layer_profile(model, sub, noise=Noise(), chunk=layer_chunk, **kw)
    noisy = Noise(grid.profile_kind, grid.profile_gamma, seed=grid.noise_seed)
    out["layer_loss"][grid.profile_condition] = layer_profile(
        model, sub, noise=noisy, chunk=layer_chunk, **kw
    )
    return out


def level_conditions(
    levels: Mapping[str, Sequence[float]], *, draws: int = 1, seed: int = 0
) -> list[tuple[str, Noise]]:
    """The clean pass, then every (kind, level > 0, draw) of a per-kind level grid, as (key, Noise)."""
    out: dict[str, Noise] = {"clean": Noise()}
    for kind, values in levels.items():
        for level in values:
            for draw in range(draws if level > 0 else 1):
                out.setdefault(noise_key(kind, level, draw), Noise(kind, float(level), seed=seed, draw=draw))
    return list(out.items())


def evaluate_levels(
    model: nn.Module,
    examples: Sequence[Example],
    levels: Mapping[str, Sequence[float]],
    *,
    pad_token_id: int,
    collate_fn: Collate,
    draws: int = 1,
    noise_seed: int = 0,
    batch_size: int = 8,
    perplexity_on: str = "all",
    layer_examples: int = 0,
    layer_chunk: int = 1024,
    profiles: Sequence[tuple[str, float]] = (),
) -> Evaluation:
    """:func:`evaluate_lm` on a grid with its own levels per kind (e.g. levels found from a baseline's
    degradation, :mod:`descentlab.evaluation.levels`); one clean pass shared by every kind.

    Returns ``{"perplexity": {key: float}, "nll": {key: [r_i]}, "ref_tokens": [n_i], "layer_loss":
    {"clean" | "<kind>@<level>": [f_0..f_L]}}``, keys from :func:`noise_key`; ``profiles`` lists the noisy
    (kind, level) profiles wanted besides the clean one (on the first ``layer_examples`` examples).
    """
    out: Evaluation = {"perplexity": {}, "nll": {}, "ref_tokens": [], "layer_loss": {}}
    score = partial(_score_into, out, model, examples, pad_token_id, collate_fn, batch_size, perplexity_on)
    for key, noise in level_conditions(levels, draws=draws, seed=noise_seed):
        out["ref_tokens"] = score(key, noise).reference_tokens.tolist()
    sub = examples[:layer_examples]
    if sub:
        kw = {"pad_token_id": pad_token_id, "collate_fn": collate_fn, "all_tokens": perplexity_on == "all"}
        out["layer_loss"]["clean"] = layer_profile(model, sub, noise=Noise(), chunk=layer_chunk, **kw)
        for kind, level in profiles:
            noisy = Noise(kind, float(level), seed=noise_seed)
            out["layer_loss"][f"{kind}@{level:g}"] = layer_profile(
                model, sub, noise=noisy, chunk=layer_chunk, **kw
            )
    return out


def seed_grid(
    grid: NoiseEvalConfig, kind: str, n_seeds: int, value: Callable[[int, str], float]
) -> np.ndarray:
    """``value(seed index, noise key)`` on the [seeds, draws, gammas] grid; γ = 0 is the one clean pass."""
    out = np.zeros((n_seeds, grid.draws, len(grid.gammas)))
    for s in range(n_seeds):
        for g, gamma in enumerate(grid.gammas):
            for d in range(grid.draws):
                out[s, d, g] = value(s, noise_key(kind, gamma, 0 if gamma == 0 else d))
    return out


def perplexity_curves(evals: Sequence[Evaluation], grid: NoiseEvalConfig) -> dict[str, dict[str, Any]]:
    """Perplexity vs γ per kind, mean ± std over (seed, draw) pairs."""
    values = {
        kind: seed_grid(grid, kind, len(evals), lambda s, key: evals[s]["perplexity"][key])
        for kind in grid.kinds
    }
    return RobustnessCurves("perplexity", tuple(grid.gammas), values).curves()


def head_to_head(
    evals_a: Sequence[Evaluation], evals_b: Sequence[Evaluation], key: str, tol: float
) -> WinRate:
    """Likelihood-judge win rate of A over B at one noise key, pooled over seeds: lower reference NLL wins."""
    nll_a = np.concatenate([np.asarray(ev["nll"][key]) for ev in evals_a])
    nll_b = np.concatenate([np.asarray(ev["nll"][key]) for ev in evals_b])
    return win_rate(nll_a, nll_b, higher_is_better=False, tie_tol=tol)


def win_rate_curves(
    evals_a: Sequence[Evaluation], evals_b: Sequence[Evaluation], grid: NoiseEvalConfig, *, tol: float = 1e-6
) -> dict[str, dict[str, Any]]:
    """``win_rate@<kind>`` curves of A over B (seed i of A against seed i of B), likelihood judge.

    ``mean`` / ``std`` are over (seed, draw) pairs of per-seed rates; the pooled draw-0 head-to-head over all
    seeds' examples adds ``pooled_rate``, ``stderr`` (binomial, over examples), ``wins``, ``ties``, ``losses``.
    """
    out: dict[str, dict[str, Any]] = {}
    for kind in grid.kinds:

        def per_seed(s: int, key: str) -> float:
            return head_to_head([evals_a[s]], [evals_b[s]], key, tol).rate

        values = {kind: seed_grid(grid, kind, len(evals_a), per_seed)}
        curve = RobustnessCurves("win_rate", tuple(grid.gammas), values).curves()[kind]
        pooled = [head_to_head(evals_a, evals_b, noise_key(kind, g, 0), tol) for g in grid.gammas]
        curve["stderr"] = [w.stderr for w in pooled]
        curve["pooled_rate"] = [w.rate for w in pooled]
        curve.update({name: [getattr(w, name) for w in pooled] for name in ("wins", "ties", "losses")})
        out[f"win_rate@{kind}"] = curve
    return out


def judged_win_rate_curves(
    judge: GenerativeJudge,
    prompts: Sequence[str],
    evals_a: Sequence[Evaluation],
    evals_b: Sequence[Evaluation],
    grid: NoiseEvalConfig,
    decode: Callable[[list[int]], str],
) -> dict[str, dict[str, Any]]:
    """``judged_win_rate@<kind>`` curves of A over B from the saved draw-0 generations, both orders judged.

    ``prompts`` are the prompt texts of the generating examples, ``decode`` turns generated ids into text.
    """
    out: dict[str, dict[str, Any]] = {}
    for kind in grid.kinds:
        values = np.zeros((len(evals_a), 1, len(grid.gammas)))
        for s, (ev_a, ev_b) in enumerate(zip(evals_a, evals_b, strict=True)):
            for g, gamma in enumerate(grid.gammas):
                key = noise_key(kind, gamma, 0)
                a = [decode(r) for r in ev_a["generations"][key]]
                b = [decode(r) for r in ev_b["generations"][key]]
                values[s, 0, g] = float(judge.compare_texts(prompts[: len(a)], a, b).mean())
        curve = RobustnessCurves("judged_win_rate", tuple(grid.gammas), {kind: values}).curves()[kind]
        out[f"judged_win_rate@{kind}"] = curve
    return out


__all__ = [
    "Evaluation",
    "evaluate_levels",
    "evaluate_lm",
    "head_to_head",
    "judged_win_rate_curves",
    "layer_profile",
    "level_conditions",
    "noise_conditions",
    "noise_key",
    "perplexity_curves",
    "prompt_ids",
    "seed_grid",
    "win_rate_curves",
]
