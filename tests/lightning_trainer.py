"""The CPU Lightning ``Trainer`` the integration tests share: one device, deterministic, no progress bar,
model summary, logger or checkpointing unless a test asks for them."""

from __future__ import annotations

from typing import Any


def cpu_trainer(**kwargs: Any):
    import lightning as L

    settings = {
        "accelerator": "cpu",
        "devices": 1,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "logger": False,
        "enable_checkpointing": False,
        "deterministic": True,
    }
    return L.Trainer(**{**settings, **kwargs})
