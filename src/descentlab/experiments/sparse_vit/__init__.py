"""sparse-vit: a small ViT trained with AC/DC at extreme sparsities, AdamW against HORST and HAM.

``config`` (settings and presets), ``run`` (tuning on validation, the final runs, the saved cells),
``jobs`` (one training run), ``claims`` (what is judged, and on which cells), ``tables`` and ``figures``.
"""
