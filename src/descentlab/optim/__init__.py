"""Update rules of Part 2: HORST, HAM and composable steepest-descent x mirror-map optimizers."""

from descentlab.optim.compose import compose
from descentlab.optim.ham import HAM
from descentlab.optim.horst import HORST, horst_param_groups, horst_reference

__all__ = ["HAM", "HORST", "compose", "horst_param_groups", "horst_reference"]
