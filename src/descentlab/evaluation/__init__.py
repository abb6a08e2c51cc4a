"""Evaluation under perturbation: robustness curves, per-layer loss profiles, win rates and judges, length
control, privacy accounting of the local-DP mechanisms, and classical video baselines."""

from descentlab.evaluation.accounting import (
    EmbeddingGeometry,
    gamma_epsilon_table,
    mean_sequence_tokens,
    print_gamma_epsilon,
    privacy_rows,
    sequence_epsilon,
)
from descentlab.evaluation.config import NoiseEvalConfig
from descentlab.evaluation.curves import (
    DEFAULT_EPSILONS,
    DEFAULT_GAMMAS,
    DEFAULT_KINDS,
    RobustnessCurves,
    accuracy_metric,
    replicate_batch,
    robustness_curve,
    token_nll_metric,
)
from descentlab.evaluation.layer_profile import layer_loss_examples, layer_loss_profile
from descentlab.evaluation.winrate import WinRate, win_rate

__all__ = [
    "DEFAULT_EPSILONS",
    "DEFAULT_GAMMAS",
    "DEFAULT_KINDS",
    "EmbeddingGeometry",
    "NoiseEvalConfig",
    "RobustnessCurves",
    "WinRate",
    "accuracy_metric",
    "gamma_epsilon_table",
    "layer_loss_examples",
    "layer_loss_profile",
    "mean_sequence_tokens",
    "print_gamma_epsilon",
    "privacy_rows",
    "replicate_batch",
    "robustness_curve",
    "sequence_epsilon",
    "token_nll_metric",
    "win_rate",
]
