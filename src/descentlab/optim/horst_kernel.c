/* The fused HORST step for float32 CPU tensors (see _horst_kernel.py): one pass over p, g, m, v.

   Two implementations of the same arithmetic, operation for operation, so that they give the same bits:
   - the portable loop (horst_block_c), plain C that the compiler vectorises;
   - with AVX-512 (and unless HORST_PORTABLE is defined), hand-written 16-lane intrinsics
     (horst_block_avx512). Its NaN guard needs no copies of the old values: a non-finite lane is blended back
     to its old p, m, v before the store, behind a branch that is almost never taken. Measured on a Zen 5
     EPYC: the portable loop's guard (stack copies) cost ~10 % of a step, the blend ~4 %; GCC's own
     vectorisation of per-element selects cost ~35 %, and AVX-512 masked stores (here for tails only) ~3x.
   tests/optim/test_horst_kernel.py checks that the two agree bit for bit. */
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

/* One block of one tensor; returns how many elements the NaN guard reverted. `mirror`, `guard` and
   `bounded` (exponent clamp c <= 80) are compile-time constants in each inlined copy, so every variant is
   one branch-free vector loop, and the exponential costs the same whatever the size of the exponent
   (alpha). With a bounded clamp, sign(p) u is copysign(1, p) u: at p = +-0 the two differ, but then
   p exp(x) = +-0 either way, as exp(x) is finite. Measured pitfalls: fminf/fmaxf,
   an OR-reduction of comparisons and 64-bit counters each slowed the loop 2-5x, and per-element selects for
   the guard cost ~25%; the guard instead keeps the old values in L1-resident stack buffers and detects a
   non-finite result with a float sum of p * 0 (NaN iff some p is inf or NaN). */
static inline __attribute__((always_inline)) int64_t
horst_block_c(float *restrict P, const float *restrict G, float *restrict M, float *restrict V, int64_t n,
              float gsign, float decay, float w1, float b2, float w2, float bc2s, float eps, float ss,
              float alpha, float lrbeta, float clamp, const int mirror, const int guard, const int bounded) {
  float op[BLOCK] __attribute__((aligned(64)));
  float om[BLOCK] __attribute__((aligned(64)));
  float ov[BLOCK] __attribute__((aligned(64)));
  float chk = 0.0f;
#pragma omp simd reduction(+ : chk)
  for (int64_t i = 0; i < n; ++i) {
    const float g = G[i] * gsign, p0 = P[i], m0 = M[i], v0 = V[i]; /* gsign = -1: maximize (exact) */
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

#if defined(__AVX512F__) && !defined(HORST_PORTABLE)
#include <immintrin.h>
#define HORST_SIMD_WIDTH 16
#define SET1 _mm512_set1_ps

/* horst_expf_impl on 16 lanes: the same operations in the same order, so the same bits. */
static inline __attribute__((always_inline)) __m512 horst_expf16(__m512 x, const int bounded) {
  const __m512 x0 = x;
  if (!bounded) { /* _mm512_min_ps(a, b) is a < b ? a : b, as in the scalar code: a NaN x becomes b */
    x = _mm512_min_ps(x, SET1(89.0f));
    x = _mm512_max_ps(x, SET1(-104.0f));
  }
  const __m512 t = _mm512_fmadd_ps(x, SET1(1.44269504088896341f), SET1(12582912.0f));
  const __m512 kf = _mm512_sub_ps(t, SET1(12582912.0f));
  __m512 r = _mm512_fmadd_ps(kf, SET1(-0.693359375f), x);
  r = _mm512_fmadd_ps(kf, SET1(2.12194440e-4f), r);
  __m512 y = _mm512_fmadd_ps(SET1(0.0013843654f), r, SET1(0.0083741555f));
  y = _mm512_fmadd_ps(y, r, SET1(0.041668f));
  y = _mm512_fmadd_ps(y, r, SET1(0.16666432f));
  y = _mm512_fmadd_ps(y, r, SET1(0.49999994f));
  y = _mm512_fmadd_ps(y, r, SET1(1.0f));
  y = _mm512_fmadd_ps(y, r, SET1(1.0f));
  const __m512i tb = _mm512_castps_si512(t);
  if (bounded) {
    const __m512i bits = _mm512_add_epi32(_mm512_slli_epi32(tb, 23), _mm512_set1_epi32(127 << 23));
    return _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
  }
  const __m512i k = _mm512_sub_epi32(tb, _mm512_set1_epi32(0x4B400000));
  const __m512i k1 = _mm512_srai_epi32(k, 1), k2 = _mm512_sub_epi32(k, k1);
  const __m512i b1 = _mm512_slli_epi32(_mm512_add_epi32(k1, _mm512_set1_epi32(127)), 23);
  const __m512i b2 = _mm512_slli_epi32(_mm512_add_epi32(k2, _mm512_set1_epi32(127)), 23);
  const __m512 e = _mm512_mul_ps(_mm512_mul_ps(y, _mm512_castsi512_ps(b1)), _mm512_castsi512_ps(b2));
  return _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q), x0);
}

/* The lanes of a 16-wide step that hold elements, with `left` elements still to go. */
static inline __attribute__((always_inline)) __mmask16 tail_lanes(int64_t left) {
  return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* Masked loads and stores for the tail only: on this Zen 5 EPYC a masked store cost several plain ones. */
static inline __attribute__((always_inline)) __m512 load16(const float *src, __mmask16 lanes) {
  return lanes == (__mmask16)0xFFFF ? _mm512_loadu_ps(src) : _mm512_maskz_loadu_ps(lanes, src);
}
static inline __attribute__((always_inline)) void store16(float *dst, __mmask16 lanes, __m512 x) {
  if (lanes == (__mmask16)0xFFFF)
    _mm512_storeu_ps(dst, x);
  else
    _mm512_mask_storeu_ps(dst, lanes, x);
}

/* horst_block_c on 16 lanes at a time, operation for operation. */
static inline __attribute__((always_inline)) int64_t
horst_block_avx512(float *restrict P, const float *restrict G, float *restrict M, float *restrict V,
                   int64_t n, float gsign, float decay, float w1, float b2, float w2, float bc2s, float eps, float ss,
                   float alpha, float lrbeta, float clamp, const int mirror, const int guard,
                   const int bounded) {
  const __m512 zero = _mm512_setzero_ps();
  const __m512i sign = _mm512_set1_epi32((int32_t)0x80000000u);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = tail_lanes(n - i);
    const __m512 g = _mm512_mul_ps(load16(G + i, lanes), SET1(gsign)), p0 = load16(P + i, lanes);
    const __m512 m0 = load16(M + i, lanes), v0 = load16(V + i, lanes);
    __m512 p = _mm512_mul_ps(p0, SET1(decay));
    __m512 m = _mm512_fmadd_ps(SET1(w1), _mm512_sub_ps(g, m0), m0);
    __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(SET1(w2), g), g, _mm512_mul_ps(v0, SET1(b2)));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), SET1(bc2s)), SET1(eps));
    const __m512 u = _mm512_div_ps(_mm512_mul_ps(SET1(ss), m), denom);
    p = _mm512_sub_ps(p, u);
    if (mirror) {
      __m512 na;
      if (bounded) { /* copysign(alpha, -p): |alpha| with the sign bit of -p */
        const __m512i s = _mm512_andnot_si512(_mm512_castps_si512(p), sign);
        na = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(SET1(fabsf(alpha))), s));
      } else {
        const __m512 neg = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, zero, _CMP_GT_OQ), SET1(-alpha));
        const __m512 pos = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, zero, _CMP_LT_OQ), SET1(alpha));
        na = _mm512_add_ps(neg, pos);
      }
      __m512 x = _mm512_sub_ps(_mm512_mul_ps(na, u), SET1(lrbeta));
      x = _mm512_min_ps(x, SET1(clamp));
      x = _mm512_max_ps(x, SET1(-clamp));
      p = _mm512_mul_ps(p, horst_expf16(x, bounded));
    }
    if (guard) { /* vfpclassps 0x99: quiet NaN, +inf, -inf, signalling NaN */
      const __mmask16 nonfinite = _mm512_fpclass_ps_mask(p, 0x99) & lanes;
      if (__builtin_expect(nonfinite != 0, 0)) { /* revert those lanes: keep their old p, m, v */
        bad += __builtin_popcount((unsigned)nonfinite);
        p = _mm512_mask_blend_ps(nonfinite, p, p0);
        m = _mm512_mask_blend_ps(nonfinite, m, m0);
        v = _mm512_mask_blend_ps(nonfinite, v, v0);
      }
    }
    store16(P + i, lanes, p);
    store16(M + i, lanes, m);
    store16(V + i, lanes, v);
  }
  return bad;
}
#define HORST_BLOCK horst_block_avx512
#else
#define HORST_SIMD_WIDTH 0
#define HORST_BLOCK horst_block_c
#endif

/* 16 when the step and the exponential run the AVX-512 intrinsics, 0 for the portable loops. */
int horst_simd_width(void) { return HORST_SIMD_WIDTH; }

/* The exponential of the step, exposed for the tests; bounded = 1 requires |x| <= 80. */
void horst_expf_array(const float *restrict X, float *restrict Y, int64_t n, int bounded) {
#if HORST_SIMD_WIDTH == 16
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = tail_lanes(n - i);
    const __m512 x = load16(X + i, lanes);
    store16(Y + i, lanes, bounded ? horst_expf16(x, 1) : horst_expf16(x, 0));
  }
#else
  if (bounded) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) Y[i] = horst_expf_impl(X[i], 1);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) Y[i] = horst_expf_impl(X[i], 0);
  }
#endif
}

#define HORST_ARGS P, G, M, V, n, gsign, decay, w1, b2, w2, bc2s, eps, ss, alpha, lrbeta, clamp
static int64_t horst_block(float *restrict P, const float *restrict G, float *restrict M, float *restrict V,
                           int64_t n, float gsign, float decay, float w1, float b2, float w2, float bc2s, float eps,
                           float ss, int mirror, float alpha, float lrbeta, float clamp, int guard) {
  if (!mirror) return guard ? HORST_BLOCK(HORST_ARGS, 0, 1, 0) : HORST_BLOCK(HORST_ARGS, 0, 0, 0);
  if (clamp <= 80.0f)
    return guard ? HORST_BLOCK(HORST_ARGS, 1, 1, 1) : HORST_BLOCK(HORST_ARGS, 1, 0, 1);
  return guard ? HORST_BLOCK(HORST_ARGS, 1, 1, 0) : HORST_BLOCK(HORST_ARGS, 1, 0, 0);
}

int64_t horst_step(int64_t T, float *const *P, const float *const *G, float *const *M, float *const *V,
                   const int64_t *numel, const double *step_sizes, const double *bc2_sqrts, double lr,
                   double beta1, double beta2, double eps, double weight_decay, int mirror, double alpha,
                   double beta, double exp_clamp, int guard, int maximize, int nthreads) {
  int64_t *offs = (int64_t *)malloc(sizeof(int64_t) * (T + 1));
  if (!offs) return -1;
  offs[0] = 0;
  for (int64_t t = 0; t < T; ++t) offs[t + 1] = offs[t] + (numel[t] + BLOCK - 1) / BLOCK;
  const float gsign = maximize ? -1.0f : 1.0f; /* g * -1 is -g exactly; g * 1 is g */
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
    bad += horst_block(P[t] + start, G[t] + start, M[t] + start, V[t] + start, n, gsign, decay, w1, b2, w2,
                       (float)bc2_sqrts[t], (float)eps, (float)step_sizes[t], mirror, falpha, lrbeta, clamp,
                       guard);
  }
  free(offs);
  return bad;
}
