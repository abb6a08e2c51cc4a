"""robust-sparse: descent constraints with HORST as the primal optimizer, then one-shot pruning; robust and
sparse at once? The primary endpoint is declared in ``claims.py``."""
