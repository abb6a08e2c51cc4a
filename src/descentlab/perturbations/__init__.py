"""Test-time perturbations: embedding and input noise as forward hooks, counter-based noise, local-DP mechanisms."""

from descentlab.perturbations.hooks import (
    EMBEDDING_KINDS,
    INPUT_KINDS,
    Perturbation,
    embedding_rms,
    input_embedding_module,
    perturb_embeddings,
    perturb_inputs,
    substitution_probability,
)
from descentlab.perturbations.ldp import LDP_KINDS, gaussian_epsilon, gaussian_sigma

__all__ = [
    "EMBEDDING_KINDS",
    "INPUT_KINDS",
    "LDP_KINDS",
    "Perturbation",
    "embedding_rms",
    "gaussian_epsilon",
    "gaussian_sigma",
    "input_embedding_module",
    "perturb_embeddings",
    "perturb_inputs",
    "substitution_probability",
]
