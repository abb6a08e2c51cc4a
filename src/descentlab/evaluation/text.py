"""The evaluation of one trained text classifier: accuracy against γ per noise kind (per example), the clean
per-example loss read out at every layer, validation numbers, dataset-shift sets and the local-DP curves.

Every model is evaluated on the same fixed batches under the same content-keyed noise
(:func:`~descentlab.evaluation.curves.robustness_curve`), so the per-example values of two models pair up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from descentlab.evaluation.accounting import EmbeddingGeometry
from descentlab.evaluation.config import NoiseEvalConfig
from descentlab.evaluation.curves import robustness_curve
from descentlab.evaluation.layer_profile import layer_loss_examples, layer_loss_profile


def clean_accuracy(model: Any, batches: list) -> float:
    curve = robustness_curve(model, batches, kinds=["gaussian"], gammas=[0.0], draws=1)
    return float(curve.values["gaussian"][0, 0, 0])


def validation_scores(model: Any, val: list, ev: NoiseEvalConfig, seed: int, draws: int) -> dict[str, float]:
    """Selection numbers: clean validation accuracy and its mean over the gaussian γ grid."""
    curve = robustness_curve(
        model, val, kinds=["gaussian"], gammas=ev.gammas, draws=draws, seed=ev.noise_seed, model_seeds=[seed]
    )
    return {"clean": float(curve.values["gaussian"][0, 0, 0]), "robust": curve.summary()["gaussian"]}


def evaluate_classifier(
    model: Any,
    test: list,
    val: list,
    shift: Mapping[str, list],
    ev: NoiseEvalConfig,
    seed: int,
) -> dict[str, Any]:
    """JSON-able test numbers of one model (``seed`` labels its row in the curves).

    Keys: ``curves`` (RobustnessCurves dict with per-example correctness), ``layer_examples`` (clean
    per-example loss ``[L+1][N]``), ``val_profile`` (validation mean loss per layer), ``profiles`` (clean, and
    ``ev.profile_condition`` when ``ev.profile_gamma > 0``), ``extra`` (accuracy, val_accuracy, val_f0,
    ``shift:<name>``), ``ldp_curves`` (with ``ev.ldp_kinds``; ``ev.clip`` resolved by the caller) and
    ``embedding_max_norm``.
    """
    curves = robustness_curve(
        model, test, metric="accuracy", kinds=list(ev.kinds), gammas=ev.gammas, draws=ev.draws,
        seed=ev.noise_seed, model_seeds=[seed], keep_examples=True,
    )  # fmt: skip
    ldp = None
    if ev.ldp_kinds:
        ldp = robustness_curve(
            model, test, kinds=list(ev.ldp_kinds), epsilons=ev.epsilons, draws=ev.draws,
            seed=ev.noise_seed, model_seeds=[seed], keep_examples=True,
            perturb_kwargs={"delta": ev.delta, "clip": ev.clip},
        ).to_dict()  # fmt: skip
    layer_examples = layer_loss_examples(model, test)  # [L+1, N], clean
    val_layers = layer_loss_examples(model, val)
    profiles = {"clean": layer_examples.mean(1).tolist()}
    if ev.profile_gamma > 0:  # a noisy profile only where asked for
        profiles[ev.profile_condition] = layer_loss_profile(
            model, test, kind=ev.profile_kind, gamma=ev.profile_gamma, draws=ev.draws, seed=ev.noise_seed
        )
    # clean validation accuracy from the argmax of the last layer's logits would need another pass anyway
    extra = {
        "accuracy": float(curves.values[ev.kinds[0]][0, 0, 0]),
        "val_accuracy": clean_accuracy(model, val),
        "val_f0": float(val_layers[0].mean()),
    }
    extra.update({f"shift:{name}": clean_accuracy(model, b) for name, b in shift.items()})
    return {
        "curves": curves.to_dict(),
        "layer_examples": layer_examples.astype(np.float32).tolist(),
        "val_profile": val_layers.mean(1).tolist(),
        "profiles": profiles,
        "extra": extra,
        "ldp_curves": ldp,
        "embedding_max_norm": EmbeddingGeometry.of(model).max_norm,
    }


__all__ = ["clean_accuracy", "evaluate_classifier", "validation_scores"]
