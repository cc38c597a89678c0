/* SPDX-License-Identifier: MIT */
/* reduce_cpu.c — the agent's CPU backend: per-unit sums of squares of host
 * tensors in fp64, with exact NaN/Inf counts. Every element is widened to
 * double and squared exactly (a float's square fits a double), summed in
 * explicit vector lanes; a block whose sum is not finite is recounted
 * element by element, so the fast path carries no per-element checks. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "gnmr/agent.h"
#include "dtype.h"
#include "reduce_cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define GNMR_HAVE_X86 1
#endif

#define BLOCK GNMR_REDUCE_BLOCK /* 16 KiB of fp32 staging */

typedef float v2f __attribute__((vector_size(8)));
typedef double v2d __attribute__((vector_size(16)));

/* Sum of squares of n floats in fp64 (8 elements per iteration, four
 * independent 2-wide accumulators). */
static double ss_f32(const float *x, size_t n) {
  v2d a0 = {0, 0}, a1 = {0, 0}, a2 = {0, 0}, a3 = {0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v2f f0, f1, f2, f3;
    memcpy(&f0, x + i, sizeof f0);
    memcpy(&f1, x + i + 2, sizeof f1);
    memcpy(&f2, x + i + 4, sizeof f2);
    memcpy(&f3, x + i + 6, sizeof f3);
    v2d d0 = __builtin_convertvector(f0, v2d);
    v2d d1 = __builtin_convertvector(f1, v2d);
    v2d d2 = __builtin_convertvector(f2, v2d);
    v2d d3 = __builtin_convertvector(f3, v2d);
    a0 += d0 * d0;
    a1 += d1 * d1;
    a2 += d2 * d2;
    a3 += d3 * d3;
  }
  v2d a = (a0 + a1) + (a2 + a3);
  double s = a[0] + a[1];
  for (; i < n; i++)
    s += (double)x[i] * (double)x[i];
  return s;
}

static double ss_f64(const double *x, size_t n) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a0 += x[i] * x[i];
    a1 += x[i + 1] * x[i + 1];
    a2 += x[i + 2] * x[i + 2];
    a3 += x[i + 3] * x[i + 3];
  }
  double s = (a0 + a1) + (a2 + a3);
  for (; i < n; i++)
    s += x[i] * x[i];
  return s;
}

#ifdef GNMR_HAVE_X86
/* AVX2 kernels, chosen at run time: 4 floats widen to 4 doubles per
 * instruction. Squares of widened floats are exact, so these give the
 * same sums as the portable kernels up to summation order. */
__attribute__((target("avx2"))) static double ss_f32_avx2(const float *x,
                                                          size_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256d d0 = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
    __m256d d1 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
    __m256d d2 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8));
    __m256d d3 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12));
    a0 = _mm256_add_pd(a0, _mm256_mul_pd(d0, d0));
    a1 = _mm256_add_pd(a1, _mm256_mul_pd(d1, d1));
    a2 = _mm256_add_pd(a2, _mm256_mul_pd(d2, d2));
    a3 = _mm256_add_pd(a3, _mm256_mul_pd(d3, d3));
  }
  __m256d a = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
  double lanes[4];
  _mm256_storeu_pd(lanes, a);
  double s = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; i++)
    s += (double)x[i] * (double)x[i];
  return s;
}

/* AVX-512: 8 floats widen to 8 doubles per instruction; FMA is exact here
 * (the product of two widened floats fits a double). */
__attribute__((target("avx512f"))) static double
ss_f32_avx512(const float *x, size_t n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512d d0 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
    __m512d d1 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
    __m512d d2 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 16));
    __m512d d3 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 24));
    a0 = _mm512_fmadd_pd(d0, d0, a0);
    a1 = _mm512_fmadd_pd(d1, d1, a1);
    a2 = _mm512_fmadd_pd(d2, d2, a2);
    a3 = _mm512_fmadd_pd(d3, d3, a3);
  }
  double s = _mm512_reduce_add_pd(
      _mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
  for (; i < n; i++)
    s += (double)x[i] * (double)x[i];
  return s;
}

/* 8 floats (as __m256) squared into two double accumulators. */
__attribute__((target("avx2"))) static inline void acc8(__m256 f,
                                                        __m256d *a,
                                                        __m256d *b) {
  __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
  __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
  *a = _mm256_add_pd(*a, _mm256_mul_pd(lo, lo));
  *b = _mm256_add_pd(*b, _mm256_mul_pd(hi, hi));
}

__attribute__((target("avx2"))) static double hsum(__m256d a) {
  double lanes[4];
  _mm256_storeu_pd(lanes, a);
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

/* bf16 -> fp32 is a 16-bit shift: 8 halves in 128 bits are 4 32-bit
 * lanes, the even halves by a shift, the odd ones by clearing the low
 * bits (ss_bf16_avx512's way), 4 floats each straight into 4 doubles. */
__attribute__((target("avx2"))) static double ss_bf16_avx2(const uint16_t *x,
                                                           size_t n,
                                                           float *tail) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  const __m128i top = _mm_set1_epi32((int)0xffff0000u);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128i h0 = _mm_loadu_si128((const void *)(x + i));
    __m128i h1 = _mm_loadu_si128((const void *)(x + i + 8));
    __m256d e0 = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(h0, 16)));
    __m256d o0 = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_and_si128(h0, top)));
    __m256d e1 = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(h1, 16)));
    __m256d o1 = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_and_si128(h1, top)));
    a0 = _mm256_add_pd(a0, _mm256_mul_pd(e0, e0));
    a1 = _mm256_add_pd(a1, _mm256_mul_pd(o0, o0));
    a2 = _mm256_add_pd(a2, _mm256_mul_pd(e1, e1));
    a3 = _mm256_add_pd(a3, _mm256_mul_pd(o1, o1));
  }
  double s = hsum(_mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)));
  for (size_t k = 0; i < n; i++, k++) {
    uint32_t bits = (uint32_t)x[i] << 16;
    memcpy(&tail[k], &bits, sizeof bits);
    s += (double)tail[k] * (double)tail[k];
  }
  return s;
}

/* AVX-512: 16 halves widen to 16 floats (bf16 by a shift, fp16 by
 * vcvtph2ps), then to two vectors of 8 doubles; FMA is exact here. */
__attribute__((target("avx512f"))) static inline void
acc16(__m512 f, __m512d *a, __m512d *b) {
  __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
  __m512d hi = _mm512_cvtps_pd(
      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
  *a = _mm512_fmadd_pd(lo, lo, *a);
  *b = _mm512_fmadd_pd(hi, hi, *b);
}

__attribute__((target("avx512f"))) static double
ss_half_avx512(const uint16_t *x, size_t n, int bf16, const float *table) {
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i h0 = _mm256_loadu_si256((const void *)(x + i));
    __m256i h1 = _mm256_loadu_si256((const void *)(x + i + 16));
    __m512 f0, f1;
    if (bf16) {
      f0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h0), 16));
      f1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h1), 16));
    } else {
      f0 = _mm512_cvtph_ps(h0);
      f1 = _mm512_cvtph_ps(h1);
    }
    acc16(f0, &a0, &a1);
    acc16(f1, &a2, &a3);
  }
  double s = _mm512_reduce_add_pd(
      _mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
  for (; i < n; i++) {
    float f;
    if (bf16) {
      uint32_t bits = (uint32_t)x[i] << 16;
      memcpy(&f, &bits, sizeof bits);
    } else {
      f = table[x[i]];
    }
    s += (double)f * (double)f;
  }
  return s;
}

/* bf16 with AVX-512: 16 halves in 256 bits are 8 32-bit lanes, each an
 * even half (low) and an odd one (high); the odd one is its lane's fp32
 * with the low bits cleared, the even one its lane shifted up: 8 floats
 * each, widened straight into 8 doubles (no lane extraction, no 16 -> 32
 * widening), then squared and summed by FMA, exact (a float's square fits
 * a double). The sum's order is even and odd halves apart: another order
 * than ss_half_avx512's, so the last bits of a large sum may differ. */
__attribute__((target("avx512f"))) static double
ss_bf16_avx512(const uint16_t *x, size_t n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i h0 = _mm256_loadu_si256((const void *)(x + i));
    __m256i h1 = _mm256_loadu_si256((const void *)(x + i + 16));
    __m512d e0 = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(h0, 16)));
    __m512d o0 = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_and_si256(h0, hi)));
    __m512d e1 = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(h1, 16)));
    __m512d o1 = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_and_si256(h1, hi)));
    a0 = _mm512_fmadd_pd(e0, e0, a0);
    a1 = _mm512_fmadd_pd(o0, o0, a1);
    a2 = _mm512_fmadd_pd(e1, e1, a2);
    a3 = _mm512_fmadd_pd(o1, o1, a3);
  }
  double s = _mm512_reduce_add_pd(
      _mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
  for (; i < n; i++) {
    float f;
    uint32_t bits = (uint32_t)x[i] << 16;
    memcpy(&f, &bits, sizeof bits);
    s += (double)f * (double)f;
  }
  return s;
}

__attribute__((target("avx2,f16c"))) static double
ss_f16_avx2(const uint16_t *x, size_t n, const float *table) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc8(_mm256_cvtph_ps(_mm_loadu_si128((const void *)(x + i))), &a0, &a1);
    acc8(_mm256_cvtph_ps(_mm_loadu_si128((const void *)(x + i + 8))), &a2,
         &a3);
  }
  double s = hsum(_mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)));
  for (; i < n; i++)
    s += (double)table[x[i]] * (double)table[x[i]];
  return s;
}
#endif

/* Slow path of a block: finite elements' squares, and the count of the
 * others. */
static double recount_f32(const float *x, size_t n, uint64_t *bad) {
  double s = 0;
  for (size_t i = 0; i < n; i++) {
    if (isfinite(x[i]))
      s += (double)x[i] * (double)x[i];
    else
      (*bad)++;
  }
  return s;
}

static double recount_f64(const double *x, size_t n, uint64_t *bad) {
  double s = 0;
  for (size_t i = 0; i < n; i++) {
    if (isfinite(x[i]))
      s += x[i] * x[i];
    else
      (*bad)++;
  }
  return s;
}

/* fp16 -> fp32 through a table of all 65536 values, fp8 through tables of
 * 256, built once with the decoders the CUDA kernel uses (dtype.h). */
static float f16_table[65536];
static float e4m3_table[256], e5m2_table[256];
static pthread_once_t f16_once = PTHREAD_ONCE_INIT;

/* SIMD level: 0 portable, 1 AVX2 (+F16C), 2 AVX2 + AVX-512F (fp32, bf16
 * and fp16 use the AVX-512 kernels). Chosen once. */
static int simd_level;
static int simd_forced = -1;

static void f16_init(void) {
  for (uint32_t i = 0; i < 65536; i++)
    f16_table[i] = gnmr__f16_f32((uint16_t)i);
  for (uint32_t i = 0; i < 256; i++) {
    e4m3_table[i] = gnmr__e4m3_f32((uint8_t)i);
    e5m2_table[i] = gnmr__e5m2_f32((uint8_t)i);
  }
#ifdef GNMR_HAVE_X86
  __builtin_cpu_init();
  simd_level = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  if (simd_level && __builtin_cpu_supports("avx512f"))
    simd_level = 2;
#endif
}

void gnmr__reduce_set_simd(int max_level) { simd_forced = max_level; }

int gnmr__reduce_simd_level(void) {
  pthread_once(&f16_once, f16_init);
  return simd_forced >= 0 && simd_forced < simd_level ? simd_forced
                                                      : simd_level;
}

/* Widens a block of 16-bit or 8-bit values to fp32 in tmp. */
static void widen(const void *data, size_t n, uint32_t dtype, float *tmp) {
  const uint16_t *src = data;
  const uint8_t *b = data;
  if (dtype == GNMR_DTYPE_F8E4M3 || dtype == GNMR_DTYPE_F8E5M2) {
    const float *tab = dtype == GNMR_DTYPE_F8E4M3 ? e4m3_table : e5m2_table;
    for (size_t i = 0; i < n; i++)
      tmp[i] = tab[b[i]];
  } else if (dtype == GNMR_DTYPE_BF16) {
    for (size_t i = 0; i < n; i++) {
      uint32_t bits = (uint32_t)src[i] << 16;
      memcpy(&tmp[i], &bits, sizeof bits);
    }
  } else {
    for (size_t i = 0; i < n; i++)
      tmp[i] = f16_table[src[i]];
  }
}

/* One block of a tensor (n <= BLOCK elements from element off): the sum of
 * squares of its finite elements; adds the count of others to *bad. */
double gnmr__reduce_block(const gnmr_tensor *t, uint64_t off, size_t n,
                          uint64_t *bad, int simd) {
  float tmp[BLOCK];
  double s;
#ifdef GNMR_HAVE_X86
  if (simd && t->dtype != GNMR_DTYPE_F64 && t->dtype < GNMR_DTYPE_F8E4M3) {
    const uint16_t *h = (const uint16_t *)t->data + off;
    if (t->dtype == GNMR_DTYPE_F32)
      s = simd == 2 ? ss_f32_avx512((const float *)t->data + off, n)
                    : ss_f32_avx2((const float *)t->data + off, n);
    else if (simd == 2 && t->dtype == GNMR_DTYPE_BF16)
      s = ss_bf16_avx512(h, n);
    else if (simd == 2)
      s = ss_half_avx512(h, n, 0, f16_table);
    else if (t->dtype == GNMR_DTYPE_BF16)
      s = ss_bf16_avx2(h, n, tmp);
    else
      s = ss_f16_avx2(h, n, f16_table);
    if (!isfinite(s)) { /* rare: recount this block exactly */
      if (t->dtype == GNMR_DTYPE_F32) {
        s = recount_f32((const float *)t->data + off, n, bad);
      } else {
        widen(h, n, t->dtype, tmp);
        s = recount_f32(tmp, n, bad);
      }
    }
    return s;
  }
#else
  (void)simd;
#endif
  switch (t->dtype) {
  case GNMR_DTYPE_F32: {
    const float *x = (const float *)t->data + off;
    s = ss_f32(x, n);
    if (!isfinite(s))
      s = recount_f32(x, n, bad);
    break;
  }
  case GNMR_DTYPE_F64: {
    const double *x = (const double *)t->data + off;
    s = ss_f64(x, n);
    if (!isfinite(s))
      s = recount_f64(x, n, bad);
    break;
  }
  case GNMR_DTYPE_F8E4M3:
  case GNMR_DTYPE_F8E5M2:
    widen((const uint8_t *)t->data + off, n, t->dtype, tmp);
    s = ss_f32(tmp, n);
    if (!isfinite(s))
      s = recount_f32(tmp, n, bad);
    break;
  default:
    widen((const uint16_t *)t->data + off, n, t->dtype, tmp);
    s = ss_f32(tmp, n);
    if (!isfinite(s))
      s = recount_f32(tmp, n, bad);
    break;
  }
  return s;
}

/* One tensor: its blocks' sums added in order, then the scale. The threaded
 * reduction (reduce_pool.c) adds the same block sums in the same order. */
static double reduce_tensor(const gnmr_tensor *t, uint64_t *bad, int simd) {
  double total = 0;
  for (uint64_t off = 0; off < t->numel; off += BLOCK) {
    size_t n = (size_t)(t->numel - off < BLOCK ? t->numel - off : BLOCK);
    total += gnmr__reduce_block(t, off, n, bad, simd);
  }
  return gnmr__reduce_scale(t, total);
}

int gnmr__reduce_check(const gnmr_tensor *tensors, size_t n,
                       uint32_t n_units) {
  if (tensors == NULL && n > 0)
    return GNMR_E_INVAL;
  for (size_t i = 0; i < n; i++) {
    const gnmr_tensor *t = &tensors[i];
    if (t->unit >= n_units || t->dtype > GNMR_DTYPE_F8E5M2 ||
        (t->data == NULL && t->numel > 0) || !(t->scale >= 0) ||
        !isfinite(t->scale))
      return GNMR_E_INVAL;
  }
  return GNMR_OK;
}

int gnmr_reduce_cpu(const gnmr_tensor *tensors, size_t n, uint32_t n_units,
                    double *sumsq, uint64_t *nonfinite, uint8_t *seen) {
  if (sumsq == NULL || nonfinite == NULL ||
      gnmr__reduce_check(tensors, n, n_units) != GNMR_OK)
    return GNMR_E_INVAL;
  int simd = gnmr__reduce_simd_level();
  for (size_t i = 0; i < n; i++) {
    const gnmr_tensor *t = &tensors[i];
    sumsq[t->unit] += reduce_tensor(t, &nonfinite[t->unit], simd);
    if (seen != NULL)
      seen[t->unit] = 1;
  }
  return GNMR_OK;
}

/* ---- checking reported sums ------------------------------------------------ */

#ifdef GNMR_HAVE_X86
__attribute__((target("avx512f"))) static int
sums_bad_avx512(const double *x, const uint8_t *skip, uint32_t n) {
  __mmask8 bad = 0;
  uint32_t i = 0;
  const __m512d zero = _mm512_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    __mmask8 b = ~_mm512_cmp_pd_mask(_mm512_loadu_pd(x + i), zero, _CMP_GE_OQ);
    if (skip != NULL) {
      __m512i k =
          _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(skip + i)));
      b &= ~_mm512_test_epi64_mask(k, k);
    }
    bad |= b;
  }
  int r = bad != 0;
  for (; i < n; i++)
    r |= !(x[i] >= 0) & (skip == NULL || !skip[i]);
  return r;
}

__attribute__((target("avx2"))) static int
sums_bad_avx2(const double *x, const uint8_t *skip, uint32_t n) {
  uint32_t i = 0;
  int r = 0;
  const __m256d zero = _mm256_setzero_pd();
  if (skip == NULL) {
    __m256d ok = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
    for (; i + 4 <= n; i += 4)
      ok = _mm256_and_pd(ok, _mm256_cmp_pd(_mm256_loadu_pd(x + i), zero,
                                           _CMP_GE_OQ));
    r = _mm256_movemask_pd(ok) != 0xf;
  }
  for (; i < n; i++)
    r |= !(x[i] >= 0) & (skip == NULL || !skip[i]);
  return r;
}
#endif

int gnmr__sums_invalid(const double *x, const uint8_t *skip, uint32_t n) {
#ifdef GNMR_HAVE_X86
  int level = gnmr__reduce_simd_level();
  if (level == 2)
    return sums_bad_avx512(x, skip, n);
  if (level == 1)
    return sums_bad_avx2(x, skip, n);
#endif
  int r = 0;
  for (uint32_t i = 0; i < n; i++)
    r |= !(x[i] >= 0) & (skip == NULL || !skip[i]);
  return r;
}

/* ---- copying reported sums into a message, checking them on the way ------- */

#ifdef GNMR_HAVE_X86
__attribute__((target("avx512f"))) static int
copy_check_avx512(uint8_t *dst, const double *x, const uint8_t *skip,
                  uint32_t n) {
  __mmask8 bad = 0;
  uint32_t i = 0;
  const __m512d zero = _mm512_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    __m512d v = _mm512_loadu_pd(x + i);
    _mm512_storeu_pd(dst + 8 * (size_t)i, v);
    __mmask8 b = ~_mm512_cmp_pd_mask(v, zero, _CMP_GE_OQ);
    if (skip != NULL) {
      __m512i k =
          _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(skip + i)));
      b &= ~_mm512_test_epi64_mask(k, k);
    }
    bad |= b;
  }
  int r = bad != 0;
  memcpy(dst + 8 * (size_t)i, x + i, 8 * (size_t)(n - i));
  for (; i < n; i++)
    r |= !(x[i] >= 0) & (skip == NULL || !skip[i]);
  return r;
}
#endif

int gnmr__sums_copy_check(uint8_t *dst, const double *x, const uint8_t *skip,
                          uint32_t n, int check) {
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
  for (uint32_t i = 0; i < n; i++) { /* the wire is little-endian */
    uint64_t b;
    memcpy(&b, &x[i], 8);
    b = __builtin_bswap64(b);
    memcpy(dst + 8 * (size_t)i, &b, 8);
  }
  return check && gnmr__sums_invalid(x, skip, n);
#endif
  if (!check) {
    memcpy(dst, x, 8 * (size_t)n);
    return 0;
  }
#ifdef GNMR_HAVE_X86
  if (gnmr__reduce_simd_level() == 2)
    return copy_check_avx512(dst, x, skip, n);
#endif
  /* one pass in blocks that stay in the cache between copy and check */
  int r = 0;
  for (uint32_t i = 0; i < n; i += 4096) {
    uint32_t m = n - i < 4096 ? n - i : 4096;
    memcpy(dst + 8 * (size_t)i, x + i, 8 * (size_t)m);
    r |= gnmr__sums_invalid(x + i, skip ? skip + i : NULL, m);
  }
  return r;
}
