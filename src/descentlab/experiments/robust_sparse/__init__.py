"""robust-sparse: descent constraints with HORST as the primal optimizer, then one-shot pruning.

Robust and sparse at once? ``config`` (methods, pruning sweep, presets), ``jobs`` (one (method, seed):
train, prune, evaluate), ``run``, ``tables``, ``claims`` (the primary endpoint and the controls) and
``figures``."""
