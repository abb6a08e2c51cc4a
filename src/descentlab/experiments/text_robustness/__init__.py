"""text-robustness: an encoder classifier fine-tuned with and without layer-wise descent constraints.

ERM, hard constraints and their resilient relaxation, beside a matched λ ≡ 0 control, a deep-supervision
baseline and a noise-trained positive control; compare clean accuracy, accuracy under embedding noise and
the per-layer loss. The five-file layout of :mod:`descentlab.experiments`, with ``legacy`` (the cells of
runs made before the cell store).
"""
