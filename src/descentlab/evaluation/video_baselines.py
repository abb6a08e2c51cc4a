"""Classical video denoisers that need no training, and their parameter choice on a validation split.

Each baseline maps noisy clips ``[N, T, H, W]`` (frames in [0, 1], additive Gaussian noise) to estimates of
the same shape, one clip at a time along axis 0 (clips never mix):

* :func:`gaussian_filter`: a separable spatio-temporal Gaussian, std ``sigma_t`` frames in time and
  ``sigma_s`` pixels in space (scipy, reflected borders); ``sigma_t = sigma_s = 0`` is the identity;
* :func:`temporal_median`: the median over a window of ``window`` frames (and ``space`` x ``space`` pixels),
  scipy, reflected borders; robust to impulse noise, exact on a static scene;
* :func:`nonlocal_means`: video non-local means (Buades, Coll, Morel 2005; in time: Buades et al. 2008). Pixel
  ``p`` becomes the weighted mean of the pixels ``q`` in a search window (``radius`` pixels in space, ``t_radius``
  frames in time) with weights ``w(p, q) = exp(-max(d²(p, q) - 2σ², 0) / h²)``, ``d²`` the mean squared
  difference of the ``patch x patch`` neighbourhoods of ``p`` and ``q`` in their frames (pixels outside the
  clip are left out of ``d²``; candidates outside it get weight 0). Written here in torch because neither
  opencv nor scikit-image is a dependency.

:func:`choose_on_validation` picks a baseline's parameters from a grid by the RMSE on validation clips;
:func:`run_baselines` does so for several baselines and tests each on noisy test clips.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage
from torch import Tensor

__all__ = [
    "BASELINES",
    "choose_on_validation",
    "denoise_tiles",
    "gaussian_filter",
    "nonlocal_means",
    "run_baselines",
    "temporal_median",
]


def _as_numpy(x: Tensor) -> np.ndarray:
    return x.detach().cpu().double().numpy()


def gaussian_filter(noisy: Tensor, *, sigma_t: float, sigma_s: float) -> Tensor:
    """Spatio-temporal Gaussian smoothing of every clip (``[N, T, H, W]``); zero sigmas leave an axis alone."""
    out = ndimage.gaussian_filter(_as_numpy(noisy), sigma=(0.0, sigma_t, sigma_s, sigma_s), mode="reflect")
    return torch.from_numpy(out).to(noisy.dtype)


def temporal_median(noisy: Tensor, *, window: int, space: int = 1) -> Tensor:
    """Median over ``window`` frames x ``space`` x ``space`` pixels around each pixel of every clip."""
    out = ndimage.median_filter(_as_numpy(noisy), size=(1, window, space, space), mode="reflect")
    return torch.from_numpy(out).to(noisy.dtype)


def _box(x: Tensor, patch: int) -> Tensor:
    """Sum over ``patch x patch`` spatial neighbourhoods of ``[N, T, H, W]`` (zero outside)."""
    n, t, h, w = x.shape
    kernel = x.new_ones(1, 1, patch, patch)
    return F.conv2d(x.reshape(n * t, 1, h, w), kernel, padding=patch // 2).reshape(n, t, h, w)


@torch.no_grad()
def nonlocal_means(
    noisy: Tensor, *, h: float, sigma: float, patch: int = 3, radius: int = 2, t_radius: int = 2
) -> Tensor:
    """Video non-local means of every clip ``[N, T, H, W]`` (see the module doc for the weights).

    Args:
        noisy: the noisy clips.
        h: the filtering parameter (pixel units; larger = smoother).
        sigma: the noise std the distance is corrected by (``2σ²`` is the expected ``d²`` of two noisy
            copies of the same patch).
        patch: odd patch side.
        radius, t_radius: the search window's half-sides in pixels and frames.
    """
    if patch % 2 != 1:
        raise ValueError(f"patch must be odd, got {patch}")
    x = noisy.float()
    t, hh, ww = x.shape[1:]
    pt, ps = min(t_radius, t - 1), radius
    xp = F.pad(x, (ps, ps, ps, ps, pt, pt))  # pads W, H, T (the last three axes)
    valid = F.pad(torch.ones_like(x), (ps, ps, ps, ps, pt, pt))
    acc, wsum = torch.zeros_like(x), torch.zeros_like(x)
    for dt, dy, dx in itertools.product(range(-pt, pt + 1), range(-ps, ps + 1), range(-ps, ps + 1)):
        window = (slice(None), slice(pt + dt, pt + dt + t), slice(ps + dy, ps + dy + hh))
        xs = xp[(*window, slice(ps + dx, ps + dx + ww))]
        ms = valid[(*window, slice(ps + dx, ps + dx + ww))]
        d2 = _box((x - xs).pow(2) * ms, patch) / _box(ms, patch).clamp_min(1.0)
        weight = torch.exp(-(d2 - 2 * sigma**2).clamp_min(0.0) / h**2) * ms
        acc += weight * xs
        wsum += weight
    return (acc / wsum).to(noisy.dtype)


# name -> (function, parameter grid); nl-means also takes ``sigma`` (the training noise level) from the caller
BASELINES: dict[str, tuple[Callable[..., Tensor], dict[str, list[Any]]]] = {
    "gaussian": (gaussian_filter, {"sigma_t": [0.0, 0.5, 1.0, 1.5], "sigma_s": [0.5, 0.75, 1.0, 1.5]}),
    "temporal-median": (temporal_median, {"window": [3, 5, 7], "space": [1, 3]}),
    "nl-means": (nonlocal_means, {"h": [0.05, 0.075, 0.1, 0.15, 0.2]}),
}


def _rmse(estimate: Tensor, clean: Tensor) -> float:
    return math.sqrt(float((estimate.double() - clean.double()).pow(2).mean()))


def choose_on_validation(
    fn: Callable[..., Tensor],
    grid: Mapping[str, Sequence[Any]],
    val_clean: Tensor,
    val_noisy: Tensor,
    **fixed: Any,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The grid point of lowest validation RMSE, and every point's ``{"params", "val_rmse"}``.

    Ties go to the first point in grid order (the product of the grid's lists, in their order).
    """
    keys = list(grid)
    scores = []
    for values in itertools.product(*(grid[k] for k in keys)):
        params = dict(zip(keys, values, strict=True))
        scores.append({"params": params, "val_rmse": _rmse(fn(val_noisy, **params, **fixed), val_clean)})
    best = min(range(len(scores)), key=lambda i: scores[i]["val_rmse"])
    return scores[best]["params"], scores


def denoise_tiles(fn: Callable[[Tensor], Tensor], frames: Tensor, tile: int) -> Tensor:
    """Apply a clip denoiser to whole frames ``[T, H, W]`` tile by tile, as the learned models see them.

    H and W are cropped to multiples of ``tile``; the result is ``[T, tile·⌊H/tile⌋, tile·⌊W/tile⌋]``.
    """
    t, h, w = frames.shape
    nh, nw = h // tile, w // tile
    x = frames[:, : nh * tile, : nw * tile].reshape(t, nh, tile, nw, tile).permute(1, 3, 0, 2, 4)
    out = fn(x.reshape(nh * nw, t, tile, tile))
    return out.reshape(nh, nw, t, tile, tile).permute(2, 0, 3, 1, 4).reshape(t, nh * tile, nw * tile)


def run_baselines(
    names: Sequence[str],
    *,
    val_clean: Tensor,
    val_noisy: Tensor,
    test_clean: Tensor,
    test_noisy: Sequence[Sequence[Tensor]],
    sample_noisy: Tensor,
    sigma: float,
    tile: int,
    grids: Mapping[str, Mapping[str, list[Any]]] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, np.ndarray]]]:
    """Choose every baseline's parameters on validation, then test it on every seed's noisy test clips.

    Args:
        names: keys of :data:`BASELINES`, in order.
        val_clean, val_noisy: the validation clips the parameters are chosen on.
        test_clean: the clean test clips ``[N, T, H, W]``.
        test_noisy: per seed, the noisy test clips at each noise level.
        sample_noisy: whole noisy frames ``[levels, T, H, W]``, denoised tile by tile for the figure.
        sigma: the noise std ``nl-means`` corrects its distances by.
        tile: the tile side for ``sample_noisy``.
        grids: name -> entries that replace those of the baseline's default grid.

    Returns:
        ``results[name]`` with ``params``, ``val_grid``, ``val_rmse``, ``rmse`` (per seed, per level) and
        ``seconds``; ``arrays[name]`` with ``example_mse [seeds, levels, N]`` and ``denoised [levels, T, h, w]``.
    """
    results: dict[str, dict[str, Any]] = {}
    arrays: dict[str, dict[str, np.ndarray]] = {}
    for name in names:
        fn, grid = BASELINES[name]
        grid = {**grid, **(grids or {}).get(name, {})}
        fixed = {"sigma": sigma} if name == "nl-means" else {}
        start = time.perf_counter()
        params, scores = choose_on_validation(fn, grid, val_clean, val_noisy, **fixed)
        per_seed, examples = [], []
        for levels in test_noisy:
            mse = torch.stack(
                [(fn(y, **params, **fixed) - test_clean).pow(2).flatten(1).mean(1) for y in levels]
            )
            examples.append(mse.numpy())
            per_seed.append([math.sqrt(float(v)) for v in mse.double().mean(1)])
        frames = torch.stack([denoise_tiles(partial(fn, **params, **fixed), y, tile) for y in sample_noisy])
        arrays[name] = {"example_mse": np.stack(examples), "denoised": frames.numpy()}
        results[name] = {
            "params": params,
            "val_grid": scores,
            "val_rmse": min(s["val_rmse"] for s in scores),
            "rmse": per_seed,
            "seconds": time.perf_counter() - start,
        }
    return results, arrays
