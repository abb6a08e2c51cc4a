"""Offline by default: when a loader may reach the Hugging Face hub, and a fast refusal when it may not.

One policy for the command line and the library. The hub is open when asked for, and only then:

1. an explicit argument (``online=True`` / ``online=False``) decides;
2. else ``DESCENTLAB_ONLINE=1`` opens it;
3. else an explicit ``HF_HUB_OFFLINE=0`` (the hub client's own switch) opens it;
4. else it is closed.

With the hub closed, a model or dataset name loads only when it is a local path or already in the Hugging
Face cache (``HF_HUB_CACHE``, and for datasets the ``datasets`` cache too). Any other name fails at once,
naming the nearest known names (the loader's offline names, its hub aliases, what the cache holds), instead
of the ~24 s of connection retries ``datasets.load_dataset`` spends on a typo before it gives up. A cached
name is then loaded with the hub client switched to offline for the call (:func:`hub_mode`), so it is
read from the cache without a request.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from descentlab.errors import DataError, ModelError

__all__ = [
    "ONLINE_ENV",
    "cached_names",
    "check_hub_name",
    "hub_mode",
    "hub_online",
    "nearest_names",
]

ONLINE_ENV = "DESCENTLAB_ONLINE"
_FALSE = ("0", "false", "no", "off")
# folders of the datasets cache that are builders or bookkeeping, not datasets
_NOT_DATASETS = frozenset({"downloads", "json", "csv", "parquet", "text", "arrow", "imagefolder", "cache"})

Kind = Literal["model", "dataset"]


def hub_online(online: bool | None = None) -> bool:
    """Whether a loader may reach the hub: ``online`` when given, else the environment (module docstring)."""
    if online is not None:
        return bool(online)
    if os.environ.get(ONLINE_ENV) == "1":
        return True
    explicit = os.environ.get("HF_HUB_OFFLINE")
    return explicit is not None and explicit.strip().lower() in _FALSE


def _hf_home() -> Path:
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface"


def _hub_cache() -> Path:
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    return _hf_home() / "hub"


def _datasets_cache() -> Path:
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    return _hf_home() / "datasets"


def _folders(path: Path) -> list[str]:
    try:
        return [p.name for p in path.iterdir() if p.is_dir()]
    except OSError:  # no cache yet
        return []


def cached_names(kind: Kind) -> list[str]:
    """The hub ids of ``kind`` in the local Hugging Face cache (``models--org--name`` -> ``org/name``; for
    datasets also the ``datasets`` cache's ``org___name`` folders). A directory listing: no import, no
    request."""
    prefix = f"{kind}s--"
    names = {
        folder[len(prefix) :].replace("--", "/")
        for folder in _folders(_hub_cache())
        if folder.startswith(prefix)
    }
    if kind == "dataset":
        names |= {
            folder.replace("___", "/")
            for folder in _folders(_datasets_cache())
            if not folder.startswith(("_", ".")) and folder not in _NOT_DATASETS
        }
    return sorted(names)


def _is_cached(name: str, cached: Iterable[str]) -> bool:
    """``name`` is in the cache, also when given without its owner (``imdb`` for ``stanfordnlp/imdb``):
    the hub resolves such legacy names to the owner's repository."""
    return any(name == c or ("/" not in name and c.split("/")[-1] == name) for c in cached)


def nearest_names(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` of ``known`` closest to ``name`` (difflib's ratio, case-insensitive, >= 0.6); a hub id
    is also compared by its last part, so ``imbd`` finds ``stanfordnlp/imdb``."""
    known = list(dict.fromkeys(known))
    score: dict[str, float] = {}
    for candidate in known:
        for form in {candidate.lower(), candidate.lower().split("/")[-1]}:
            ratio = difflib.SequenceMatcher(None, name.lower(), form).ratio()
            score[candidate] = max(score.get(candidate, 0.0), ratio)
    close = sorted((c for c in known if score[c] >= 0.6), key=lambda c: (-score[c], c))
    return close[:n]


def check_hub_name(
    name: str,
    *,
    kind: Kind,
    known: Iterable[str] = (),
    online: bool | None = None,
    label: str | None = None,
) -> bool:
    """Refuse, at once, a ``name`` that would have to come from a closed hub.

    Args:
        name: what the user passed: a local path, a cached hub id, or a hub id.
        kind: ``"model"`` or ``"dataset"`` (which cache to look in, which error to raise).
        known: the loader's own names (offline names, hub aliases): candidates for "did you mean".
        online: the explicit choice, if any (:func:`hub_online`).
        label: what the message calls it (default ``kind``), e.g. ``"image dataset"``.

    Returns:
        True when the hub is open (the loader may download), False when ``name`` is a local path or cached
        (load it under ``hub_mode(False)``, so nothing is requested).

    Raises:
        DataError (datasets) or ModelError (models): the hub is closed and ``name`` is neither local nor
        cached; one line with the nearest known names and how to open the hub.
    """
    if hub_online(online):
        return True
    if Path(name).expanduser().exists():
        return False
    error, local = (DataError, "folder or file") if kind == "dataset" else (ModelError, "folder")
    if name.startswith(("/", "./", "../", "~")):  # a path, not a hub id
        raise error(f"cannot load {label or kind} {name!r}: no such {local}")
    cached = cached_names(kind)
    if _is_cached(name, cached):
        return False
    close = nearest_names(name, [*known, *cached])
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    raise error(
        f"cannot load {label or kind} {name!r}: neither a local path nor in the Hugging Face cache, and the "
        f"hub is off (offline by default): {hint}Download it with {ONLINE_ENV}=1 (or online=True), or pass "
        f"a local {local}"
    )


@contextlib.contextmanager
def hub_mode(online: bool) -> Iterator[None]:
    """Within the block, the hub client (and ``datasets``) is online or offline as asked, whatever the
    environment said when they were imported; restored on exit. Not thread-safe: the switch is global."""
    import huggingface_hub.constants as hub_constants

    switches: list[tuple[object, str]] = [(hub_constants, "HF_HUB_OFFLINE")]
    # datasets keeps its own copy of the switch; it is not imported here (seconds) for a model's load: a
    # dataset loader imports datasets before it enters the block
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:
        switches += [(datasets_config, "HF_HUB_OFFLINE"), (datasets_config, "HF_DATASETS_OFFLINE")]
    saved = [(module, attr, getattr(module, attr)) for module, attr in switches if hasattr(module, attr)]
    try:
        for module, attr, _ in saved:
            setattr(module, attr, not online)
        yield
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)
