"""The toolkit every study uses, one concept per module (``docs/write-a-study.md`` walks through a study
built on it):

* :mod:`descentlab.study.tuning`: tune on the tuning seed, then replicate (``TuningConfig``, ``Round``,
  ``tune_then_replicate``);
* :mod:`descentlab.study.cells`: the cell store, one key scheme ``metric/arm/condition`` with the design
  record (``CellStore``, ``Design``);
* :mod:`descentlab.study.tables`: ``Table`` and the formatters ``pm``, ``mean_sd``, ``ci``, ``signed_ci``;
* :mod:`descentlab.study.figures`: ``panel_figure`` and ``plot_band``.

Only the light modules are re-exported here, so a claims module that reads the store imports neither
matplotlib nor the training runtime.
"""

from descentlab.study.cells import CellStore, Design, cell_key, condition_name
from descentlab.study.tables import Table, ci, mean_sd, pm, signed_ci

__all__ = ["CellStore", "Design", "Table", "cell_key", "ci", "condition_name", "mean_sd", "pm", "signed_ci"]
