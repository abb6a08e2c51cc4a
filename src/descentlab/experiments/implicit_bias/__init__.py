"""implicit-bias: which norm each optimizer geometry favours, against exact references.

Small float64 problems. ``config`` (problems, Theorem 4.7's run, the scale study, presets), ``vector_fit`` (one
vector trained by a named geometry), ``run``, ``tables``, ``claims`` (the primary endpoint: Theorem 4.7
with sign descent) and ``figures``."""
