"""A fused single-pass CPU kernel for the HORST step: plain C + OpenMP, built once with the system compiler.

Why a kernel: the update has the memory traffic of AdamW (read p, g, m, v; write p, m, v), but a foreach
implementation makes ~15 passes over memory and pays one ``exp`` per element, which dominates on CPU. The
kernel does everything in one vectorised pass over cache-sized blocks, with its own exponential
(``horst_expf_impl``): range reduction x = k ln2 + r, |r| <= ln2 / 2, then 2^k * p(r), p a degree-6
near-minimax polynomial, all in fma's and integer bit operations that vectorise inside the loop. It is
within 1.04 ulp of the correctly rounded exp over the whole float32 range (0.99 ulp for |x| <= 80; overflow
to inf, gradual underflow to denormals and 0 included; tests/optim/test_horst_kernel.py bounds it at 1.05),
and it costs the same for every exponent, so alpha = 30 costs what alpha = 1 does. (The previous kernel
used a cubic for |x| < 1e-2 and a second pass with libm's ``expf`` elsewhere: 1.3x fused AdamW at alpha = 1,
4x at alpha = 30.)

The AdamW half rounds like ``torch.optim.AdamW(fused=True)`` (``lerp`` as an fma, ``addcmul`` as
``fma(value * g, g, v)``, correctly rounded ``sqrt``), so with alpha = beta = 0 it reproduces it bit for bit
(exp(0) is exactly 1; the default, non-fused AdamW differs by an ulp here and there: its CPU ``sqrt`` is
not correctly rounded).

Plain C (no torch headers) compiles in about a second; the shared library is cached under
``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``), keyed by the source, flags and CPU flags,
and called through ``ctypes``. If it cannot be built (no C compiler, ``DESCENTLAB_HORST_KERNEL=0``),
:func:`load_kernel` returns ``None`` and HORST uses its pure-torch foreach path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from descentlab.optim.functional import Bucket, HorstHyper

logger = logging.getLogger(__name__)


_C_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 512 /* 3 stack buffers + 4 streams stay in a 32 KB L1 */
static const float FLT_MAX_ = 3.4028234663852886e38f;

/* exp(x) in float32 without libm, written so that the compiler vectorises it inside the step loop.
   Range reduction x = k ln2 + r, k = rint(x / ln2) (the 1.5 * 2^23 trick, exact with -ffp-contract=off and
   no -ffast-math), r = x - k ln2 with ln2 split in two (Cody-Waite), |r| <= ln2 / 2; then
   exp(r) = 1 + r + ... in Horner form, a degree-6 near-minimax fit of relative error 2e-9 (well below half an
   ulp, so float32 rounding sets the error), and exp(x) = 2^k exp(r) with 2^k built from its bits. `bounded`
   (a compile-time constant): the caller guarantees |x| <= 80, so one exact factor 2^k suffices. Otherwise x
   is clamped to [-104, 89] (exp is 0 / inf beyond; NaN propagates) and 2^k is applied as two exact
   factors, so that overflow (inf) and gradual underflow (denormals, 0) round once, like expf.
   Error <= 1.04 ulp against the correctly rounded exp (tests/optim/test_horst_kernel.py bounds 1.05). */
static inline __attribute__((always_inline)) float horst_expf_impl(float x, const int bounded) {
  const float x0 = x;
  if (!bounded) {
    x = x < 89.0f ? x : 89.0f; /* vminps / vmaxps; a NaN x becomes a bound, handled below */
    x = x > -104.0f ? x : -104.0f;
  }
  /* t = 1.5 * 2^23 + k: the low bits of t's representation are k, so 2^k needs no float-to-int conversion */
  const float t = fmaf(x, 1.44269504088896341f, 12582912.0f);
  const float kf = t - 12582912.0f;
  float r = fmaf(kf, -0.693359375f, x);
  r = fmaf(kf, 2.12194440e-4f, r);
  float y = fmaf(0.0013843654f, r, 0.0083741555f);
  y = fmaf(y, r, 0.041668f);
  y = fmaf(y, r, 0.16666432f);
  y = fmaf(y, r, 0.49999994f);
  y = fmaf(y, r, 1.0f);
  y = fmaf(y, r, 1.0f);
  int32_t tb;
  memcpy(&tb, &t, sizeof tb);
  if (bounded) {
    const int32_t bits = (int32_t)(((uint32_t)tb << 23) + (127u << 23)); /* (k + 127) << 23 */
    float s;
    memcpy(&s, &bits, sizeof s);
    return y * s;
  }
  const int32_t k = tb - 0x4B400000; /* k in [-150, 128]: 2^k1 and 2^k2 are normal */
  const int32_t k1 = k >> 1, k2 = k - k1;
  const int32_t b1 = (k1 + 127) << 23, b2 = (k2 + 127) << 23;
  float s1, s2;
  memcpy(&s1, &b1, sizeof s1);
  memcpy(&s2, &b2, sizeof s2);
  const float e = (y * s1) * s2;
  return x0 == x0 ? e : x0;
}

/* The exponential of the step, exposed for the tests; bounded = 1 requires |x| <= 80. */
void horst_expf_array(const float *restrict X, float *restrict Y, int64_t n, int bounded) {
  if (bounded) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) Y[i] = horst_expf_impl(X[i], 1);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) Y[i] = horst_expf_impl(X[i], 0);
  }
}

/* One block of one tensor; returns how many elements the NaN guard reverted. `mirror`, `guard` and
   `bounded` (exponent clamp c <= 80) are compile-time constants in each inlined copy, so every variant is
   one branch-free vector loop, and the exponential costs the same whatever the size of the exponent
   (alpha). With a bounded clamp, sign(p) u is copysign(1, p) u: at p = +-0 the two differ, but then
   p exp(x) = +-0 either way, as exp(x) is finite. Measured pitfalls: fminf/fmaxf,
   an OR-reduction of comparisons and 64-bit counters each slowed the loop 2-5x, and per-element selects for
   the guard cost ~25%; the guard instead keeps the old values in L1-resident stack buffers and detects a
   non-finite result with a float sum of p * 0 (NaN iff some p is inf or NaN). */
static inline __attribute__((always_inline)) int64_t
horst_block_impl(float *restrict P, const float *restrict G, float *restrict M, float *restrict V, int64_t n,
                 float decay, float w1, float b2, float w2, float bc2s, float eps, float ss, float alpha,
                 float lrbeta, float clamp, const int mirror, const int guard, const int bounded) {
  float op[BLOCK] __attribute__((aligned(64)));
  float om[BLOCK] __attribute__((aligned(64)));
  float ov[BLOCK] __attribute__((aligned(64)));
  float chk = 0.0f;
#pragma omp simd reduction(+ : chk)
  for (int64_t i = 0; i < n; ++i) {
    const float g = G[i], p0 = P[i], m0 = M[i], v0 = V[i];
    if (guard) {
      op[i] = p0;
      om[i] = m0;
      ov[i] = v0;
    }
    float p = p0 * decay;
    const float m = fmaf(w1, g - m0, m0);
    const float v = fmaf(w2 * g, g, v0 * b2);
    const float denom = sqrtf(v) / bc2s + eps;
    const float u = (ss * m) / denom;
    p = p - u;
    if (mirror) {
      /* -alpha sign(p) u, rounded once either way (+-alpha is exact) */
      const float na = bounded ? copysignf(alpha, -p) : (p > 0.0f ? -alpha : 0.0f) + (p < 0.0f ? alpha : 0.0f);
      float x = na * u - lrbeta;
      x = x < clamp ? x : clamp; /* vminps / vmaxps. x is NaN only where p is NaN or +-inf (it then */
      x = x > -clamp ? x : -clamp; /* stays non-finite), so losing the NaN to a bound is harmless */
      p = p * horst_expf_impl(x, bounded);
    }
    if (guard) chk += p * 0.0f;
    P[i] = p;
    M[i] = m;
    V[i] = v;
  }
  int64_t bad = 0;
  if (guard && !(chk == 0.0f)) { /* rare: revert the elements whose new value is not finite */
    for (int64_t i = 0; i < n; ++i) {
      if (!(fabsf(P[i]) <= FLT_MAX_)) {
        P[i] = op[i];
        M[i] = om[i];
        V[i] = ov[i];
        ++bad;
      }
    }
  }
  return bad;
}

#define HORST_ARGS P, G, M, V, n, decay, w1, b2, w2, bc2s, eps, ss, alpha, lrbeta, clamp
static int64_t horst_block(float *restrict P, const float *restrict G, float *restrict M, float *restrict V,
                           int64_t n, float decay, float w1, float b2, float w2, float bc2s, float eps,
                           float ss, int mirror, float alpha, float lrbeta, float clamp, int guard) {
  if (!mirror) return guard ? horst_block_impl(HORST_ARGS, 0, 1, 0) : horst_block_impl(HORST_ARGS, 0, 0, 0);
  if (clamp <= 80.0f)
    return guard ? horst_block_impl(HORST_ARGS, 1, 1, 1) : horst_block_impl(HORST_ARGS, 1, 0, 1);
  return guard ? horst_block_impl(HORST_ARGS, 1, 1, 0) : horst_block_impl(HORST_ARGS, 1, 0, 0);
}

int64_t horst_step(int64_t T, float *const *P, const float *const *G, float *const *M, float *const *V,
                   const int64_t *numel, const double *step_sizes, const double *bc2_sqrts, double lr,
                   double beta1, double beta2, double eps, double weight_decay, int mirror, double alpha,
                   double beta, double exp_clamp, int guard, int nthreads) {
  int64_t *offs = (int64_t *)malloc(sizeof(int64_t) * (T + 1));
  if (!offs) return -1;
  offs[0] = 0;
  for (int64_t t = 0; t < T; ++t) offs[t + 1] = offs[t] + (numel[t] + BLOCK - 1) / BLOCK;
  const float decay = (float)(1.0 - lr * weight_decay);
  const float w1 = (float)(1.0 - beta1), b2 = (float)beta2, w2 = (float)(1.0 - beta2);
  const float falpha = (float)alpha, lrbeta = (float)(lr * beta);
  const float clamp = exp_clamp > 0 ? (float)exp_clamp : INFINITY;
  const int64_t nb = offs[T];
  int64_t bad = 0;
#pragma omp parallel for schedule(dynamic, 64) num_threads(nthreads) reduction(+ : bad)
  for (int64_t b = 0; b < nb; ++b) {
    int64_t lo = 0, hi = T - 1;
    while (lo < hi) {  /* the tensor t with offs[t] <= b < offs[t + 1] */
      const int64_t mid = (lo + hi + 1) / 2;
      if (offs[mid] <= b) lo = mid; else hi = mid - 1;
    }
    const int64_t t = lo, start = (b - offs[t]) * BLOCK;
    const int64_t n = numel[t] - start < BLOCK ? numel[t] - start : BLOCK;
    bad += horst_block(P[t] + start, G[t] + start, M[t] + start, V[t] + start, n, decay, w1, b2, w2,
                       (float)bc2_sqrts[t], (float)eps, (float)step_sizes[t], mirror, falpha, lrbeta, clamp,
                       guard);
  }
  free(offs);
  return bad;
}
"""

# No fp contraction: the AdamW half must round like torch's fused AdamW, built with -ffp-contract=off (and
# the exp's rint trick needs the add and the subtract rounded separately). -fno-math-errno lets sqrtf
# vectorise (errno is never read). The OpenMP runtime resolves to the libgomp.so.1 torch already loaded, so
# both share one thread pool. The second entry drops -march=native for toolchains that reject it.
_BASE_FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno"]
_FLAG_SETS: tuple[tuple[list[str], list[str]], ...] = (
    ([*_BASE_FLAGS, "-march=native"], []),
    (_BASE_FLAGS, []),
)


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def _cache_dir() -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    return Path(root) / "descentlab_horst"


def _build(source: str, flags: list[str], libs: list[str]) -> Path:
    key = hashlib.sha256("\n".join([source, *flags, *libs, _cpu_flags()]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"horst_{key}.so"
    if target.exists():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, out = Path(tmp) / "horst.c", Path(tmp) / "horst.so"
        src.write_text(source)
        cmd = [compiler, *flags, "-std=c99", "-shared", "-fPIC", str(src), "-o", str(out), *libs, "-lm"]
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
        os.replace(out, target)  # atomic: concurrent builders each write a complete file
    return target


class HorstKernel:
    """The loaded shared library, with a typed Python entry point."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lib = ctypes.CDLL(str(path))
        fn = self._lib.horst_step
        fn.restype = ctypes.c_int64
        ptr, dbl = ctypes.c_void_p, ctypes.c_double
        fn.argtypes = [ctypes.c_int64, ptr, ptr, ptr, ptr, ptr, ptr, ptr]
        fn.argtypes += [dbl] * 5 + [ctypes.c_int, dbl, dbl, dbl, ctypes.c_int, ctypes.c_int]
        self._fn = fn
        exp = self._lib.horst_expf_array
        exp.restype = None
        exp.argtypes = [ptr, ptr, ctypes.c_int64, ctypes.c_int]
        self._exp = exp

    def expf(self, x: Tensor, *, bounded: bool = False) -> Tensor:
        """The kernel's own exponential (the one inside the step), elementwise on a float32 CPU tensor.

        Exposed so that its error against the correctly rounded exp can be tested. ``bounded=True`` is the
        variant the step uses when the exponent clamp is at most 80; it requires |x| <= 80.
        """
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise TypeError("expf expects a float32 CPU tensor")
        x = x.contiguous()
        out = torch.empty_like(x)
        if bounded and x.numel() and not bool(x.abs().max() <= 80):
            raise ValueError("expf(bounded=True) requires |x| <= 80")
        self._exp(x.data_ptr(), out.data_ptr(), x.numel(), int(bounded))
        return out

    def horst_step_(self, bucket: Bucket, hp: HorstHyper, *, mirror: bool, check: bool = True) -> int:
        """In-place fused step of contiguous float32 CPU tensors at steps ``steps`` (one per tensor).

        ``check=False`` skips the per-tensor dtype / layout / size checks, for callers that made them (HORST
        does, when it picks the path); a wrong tensor then corrupts memory instead of raising.

        Returns:
            The number of elements the NaN guard reverted.
        """
        params, grads, exp_avgs, exp_avg_sqs, _ = bucket
        n = len(params)
        for lst in (grads, exp_avgs, exp_avg_sqs) if check else ():
            for p, t in zip(params, lst, strict=True):
                if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
                    raise TypeError("horst_step_ expects contiguous float32 CPU tensors")
                if t.numel() != p.numel():
                    raise ValueError("horst_step_: a gradient or moment does not match its parameter's size")
        if n == 0:
            return 0

        def ptrs(ts: list[Tensor]) -> ctypes.Array:
            return (ctypes.c_void_p * n)(*[t.data_ptr() for t in ts])

        step_sizes, bc2_sqrts = hp.bias_corrections(bucket.steps)
        lr, beta1, beta2, eps, weight_decay, alpha, beta, exp_clamp, nan_guard = hp
        exp_clamp = -1.0 if exp_clamp is None else float(exp_clamp)  # the C side reads <= 0 as "no clamp"
        numel = (ctypes.c_int64 * n)(*[p.numel() for p in params])
        reverted = self._fn(
            n, ptrs(params), ptrs(grads), ptrs(exp_avgs), ptrs(exp_avg_sqs), numel,
            (ctypes.c_double * n)(*step_sizes), (ctypes.c_double * n)(*bc2_sqrts),
            lr, beta1, beta2, eps, weight_decay, int(mirror), alpha, beta, exp_clamp, int(nan_guard),
            torch.get_num_threads(),
        )  # fmt: skip
        if reverted < 0:
            raise MemoryError("horst_step_: out of memory")
        return int(reverted)


@functools.lru_cache(maxsize=1)
def load_kernel() -> HorstKernel | None:
    """Build (first call on a machine, about a second) or load the fused kernel.

    Returns:
        The kernel, or ``None`` if it cannot be built here (then HORST uses its foreach path).
    """
    if os.environ.get("DESCENTLAB_HORST_KERNEL", "1") == "0":
        return None
    for flags, libs in _FLAG_SETS:
        try:
            return HorstKernel(_build(_C_SOURCE, flags, libs))
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            logger.warning("HORST kernel build with %s failed: %s %s", flags, exc, detail.decode()[-500:])
    logger.warning("HORST fused CPU kernel unavailable; using the pure-torch foreach path")
    return None


if __name__ == "__main__":
    kernel = load_kernel()
    print(f"HORST kernel: {kernel.path if kernel else 'unavailable (foreach fallback)'}")
