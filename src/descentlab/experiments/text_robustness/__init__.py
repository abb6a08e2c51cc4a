"""text-robustness: an encoder classifier fine-tuned with and without layer-wise descent constraints.

ERM, hard constraints and their resilient relaxation, beside a matched λ ≡ 0 control, a deep-supervision
baseline and a noise-trained positive control; compare clean accuracy, accuracy under embedding noise and
the per-layer loss.

``config`` (the config and presets), ``run`` (data -> selection on validation -> every (method, seed) job
-> arrays and results), ``jobs`` (one job), ``claims`` (what is judged; the primary endpoint), ``figures``,
``tables`` (the descriptive tables and protocol), ``arrays`` (the saved arrays' names and the cell store),
``legacy`` (the cells of runs made before the store) and ``ldp`` (the local-DP accounting).
"""
