/* SPDX-License-Identifier: MIT */
/* test_policy_simd.c — the SIMD path of the policy step (policy_simd.c)
 * gives the scalar engine's results bit for bit. Random engines (unit
 * counts that are not multiples of the lanes, every window size, powers
 * of two and not, warm-up, early thresholds, locks) are stepped with
 * random norms that hit every branch: steady units, idle (0 and -0),
 * NaN, +Inf, overflowing and subnormal norms, units not reported or
 * missing, units that join mid-run and new parameters mid-run. Each step's
 * decision, counts, events, g, d and s, and the whole exported state, must
 * equal the scalar engine's; each SIMD level the CPU lacks says so and is
 * skipped. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "policy_priv.h"
#include "policyutil.h"

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static double rng_unit(uint64_t *s) {
  return (double)(rng_next(s) >> 11) * 0x1p-53;
}

/* Norms for one step: mostly steady values around each unit's scale. */
static void fill(double *norm, uint8_t *in, uint32_t n, uint64_t *rng,
                 int with_input) {
  for (uint32_t u = 0; u < n; u++) {
    uint64_t r = rng_next(rng) % 1000;
    double scale = 1.0 + (double)(u % 13);
    norm[u] = scale * (0.5 + rng_unit(rng));
    in[u] = POLICY_REPORTED;
    if (r < 40)
      norm[u] *= 5 + 20 * rng_unit(rng); /* a spike */
    else if (r < 48)
      norm[u] = 0;
    else if (r < 52)
      norm[u] = -0.0;
    else if (r < 56)
      norm[u] = NAN;
    else if (r < 60)
      norm[u] = INFINITY;
    else if (r < 64)
      norm[u] = 1e308 * (1 + rng_unit(rng)); /* sums overflow */
    else if (r < 68)
      norm[u] = 4.9e-324 * (double)(1 + rng_next(rng) % 1000); /* subnormal */
    else if (r < 74 && with_input)
      in[u] = POLICY_NOT_REPORTED;
    else if (r < 80 && with_input)
      in[u] = POLICY_MISSING;
  }
}

static int same_bits(const double *a, const double *b, uint32_t n) {
  return memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

static unsigned char *export_all(const policy *e, size_t *len) {
  size_t need = policy_export_size(e);
  unsigned char *b = malloc(need);
  ck_assert_int_eq(policy_export(e, b, need, len), GNMR_OK);
  return b;
}

/* One random run at level against the scalar engine. */
static void one_run(int level, uint64_t seed) {
  uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
  uint32_t n = 1 + (uint32_t)(rng_next(&rng) % 300);
  uint32_t w = 1 + (uint32_t)(rng_next(&rng) % 12);
  policy_params p = params(1.2 + rng_unit(&rng), 1.1 + rng_unit(&rng), w,
                           1 + (uint32_t)(rng_next(&rng) % 10),
                           (uint32_t)(rng_next(&rng) % 4),
                           rng_next(&rng) % 6);
  if (rng_next(&rng) % 3 == 0) { /* powers of two: multiplied, not divided */
    p.alpha = rng_next(&rng) % 2 ? 2.0 : 4.0;
    p.beta = rng_next(&rng) % 2 ? 2.0 : 1.1 + rng_unit(&rng);
  }
  if (rng_next(&rng) % 2) {
    p.early_steps = 5 + rng_next(&rng) % 20;
    p.early_alpha = rng_next(&rng) % 2 ? 3.0 : 2.0;
    p.early_beta = rng_next(&rng) % 2 ? 2.5 : 4.0;
  }
  /* the optional rules: the mean horizon in the SIMD update, the
   * job-relative rule after it */
  if (rng_next(&rng) % 2)
    p.mean_horizon = 1 + rng_next(&rng) % 12;
  p.job_relative = (uint32_t)(rng_next(&rng) % 2);
  p.confirm_steps = (uint32_t)(rng_next(&rng) % 4);
  policy *ref = make(&p, n), *vec = make(&p, n);
  uint32_t cap = n + 64;
  double *norm = calloc(cap, sizeof *norm);
  uint8_t *in = calloc(cap, 1);
  int with_input = rng_next(&rng) % 2;
  for (uint64_t t = 1; t <= 120; t++) {
    if (t == 60) { /* units join: short windows among full ones */
      ck_assert_int_eq(policy_resize(ref, n + 40), GNMR_OK);
      ck_assert_int_eq(policy_resize(vec, n + 40), GNMR_OK);
      n += 40;
    }
    if (t == 90) { /* a new window: every ring reshaped */
      policy_params q = p;
      q.window = 1 + (uint32_t)(rng_next(&rng) % 12);
      ck_assert_int_eq(policy_set_params(ref, &q), GNMR_OK);
      ck_assert_int_eq(policy_set_params(vec, &q), GNMR_OK);
    }
    fill(norm, in, n, &rng, with_input);
    policy_result ra, rb;
    ck_assert_int_eq(policy_simd_set(POLICY_SIMD_OFF), GNMR_OK);
    ck_assert_int_eq(policy_step(ref, t, norm, with_input ? in : NULL, &ra),
                     GNMR_OK);
    ck_assert_int_eq(policy_simd_set(level), GNMR_OK);
    ck_assert_int_eq(policy_step(vec, t, norm, with_input ? in : NULL, &rb),
                     GNMR_OK);
    ck_assert_msg(ra.n_active == rb.n_active && ra.n_risky == rb.n_risky &&
                      ra.n_pool == rb.n_pool && ra.n_events == rb.n_events,
                  "%s seed %llu step %llu: counts differ",
                  policy_simd_name(level), (unsigned long long)seed,
                  (unsigned long long)t);
    ck_assert(memcmp(ra.active, rb.active, ra.n_active * sizeof *ra.active) ==
              0);
    ck_assert(memcmp(ra.events, rb.events, ra.n_events * sizeof *ra.events) ==
              0);
    ck_assert_msg(same_bits(ra.g, rb.g, n) && same_bits(ra.d, rb.d, n) &&
                      same_bits(ra.s, rb.s, n),
                  "%s seed %llu step %llu: g, d or s differ",
                  policy_simd_name(level), (unsigned long long)seed,
                  (unsigned long long)t);
    if (t % 20 == 0 || t == 120) {
      size_t la, lb;
      unsigned char *ea = export_all(ref, &la), *eb = export_all(vec, &lb);
      ck_assert_msg(la == lb && memcmp(ea, eb, la) == 0,
                    "%s seed %llu step %llu: states differ",
                    policy_simd_name(level), (unsigned long long)seed,
                    (unsigned long long)t);
      free(ea);
      free(eb);
    }
  }
  policy_simd_set(POLICY_SIMD_OFF);
  free(norm);
  free(in);
  policy_destroy(&ref);
  policy_destroy(&vec);
}

static void level_matches_scalar(int level) {
  if (policy_simd_set(level) != GNMR_OK) {
    printf("SKIPPED: policy SIMD %s: this CPU does not have it\n",
           policy_simd_name(level));
    return;
  }
  for (uint64_t seed = 1; seed <= 150; seed++)
    one_run(level, seed);
}

START_TEST(avx2_matches_scalar_bit_for_bit) {
  level_matches_scalar(POLICY_SIMD_AVX2);
}
END_TEST

START_TEST(avx512_matches_scalar_bit_for_bit) {
  level_matches_scalar(POLICY_SIMD_AVX512);
}
END_TEST

/* The steady path must actually run: a steady engine's steps under a SIMD
 * level are the scalar one's, and the level is what was asked. */
START_TEST(levels_can_be_chosen_and_off_is_always_there) {
  ck_assert_int_eq(policy_simd_set(POLICY_SIMD_OFF), GNMR_OK);
  ck_assert_int_eq(policy_simd_get(), POLICY_SIMD_OFF);
  ck_assert_int_eq(policy_simd_set(7), GNMR_E_UNSUPPORTED);
  ck_assert_int_eq(policy_simd_set(-1), GNMR_E_UNSUPPORTED);
  ck_assert_str_eq(policy_simd_name(POLICY_SIMD_AVX512), "avx512");
  ck_assert_str_eq(policy_simd_name(9), "unknown");
  for (int l = POLICY_SIMD_AVX2; l <= POLICY_SIMD_AVX512; l++)
    if (policy_simd_set(l) == GNMR_OK)
      ck_assert_int_eq(policy_simd_get(), l);
  policy_simd_set(POLICY_SIMD_OFF);
}
END_TEST

/* The divisors the steady path multiplies by the reciprocal of: exactly
 * the powers of two whose reciprocal is a normal number. */
START_TEST(exact_reciprocals_only_for_powers_of_two) {
  ck_assert(policy__exact_recip(2.0) == 0.5);
  ck_assert(policy__exact_recip(4.0) == 0.25);
  ck_assert(policy__exact_recip(1.0) == 1.0);
  ck_assert(policy__exact_recip(0.5) == 2.0);
  ck_assert(policy__exact_recip(0x1p1022) == 0x1p-1022); /* smallest normal */
  ck_assert(policy__exact_recip(0x1p-1022) == 0x1p1022);
  ck_assert(policy__exact_recip(0x1p1023) == 0);  /* 2^-1023: subnormal */
  ck_assert(policy__exact_recip(0x1p-1074) == 0); /* a subnormal */
  const double no[] = {3.0, 2.5, 1.8, -2.0, 0.0, -0.0, INFINITY, -INFINITY,
                       NAN, 0x1.0000000000001p1};
  for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
    ck_assert_msg(policy__exact_recip(no[i]) == 0, "%a", no[i]);
  /* and x * (1/2^k) is x / 2^k bit for bit, subnormal results included */
  const double xs[] = {1.0, 3.0, 0x1.fffffffffffffp1023, 0x1p-1022,
                       0x1.8p-1073, 0x1p-1074, 0x1.23456789abcdep-1030};
  const double ks[] = {2.0, 4.0, 0x1p10, 0x1p-3};
  for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++)
    for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++) {
      volatile double q = xs[i] / ks[k], m = xs[i] * policy__exact_recip(ks[k]);
      ck_assert_msg(memcmp((const void *)&q, (const void *)&m, sizeof q) == 0,
                    "%a / %a", xs[i], ks[k]);
    }
}
END_TEST

/* policy_step's input check at every level, with the offending value at
 * every position of a run that is not a multiple of the lanes: negative
 * finite norms are refused where reported, -0, -inf and NaN are not, and
 * an unknown input kind is refused anywhere. */
START_TEST(input_check_finds_a_bad_value_at_every_position) {
  enum { N = 37 };
  double x[N];
  uint8_t in[N];
  for (int l = POLICY_SIMD_OFF; l <= POLICY_SIMD_AVX512; l++) {
    if (policy_simd_set(l) != GNMR_OK)
      continue;
    for (int pos = 0; pos < N; pos++) {
      for (int i = 0; i < N; i++) {
        x[i] = 1.0 + i;
        in[i] = (uint8_t)(i % 3);
      }
      ck_assert_int_eq(policy__bad_norms(x, NULL, N), 0);
      ck_assert_int_eq(policy__bad_norms(x, in, N), 0);
      const double fine[] = {-0.0, -INFINITY, NAN, -NAN, 0.0, INFINITY};
      for (size_t f = 0; f < sizeof fine / sizeof fine[0]; f++) {
        x[pos] = fine[f];
        ck_assert_msg(policy__bad_norms(x, NULL, N) == 0, "%s: %a at %d",
                      policy_simd_name(l), fine[f], pos);
      }
      x[pos] = -1e-300;
      ck_assert_msg(policy__bad_norms(x, NULL, N) == 1, "%s: negative at %d",
                    policy_simd_name(l), pos);
      in[pos] = POLICY_NOT_REPORTED; /* not reported: its value is not read */
      ck_assert_int_eq(policy__bad_norms(x, in, N), 0);
      in[pos] = POLICY_REPORTED;
      ck_assert_int_eq(policy__bad_norms(x, in, N), 1);
      x[pos] = 2.0;
      in[pos] = 3; /* not an input kind */
      ck_assert_msg(policy__bad_norms(x, in, N) == 1, "%s: kind 3 at %d",
                    policy_simd_name(l), pos);
      in[pos] = 255;
      ck_assert_int_eq(policy__bad_norms(x, in, N), 1);
    }
  }
  policy_simd_set(POLICY_SIMD_OFF);
}
END_TEST

static int dbl_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* policy__lower_median (median.c: radix narrowing, then quickselect) is
 * the ceil(n/2)-th smallest that sorting finds, for sets small and large,
 * values crowded near 1 (as GNMR values are), ties, zeros, +inf,
 * subnormals, and orders that defeat pivots (sorted, reversed, equal). */
START_TEST(lower_median_is_the_sorted_one) {
  uint64_t rng = 46;
  static const size_t sizes[] = {1, 2, 3, 4, 5, 100, 2047, 2048, 2049,
                                 10000, 65537, 200001};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    for (int kind = 0; kind < 6; kind++) {
      size_t n = sizes[si];
      double *v = malloc(n * sizeof *v), *s = malloc(n * sizeof *s);
      for (size_t i = 0; i < n; i++) {
        double x = rng_unit(&rng);
        switch (kind) {
        case 0: x = 0.98 + 0.04 * x; break;               /* near 1 */
        case 1: x = (double)(rng_next(&rng) % 7) * 0.5; break; /* ties */
        case 2: x = (double)i; break;                     /* sorted */
        case 3: x = (double)(n - i); break;               /* reversed */
        case 4: x = 1.0; break;                           /* all equal */
        default:
          x = rng_next(&rng) % 50 == 0 ? INFINITY
              : rng_next(&rng) % 50 == 0 ? 0x1p-1060
              : rng_next(&rng) % 50 == 0 ? 0.0 : x * 1e6;
        }
        v[i] = s[i] = x;
      }
      qsort(s, n, sizeof *s, dbl_cmp);
      double got = policy__lower_median(v, n);
      ck_assert_msg(got == s[(n - 1) / 2], "n %zu kind %d: %g, want %g", n,
                    kind, got, s[(n - 1) / 2]);
      free(v);
      free(s);
    }
  }
}
END_TEST

/* The job-relative rule's passes (policy_simd.c) at every level the CPU
 * has: the counts of g and d not NaN and at or below 1, and the values
 * above 1 gathered in order, as a plain loop finds them; every length
 * around a block of 8, NaN in g or d, +inf, exactly 1, the next double
 * above 1. A median above 1 is then the one among them (policy__kth). */
START_TEST(median_passes_match_a_plain_loop_at_every_level) {
  uint64_t rng = 47;
  static const double pick[] = {NAN, 0.5, 1.0, 0x1.0000000000001p0, 1.5,
                                INFINITY, 0.0, 3.0};
  for (int l = POLICY_SIMD_OFF; l <= POLICY_SIMD_AVX512; l++) {
    if (policy_simd_set(l) != GNMR_OK)
      continue;
    for (uint32_t n = 0; n <= 41; n++) {
      double g[41], d[41], out[41], want[41];
      for (uint32_t i = 0; i < n; i++) {
        g[i] = pick[rng_next(&rng) % 8];
        d[i] = pick[rng_next(&rng) % 8];
      }
      size_t c[4] = {9, 9, 9, 9}, w[4] = {0, 0, 0, 0};
      size_t wm = 0;
      for (uint32_t i = 0; i < n; i++) {
        if (isnan(g[i]))
          continue;
        w[0]++;
        w[1] += g[i] <= 1;
        if (!isnan(d[i])) {
          w[2]++;
          w[3] += d[i] <= 1;
          if (d[i] > 1)
            want[wm++] = d[i];
        }
      }
      policy__median_counts(g, d, n, c);
      for (int k = 0; k < 4; k++)
        ck_assert_msg(c[k] == w[k], "level %d n %u count %d: %zu, want %zu",
                      l, n, k, c[k], w[k]);
      size_t m = policy__above_one(d, g, n, out);
      ck_assert_msg(m == wm, "level %d n %u: %zu kept, want %zu", l, n, m,
                    wm);
      for (size_t i = 0; i < m; i++)
        ck_assert_msg(out[i] == want[i], "level %d n %u: kept %zu is %g",
                      l, n, i, out[i]);
      m = policy__above_one(g, g, n, out);
      size_t above = 0;
      for (uint32_t i = 0; i < n; i++)
        above += g[i] > 1;
      ck_assert_uint_eq(m, above);
    }
  }
  policy_simd_set(POLICY_SIMD_OFF);
  double v[5] = {3, 1.5, 2, 1.5, 7};
  ck_assert(policy__kth(v, 5, 0) == 1.5);
  ck_assert(policy__kth(v, 5, 4) == 7);
  ck_assert(isnan(policy__kth(v, 5, 5)));
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("policy_simd");
  TCase *tc = tcase_create("simd");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, levels_can_be_chosen_and_off_is_always_there);
  tcase_add_test(tc, lower_median_is_the_sorted_one);
  tcase_add_test(tc, median_passes_match_a_plain_loop_at_every_level);
  tcase_add_test(tc, exact_reciprocals_only_for_powers_of_two);
  tcase_add_test(tc, input_check_finds_a_bad_value_at_every_position);
  tcase_add_test(tc, avx2_matches_scalar_bit_for_bit);
  tcase_add_test(tc, avx512_matches_scalar_bit_for_bit);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
