"""Classical video denoisers: exact on the cases they are built for, and chosen on validation by RMSE."""

from __future__ import annotations

import pytest
import torch

from descentlab.evaluation.video_baselines import (
    BASELINES,
    choose_on_validation,
    denoise_tiles,
    gaussian_filter,
    nonlocal_means,
    temporal_median,
)


def _static_scene(n: int = 3, t: int = 8, h: int = 8, w: int = 8) -> torch.Tensor:
    frame = torch.rand(n, 1, h, w, generator=torch.Generator().manual_seed(0))
    return frame.expand(n, t, h, w).contiguous()


def test_temporal_median_recovers_a_static_scene_from_impulse_noise() -> None:
    clean = _static_scene()
    noisy = clean.clone()
    # salt and pepper in frames 1 and 4 only: every window of 3 frames (borders reflected) holds one at most
    gen = torch.Generator().manual_seed(1)
    hit = torch.rand(clean.shape, generator=gen) < 0.5
    hit[:, [0, 2, 3, 5, 6, 7]] = False
    noisy[hit] = torch.randint(0, 2, (int(hit.sum()),), generator=gen).float()
    assert (noisy != clean).any()
    torch.testing.assert_close(temporal_median(noisy, window=3), clean)


def test_gaussian_filter_with_zero_sigma_is_the_identity() -> None:
    x = torch.rand(2, 8, 8, 8)
    torch.testing.assert_close(gaussian_filter(x, sigma_t=0.0, sigma_s=0.0), x)
    smooth = gaussian_filter(x, sigma_t=1.0, sigma_s=1.0)
    assert smooth.std() < x.std()
    # clips are filtered independently: changing one leaves the other's output alone
    y = x.clone()
    y[1] = 0.0
    torch.testing.assert_close(gaussian_filter(y, sigma_t=1.0, sigma_s=1.0)[0], smooth[0])


def test_nonlocal_means_limits() -> None:
    x = torch.rand(2, 6, 8, 8, generator=torch.Generator().manual_seed(2))
    # a tiny filtering parameter keeps only the pixel itself: the identity
    torch.testing.assert_close(nonlocal_means(x, h=1e-4, sigma=0.0), x, atol=1e-5, rtol=0)
    const = torch.full((1, 4, 8, 8), 0.3)
    torch.testing.assert_close(nonlocal_means(const, h=0.1, sigma=0.1), const)
    clean = _static_scene()
    noisy = clean + 0.1 * torch.randn(clean.shape, generator=torch.Generator().manual_seed(3))
    out = nonlocal_means(noisy, h=0.1, sigma=0.1)
    assert (out - clean).pow(2).mean() < 0.5 * (noisy - clean).pow(2).mean()
    with pytest.raises(ValueError):
        nonlocal_means(x, h=0.1, sigma=0.1, patch=2)


def test_choose_on_validation_picks_the_lowest_rmse() -> None:
    clean = _static_scene()
    noisy = clean + 0.1 * torch.randn(clean.shape, generator=torch.Generator().manual_seed(4))
    params, scores = choose_on_validation(
        gaussian_filter, {"sigma_t": [0.0, 2.0], "sigma_s": [0.0]}, clean, noisy
    )
    assert params == {"sigma_t": 2.0, "sigma_s": 0.0}  # a static scene: smoothing in time only is best
    assert [s["params"]["sigma_t"] for s in scores] == [0.0, 2.0]
    assert scores[1]["val_rmse"] < scores[0]["val_rmse"]
    assert set(BASELINES) == {"gaussian", "temporal-median", "nl-means"}


def test_denoise_tiles_reassembles_whole_frames() -> None:
    frames = torch.rand(8, 20, 27)
    torch.testing.assert_close(denoise_tiles(lambda x: x, frames, 8), frames[:, :16, :24])
    doubled = denoise_tiles(lambda x: 2 * x, frames, 4)
    torch.testing.assert_close(doubled, 2 * frames[:, :20, :24])
