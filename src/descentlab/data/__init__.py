"""Offline assets (:mod:`.assets`) and data/model loaders, plus the same API for real datasets.

Loaders are re-exported lazily (PEP 562): ``from descentlab.data import cache_dir`` does not import
transformers, datasets or tiktoken.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "cache_dir": "descentlab.data.assets",
    "asset_path": "descentlab.data.assets",
    "available_assets": "descentlab.data.assets",
    "ASSETS": "descentlab.data.assets",
    "load_text_classification": "descentlab.data.text",
    "load_encoder_classifier": "descentlab.data.pretrained",
    "load_causal_lm": "descentlab.data.pretrained",
    "load_austen": "descentlab.data.lm_corpus",
    "austen_novels": "descentlab.data.lm_corpus",
    "gpt2_bpe": "descentlab.data.lm_corpus",
    "load_image_classification": "descentlab.data.images",
    "load_video": "descentlab.data.video",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'descentlab.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
