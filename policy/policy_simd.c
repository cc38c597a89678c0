/* SPDX-License-Identifier: MIT */
/* policy_simd.c — the steady units of a step, several at a time, with the
 * spec's results bit for bit. A unit is steady when it reported a finite
 * norm > 0, has history (cnt > 0) and a full window: then steps 1-3 of
 * the spec are the same straight-line arithmetic for every unit, and each
 * SIMD lane does exactly the scalar engine's operations in its order
 * (IEEE division and addition are correctly rounded per lane, no fused
 * multiply-add, the window summed oldest to newest; x / 2^k is x * 2^-k).
 * With AVX-512 a block's other units go the scalar way, one by one, and
 * its steady ones stay in SIMD (masked); with AVX2 a block with any other
 * unit goes the scalar way whole (policy.c). Chosen at
 * run time: AVX-512 (8 units), AVX2 (4), or none; GNMR_POLICY_SIMD=off|
 * avx2|avx512 or policy_simd_set() narrows it (tests compare the three).
 * tests/test_policy_simd.c runs random engines through every path. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "policy_priv.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SIMD_X86 1
#else
#define SIMD_X86 0
#endif

/* What the next steps use (POLICY_SIMD_*): -1 = not chosen yet. */
static int level = -1;

static int supported(int l) {
#if SIMD_X86
  __builtin_cpu_init();
  if (l == POLICY_SIMD_AVX512)
    return __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
  if (l == POLICY_SIMD_AVX2)
    return __builtin_cpu_supports("avx2");
#endif
  return l == POLICY_SIMD_OFF;
}

static int best(void) {
  const char *env = getenv("GNMR_POLICY_SIMD");
  int cap = POLICY_SIMD_AVX512;
  if (env != NULL && strcmp(env, "off") == 0)
    cap = POLICY_SIMD_OFF;
  else if (env != NULL && strcmp(env, "avx2") == 0)
    cap = POLICY_SIMD_AVX2;
  for (int l = cap; l > POLICY_SIMD_OFF; l--)
    if (supported(l))
      return l;
  return POLICY_SIMD_OFF;
}

int policy_simd_set(int l) {
  if (l < POLICY_SIMD_OFF || l > POLICY_SIMD_AVX512 || !supported(l))
    return GNMR_E_UNSUPPORTED;
  level = l;
  return GNMR_OK;
}

int policy_simd_get(void) {
  if (level < 0)
    level = best();
  return level;
}

const char *policy_simd_name(int l) {
  static const char *const names[] = {"off", "avx2", "avx512"};
  return l >= POLICY_SIMD_OFF && l <= POLICY_SIMD_AVX512 ? names[l] : "unknown";
}

#if SIMD_X86
/* 8 units from u: the steady ones among want get their scores into p->s
 * and their statistics updated, and come back as a mask (*quiet: all 8
 * done, none scored above 1 or is locked); the others are not touched.
 * kc: the step's thresholds and exact reciprocals (policy_priv.h). */
__attribute__((target("avx512f,avx512dq,avx512vl"))) static int
score8(policy *p, uint32_t u, const double *norm, const policy__consts *kc,
       __mmask8 want, int *quiet) {
  uint32_t w = p->prm.window;
  __m512d n = _mm512_loadu_pd(norm + u);
  __m512i cnt = _mm512_loadu_si512((const void *)(p->cnt + u));
  __m256i len = _mm256_loadu_si256((const __m256i *)(p->win_len + u));
  __mmask8 ok =
      want & _mm512_cmp_pd_mask(n, _mm512_setzero_pd(), _CMP_GT_OQ) &
      _mm512_cmp_pd_mask(n, _mm512_set1_pd(INFINITY), _CMP_LT_OQ) &
      _mm512_cmpneq_epu64_mask(cnt, _mm512_setzero_si512()) &
      (__mmask8)_mm256_cmpeq_epi32_mask(len, _mm256_set1_epi32((int)w));
  *quiet = 0;
  if (ok == 0)
    return 0;
  /* the lanes not ok (idle, non-finite, short window, not reported) are
   * computed on whatever they hold and never stored: the caller scores
   * them the scalar way */
  __m512d sum = _mm512_loadu_pd(p->sum + u);
  __m512d m = _mm512_div_pd(sum, _mm512_cvtepu64_pd(cnt));
  __m512d g = _mm512_div_pd(n, m);
  /* the window, oldest to newest (stored by age: win_at); as it is full,
   * it shifts down one age and g becomes the newest */
  const double *c = p->win + u;
  size_t st = p->n;
  __m512d acc = _mm512_setzero_pd(), v = _mm512_loadu_pd(c);
  acc = _mm512_add_pd(acc, v);
  for (uint32_t k = 1; k < w; k++) {
    v = _mm512_loadu_pd(c + k * st);
    acc = _mm512_add_pd(acc, v);
    _mm512_mask_storeu_pd(p->win + (k - 1) * st + u, ok, v);
  }
  _mm512_mask_storeu_pd(p->win + (size_t)(w - 1) * st + u, ok, g);
  __m512d mean = kc->inv != 0
                     ? _mm512_mul_pd(acc, _mm512_set1_pd(kc->inv))
                     : _mm512_div_pd(acc, _mm512_set1_pd((double)w));
  __m512d d = _mm512_div_pd(g, mean);
  /* fmax(g / a, d / b): max_pd gives its second operand when either is
   * NaN; g / a never is (n finite > 0, m > 0), d / b may be */
  __m512d db = kc->ib != 0 ? _mm512_mul_pd(d, _mm512_set1_pd(kc->ib))
                           : _mm512_div_pd(d, _mm512_set1_pd(kc->b));
  __m512d ga = kc->ia != 0 ? _mm512_mul_pd(g, _mm512_set1_pd(kc->ia))
                           : _mm512_div_pd(g, _mm512_set1_pd(kc->a));
  __m512d s = _mm512_max_pd(db, ga);
  /* g, d and s whole: the caller writes the other lanes' own (the scalar
   * way) before anything reads them, and it reads s back at once, which a
   * full-width store forwards and a masked one would not */
  _mm512_storeu_pd(p->g + u, g);
  _mm512_storeu_pd(p->d + u, d);
  _mm512_storeu_pd(p->s + u, s);
  __m256i lock = _mm256_loadu_si256((const __m256i *)(p->lock + u));
  *quiet = ok == 0xff &&
           _mm512_cmp_pd_mask(s, _mm512_set1_pd(1), _CMP_GT_OQ) == 0 &&
           _mm256_test_epi32_mask(lock, lock) == 0;
  /* the update: sum + n and cnt + 1, or, with a mean horizon reached,
   * (sum - sum / cnt) + n (m is sum / cnt) and cnt as it is */
  __mmask8 cap = 0;
  if (p->prm.mean_horizon != 0)
    cap = _mm512_cmpge_epu64_mask(
        cnt, _mm512_set1_epi64((long long)p->prm.mean_horizon));
  __m512d ns = _mm512_mask_blend_pd(cap, _mm512_add_pd(sum, n),
                                    _mm512_add_pd(_mm512_sub_pd(sum, m), n));
  _mm512_mask_storeu_pd(p->sum + u, ok, ns);
  _mm512_mask_storeu_epi64(p->cnt + u, ok & (__mmask8)~cap,
                           _mm512_add_epi64(cnt, _mm512_set1_epi64(1)));
  return ok;
}

/* The same for 4 units with AVX2 (no u64 -> double conversion: counts
 * below 2^52 go through the exponent trick, exact; larger ones are not
 * steady here). */
__attribute__((target("avx2"))) static int score4(policy *p, uint32_t u,
                                                  const double *norm,
                                                  const policy__consts *kc,
                                                  int *quiet) {
  uint32_t w = p->prm.window;
  __m256d n = _mm256_loadu_pd(norm + u);
  __m256i cnt = _mm256_loadu_si256((const __m256i *)(p->cnt + u));
  __m256d pos = _mm256_and_pd(
      _mm256_cmp_pd(n, _mm256_setzero_pd(), _CMP_GT_OQ),
      _mm256_cmp_pd(n, _mm256_set1_pd(INFINITY), _CMP_LT_OQ));
  if (_mm256_movemask_pd(pos) != 0xf)
    return 0;
  for (int k = 0; k < 4; k++)
    if (p->cnt[u + k] == 0 || p->cnt[u + k] >= (1ull << 52) ||
        p->win_len[u + k] != w)
      return 0;
  const __m256i magic = _mm256_set1_epi64x(0x4330000000000000ll);
  __m256d cntd = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(cnt, magic)),
                               _mm256_set1_pd(4503599627370496.0));
  __m256d sum = _mm256_loadu_pd(p->sum + u);
  __m256d m = _mm256_div_pd(sum, cntd);
  __m256d g = _mm256_div_pd(n, m);
  /* the window by age, shifted down one (all four are full) */
  const double *c = p->win + u;
  size_t st = p->n;
  __m256d acc = _mm256_setzero_pd(), v = _mm256_loadu_pd(c);
  acc = _mm256_add_pd(acc, v);
  for (uint32_t k = 1; k < w; k++) {
    v = _mm256_loadu_pd(c + k * st);
    acc = _mm256_add_pd(acc, v);
    _mm256_storeu_pd(p->win + (k - 1) * st + u, v);
  }
  _mm256_storeu_pd(p->win + (size_t)(w - 1) * st + u, g);
  __m256d mean = kc->inv != 0
                     ? _mm256_mul_pd(acc, _mm256_set1_pd(kc->inv))
                     : _mm256_div_pd(acc, _mm256_set1_pd((double)w));
  __m256d d = _mm256_div_pd(g, mean);
  __m256d db = kc->ib != 0 ? _mm256_mul_pd(d, _mm256_set1_pd(kc->ib))
                           : _mm256_div_pd(d, _mm256_set1_pd(kc->b));
  __m256d ga = kc->ia != 0 ? _mm256_mul_pd(g, _mm256_set1_pd(kc->ia))
                           : _mm256_div_pd(g, _mm256_set1_pd(kc->a));
  __m256d s = _mm256_max_pd(db, ga);
  _mm256_storeu_pd(p->g + u, g);
  _mm256_storeu_pd(p->d + u, d);
  _mm256_storeu_pd(p->s + u, s);
  __m128i lock = _mm_loadu_si128((const __m128i *)(p->lock + u));
  *quiet = _mm256_movemask_pd(_mm256_cmp_pd(s, _mm256_set1_pd(1),
                                            _CMP_GT_OQ)) == 0 &&
           _mm_testz_si128(lock, lock);
  /* the update, as score8's: a lane at its mean horizon forgets 1/cnt */
  uint64_t h = p->prm.mean_horizon;
  long long capped[4], inc[4];
  for (int k = 0; k < 4; k++) {
    int at = h != 0 && p->cnt[u + k] >= h;
    capped[k] = at ? -1 : 0;
    inc[k] = at ? 0 : 1;
  }
  __m256d cap = _mm256_castsi256_pd(
      _mm256_loadu_si256((const __m256i *)capped));
  __m256d ns = _mm256_blendv_pd(_mm256_add_pd(sum, n),
                                _mm256_add_pd(_mm256_sub_pd(sum, m), n), cap);
  _mm256_storeu_pd(p->sum + u, ns);
  _mm256_storeu_si256((__m256i *)(p->cnt + u),
                      _mm256_add_epi64(cnt, _mm256_loadu_si256(
                                                (const __m256i *)inc)));
  return 1;
}

/* Whether any of x[0..n) is below 0 and above -inf: policy_step's check
 * of the norms. */
__attribute__((target("avx512f"))) static int neg512(const double *x,
                                                    uint32_t n) {
  __mmask8 bad = 0;
  uint32_t i = 0;
  const __m512d zero = _mm512_setzero_pd(), ninf = _mm512_set1_pd(-INFINITY);
  for (; i + 8 <= n; i += 8) {
    __m512d v = _mm512_loadu_pd(x + i);
    bad |= _mm512_cmp_pd_mask(v, zero, _CMP_LT_OQ) &
           _mm512_cmp_pd_mask(v, ninf, _CMP_GT_OQ);
  }
  int r = bad != 0;
  for (; i < n; i++)
    r |= (x[i] < 0) & (x[i] > -INFINITY);
  return r;
}

/* The same where in[i] is POLICY_REPORTED, or any in[i] above
 * POLICY_MISSING (not an input at all). */
__attribute__((target("avx512f"))) static int bad512(const double *x,
                                                    const uint8_t *in,
                                                    uint32_t n) {
  __mmask8 bad = 0;
  uint32_t i = 0;
  const __m512d zero = _mm512_setzero_pd(), ninf = _mm512_set1_pd(-INFINITY);
  const __m512i rep = _mm512_set1_epi64(POLICY_REPORTED),
                top = _mm512_set1_epi64(POLICY_MISSING);
  for (; i + 8 <= n; i += 8) {
    __m512i k = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(in + i)));
    __m512d v = _mm512_loadu_pd(x + i);
    bad |= _mm512_cmpgt_epu64_mask(k, top) |
           (_mm512_cmpeq_epu64_mask(k, rep) &
            _mm512_cmp_pd_mask(v, zero, _CMP_LT_OQ) &
            _mm512_cmp_pd_mask(v, ninf, _CMP_GT_OQ));
  }
  int r = bad != 0;
  for (; i < n; i++)
    r |= (in[i] > POLICY_MISSING) |
         ((in[i] == POLICY_REPORTED) & (x[i] < 0) & (x[i] > -INFINITY));
  return r;
}

__attribute__((target("avx2"))) static int neg256(const double *x,
                                                 uint32_t n) {
  __m256d bad = _mm256_setzero_pd();
  uint32_t i = 0;
  const __m256d zero = _mm256_setzero_pd(), ninf = _mm256_set1_pd(-INFINITY);
  for (; i + 4 <= n; i += 4) {
    __m256d v = _mm256_loadu_pd(x + i);
    bad = _mm256_or_pd(bad, _mm256_and_pd(_mm256_cmp_pd(v, zero, _CMP_LT_OQ),
                                          _mm256_cmp_pd(v, ninf,
                                                        _CMP_GT_OQ)));
  }
  int r = _mm256_movemask_pd(bad) != 0;
  for (; i < n; i++)
    r |= (x[i] < 0) & (x[i] > -INFINITY);
  return r;
}
#endif

/* The scalar passes, from unit i on (the SIMD ones end with them). */
static void counts_from(const double *g, const double *d, uint32_t i,
                        uint32_t n, size_t c[4]) {
  for (; i < n; i++) {
    int has_g = !isnan(g[i]), has_d = has_g && !isnan(d[i]);
    c[0] += has_g;
    c[1] += has_g && g[i] <= 1;
    c[2] += has_d;
    c[3] += has_d && d[i] <= 1;
  }
}

static size_t above_from(const double *v, const double *g, uint32_t i,
                         uint32_t n, double *out, size_t m) {
  for (; i < n; i++) {
    out[m] = v[i];
    m += !isnan(g[i]) && v[i] > 1;
  }
  return m;
}

#if SIMD_X86
/* policy__median_counts and policy__above_one, 8 units at a time: the
 * same comparisons as the scalar loops (ordered: a NaN is never <= 1 nor
 * > 1), counted by popcount; the values kept compressed in a register,
 * then stored whole (a compressing store to memory is slow on some CPUs),
 * the lanes past the kept ones overwritten by the next store. */
__attribute__((target("avx512f"))) static void
counts512(const double *g, const double *d, uint32_t n, size_t c[4]) {
  size_t ng = 0, lg = 0, nd = 0, ld = 0;
  uint32_t i = 0;
  const __m512d one = _mm512_set1_pd(1);
  for (; i + 8 <= n; i += 8) {
    __m512d gv = _mm512_loadu_pd(g + i), dv = _mm512_loadu_pd(d + i);
    __mmask8 hg = _mm512_cmp_pd_mask(gv, gv, _CMP_ORD_Q);
    __mmask8 hd = hg & _mm512_cmp_pd_mask(dv, dv, _CMP_ORD_Q);
    ng += (size_t)__builtin_popcount(hg);
    nd += (size_t)__builtin_popcount(hd);
    lg += (size_t)__builtin_popcount(_mm512_cmp_pd_mask(gv, one, _CMP_LE_OQ));
    ld += (size_t)__builtin_popcount(
        hd & _mm512_cmp_pd_mask(dv, one, _CMP_LE_OQ));
  }
  c[0] = ng, c[1] = lg, c[2] = nd, c[3] = ld;
  counts_from(g, d, i, n, c);
}

__attribute__((target("avx512f"))) static size_t
above512(const double *v, const double *g, uint32_t n, double *out) {
  size_t m = 0;
  uint32_t i = 0;
  const __m512d one = _mm512_set1_pd(1);
  for (; i + 8 <= n; i += 8) {
    __m512d x = _mm512_loadu_pd(v + i), gv = _mm512_loadu_pd(g + i);
    __mmask8 k = _mm512_cmp_pd_mask(x, one, _CMP_GT_OQ) &
                 _mm512_cmp_pd_mask(gv, gv, _CMP_ORD_Q);
    /* out has n places and m + 8 <= i + 8 <= n: a whole store fits */
    _mm512_storeu_pd(out + m, _mm512_maskz_compress_pd(k, x));
    m += (size_t)__builtin_popcount(k);
  }
  return above_from(v, g, i, n, out, m);
}
#endif

void policy__median_counts(const double *g, const double *d, uint32_t n,
                           size_t c[4]) {
#if SIMD_X86
  if (policy_simd_get() == POLICY_SIMD_AVX512) {
    counts512(g, d, n, c);
    return;
  }
#endif
  c[0] = c[1] = c[2] = c[3] = 0;
  counts_from(g, d, 0, n, c);
}

size_t policy__above_one(const double *v, const double *g, uint32_t n,
                         double *out) {
#if SIMD_X86
  if (policy_simd_get() == POLICY_SIMD_AVX512)
    return above512(v, g, n, out);
#endif
  return above_from(v, g, 0, n, out, 0);
}

int policy__bad_norms(const double *x, const uint8_t *in, uint32_t n) {
  int r = 0;
#if SIMD_X86
  int l = policy_simd_get();
  if (l == POLICY_SIMD_AVX512)
    return in ? bad512(x, in, n) : neg512(x, n);
  if (l == POLICY_SIMD_AVX2 && in == NULL)
    return neg256(x, n);
#endif
  if (in != NULL)
    for (uint32_t i = 0; i < n; i++)
      r |= (in[i] > POLICY_MISSING) |
           ((in[i] == POLICY_REPORTED) & (x[i] < 0) & (x[i] > -INFINITY));
  else
    for (uint32_t i = 0; i < n; i++)
      r |= (x[i] < 0) & (x[i] > -INFINITY);
  return r;
}

/* Scores the steady units of the block at u with kc: returns the block's
 * length (0: no SIMD in use, or the block runs past the last unit) and in
 * *done the lanes it scored (bit i: unit u + i; its statistics updated,
 * its score in p->s). The other lanes are untouched: the caller scores
 * them the scalar way, in unit order as always. *quiet: every lane done,
 * none scored above 1 and none locked, so nothing else to do for the
 * block. */
static inline uint32_t score_block(policy *p, uint32_t u, const double *norm,
                                   const uint8_t *input,
                                   const policy__consts *kc, uint32_t *done,
                                   int *quiet) {
  *quiet = 0;
  *done = 0;
#if SIMD_X86
  int l = policy_simd_get();
  uint32_t lanes = l == POLICY_SIMD_AVX512 ? 8 : l == POLICY_SIMD_AVX2 ? 4 : 0;
  if (lanes == 0 || u + lanes > p->n)
    return 0;
  uint32_t want = (1u << lanes) - 1;
  if (input != NULL)
    for (uint32_t k = 0; k < lanes; k++)
      if (input[u + k] != POLICY_REPORTED)
        want &= ~(1u << k);
  if (l == POLICY_SIMD_AVX512) {
    *done = want ? score8(p, u, norm, kc, (__mmask8)want, quiet) : 0;
    return 8;
  }
  if (want != 0xf)
    return 4; /* AVX2: all four lanes or none */
  *done = score4(p, u, norm, kc, quiet) ? 0xf : 0;
  return 4;
#else
  (void)p, (void)u, (void)norm, (void)input, (void)kc;
  return 0;
#endif
}

uint32_t policy__score_blocks(policy *p, uint32_t u, const double *norm,
                              const uint8_t *input, const policy__consts *kc,
                              uint32_t *len, uint32_t *done) {
  int quiet;
  while (u < p->n) {
    *len = score_block(p, u, norm, input, kc, done, &quiet);
    if (*len == 0 || !quiet)
      return u;
    u += *len;
  }
  *len = 0;
  *done = 0;
  return p->n;
}
