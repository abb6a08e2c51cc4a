"""implicit-bias: which norm each optimizer geometry favours, on small float64 problems with exact
references; the primary endpoint is Theorem 4.7 at p = 4 (``claims.py``)."""
