r"""Stochastic rounding of HORST's float32 results into bf16 / fp16 parameters.

Why: HORST computes the new value of a bf16 / fp16 parameter in float32 and writes it back. Rounded to the
nearest, any change smaller than half an ulp of the parameter is lost, every step: with bf16 weights near 1
(ulp 2^-7) an Adam step of lr = 1e-3 never moves them, nor does the mirror step's shrink
theta * exp(-alpha |u|). Stochastic rounding keeps those changes in expectation.

The rounding. Let lo <= x <= hi be the two neighbours of the float32 value x in the target dtype (lo = hi =
x when x is representable). Then::

    SR(x) = hi   with probability (x - lo) / (hi - lo),
            lo   otherwise,                                    so that E[SR(x)] = x.

Equivalently, in magnitudes: with t the neighbour toward zero and a the one away from it, SR rounds to a
with probability |x - t| / |a - t|. A uniform w in [0, 1) decides: away from zero iff w < |x - t| / |a - t|.

* bf16 (a float32 with its low 16 bits dropped): add 16 random bits r to the float32 bit pattern, then clear
  the low 16 bits. The carry into bit 16 happens iff (low 16 bits of x) + r >= 2^16, i.e. with probability
  |x - t| / |a - t| exactly (the low bits are that fraction times 2^16, in every binade, subnormals
  included; a carry out of the largest binade gives inf, as round-to-nearest does there). This is the
  rule above with w = (2^16 - 1 - r) / 2^16.
* fp16: the spacing of fp16 near |x| is ulp = 2^(max(e, -14) - 10), e the float32 exponent of |x| (a
  power of two, built from its bits); s = |x| / ulp is exact, t = floor(s) ulp, and SR rounds to
  (floor(s) + [w < s - floor(s)]) ulp with w = (24 random bits) / 2^24. Exact for |x| >= 2^-25; below, the
  probability is rounded up to a multiple of 2^-24 (a bias below 2^-48 in absolute value).

Non-finite values (inf, NaN) are written as round-to-nearest writes them.

The random bits. No generator state: the bits of element i (its row-major index in the tensor) are
``hash32(i + key)``, a 32-bit integer hash, and ``key`` mixes (seed, the tensor's index in the optimizer, the
step number) on the host. So the reference, foreach and compiled paths draw the same bits, one step's bits
do not depend on what ran before, a run is reproducible from its seed, and a resumed run continues
exactly (the seed is a param-group key, the step is in the state). The hash works in int64 on 32-bit values
(every product stays below 2^63), so that CPU, CUDA and Inductor compute the same bits: tested on CPU
(eager and Inductor's C++); not yet run on a GPU.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
_M1 = 0x7FEB352D  # lowbias32 (C. Wellons' hash prospector); both multipliers as int64 below 2^31 in size:
_M2 = 0x846CA68B - (1 << 32)  # the same residue mod 2^32, negative, so that h * _M2 stays within int64
_LOW = (torch.bfloat16, torch.float16)


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def rounding_key(seed: int, index: int, step: int) -> int:
    """The 32-bit key of one tensor at one step (host integers only; no device work)."""
    return _splitmix64(_splitmix64(_splitmix64(seed) ^ index) ^ step) & _MASK32


def _hash32(h: Tensor) -> Tensor:
    """lowbias32 of the low 32 bits of an int64 tensor, as non-negative int64 in [0, 2^32)."""
    h = h & _MASK32
    h = h ^ (h >> 16)
    h = (h * _M1) & _MASK32
    h = h ^ (h >> 15)
    h = (h * _M2) & _MASK32
    return h ^ (h >> 16)


def random_bits(x: Tensor, key: int | Tensor) -> Tensor:
    """32 random bits per element of ``x`` (int64, shaped like ``x``), a function of (row-major index, key)."""
    index = torch.arange(x.numel(), device=x.device, dtype=torch.int64).view(x.shape)
    return _hash32(index + key)


def uniform_of(bits: Tensor, dtype: torch.dtype) -> Tensor:
    """The uniform w in [0, 1) (float64) that :func:`stochastic_round` draws from ``bits`` for ``dtype``: the
    bridge to :func:`stochastic_round_reference`, its slow twin."""
    if dtype == torch.bfloat16:
        return ((1 << 16) - 1 - (bits & 0xFFFF)).double() / (1 << 16)
    return (bits >> 8).double() / (1 << 24)


def _power_of_two(exponent: Tensor) -> Tensor:
    """2^exponent as float32 from its bits (exponent an int32 tensor in [-126, 127]: normal numbers)."""
    return ((exponent + 127) << 23).view(torch.float32)


def stochastic_round(x: Tensor, dtype: torch.dtype, key: int | Tensor) -> Tensor:
    """SR(x) of a plain float32 tensor into ``dtype`` (bf16 or fp16) with the bits ``random_bits(x, key)``.

    Elementwise torch ops only, so that ``torch.compile`` fuses it into the step's kernel.
    """
    bits = random_bits(x, key)
    if dtype == torch.bfloat16:
        # in int64, so that no int32 sum can overflow (a NaN's bits plus r would); the result fits in int32
        dithered = x.view(torch.int32).to(torch.int64) + (bits & 0xFFFF)
        rounded = (dithered & -65536).to(torch.int32).view(torch.float32)
    elif dtype == torch.float16:
        magnitude = x.abs()
        exponent = ((magnitude.view(torch.int32) >> 23) - 127).clamp(-14, 127) - 10
        scaled = magnitude * _power_of_two(-exponent)  # exact: a power-of-two scaling into [0, 2^11)
        whole = torch.floor(scaled)
        w = (bits >> 8).to(torch.float32) * 2.0**-24  # 24 bits: exact in float32
        up = (w < scaled - whole).to(torch.float32)
        rounded = torch.copysign((whole + up) * _power_of_two(exponent), x)
    else:
        raise TypeError(f"stochastic rounding is for bf16 / fp16, not {dtype}")
    return torch.where(torch.isfinite(x), rounded, x).to(dtype)


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    return DTensor


def can_round(t: Tensor) -> bool:
    """Whether :func:`stochastic_round_any` can write ``t``: a plain tensor or a DTensor."""
    if type(t) in (Tensor, torch.nn.Parameter):
        return True
    dtensor = _dtensor_type()
    return dtensor is not None and isinstance(t, dtensor)


def stochastic_round_any(x: Tensor, dtype: torch.dtype, key: int) -> Tensor:
    """:func:`stochastic_round` of a plain tensor or of a DTensor (FSDP2), which is rounded shard by shard
    with each shard's local indices (so shards on different ranks draw the same bits at the same local
    offsets; each element is still rounded without bias, independently from step to step)."""
    dtensor = _dtensor_type()
    if dtensor is not None and isinstance(x, dtensor):
        out = stochastic_round(x.to_local(), dtype, key)
        return dtensor.from_local(
            out, x.device_mesh, x.placements, run_check=False, shape=x.shape, stride=x.stride()
        )
    return stochastic_round(x, dtype, key)


def stochastic_round_reference(x: Tensor, dtype: torch.dtype, w: Tensor) -> Tensor:
    """Slow twin of :func:`stochastic_round`: the neighbours from ``frexp`` in float64, away from zero iff
    ``w < |x - t| / |a - t|`` (``w`` float64 in [0, 1), e.g. :func:`uniform_of` of the same bits)."""
    info = torch.finfo(dtype)
    mantissa_bits = -round(math.log2(info.eps))  # 7 for bf16, 10 for fp16
    min_exponent = round(math.log2(info.tiny))  # -126, -14
    xd = x.double()
    magnitude = xd.abs()
    _, e = torch.frexp(magnitude)  # magnitude = f 2^e, f in [0.5, 1): the leading bit is 2^(e - 1)
    lead = (e - 1).clamp(min=min_exponent)
    spacing = torch.ldexp(torch.ones_like(xd), lead - mantissa_bits)
    toward_zero = torch.floor(magnitude / spacing) * spacing
    away = w < (magnitude - toward_zero) / spacing
    out = torch.copysign(torch.where(away, toward_zero + spacing, toward_zero), xd)
    return torch.where(torch.isfinite(xd), out, xd).to(dtype)


__all__ = [
    "can_round",
    "random_bits",
    "rounding_key",
    "stochastic_round",
    "stochastic_round_any",
    "stochastic_round_reference",
    "uniform_of",
]
