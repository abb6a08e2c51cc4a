"""video-denoising: unrolled transformers (UT, DUST) trained with and without layer-wise descent constraints.

Do the constraints make them better video denoisers than ERM at test noise above the training level?

``config`` (the methods, grids, controls and presets), ``jobs`` (train and evaluate one (architecture,
method, candidate, seed); the classical baselines), ``run`` (grid on validation, then every seed; saves the
per-sequence errors), ``summary`` (the results body and tables), ``budget`` (has ERM converged; is a gain
a budget effect), ``claims`` (what is judged; primary endpoint: UT's constrained minus ERM test RMSE at
gamma > 1) and ``figures``.
"""
