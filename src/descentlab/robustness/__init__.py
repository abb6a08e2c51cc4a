"""Test-time robustness: embedding and input perturbations (hooks), robustness curves, win rates."""

from descentlab.robustness.config import NoiseEvalConfig
from descentlab.robustness.curves import (
    DEFAULT_GAMMAS,
    DEFAULT_KINDS,
    RobustnessCurves,
    accuracy_metric,
    replicate_batch,
    robustness_curve,
    token_nll_metric,
)
from descentlab.robustness.layer_profile import layer_loss_profile
from descentlab.robustness.perturb import (
    EMBEDDING_KINDS,
    INPUT_KINDS,
    Perturbation,
    embedding_rms,
    input_embedding_module,
    perturb_embeddings,
    perturb_inputs,
    substitution_probability,
)
from descentlab.robustness.winrate import WinRate, win_rate

__all__ = [
    "DEFAULT_GAMMAS",
    "DEFAULT_KINDS",
    "EMBEDDING_KINDS",
    "INPUT_KINDS",
    "NoiseEvalConfig",
    "Perturbation",
    "RobustnessCurves",
    "WinRate",
    "accuracy_metric",
    "embedding_rms",
    "input_embedding_module",
    "layer_loss_profile",
    "perturb_embeddings",
    "perturb_inputs",
    "replicate_batch",
    "robustness_curve",
    "substitution_probability",
    "token_nll_metric",
    "win_rate",
]
