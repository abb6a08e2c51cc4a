"""sparse-lm: small GPT-2 LMs trained with AdamW, HORST and HAM, then pruned one-shot, layer-wise, no fine-tuning.

``config`` (settings and presets), ``run`` (tuning on the validation novel, the final runs), ``jobs`` (one
training run and its pruning sweep), ``claims`` (what is judged, on the saved per-block test NLLs),
``tables`` and ``figures``.
"""
