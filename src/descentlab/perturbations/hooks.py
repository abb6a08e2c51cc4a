"""Test-time perturbations as forward hooks: token embeddings (any HF model, ours) and raw inputs (pixels, frames).

arXiv 2601.17257 perturbs token embeddings with Gaussian, uniform and discrete noise at a level γ; the exact
formulas below are ours (docs/methods.md). With σ the reference scale (σ_E = RMS of the input-embedding
matrix for embeddings, a given σ such as σ_train for inputs), each kind adds noise of per-coordinate variance
(γσ)² to the hooked tensor e:

- gaussian:   e + γ σ ξ,       ξ ~ N(0, I)
- uniform:    e + γ σ √3 ν,    ν ~ U(-1, 1)
- discrete:   e + γ σ s,       s Rademacher (±1)
- substitute: each token's embedding replaced, with probability min(1, γ/4), by the embedding of a
  uniformly drawn vocabulary row (embeddings only).
- neftune:    e + (γ / √(n·d)) ν,  ν ~ U(-1, 1), the scale of NEFTune (Jain et al. 2023; HF's
  ``neftune_noise_alpha``): here γ is NEFTune's α, not relative to σ_E; n is the example's number of real
  (non-padding) tokens, d the embedding width (HF uses the padded length; equal for unpadded batches).
  Per-coordinate std γ / √(3 n d): at γ = 5, n = 96 and d = 576 that is 0.012.

Two more embedding kinds are calibrated by a privacy parameter ε instead of γ (:mod:`.ldp`): ``metric_ldp``
(e + z, density ∝ exp(-ε‖z‖) per token) and ``gaussian_mechanism``
(clip_C(e) + σξ with σ from the analytic Gaussian mechanism at (ε, δ), Δ = 2C). Their noise is absolute
(it does not scale with σ_E); the record's ``gamma`` is the equivalent level, per-coordinate std / σ_E.

The noise is a pure function of (seed, draw, example content, position): see :mod:`.noise`. ``replicas=k``
lets one forward pass carry k stacked copies of a batch, copy j receiving draw ``draw + j``; this is the
batched fast path of :func:`descentlab.evaluation.curves.robustness_curve`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from descentlab.errors import ConfigError, DataError, ModelError
from descentlab.perturbations import ldp
from descentlab.perturbations import noise as nz
from descentlab.readout.structure import in_probe

EMBEDDING_KINDS = ("gaussian", "uniform", "discrete", "substitute", "neftune")  # levels γ
LDP_KINDS = ldp.LDP_KINDS  # levels ε
INPUT_KINDS = nz.NOISE_KINDS
KEY_MODES = ("content", "sequence")


@dataclass
class Perturbation:
    """What a perturbation context did: read it after the ``with`` block (e.g. to check the hook fired)."""

    kind: str
    gamma: float
    seed: int
    sigma: float
    calls: int = 0
    rows: int = 0
    epsilon: float | None = None  # ε kinds: the mechanism's ε (gamma is then the equivalent level)
    delta: float | None = None  # gaussian_mechanism: δ per token
    clip: float | None = None  # gaussian_mechanism: the clip norm C (sensitivity 2C)


def substitution_probability(gamma: float) -> float:
    """Probability that a token is substituted at level γ: ``min(1, γ/4)``."""
    return min(1.0, gamma / 4.0)


def embedding_rms(module: nn.Module) -> float:
    """σ_E: root mean square of all entries of the module's ``weight`` (the input-embedding matrix)."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, Tensor):
        raise ModelError(
            f"{type(module).__name__} has no `weight` matrix to take σ_E from; pass sigma=<float> explicitly."
        )
    with torch.no_grad():
        return float(weight.detach().double().pow(2).mean().sqrt())


def input_embedding_module(model: nn.Module) -> nn.Module:
    """The module whose output is the token embedding: ``model.get_input_embeddings()`` when defined."""
    getter = getattr(model, "get_input_embeddings", None)
    module = getter() if callable(getter) else None
    if isinstance(module, nn.Module):
        return module
    raise ModelError(
        f"{type(model).__name__} exposes no input embeddings (get_input_embeddings()); pass module=<the "
        "embedding module>, or use perturb_inputs(...) for pixel or frame inputs."
    )


def _check_args(kind: str, gamma: float, kinds: tuple[str, ...], key: str, replicas: int) -> None:
    if kind not in kinds:
        raise ConfigError(f"unknown perturbation kind {kind!r}; choose one of {', '.join(kinds)}.")
    if not (isinstance(gamma, (int, float)) and math.isfinite(gamma) and gamma >= 0):
        raise ConfigError(f"gamma must be a finite number >= 0, got {gamma!r}.")
    if key not in KEY_MODES:
        raise ConfigError(f"unknown key mode {key!r}; choose 'content' or 'sequence'.")
    if replicas < 1:
        raise ConfigError(f"replicas must be >= 1, got {replicas}.")


def _row_keys(
    content: Tensor,
    valid: Tensor | None,
    *,
    seed: int,
    draw: int,
    replicas: int,
    key: str,
    call: int,
) -> Tensor:
    """One key per row from (seed, draw of the row's replica, content hash or (call, row index))."""
    rows = content.shape[0]
    if rows % replicas:
        raise DataError(f"a batch of {rows} rows cannot hold {replicas} equal replicas; use a multiple.")
    per_replica = rows // replicas
    device = content.device
    draws = draw + torch.arange(rows, device=device, dtype=torch.int64) // per_replica
    if key == "content":
        ident = nz.content_keys(content, valid)
    else:
        ident = nz.fold_key(call, torch.arange(rows, device=device, dtype=torch.int64) % per_replica)
    return nz.fold_key(seed & nz.MASK32, draws & nz.MASK32, ident)


def neftune_noise(output: Tensor, keys: Tensor, alpha: float, valid: Tensor | None) -> Tensor:
    """NEFTune's noise for ``output [B, T, d]``: ``(α / √(n_b d)) ν``, ν ~ U(-1, 1), n_b the real tokens of row b.

    ``valid [B, T]`` marks the real tokens (None: all T); the noise is the content-keyed uniform stream of
    :func:`~descentlab.perturbations.noise.standard_noise` (√3·U(-1, 1)) divided by √3.
    """
    rows, width = output.shape[0], output.shape[-1]
    if valid is not None and valid.shape == output.shape[:2]:
        n = valid.sum(1).clamp_min(1).to(torch.float64)
    else:
        n = torch.full((rows,), float(math.prod(output.shape[1:-1])), dtype=torch.float64)
    n = n.to(output.device)
    nu = nz.standard_noise("uniform", keys, tuple(output.shape)) / math.sqrt(3.0)
    scale = alpha / torch.sqrt(n * width)
    return nu * scale.view(rows, *([1] * (output.dim() - 1)))


def neftune_std(alpha: float, tokens: int, width: int) -> float:
    """Per-coordinate std of NEFTune noise at level α: ``α / √(3 n d)`` (to compare with γ·σ_E)."""
    return alpha / math.sqrt(3.0 * tokens * width)


def _valid_positions(ids: Tensor, pad_token_id: int | None) -> Tensor | None:
    return None if pad_token_id is None else ids != pad_token_id


def default_clip(module: nn.Module) -> float:
    """The Gaussian mechanism's default clip norm C: the largest row norm of ``module.weight``, so that
    clipping leaves every vocabulary row (and the clean accuracy) unchanged."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise ModelError(f"{type(module).__name__} has no `weight` matrix to take C from; pass clip=<float>.")
    with torch.no_grad():
        return float(weight.detach().double().norm(dim=1).max())


def _ldp_setup(
    kind: str, gamma: float | None, epsilon: float | None, delta: float, clip: float | None, target: nn.Module
) -> tuple[float, float | None]:
    """Check an ε kind's arguments; return (ε, C or None)."""
    if gamma is not None:
        raise ConfigError(f"the {kind} kind is calibrated by epsilon=<ε>, not by gamma; drop gamma.")
    if epsilon is None:
        raise ConfigError(f"the {kind} kind needs epsilon=<ε > 0>.")
    ldp.check_epsilon(epsilon, delta if kind == "gaussian_mechanism" else None)
    if kind != "gaussian_mechanism":
        return float(epsilon), None
    return float(epsilon), float(clip) if clip is not None else default_clip(target)


@contextmanager
def perturb_embeddings(
    model: nn.Module,
    kind: str = "gaussian",
    gamma: float | None = None,
    seed: int = 0,
    *,
    epsilon: float | None = None,
    delta: float = 1e-5,
    clip: float | None = None,
    draw: int = 0,
    replicas: int = 1,
    module: nn.Module | None = None,
    sigma: float | None = None,
    pad_token_id: int | str | None = "auto",
    key: str = "content",
) -> Iterator[Perturbation]:
    """Perturb the output of the model's input-embedding module while the context is open.

    Args:
        model: any model; ``model.get_input_embeddings()`` is hooked unless ``module`` is given.
        kind: ``gaussian``, ``uniform``, ``discrete`` or ``substitute`` (level γ), or ``metric_ldp`` or
            ``gaussian_mechanism`` (level ε); see the module docstring.
        gamma: noise level γ >= 0 (default 1), relative to σ_E; γ = 0 leaves every output bit-identical.
            Not used by the ε kinds.
        seed: noise seed; with ``draw`` it indexes independent noise realisations.
        epsilon: ε of ``metric_ldp`` (per unit L2 distance) or of ``gaussian_mechanism`` (per token).
        delta: δ of ``gaussian_mechanism`` (per token).
        clip: C of ``gaussian_mechanism`` (default: the largest row norm of the embedding matrix).
        draw: index of the noise draw (the first one when ``replicas > 1``).
        replicas: the batch holds this many stacked copies; copy j gets draw ``draw + j``.
        module: the embedding module to hook (for models without ``get_input_embeddings``).
        sigma: reference scale; defaults to σ_E, the RMS of ``module.weight``.
        pad_token_id: ids excluded from an example's content key (``"auto"``: ``model.config.pad_token_id``),
            so right-padding does not change the noise an example receives.
        key: ``"content"`` (noise keyed by the example's tokens: independent of batch composition) or
            ``"sequence"`` (keyed by call count and row index, like a generator; for incremental decoding).

    Yields:
        A :class:`Perturbation` record; ``calls`` counts the perturbed forward calls.

    The hook is removed when the context exits, also on an exception. Forward calls that bypass the
    embedding module (``inputs_embeds=...``) are not perturbed: check ``record.calls``.
    """
    target = module if module is not None else input_embedding_module(model)
    private = kind in LDP_KINDS
    if private:
        epsilon, clip = _ldp_setup(kind, gamma, epsilon, delta, clip, target)
        gamma = 1.0  # checked below, then replaced by the equivalent level once d is known
    gamma = 1.0 if gamma is None else gamma
    _check_args(kind, gamma, EMBEDDING_KINDS + LDP_KINDS, key, replicas)
    scale = float(sigma) if sigma is not None else embedding_rms(target)
    if pad_token_id == "auto":
        pad_token_id = getattr(getattr(model, "config", None), "pad_token_id", None)
    record = Perturbation(kind=kind, gamma=float(gamma), seed=seed, sigma=scale)
    if private:  # gamma: the equivalent level, known once the hook sees the width d
        record.gamma, record.epsilon = math.nan, epsilon
        record.delta, record.clip = (delta, clip) if kind == "gaussian_mechanism" else (None, None)

    def hook(mod: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
        if in_probe():  # a readout's structure probe: one short row, not a batch to perturb
            return None
        record.calls += 1
        record.rows += output.shape[0]
        if gamma == 0:
            return None
        source = args[0] if args and isinstance(args[0], Tensor) else output
        integer_ids = not source.is_floating_point()
        valid = _valid_positions(source, pad_token_id) if integer_ids else None
        with torch.no_grad():
            keys = _row_keys(
                source, valid, seed=seed, draw=draw, replicas=replicas, key=key, call=record.calls
            )
            if private:
                std = ldp.mechanism_std(kind, epsilon, output.shape[-1], delta=delta, clip=clip or 0.0)
                record.gamma = std / scale
                return ldp.privatize(kind, output, keys, epsilon, delta=delta, clip=clip)
            if kind == "neftune":
                return output + neftune_noise(output, keys, gamma, valid).to(output.dtype)
            if kind != "substitute":
                xi = nz.standard_noise(kind, keys, tuple(output.shape))
                return output + (gamma * scale * xi).to(output.dtype)
            if not integer_ids or source.shape != output.shape[: source.dim()]:
                raise ModelError("the substitute kind needs an embedding module called on token ids.")
            vocab = getattr(mod, "num_embeddings", None) or mod.weight.shape[0]
            mask, ids = nz.substitution_plan(keys, source[0].numel(), substitution_probability(gamma), vocab)
            # .forward bypasses hooks: neither ours nor anybody else's sees this lookup
            replaced = mod.forward(ids.reshape(source.shape))
        tokens_mask = mask.reshape(*source.shape, *([1] * (output.dim() - source.dim())))
        return torch.where(tokens_mask, replaced.to(output.dtype), output)

    handle = target.register_forward_hook(hook)
    try:
        yield record
    finally:
        handle.remove()


def _pick_input(args: tuple[Any, ...], kwargs: dict[str, Any], name: str | None) -> tuple[str | int, Tensor]:
    if name is not None:
        if isinstance(kwargs.get(name), Tensor):
            return name, kwargs[name]
        raise DataError(f"the forward call has no tensor keyword argument {name!r} to perturb.")
    if args and isinstance(args[0], Tensor):
        return 0, args[0]
    for arg_name, value in kwargs.items():
        if isinstance(value, Tensor) and value.is_floating_point():
            return arg_name, value
    raise DataError("found no floating-point input to perturb; pass input_name=<keyword argument>.")


@contextmanager
def perturb_inputs(
    model: nn.Module,
    kind: str = "gaussian",
    gamma: float = 1.0,
    seed: int = 0,
    *,
    sigma: float,
    draw: int = 0,
    replicas: int = 1,
    module: nn.Module | None = None,
    input_name: str | None = None,
    clamp: tuple[float, float] | None = None,
    key: str = "content",
) -> Iterator[Perturbation]:
    """Add noise of per-coordinate std γσ to a model's raw input (pixels, frames) while the context is open.

    ``x <- clamp(x + γ σ ξ)`` with ξ gaussian, √3·uniform or Rademacher as in :func:`perturb_embeddings`.
    σ is the reference scale (for video denoising: the training noise level σ_train, so the model is tested
    at γ·σ_train). A forward pre-hook on ``module`` (default: ``model``) perturbs ``input_name`` if given,
    else the first positional tensor, else the first floating-point keyword tensor (``pixel_values``).
    The hook is removed on exit, also after an exception; γ = 0 leaves the input untouched.
    """
    _check_args(kind, gamma, INPUT_KINDS, key, replicas)
    if not (math.isfinite(sigma) and sigma > 0):
        raise ConfigError(f"sigma must be a positive finite reference scale, got {sigma!r}.")
    record = Perturbation(kind=kind, gamma=float(gamma), seed=seed, sigma=float(sigma))
    target = module if module is not None else model

    def pre_hook(
        mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if in_probe():  # a readout's structure probe: one short row, not a batch to perturb
            return None
        where, x = _pick_input(args, kwargs, input_name)
        record.calls += 1
        record.rows += x.shape[0]
        if gamma == 0:
            return None
        if not x.is_floating_point():
            raise DataError(
                "perturb_inputs needs a floating-point input; for token ids use perturb_embeddings."
            )
        with torch.no_grad():
            keys = _row_keys(x, None, seed=seed, draw=draw, replicas=replicas, key=key, call=record.calls)
            xi = nz.standard_noise(kind, keys, tuple(x.shape))
        noisy = x + (gamma * sigma * xi).to(x.dtype)
        if clamp is not None:
            noisy = noisy.clamp(*clamp)
        if isinstance(where, int):
            return (noisy, *args[1:]), kwargs
        return args, {**kwargs, where: noisy}

    handle = target.register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        yield record
    finally:
        handle.remove()
