"""sparse-vit: a small ViT trained with AC/DC at extreme sparsities, AdamW against HORST and HAM.

``config`` (settings, presets, the design a run measures), ``jobs`` (one training run, small ViT or timm
DeiT), ``run`` (tuning on validation, the final runs, the saved cells), ``claims`` (what is judged, on which
cells, and the fidelity to the paper), ``report`` (tables and figures), ``legacy`` (the committed runs' old
arrays).
"""
