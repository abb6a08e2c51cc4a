"""Robustness curves: a metric against the noise level γ, per perturbation kind, over noise draws and models.

Protocol (ours; docs/methods.md): a γ grid (default 0, 0.25, 0.5, 1, 1.5, 2, 3); for every model (one per
training seed), every kind and every γ > 0, ``draws`` independent noise realisations; mean ± std over all
(model, draw) pairs, and one summary number per kind (the mean over the grid). Noise is keyed by example
content, so every model sees the *same* noisy inputs: differences between methods are paired.

The ε kinds of :mod:`descentlab.perturbations.ldp` (``metric_ldp``, ``gaussian_mechanism``) have a curve against ε instead
(``epsilons=...``, x_name ``epsilon``; every ε > 0 is noisy, so the clean point is not on it).
``keep_examples=True`` also keeps the per-example values ``[model, draw, x, example]``, which the paired
bootstrap CIs of :mod:`descentlab.report.stats` resample.

Cost is forward passes only, under ``torch.inference_mode``. The fast path stacks the ``draws`` copies of a
batch into one forward pass (``replicas``); ``stack_draws=False`` is its slow twin, one pass per draw.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from descentlab.errors import ConfigError, ModelError
from descentlab.losses import next_token_nll
from descentlab.perturbations.hooks import perturb_embeddings
from descentlab.perturbations.ldp import LDP_KINDS, check_epsilon

DEFAULT_GAMMAS: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0)
DEFAULT_KINDS: tuple[str, ...] = ("gaussian", "uniform", "discrete")
# half-decades spanning both mechanisms on MiniLM-L6 (d = 384, σ_E ≈ 0.056): equivalent γ from 13 (ε = 30)
# to 0.04-0.4 (ε = 10^4); metric ε = 300 has E‖z‖ = 1.28, about one token norm (docs/privacy.md)
DEFAULT_EPSILONS: tuple[float, ...] = (30.0, 100.0, 300.0, 1000.0, 3000.0, 10000.0)

# metric(model, batch) -> (numerator [B], denominator [B]); value = transform(Σ num / Σ den)
MetricFn = Callable[[nn.Module, Any], tuple[Tensor, Tensor]]


def _model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in batch.items() if k != "labels"}


def accuracy_metric(model: nn.Module, batch: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """Per-example correctness of a classifier: ``argmax logits == labels``; batch is a dict with ``labels``."""
    logits = model(**_model_inputs(batch)).logits
    correct = (logits.argmax(dim=-1) == batch["labels"]).to(torch.float64)
    return correct, torch.ones_like(correct)


def token_nll_metric(model: nn.Module, batch: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """Per-example summed next-token NLL and token count of a causal LM (exp of the ratio is perplexity).

    Targets are ``batch["labels"]`` if present (-100 ignored), else ``input_ids`` with padding masked out.
    """
    logits = model(**_model_inputs(batch)).logits
    labels = batch.get("labels")
    if labels is None:
        labels = batch["input_ids"].masked_fill(batch.get("attention_mask", 1) == 0, -100)
    targets = labels[:, 1:]
    nll = next_token_nll(logits, labels, dtype=torch.float64)
    return nll.sum(dim=1), (targets != -100).sum(dim=1).to(torch.float64)


METRICS: dict[str, tuple[MetricFn, Callable[[float], float]]] = {
    "accuracy": (accuracy_metric, lambda v: v),
    "perplexity": (token_nll_metric, math.exp),
}


@dataclass
class RobustnessCurves:
    """Metric values ``values[kind][model, draw, x]`` and the protocol that produced them.

    ``gammas`` is the grid of the varied level, γ or (``x_name == "epsilon"``) ε. ``examples[kind]``, when
    kept, holds the per-example values ``[model, draw, x, example]`` whose example mean is ``values``.
    """

    metric: str
    gammas: tuple[float, ...]
    values: dict[str, np.ndarray]
    protocol: dict[str, Any] = field(default_factory=dict)
    x_name: str = "gamma"
    examples: dict[str, np.ndarray] | None = None

    def curves(self) -> dict[str, dict[str, Any]]:
        """The results.json ``curves`` block: per kind, x = γ grid, mean and std over (model, draw) pairs.

        Extra keys: ``per_model`` (each model's draw-mean), ``summary`` (mean over the grid).
        """
        block = {}
        for kind, vals in self.values.items():
            pairs = vals.reshape(-1, vals.shape[-1])
            block[kind] = {
                "x_name": self.x_name,
                "x": list(self.gammas),
                "metric": self.metric,
                "mean": pairs.mean(axis=0).tolist(),
                "std": pairs.std(axis=0).tolist(),
                "per_model": vals.mean(axis=1).tolist(),
                "summary": float(pairs.mean()),
            }
        return block

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (values as nested lists); :meth:`from_dict` inverts it exactly."""
        out = {
            "metric": self.metric,
            "gammas": list(self.gammas),
            "values": {k: v.tolist() for k, v in self.values.items()},
            "protocol": self.protocol,
        }
        if self.x_name != "gamma":
            out["x_name"] = self.x_name
        if self.examples is not None:
            out["examples"] = {k: v.tolist() for k, v in self.examples.items()}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RobustnessCurves:
        values = {k: np.asarray(v, dtype=np.float64) for k, v in data["values"].items()}
        examples = data.get("examples")
        if examples is not None:
            examples = {k: np.asarray(v, dtype=np.float64) for k, v in examples.items()}
        protocol = dict(data.get("protocol", {}))
        x_name = data.get("x_name", "gamma")
        return cls(data["metric"], tuple(data["gammas"]), values, protocol, x_name, examples)

    @classmethod
    def concat(cls, parts: Sequence[RobustnessCurves]) -> RobustnessCurves:
        """Join curves of different models (e.g. one per training seed) evaluated under the same protocol."""
        first = parts[0]
        for part in parts[1:]:
            if (
                part.gammas != first.gammas
                or part.metric != first.metric
                or part.values.keys() != first.values.keys()
                or part.x_name != first.x_name
                or (part.examples is None) != (first.examples is None)
            ):
                raise ConfigError(
                    "cannot join robustness curves with different metrics, kinds or gamma grids."
                )
        values = {k: np.concatenate([p.values[k] for p in parts]) for k in first.values}
        examples = None
        if first.examples is not None:
            examples = {k: np.concatenate([p.examples[k] for p in parts]) for k in first.examples}  # type: ignore[index]
        protocol = dict(first.protocol)
        protocol["n_models"] = sum(
            p.protocol.get("n_models", len(p.values[next(iter(p.values))])) for p in parts
        )
        protocol["model_seeds"] = [s for p in parts for s in p.protocol.get("model_seeds", [])]
        return cls(first.metric, first.gammas, values, protocol, first.x_name, examples)

    def summary(self) -> dict[str, float]:
        """Mean over the γ grid (and over models and draws), per kind: one number per curve."""
        return {kind: float(v.mean()) for kind, v in self.values.items()}


def batch_rows(batch: Any) -> int:
    if isinstance(batch, Tensor):
        return batch.shape[0]
    if isinstance(batch, Mapping):
        return next(batch_rows(v) for v in batch.values() if isinstance(v, (Tensor, Mapping, list, tuple)))
    return batch_rows(batch[0])


def map_tensors(batch: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    if isinstance(batch, Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {k: map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(v, fn) for v in batch)
    return batch


def replicate_batch(batch: Any, copies: int) -> Any:
    """Stack ``copies`` copies of every tensor along dim 0: the layout ``perturb_*(replicas=copies)`` expects."""
    rows = batch_rows(batch)
    return map_tensors(batch, lambda t: torch.cat([t] * copies) if t.dim() and t.shape[0] == rows else t)


def model_device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def _evaluate(
    model: nn.Module,
    data: Iterable[Any],
    metric: MetricFn,
    context: Callable[[int, int], Any],
    draws: int,
    stack: bool,
) -> tuple[np.ndarray, float, np.ndarray]:
    """(Σnum/Σden per draw [draws], Σden of one draw, num/den per example [draws, examples]);
    ``context(draw, replicas)`` opens the perturbation."""
    num = np.zeros(draws)
    den = np.zeros(draws)
    per_example: list[np.ndarray] = []
    device = model_device(model)
    for batch in data:
        batch = map_tensors(batch, lambda t: t.to(device))
        groups = [(0, draws)] if stack else [(d, 1) for d in range(draws)]
        for first, copies in groups:
            with context(first, copies) as record:
                n, d = metric(model, replicate_batch(batch, copies) if copies > 1 else batch)
            if record.calls == 0:
                raise ModelError(
                    "the perturbation hook never ran: the model bypassed the hooked module "
                    "(inputs_embeds?); pass module=... or use perturb_inputs."
                )
            n = n.double().reshape(copies, -1)
            d = d.double().reshape(copies, -1)
            ratio = torch.where(d > 0, n / d.clamp_min(1e-300), torch.nan)
            if stack or first == 0:
                per_example.append(np.zeros((draws, n.shape[1])))
            per_example[-1][first : first + copies] = ratio.cpu().numpy()
            num[first : first + copies] += n.sum(dim=1).cpu().numpy()
            den[first : first + copies] += d.sum(dim=1).cpu().numpy()
    if not (den > 0).all():
        raise ConfigError("the evaluation data is empty: robustness_curve needs at least one batch.")
    return num / den, float(den[0]), np.concatenate(per_example, axis=1)


def _open(
    perturb: Callable[..., Any],
    model: nn.Module,
    kind: str,
    gamma: float,
    seed: int,
    extra: Mapping[str, Any],
    first: int,
    copies: int,
) -> Any:
    if kind in LDP_KINDS:  # the level is ε
        return perturb(model, kind, seed=seed, epsilon=gamma, draw=first, replicas=copies, **extra)
    return perturb(model, kind, gamma, seed, draw=first, replicas=copies, **extra)


def robustness_curve(
    models: nn.Module | Sequence[nn.Module],
    data: Iterable[Any],
    *,
    metric: str | MetricFn = "accuracy",
    transform: Callable[[float], float] | None = None,
    kinds: Sequence[str] = DEFAULT_KINDS,
    gammas: Sequence[float] = DEFAULT_GAMMAS,
    draws: int = 3,
    seed: int = 0,
    perturb: Callable[..., Any] = perturb_embeddings,
    perturb_kwargs: Mapping[str, Any] | None = None,
    stack_draws: bool = True,
    model_seeds: Sequence[int] | None = None,
    epsilons: Sequence[float] | None = None,
    keep_examples: bool = False,
) -> RobustnessCurves:
    """Evaluate ``metric`` against γ for every kind, over ``draws`` noise draws and every model.

    Args:
        models: one model, or one per training seed (their spread enters the std).
        data: a re-iterable of batches (a list or a DataLoader), e.g. dicts with ``labels``.
        metric: ``"accuracy"``, ``"perplexity"`` or ``fn(model, batch) -> (num [B], den [B])``.
        transform: applied to Σnum/Σden (default: identity, ``exp`` for perplexity).
        kinds: perturbation kinds, passed to ``perturb``: all γ kinds, or all ε kinds (``metric_ldp``,
            ``gaussian_mechanism``), not a mix.
        gammas: the γ grid; γ = 0 is evaluated once per model (it is deterministic).
        epsilons: the ε grid (each finite and > 0) of the ε kinds; used instead of ``gammas``.
        draws: noise realisations per (model, kind, γ > 0); draw d uses ``perturb(..., seed, draw=d)``.
        seed: the noise seed, shared by all models so that comparisons are paired.
        perturb: :func:`perturb_embeddings` or :func:`~descentlab.perturbations.hooks.perturb_inputs` (or the same signature).
        perturb_kwargs: extra keywords for ``perturb`` (``sigma=...`` for inputs).
        stack_draws: one forward pass carries all draws of a batch (fast); False: one pass per draw.
        model_seeds: training seeds of ``models``, recorded in the protocol.
        keep_examples: also keep each example's value (``.examples``), e.g. for a paired bootstrap.

    Returns:
        :class:`RobustnessCurves`; ``.curves()`` is the results.json block, ``.protocol`` the protocol.
    """
    model_list = [models] if isinstance(models, nn.Module) else list(models)
    private = [k in LDP_KINDS for k in kinds]
    if any(private) and not all(private):
        raise ConfigError(
            f"kinds mixes γ kinds and ε kinds ({list(kinds)}); make one curve call for each family."
        )
    x_name = "epsilon" if kinds and all(private) else "gamma"
    if x_name == "epsilon":
        if epsilons is None:
            raise ConfigError(f"the ε kinds {list(kinds)} need epsilons=[...] (finite values > 0).")
        gammas = [float(e) for e in epsilons]
        for eps in gammas:
            check_epsilon(eps)
    if not model_list or draws < 1 or not gammas:
        raise ConfigError("robustness_curve needs at least one model, one draw and one gamma.")
    if any(g < 0 for g in gammas):
        raise ConfigError(f"gammas must be >= 0, got {list(gammas)}.")
    metric_name = metric if isinstance(metric, str) else getattr(metric, "__name__", "metric")
    if isinstance(metric, str):
        if metric not in METRICS:
            raise ConfigError(f"unknown metric {metric!r}; use one of {sorted(METRICS)} or a callable.")
        metric, default_transform = METRICS[metric]
        transform = transform or default_transform
    transform = transform or (lambda v: v)
    extra = dict(perturb_kwargs or {})
    values = {kind: np.zeros((len(model_list), draws, len(gammas))) for kind in kinds}
    examples: dict[str, list] = {kind: [[None] * len(gammas) for _ in model_list] for kind in kinds}
    n_eval = 0.0
    for m, model in enumerate(model_list):
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                clean = clean_examples = None
                for kind in kinds:
                    for g, gamma in enumerate(gammas):
                        if gamma == 0 and clean is not None:
                            values[kind][m, :, g] = clean
                            examples[kind][m][g] = clean_examples
                            continue
                        context = functools.partial(_open, perturb, model, kind, gamma, seed, extra)
                        n_draws = 1 if gamma == 0 else draws
                        ratio, n_eval, each = _evaluate(model, data, metric, context, n_draws, stack_draws)
                        values[kind][m, :, g] = [transform(float(r)) for r in ratio]
                        examples[kind][m][g] = np.broadcast_to(each, (draws, each.shape[1]))
                        if gamma == 0:
                            clean, clean_examples = values[kind][m, 0, g], examples[kind][m][g]
        finally:
            model.train(was_training)
    protocol = {
        "metric": metric_name,
        "kinds": list(kinds),
        ("epsilons" if x_name == "epsilon" else "gammas"): list(gammas),
        "draws": draws,
        "noise_seed": seed,
        "n_eval": n_eval,
        "n_models": len(model_list),
        "model_seeds": list(model_seeds) if model_seeds is not None else list(range(len(model_list))),
        "perturbation": getattr(perturb, "__name__", str(perturb)),
        "noise_keying": extra.get("key", "content"),
        "aggregate": "mean and std over (model, draw) pairs; gamma=0 evaluated once per model",
    }
    kept = None
    if keep_examples:  # [model, draw, x, example]
        kept = {k: np.stack([np.stack(per_x, axis=1) for per_x in v]) for k, v in examples.items()}
    return RobustnessCurves(metric_name, tuple(gammas), values, protocol, x_name, kept)
