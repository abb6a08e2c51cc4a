"""Sparsity: prunable-weight selection, magnitude masks, one-shot pruning, the AC/DC controller, reports."""

from descentlab.sparsity.acdc import ACDC, ACDCSchedule
from descentlab.sparsity.config import ACDCConfig
from descentlab.sparsity.masks import Selection, find_blocks, select_prunable
from descentlab.sparsity.pruning import prune_magnitude
from descentlab.sparsity.report import SparsityReport, sparsity_report
from descentlab.sparsity.vit import BLOCK_LINEAR_ROLES, vit_block_linears

__all__ = [
    "ACDC",
    "BLOCK_LINEAR_ROLES",
    "ACDCConfig",
    "ACDCSchedule",
    "Selection",
    "SparsityReport",
    "find_blocks",
    "prune_magnitude",
    "select_prunable",
    "sparsity_report",
    "vit_block_linears",
]
