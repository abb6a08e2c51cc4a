"""Adapters for other training engines (Hugging Face Trainer)."""
