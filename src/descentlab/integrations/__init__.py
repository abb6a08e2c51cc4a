"""Adapters for other training engines: Hugging Face Trainer (``hf``) and Lightning (``lightning``)."""
