"""DUST: deep unfolding sequential transformer (after De Weerdt, Eldar, Deligiannis, IEEE TSP 2024).

Written from the algorithm it unfolds; see :class:`DUST` for the derivation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from descentlab.errors import ConfigError
from descentlab.models.unrolled import UnrolledOutput, _check_clip, patchify, unpatchify

__all__ = ["DUST", "dct_dictionary", "ista_step", "soft_threshold"]


def soft_threshold(x: Tensor, theta: Tensor) -> Tensor:
    """Proximal operator of ``θ‖·‖₁``: ``soft(x, θ) = sign(x) · max(|x| - θ, 0)`` (θ broadcast, θ >= 0)."""
    return torch.sign(x) * F.relu(x.abs() - theta)


def ista_step(z: Tensor, y: Tensor, dictionary: Tensor, step: Tensor | float, theta: Tensor) -> Tensor:
    """One ISTA iteration for ``min_z ½‖y - D z‖² + λ‖z‖₁`` (codes and signals as rows).

    ``z⁺ = soft(z + η Dᵀ(y - D z), θ)`` with ``η = 1/L_c``, ``L_c = ‖D‖₂²`` and ``θ = η λ`` for plain ISTA.

    Args:
        z: codes ``[..., K]``.
        y: signals ``[..., n]``.
        dictionary: ``D``, ``[n, K]``.
        step: η.
        theta: threshold, broadcastable to ``[..., K]``.
    """
    residual = y - z @ dictionary.T
    return soft_threshold(z + step * (residual @ dictionary), theta)


def dct_dictionary(patch_size: int, num_atoms: int) -> Tensor:
    """Overcomplete 2-D DCT dictionary ``[p², K]`` with unit-norm atoms (K a perfect square >= p²).

    The classical starting dictionary for patch denoising (K-SVD's initialisation): the Kronecker product of
    a 1-D overcomplete cosine basis with itself.
    """
    k = math.isqrt(num_atoms)
    if k * k != num_atoms or k < patch_size:
        raise ConfigError(
            f"a DCT dictionary needs num_atoms a perfect square >= patch_size²; got {num_atoms}"
        )
    n = torch.arange(patch_size, dtype=torch.float64)
    basis = torch.stack([torch.cos(n * j * math.pi / k) for j in range(k)], dim=1)  # [p, k]
    basis[:, 1:] -= basis[:, 1:].mean(dim=0, keepdim=True)
    basis = basis / basis.norm(dim=0, keepdim=True)
    return torch.kron(basis, basis).to(torch.get_default_dtype())


class FrameAttention(nn.Module):
    """Attention across the frames of a clip, in code space: ``A(v) = W_o MHA(W_i LN(v))``.

    One patch location's codes over T frames form a sequence of T tokens. ``W_o`` starts at zero, so the layer
    starts as a pure ISTA step.
    """

    def __init__(self, num_atoms: int, width: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.norm = nn.LayerNorm(num_atoms)
        self.proj_in = nn.Linear(num_atoms, width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.proj_out = nn.Linear(width, num_atoms)
        nn.init.zeros_(self.proj_out.weight)
        nn.init.zeros_(self.proj_out.bias)

    def forward(self, v: Tensor) -> Tensor:
        """``v``: ``[N, T, K]`` codes of N patch locations over T frames."""
        t = v.shape[1]
        mask = None
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=v.device).triu(1)
        q = self.proj_in(self.norm(v))
        return self.proj_out(self.attn(q, q, q, attn_mask=mask, need_weights=False)[0])


class DUST(nn.Module):
    r"""DUST: each layer one ISTA step on a learned dictionary, with attention across the frames of a clip.

    Derivation. A clean patch ``x_t`` of frame t is sparse in a dictionary, ``x_t ≈ D z_t``; the noisy
    observation is ``y_t = x_t + σε``. The sparse code solves the lasso

        min_z  F(z) = ½‖y_t - D z‖² + λ‖z‖₁.

    Its smooth part has gradient ``Dᵀ(D z - y_t)``, Lipschitz with ``L_c = ‖D‖₂²``. Proximal gradient (ISTA)
    takes a gradient step of size ``1/L_c`` and then the prox of ``(λ/L_c)‖·‖₁``, which is soft thresholding:

        z^{k+1} = soft( z^k + (1/L_c) Dᵀ(y_t - D z^k),  λ/L_c ).

    Unfolding L iterations into L layers and learning the constants gives, for layer l = 1..L,

        v_l = z_{l-1} + (s_l/L_c) Dᵀ(y - D z_{l-1})        gradient step, learned step scale s_l (init 1)
        u_l = v_l + A_l(v_l)                                 attention across frames (optional)
        z_l = soft(u_l, θ_l)                                 learned per-layer, per-atom thresholds θ_l >= 0

    with ``z_0 = 0``. ISTA treats each frame alone; consecutive frames of a video share most of their sparse
    support, so ``A_l`` (see :class:`FrameAttention`) lets the code of frame t borrow from the codes of the
    other frames at the same patch location before the shrinkage decides the support. Without ``A_l``
    (``attention=False``) and with ``s_l = 1``, ``θ_l = λ/L_c``, layer l is exactly one ISTA iteration.

    The shared decoder is the dictionary: the estimate after layer l is ``x̂_l = D z_l``; the initial iterate
    ``z_0 = 0`` reads out as ``x̂_0 = 0``. ``L_c`` is recomputed from the current ``D`` at every forward pass
    and treated as a constant (no gradient through the spectral norm).

    Args:
        image_size: frame height and width.
        num_frames: largest number of frames per clip.
        patch_size: patch side p (signals of dimension p²).
        num_atoms: dictionary size K (default 4p²).
        depth: number of unrolled layers L.
        width: attention width.
        heads: attention heads.
        attention: use the frame attention ``A_l`` (False gives learned ISTA, i.e. no mixing across frames).
        causal: each frame attends only to itself and earlier frames.
        threshold_init: initial θ_l (all layers, all atoms).
        dictionary_init: ``"dct"`` (overcomplete DCT, K a perfect square) or ``"random"`` (unit-norm Gaussian).
    """

    def __init__(
        self,
        *,
        image_size: int | tuple[int, int] = 32,
        num_frames: int = 8,
        patch_size: int = 8,
        num_atoms: int | None = None,
        depth: int = 6,
        width: int = 64,
        heads: int = 4,
        attention: bool = True,
        causal: bool = False,
        threshold_init: float = 0.02,
        dictionary_init: str = "dct",
    ) -> None:
        super().__init__()
        hw = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if depth < 1 or width % heads or hw[0] % patch_size or hw[1] % patch_size or threshold_init < 0:
            raise ConfigError(
                f"DUST needs depth >= 1, width divisible by heads, frames divisible by patch_size and "
                f"threshold_init >= 0; got depth={depth}, width={width}, heads={heads}, image_size={hw}, "
                f"patch_size={patch_size}, threshold_init={threshold_init}"
            )
        dim = patch_size * patch_size
        num_atoms = 4 * dim if num_atoms is None else num_atoms
        if dictionary_init == "dct":
            d0 = dct_dictionary(patch_size, num_atoms)
        elif dictionary_init == "random":
            d0 = torch.randn(dim, num_atoms)
            d0 = d0 / d0.norm(dim=0, keepdim=True)
        else:
            raise ConfigError(f"dictionary_init must be 'dct' or 'random', got {dictionary_init!r}")
        self.image_size: tuple[int, int] = (int(hw[0]), int(hw[1]))
        self.num_frames = num_frames
        self.patch_size = patch_size
        self.num_atoms = num_atoms
        self.num_layers = depth
        self.dictionary = nn.Parameter(d0)
        self.step_scale = nn.Parameter(torch.ones(depth))
        self.threshold = nn.Parameter(torch.full((depth, num_atoms), float(threshold_init)))
        self.mixers = nn.ModuleList(
            FrameAttention(num_atoms, width, heads, causal) if attention else nn.Identity()
            for _ in range(depth)
        )
        self.attention = attention

    def lipschitz(self) -> Tensor:
        """``L_c = ‖D‖₂²``, the Lipschitz constant of the data-fit gradient (no gradient flows through it)."""
        with torch.no_grad():
            return torch.linalg.matrix_norm(self.dictionary, ord=2) ** 2

    def layer(self, index: int, z: Tensor, y: Tensor, lipschitz: Tensor) -> Tensor:
        """Layer ``index`` (0-based) on codes ``z`` ``[B, T, P, K]`` and patches ``y`` ``[B, T, P, p²]``."""
        d = self.dictionary
        v = z + (self.step_scale[index] / lipschitz) * ((y - z @ d.T) @ d)
        if self.attention:
            b, t, n_patch, k = v.shape
            seq = v.permute(0, 2, 1, 3).reshape(b * n_patch, t, k)
            v = v + self.mixers[index](seq).reshape(b, n_patch, t, k).permute(0, 2, 1, 3)
        return soft_threshold(v, self.threshold[index].clamp_min(0))

    def forward(self, noisy: Tensor) -> UnrolledOutput:
        """Denoise a batch of clips ``[B, T, H, W]``; estimates ``[L+1, B, T, H, W]`` (index 0 is ``D·0``)."""
        _check_clip(noisy, self.num_frames, self.image_size)
        b, t, height, width = noisy.shape
        y = patchify(noisy, self.patch_size)
        lipschitz = self.lipschitz()
        z = y.new_zeros(*y.shape[:3], self.num_atoms)
        codes = [z]
        for index in range(self.num_layers):
            z = self.layer(index, z, y, lipschitz)
            codes.append(z)
        patches = torch.stack(codes) @ self.dictionary.T  # [L+1, B, T, P, p²]
        n = len(codes)
        frames = unpatchify(patches.reshape(n * b, t, *patches.shape[3:]), self.patch_size, height, width)
        frames = frames.reshape(n, b, t, height, width)
        return UnrolledOutput(final=frames[-1], layer_estimates=frames)
