"""Sparsity: prunable-weight selection, magnitude masks, one-shot pruning, the AC/DC controller, reports."""

from descentlab.sparsity.acdc import ACDC, ACDCSchedule
from descentlab.sparsity.masks import Selection, find_blocks, select_prunable
from descentlab.sparsity.pruning import prune_magnitude
from descentlab.sparsity.report import SparsityReport, sparsity_report

__all__ = [
    "ACDC",
    "ACDCSchedule",
    "Selection",
    "SparsityReport",
    "find_blocks",
    "prune_magnitude",
    "select_prunable",
    "sparsity_report",
]
