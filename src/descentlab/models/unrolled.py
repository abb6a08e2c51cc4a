"""UT: a generic unrolled transformer for video denoising, and the output type shared with DUST.

Every unrolled model here maps a noisy clip ``y`` of shape ``[B, T, H, W]`` (T frames of H×W grayscale pixels)
to an :class:`UnrolledOutput`: the final estimate and the estimate read out after every layer by one decoder
shared across layers, so that the per-layer loss ``f(X, Φ_l) = MSE(x̂_l, x)`` (docs/methods.md) needs no
extra head.

Frames are cut into ``patch_size × patch_size`` patches; a token is one patch of one frame (one token per
frame when the patch covers the frame).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from descentlab.errors import ConfigError, DataError

__all__ = ["UnrolledOutput", "UnrolledTransformer", "patchify", "unpatchify"]


@dataclass
class UnrolledOutput:
    """What an unrolled model returns.

    Attributes:
        final: the last layer's estimate of the clean clip, ``[B, T, H, W]``.
        layer_estimates: ``[L+1, B, T, H, W]``; index 0 is the initial iterate's estimate, index ``l`` the
            estimate after layer ``l``; ``layer_estimates[-1]`` is ``final``.
    """

    final: Tensor
    layer_estimates: Tensor

    @property
    def num_estimates(self) -> int:
        return int(self.layer_estimates.shape[0])


def patchify(frames: Tensor, patch_size: int) -> Tensor:
    """Cut frames into non-overlapping square patches.

    Args:
        frames: ``[B, T, H, W]`` with H and W multiples of ``patch_size``.
        patch_size: side p of a patch.

    Returns:
        ``[B, T, P, p*p]`` with ``P = (H/p)(W/p)`` patches in row-major order.
    """
    b, t, h, w = frames.shape
    p = patch_size
    if h % p or w % p:
        raise DataError(f"frame size {h}x{w} is not a multiple of patch_size={p}; crop or resize the frames")
    x = frames.reshape(b, t, h // p, p, w // p, p).permute(0, 1, 2, 4, 3, 5)
    return x.reshape(b, t, (h // p) * (w // p), p * p)


def unpatchify(tokens: Tensor, patch_size: int, height: int, width: int) -> Tensor:
    """Inverse of :func:`patchify`: ``[B, T, P, p*p] -> [B, T, H, W]``."""
    b, t = tokens.shape[:2]
    p = patch_size
    x = tokens.reshape(b, t, height // p, width // p, p, p).permute(0, 1, 2, 4, 3, 5)
    return x.reshape(b, t, height, width)


def _check_clip(y: Tensor, num_frames: int, image_size: tuple[int, int]) -> None:
    if y.dim() != 4:
        raise DataError(f"expected a clip batch [B, T, H, W], got shape {tuple(y.shape)}")
    if y.shape[1] > num_frames or tuple(y.shape[2:]) != image_size:
        raise DataError(
            f"clip shape {tuple(y.shape[1:])} does not fit the model (at most {num_frames} frames of "
            f"{image_size[0]}x{image_size[1]}); build the model with matching num_frames / image_size"
        )


class DescentBlock(nn.Module):
    """One unrolled step in token space: ``h_l = h_{l-1} - η_l · g_l(h_{l-1}, e_y)``.

    ``g_l`` is a pre-norm transformer block read as a learned descent direction: with ``u = h_{l-1} + e_y``
    (the embedded observation re-injected at every step, as an unrolled algorithm sees ``y`` at every
    iteration; ``u = h_{l-1}`` when injection is off),

        a   = MHA(LN(u))                 attention across all patch tokens of the clip
        g_l = -(a + MLP(LN(u + a)))

    and ``η_l`` is a learned scalar step (initialised at 1, which makes the step a standard residual block).
    """

    def __init__(self, width: int, heads: int, mlp_ratio: float, dropout: float, inject_input: bool) -> None:
        super().__init__()
        self.inject_input = inject_input
        self.norm_attn = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.norm_mlp = nn.LayerNorm(width)
        hidden = round(width * mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(width, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, width)
        )
        self.step = nn.Parameter(torch.ones(()))

    def direction(self, h: Tensor, e_y: Tensor) -> Tensor:
        """The descent direction ``g_l`` (tokens ``[N, S, width]``)."""
        u = h + e_y if self.inject_input else h
        q = self.norm_attn(u)
        a = self.attn(q, q, q, need_weights=False)[0]
        return -(a + self.mlp(self.norm_mlp(u + a)))

    def forward(self, h: Tensor, e_y: Tensor) -> Tensor:
        return h - self.step * self.direction(h, e_y)


class UnrolledTransformer(nn.Module):
    """UT: tokens are frame patches, each layer one descent step, one decoder shared by all layers.

    State and estimates, for a noisy clip ``y`` cut into patch tokens ``Y`` (``[B, T·P, p²]``)::

        e_y = E(Y) + pos                           embedding: linear + learned time and patch positions
        h_0 = e_y                                  initial iterate
        h_l = h_{l-1} - η_l g_l(h_{l-1}, e_y)      l = 1..L   (see DescentBlock)
        x̂_l = Y - Dec(h_l)     (residual=True)     the decoder predicts the noise
        x̂_l = Dec(h_l)         (residual=False)    the decoder predicts the clean patches

    ``Dec = Linear(h)`` is shared across layers. With ``residual=True`` its weights start at zero, so every
    layer's estimate starts as the noisy input itself and training moves them from there. The decoder has no
    LayerNorm: normalising a token divides away its amplitude, which carries the noise level (in a pilot on
    carphone clips a LayerNorm there slowed learning several-fold). Keep ``width >= patch_size²`` so that the
    embedding can hold a whole patch.

    Args:
        image_size: frame height and width (int for square frames).
        num_frames: largest number of frames per clip (sets the time embedding).
        patch_size: patch side; ``patch_size == image_size`` gives one token per frame.
        depth: number of unrolled layers L.
        width: token width.
        heads: attention heads.
        mlp_ratio: MLP hidden width / width.
        dropout: dropout in attention and MLP.
        residual: decode the noise (``x̂ = y - Dec(h)``) instead of the clean clip.
        inject_input: add the embedded observation to every layer's input.
    """

    def __init__(
        self,
        *,
        image_size: int | tuple[int, int] = 32,
        num_frames: int = 8,
        patch_size: int = 8,
        depth: int = 6,
        width: int = 64,
        heads: int = 4,
        mlp_ratio: float = 2.0,
        dropout: float = 0.0,
        residual: bool = True,
        inject_input: bool = True,
    ) -> None:
        super().__init__()
        hw = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if depth < 1 or width % heads or hw[0] % patch_size or hw[1] % patch_size:
            raise ConfigError(
                f"UnrolledTransformer needs depth >= 1, width divisible by heads and frames divisible by "
                f"patch_size; got depth={depth}, width={width}, heads={heads}, image_size={hw}, "
                f"patch_size={patch_size}"
            )
        self.image_size: tuple[int, int] = (int(hw[0]), int(hw[1]))
        self.num_frames = num_frames
        self.patch_size = patch_size
        self.num_layers = depth
        self.residual = residual
        num_patches = (hw[0] // patch_size) * (hw[1] // patch_size)
        dim = patch_size * patch_size
        self.embed = nn.Linear(dim, width)
        self.time_pos = nn.Parameter(torch.zeros(num_frames, 1, width))
        self.patch_pos = nn.Parameter(torch.zeros(1, num_patches, width))
        nn.init.normal_(self.time_pos, std=0.02)
        nn.init.normal_(self.patch_pos, std=0.02)
        self.layers = nn.ModuleList(
            DescentBlock(width, heads, mlp_ratio, dropout, inject_input) for _ in range(depth)
        )
        self.decoder = nn.Linear(width, dim)
        if residual:
            nn.init.zeros_(self.decoder.weight)
            nn.init.zeros_(self.decoder.bias)

    def _decode(self, h: Tensor, y_tok: Tensor) -> Tensor:
        out = self.decoder(h)
        return y_tok - out if self.residual else out

    def forward(self, noisy: Tensor) -> UnrolledOutput:
        """Denoise a batch of clips.

        Args:
            noisy: ``[B, T, H, W]`` noisy frames.

        Returns:
            :class:`UnrolledOutput` with ``layer_estimates`` of shape ``[L+1, B, T, H, W]``.
        """
        _check_clip(noisy, self.num_frames, self.image_size)
        b, t, height, width = noisy.shape
        y_tok = patchify(noisy, self.patch_size)  # [B, T, P, p²]
        n_patch = y_tok.shape[2]
        e_y = (self.embed(y_tok) + self.time_pos[:t] + self.patch_pos).reshape(b, t * n_patch, -1)
        y_flat = y_tok.reshape(b, t * n_patch, -1)
        h = e_y
        estimates = [self._decode(h, y_flat)]
        for layer in self.layers:
            h = layer(h, e_y)
            estimates.append(self._decode(h, y_flat))
        stacked = torch.stack(estimates).reshape(len(estimates) * b, t, n_patch, -1)
        frames = unpatchify(stacked, self.patch_size, height, width).reshape(
            len(estimates), b, t, height, width
        )
        return UnrolledOutput(final=frames[-1], layer_estimates=frames)
