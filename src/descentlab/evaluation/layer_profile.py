"""Per-layer loss profile of an evaluation set, clean or under a perturbation (forward passes only).

``profile[l] = Σ_batches n_b · f_l(batch) / Σ_batches n_b``: the example-weighted mean of the batch-mean
losses that :func:`descentlab.readout.layer_losses` reads out at layers 0..L. Under noise the ``draws``
realisations ride in one stacked forward pass (``replicas``), and the profile averages over them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from descentlab.errors import ConfigError, ModelError
from descentlab.evaluation.curves import batch_rows, map_tensors, model_device, replicate_batch
from descentlab.perturbations.hooks import perturb_embeddings


def layer_loss_profile(
    model: nn.Module,
    data: Iterable[Any],
    *,
    kind: str | None = None,
    gamma: float = 0.0,
    draws: int = 1,
    seed: int = 0,
    readout: Any = None,
    perturb: Callable[..., Any] = perturb_embeddings,
    perturb_kwargs: dict[str, Any] | None = None,
) -> list[float]:
    """Mean loss read out at every layer over ``data``, optionally with ``kind`` noise at level ``gamma``.

    Args:
        model: a model :func:`~descentlab.readout.layer_losses` supports (or pass ``readout``).
        data: a re-iterable of dict batches carrying the targets (``labels``).
        kind: perturbation kind, or None for clean data.
        gamma: noise level (relative to σ_E for embeddings).
        draws: noise realisations, averaged (stacked into one pass per batch).
        seed: noise seed; same content-keyed noise as :func:`robustness_curve` for the same (seed, draw).
        readout: passed to ``layer_losses``.
        perturb: :func:`perturb_embeddings` or :func:`~descentlab.perturbations.hooks.perturb_inputs`.
        perturb_kwargs: extra keywords for ``perturb``.

    Returns:
        The L+1 losses, layer 0 (embedding output) first.
    """
    from descentlab.readout import layer_losses

    if draws < 1:
        raise ConfigError(f"draws must be >= 1, got {draws}")
    noisy = kind is not None and gamma > 0
    copies = draws if noisy else 1
    total, count = None, 0
    device = model_device(model)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for batch in data:
                batch = map_tensors(batch, lambda t: t.to(device))
                rows = batch_rows(batch)
                if noisy:
                    with perturb(
                        model, kind, gamma, seed, draw=0, replicas=copies, **(perturb_kwargs or {})
                    ) as record:
                        f = layer_losses(model, replicate_batch(batch, copies), readout=readout)
                    if record.calls == 0:
                        raise ModelError("the perturbation hook never ran during the layer readout.")
                else:
                    f = layer_losses(model, batch, readout=readout)
                f = f.detach().double().cpu() * rows
                total = f if total is None else total + f
                count += rows
    finally:
        model.train(was_training)
    if total is None:
        raise ConfigError("layer_loss_profile got no batches.")
    return (total / count).tolist()


def layer_loss_examples(model: nn.Module, data: Iterable[Any], *, readout: Any = None) -> np.ndarray:
    """Each example's clean cross-entropy read out at every layer, ``[L+1, examples]`` in data order.

    For classifiers whose readout has ``layer_logits`` (the Hugging Face classifier readouts): one backbone
    pass per batch, the head replayed on every layer, so the example mean of row l is the profile of
    :func:`layer_loss_profile` (batch-size weighting aside). Needs ``labels`` in every batch.
    """
    from descentlab.readout import find_readout

    chosen = readout if readout is not None else find_readout(model)
    if not hasattr(chosen, "layer_logits"):
        raise ModelError(f"the {chosen.name} readout gives no per-layer logits; per-example losses need one")
    device = model_device(model)
    was_training = model.training
    model.eval()
    rows = []
    try:
        with torch.inference_mode():
            for batch in data:
                batch = map_tensors(batch, lambda t: t.to(device))
                logits = chosen.layer_logits(model, batch).float()  # [L+1, B, C]
                labels = batch["labels"].to(device)
                ce = torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1), labels.repeat(logits.shape[0]), reduction="none"
                )
                rows.append(ce.view(logits.shape[0], -1).double().cpu())
    finally:
        model.train(was_training)
    if not rows:
        raise ConfigError("layer_loss_examples got no batches.")
    return torch.cat(rows, dim=1).numpy()
