"""sparse-lm: small GPT-2 LMs trained with AdamW, HORST and HAM, then pruned one-shot, layer-wise, with no
fine-tuning; the claims (``claims.py``) are judged on the saved per-block test NLLs."""
