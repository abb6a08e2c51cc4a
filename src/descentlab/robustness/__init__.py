"""Test-time robustness: embedding and input perturbations (hooks), robustness curves, win rates."""

from descentlab.robustness.accounting import (
    EmbeddingGeometry,
    gamma_epsilon_table,
    mean_sequence_tokens,
    print_gamma_epsilon,
    privacy_rows,
    sequence_epsilon,
)
from descentlab.robustness.config import NoiseEvalConfig
from descentlab.robustness.curves import (
    DEFAULT_EPSILONS,
    DEFAULT_GAMMAS,
    DEFAULT_KINDS,
    RobustnessCurves,
    accuracy_metric,
    replicate_batch,
    robustness_curve,
    token_nll_metric,
)
from descentlab.robustness.layer_profile import layer_loss_examples, layer_loss_profile
from descentlab.robustness.ldp import LDP_KINDS, gaussian_epsilon, gaussian_sigma
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
    "DEFAULT_EPSILONS",
    "DEFAULT_GAMMAS",
    "DEFAULT_KINDS",
    "EMBEDDING_KINDS",
    "INPUT_KINDS",
    "LDP_KINDS",
    "EmbeddingGeometry",
    "NoiseEvalConfig",
    "Perturbation",
    "RobustnessCurves",
    "WinRate",
    "accuracy_metric",
    "embedding_rms",
    "gamma_epsilon_table",
    "gaussian_epsilon",
    "gaussian_sigma",
    "input_embedding_module",
    "layer_loss_examples",
    "layer_loss_profile",
    "mean_sequence_tokens",
    "perturb_embeddings",
    "perturb_inputs",
    "print_gamma_epsilon",
    "privacy_rows",
    "replicate_batch",
    "robustness_curve",
    "sequence_epsilon",
    "substitution_probability",
    "token_nll_metric",
    "win_rate",
]
