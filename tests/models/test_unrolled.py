"""UT (UnrolledTransformer): shapes, per-layer estimates, patching, the descent step, the readout contract."""

from __future__ import annotations

import pytest
import torch

import descentlab as dl
from descentlab.errors import ConfigError, DataError
from descentlab.models.unrolled import UnrolledOutput, UnrolledTransformer, patchify, unpatchify


def small_ut(**kw) -> UnrolledTransformer:
    args = dict(image_size=16, num_frames=4, patch_size=8, depth=3, width=32, heads=4)
    args.update(kw)
    return UnrolledTransformer(**args)


@pytest.mark.parametrize("depth", [1, 3])
def test_shapes_and_one_estimate_per_layer(depth: int) -> None:
    model = small_ut(depth=depth)
    y = torch.rand(2, 4, 16, 16)
    out = model(y)
    assert isinstance(out, UnrolledOutput)
    assert model.num_layers == depth
    assert out.final.shape == (2, 4, 16, 16)
    assert out.layer_estimates.shape == (depth + 1, 2, 4, 16, 16)
    assert out.num_estimates == depth + 1
    assert torch.equal(out.layer_estimates[-1], out.final)


def test_shorter_clips_and_rectangular_frames() -> None:
    model = small_ut(image_size=(8, 16), num_frames=6)
    out = model(torch.rand(3, 2, 8, 16))
    assert out.layer_estimates.shape == (4, 3, 2, 8, 16)


def test_patchify_is_a_tiling_and_unpatchify_inverts_it() -> None:
    x = torch.arange(2 * 3 * 8 * 12, dtype=torch.float64).reshape(2, 3, 8, 12)
    tokens = patchify(x, 4)
    assert tokens.shape == (2, 3, 6, 16)
    # patch 4 (row 1, column 1) of frame (1, 2) is rows 4..7, columns 4..7, flattened row-major
    assert torch.equal(tokens[1, 2, 4], x[1, 2, 4:8, 4:8].reshape(-1))
    assert torch.equal(unpatchify(tokens, 4, 8, 12), x)


def test_residual_decoder_starts_at_the_noisy_input() -> None:
    # Zero-initialised decoder: every layer's estimate is y itself before training, so f_l = MSE(y, x).
    model = small_ut()
    y = torch.rand(2, 4, 16, 16)
    out = model(y)
    for est in out.layer_estimates:
        torch.testing.assert_close(est, y, rtol=0, atol=0)


def test_layer_is_a_descent_step_with_learned_step_size() -> None:
    model = small_ut().double()
    block = model.layers[0]
    h, e_y = torch.randn(2, 5, 32, dtype=torch.float64), torch.randn(2, 5, 32, dtype=torch.float64)
    with torch.no_grad():
        block.step.fill_(0.37)
    expected = h - 0.37 * block.direction(h, e_y)
    torch.testing.assert_close(block(h, e_y), expected)
    with torch.no_grad():
        block.step.zero_()
    torch.testing.assert_close(block(h, e_y), h)


def test_attention_mixes_frames() -> None:
    model = small_ut(residual=False)
    y = torch.rand(1, 4, 16, 16)
    y2 = y.clone()
    y2[0, 3] += 0.5  # change the last frame only
    out, out2 = model(y).final, model(y2).final
    assert not torch.allclose(out[0, 0], out2[0, 0]), "frame 0's estimate should depend on frame 3"


def test_layer_losses_readout_and_gradients() -> None:
    model = small_ut(residual=False)
    x = torch.rand(2, 4, 16, 16)
    batch = {"noisy": x + 0.1 * torch.randn_like(x), "target": x}
    f = dl.layer_losses(model, batch)
    assert f.shape == (model.num_layers + 1,)
    out = model(batch["noisy"])
    expected = (out.layer_estimates - x).pow(2).flatten(1).mean(1)
    torch.testing.assert_close(f, expected)
    f.sum().backward()
    assert all(p.grad is not None for p in model.layers.parameters())


def test_bad_config_and_bad_input_raise_clear_errors() -> None:
    with pytest.raises(ConfigError):
        small_ut(width=30, heads=4)
    with pytest.raises(ConfigError):
        small_ut(image_size=12, patch_size=8)
    model = small_ut()
    with pytest.raises(DataError):
        model(torch.rand(2, 5, 16, 16))  # more frames than the time embedding
    with pytest.raises(DataError):
        model(torch.rand(2, 4, 16))
