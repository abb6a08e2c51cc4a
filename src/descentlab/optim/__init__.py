"""HORST (arXiv 2605.21104), HAM and composable steepest-descent x mirror-map optimizers."""

from descentlab.optim.compose import compose
from descentlab.optim.config import (
    OptimizerConfig,
    build_optimizer,
    build_scheduler,
    horst_param_groups,
    param_groups,
)
from descentlab.optim.functional import (
    HorstHyper,
    adam_update_,
    adam_update_foreach_,
    bias_correction,
    hyperbolic_mirror,
    hyperbolic_mirror_foreach_,
    mirror_exponent,
)
from descentlab.optim.ham import HAM
from descentlab.optim.horst import HORST, horst_reference

__all__ = [
    "HAM",
    "HORST",
    "HorstHyper",
    "OptimizerConfig",
    "adam_update_",
    "adam_update_foreach_",
    "bias_correction",
    "build_optimizer",
    "build_scheduler",
    "compose",
    "horst_param_groups",
    "horst_reference",
    "hyperbolic_mirror",
    "hyperbolic_mirror_foreach_",
    "mirror_exponent",
    "param_groups",
]
