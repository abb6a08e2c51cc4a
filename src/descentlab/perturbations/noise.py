"""Counter-based noise: reproducible per (seed, draw, example), whatever the batch looks like.

A stateful generator (``torch.Generator``) hands out numbers in call order, so the noise an example receives
would depend on which examples share its batch, on the padded length and on the device. Robustness curves
compare models on *the same* noisy inputs, so here every random number is a pure function of

    (seed, draw, example key, stream, flat index inside the example)

computed with a 32-bit integer hash (Wellons' "lowbias32" finaliser) in int64 tensor arithmetic. The
example key is a hash of the example's own content (token ids, or the bit pattern of a float input) with
padding positions left out, so an example gets identical noise alone, in any batch, at any padded length,
and under any model that reads the same tokens: paired comparisons between methods come for free.

All functions accept Python ints or int64 tensors holding values in [0, 2^32): every product is split into
16-bit limbs so that no intermediate leaves the int64 range (signed overflow is undefined in C++).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
_TWO_POW_32 = float(2**32)

# streams: independent sub-sequences of one (seed, draw, example) key
STREAM_A = 0  # gaussian first uniform, uniform kind, rademacher signs
STREAM_B = 1  # gaussian second uniform
STREAM_MASK = 2  # substitute: which tokens are replaced
STREAM_INDEX = 3  # substitute: replacement vocabulary row

NOISE_KINDS = ("gaussian", "uniform", "discrete")


def mul32(x: Tensor | int, c: int) -> Tensor | int:
    """Return ``x * c mod 2^32`` for ``x, c`` in [0, 2^32) without leaving the int64 range.

    With ``x = hi·2^16 + lo``: ``x c ≡ lo c + ((hi c) mod 2^16)·2^16 (mod 2^32)``; both terms stay < 2^49.
    """
    lo = x & 0xFFFF
    hi = x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & MASK32


def mix32(x: Tensor | int) -> Tensor | int:
    """The lowbias32 integer hash, a bijection of [0, 2^32) with good avalanche.

    ``x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16`` (all mod 2^32).
    """
    x = x ^ (x >> 16)
    x = mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def fold_key(*parts: Tensor | int) -> Tensor | int:
    """Hash an ordered tuple of 32-bit values into one key: ``k <- mix32(k ^ mix32(p + φ))`` for each part."""
    key: Tensor | int = 0x2545F491
    for part in parts:
        key = mix32(key ^ mix32((part + _GOLDEN) & MASK32))
    return key


def to_u32(x: Tensor) -> Tensor:
    """Fold any integer or float tensor elementwise into int64 values in [0, 2^32) (floats: their bit pattern)."""
    if x.is_floating_point():
        x = x.detach().to(torch.float32).contiguous().view(torch.int32)
    x = x.detach().to(torch.int64)
    # an int64 id may exceed 32 bits: fold the high word in (arithmetic shift, then mask)
    return (x ^ ((x >> 32) & MASK32)) & MASK32


def content_keys(x: Tensor, valid: Tensor | None = None) -> Tensor:
    """One 32-bit key per example (dim 0) from its content; positions with ``valid == False`` are ignored.

    ``key_b = mix32(Σ_t valid_bt · mix32(u32(x_bt) ^ mix32(t + φ)) mod 2^32)``, t the flat index inside the
    example: order-sensitive, and unchanged by appending padding.
    """
    flat = to_u32(x.reshape(x.shape[0], -1))
    positions = torch.arange(flat.shape[1], dtype=torch.int64, device=flat.device)
    per_position = mix32(flat ^ mix32((positions + _GOLDEN) & MASK32))
    if valid is not None:
        per_position = per_position * valid.reshape(flat.shape).to(torch.int64)
    # 2^32 · (positions per example) stays far inside int64 for any realistic example
    return mix32(per_position.sum(dim=1) & MASK32)


def uniform_bits(row_keys: Tensor, numel: int, stream: int) -> Tensor:
    """Hash bits ``[B, numel]``: ``bits[b, i] = mix32(mix32(i·4 + stream) ^ row_keys[b])``."""
    index = torch.arange(numel, dtype=torch.int64, device=row_keys.device) * 4 + stream
    return mix32(mix32(index & MASK32).unsqueeze(0) ^ row_keys.unsqueeze(1))


def bits_to_unit(bits: Tensor) -> Tensor:
    """Map 32-bit values to float64 in the open interval (0, 1): ``u = (bits + 1/2) / 2^32``."""
    return (bits.to(torch.float64) + 0.5) / _TWO_POW_32


def standard_noise(kind: str, row_keys: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Zero-mean, unit-variance noise of ``shape = (B, *S)`` in float64, one key per example.

    - gaussian: Box–Muller, ``ξ = sqrt(-2 ln u_A) cos(2π u_B)``, ξ ~ N(0, 1);
    - uniform: ``√3 (2 u_A - 1)``, i.e. √3·U(-1, 1);
    - discrete: Rademacher ``s = ±1``, from the top bit of stream A.
    """
    numel = math.prod(shape[1:])
    bits = uniform_bits(row_keys, numel, STREAM_A)
    if kind == "gaussian":
        radius = torch.sqrt(-2.0 * torch.log(bits_to_unit(bits)))
        angle = (2.0 * math.pi) * bits_to_unit(uniform_bits(row_keys, numel, STREAM_B))
        out = radius * torch.cos(angle)
    elif kind == "uniform":
        out = math.sqrt(3.0) * (2.0 * bits_to_unit(bits) - 1.0)
    elif kind == "discrete":
        out = torch.where(bits >= 2**31, 1.0, -1.0).to(torch.float64)
    else:
        raise ValueError(f"unknown noise kind {kind!r}; expected one of {NOISE_KINDS}")
    return out.reshape(shape)


def substitution_plan(row_keys: Tensor, length: int, prob: float, vocab_size: int) -> tuple[Tensor, Tensor]:
    """Which tokens to replace and by which vocabulary row: ``(mask [B, length] bool, ids [B, length])``.

    Token (b, t) is replaced when ``u_mask < prob`` (so with probability ``prob``), by row
    ``floor(u_index · V)``, uniform over the V vocabulary rows.
    """
    mask = bits_to_unit(uniform_bits(row_keys, length, STREAM_MASK)) < prob
    ids = (bits_to_unit(uniform_bits(row_keys, length, STREAM_INDEX)) * vocab_size).floor().to(torch.int64)
    return mask, ids.clamp_(max=vocab_size - 1)
