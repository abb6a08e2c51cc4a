"""Deterministic stratified splits shared by the text and image loaders."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from descentlab.errors import ConfigError


def stratified_split(
    labels: Sequence[int] | np.ndarray,
    fracs: Sequence[float],
    seed: int,
    *,
    keys: Sequence[str] | None = None,
) -> list[np.ndarray]:
    """Split indices into parts whose class proportions match the whole, deterministically by seed.

    Each class's indices are permuted with ``numpy.random.default_rng(seed)``; part ``k`` (k >= 1) gets
    ``round(fracs[k-1] * n_c)`` of class ``c`` and part 0 gets the rest. Each part is then shuffled.

    Args:
        labels: Integer label per example.
        fracs: Fractions of the parts after the first (e.g. ``(val_frac, test_frac)``); sum < 1.
        seed: Seed of the split.
        keys: The config keys the fractions come from, named in the error for a bad fraction.

    Returns:
        ``len(fracs) + 1`` index arrays (part 0 first), disjoint and covering ``range(len(labels))``.
    """
    for key, frac in zip(keys or (), fracs, strict=False):
        if frac < 0:
            raise ConfigError(f"{key} must be >= 0, got {frac}; pass a non-negative value")
    if any(f < 0 for f in fracs) or sum(fracs) >= 1:
        named = f" ({', '.join(keys)})" if keys else ""
        raise ConfigError(f"split fractions {tuple(fracs)}{named} must be >= 0 and sum to < 1")
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(len(fracs) + 1)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        start = 0
        for k, frac in enumerate(fracs, 1):
            n = round(frac * len(idx))
            parts[k].append(idx[start : start + n])
            start += n
        parts[0].append(idx[start:])
    return [rng.permutation(np.concatenate(p)) for p in parts]


def stratified_take(labels: Sequence[int] | np.ndarray, n: int, seed: int, *, key: str = "n") -> np.ndarray:
    """``n`` sorted indices whose class proportions match ``labels`` (all of them when ``n >= len``).

    Args:
        labels: Integer label per example.
        n: How many to keep; ``key`` is the config key it came from (named in the error for ``n < 0``).
        seed: Seed of the subsample.
    """
    if n < 0:
        raise ConfigError(f"{key} must be >= 0 (a number of examples) or null for all, got {n}")
    labels = np.asarray(labels)
    if n >= len(labels):
        return np.arange(len(labels))
    _, take = stratified_split(labels, (n / len(labels),), seed)
    return np.sort(take)
