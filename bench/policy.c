/* SPDX-License-Identifier: MIT */
/* bench/policy.c — cost of one policy step, in ns per unit-step, for 10k
 * and 1M units, against a limit measured in the same run: one streaming
 * pass that reads and writes the same per-unit state bytes (statistics,
 * window, scores), the floor of any engine that touches every unit.
 * Target (issue 2): a 10k-unit step well under 1 ms. Also a snapshot:
 * policy_export against memcpy of its bytes, and the same taken off the
 * engine's thread (policy_snap_*) as gnmrd's loop sees it. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gnmr/error.h"
#include "policy.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Deterministic norms: each unit has its own scale; about 0.5% of
 * unit-steps spike 5-20x, 0.01% are non-finite, 1% are idle. */
static void fill(double *norm, const double *scale, uint32_t n, uint64_t t,
                 unsigned *seed) {
  for (uint32_t u = 0; u < n; u++) {
    unsigned r = (unsigned)rand_r(seed);
    double x = scale[u] * (0.9 + 0.2 * (r % 1000) / 1000.0);
    unsigned k = r % 10000;
    if (k < 50)
      x *= 5 + (double)(k % 16);
    else if (k < 51)
      x = NAN;
    else if (k < 151)
      x = 0;
    norm[u] = x;
  }
  (void)t;
}

typedef struct taker {
  policy_snap *s;
  double done_at;
} taker;

static void *take_main(void *arg) {
  taker *t = arg;
  void *b;
  size_t len;
  (void)policy_snap_take(t->s, &b, &len); /* the handle keeps b */
  t->done_at = now_s();
  return NULL;
}

/* gnmrd's snapshot as its loop sees it (policy_snap_*: the store's
 * writer serializes): what begin costs the loop, and what the next step
 * pays on top of a plain step when it comes after the writer is done
 * (the usual case) and when it comes at once (the writer still busy). */
static void snap_handover(policy *p, double *norm, const double *scale,
                          uint32_t n, uint64_t t, double export_s) {
  policy_result r;
  unsigned seed = 99;
  double begin_s = 0, plain_s = 0, after_s = 0, early_s = 0;
  int reps = n >= 1000000 ? 5 : 100;
  /* round -1 is not counted: the first snapshot maps its buffer (gnmrd's
   * later ones reuse it) and the first step after the export above runs
   * cold */
  for (int i = -1; i < reps; i++) {
    if (i == 0)
      begin_s = plain_s = after_s = early_s = 0;
    fill(norm, scale, n, ++t, &seed);
    double t0 = now_s();
    policy_step(p, t, norm, NULL, &r);
    plain_s += now_s() - t0;
    /* the writer done before the next step */
    taker tk = {NULL, 0};
    t0 = now_s();
    tk.s = policy_snap_begin(p);
    begin_s += now_s() - t0;
    pthread_t th;
    pthread_create(&th, NULL, take_main, &tk);
    pthread_join(th, NULL);
    fill(norm, scale, n, ++t, &seed);
    t0 = now_s();
    policy_step(p, t, norm, NULL, &r);
    after_s += now_s() - t0;
    policy_snap_free(&tk.s);
    /* the next step at once */
    tk.s = policy_snap_begin(p);
    fill(norm, scale, n, ++t, &seed);
    pthread_create(&th, NULL, take_main, &tk);
    t0 = now_s();
    policy_step(p, t, norm, NULL, &r);
    early_s += now_s() - t0;
    pthread_join(th, NULL);
    policy_snap_free(&tk.s);
  }
  begin_s /= reps, plain_s /= reps, after_s /= reps, early_s /= reps;
  printf("policy %8u units: snapshot off the loop: begin %.3f ms (target "
         "< 2 ms); next step %.2fx a plain step when the writer is done, "
         "%.2fx when it comes at once (+%.1f ms = %.2fx the export)\n",
         n, begin_s * 1e3, after_s / plain_s, early_s / plain_s,
         (early_s - plain_s) * 1e3, (early_s - plain_s) / export_s);
}

/* A second limit: the spec's arithmetic needs five correctly rounded
 * divisions per steady unit-step (sum/cnt, norm/mean, g/window mean, g/a,
 * d/b; a power-of-two window's mean is a multiply), which no exact engine
 * can replace by reciprocals. Their time alone, as wide as the engine's
 * SIMD path, over data in cache. */
typedef double v8d __attribute__((vector_size(64)));
typedef double v4d __attribute__((vector_size(32)));

#define DIV_BODY(V, W)                                                    \
  for (uint32_t i = 0; i + W <= n; i += W) {                              \
    V su, c, x, w;                                                        \
    memcpy(&su, sum + i, sizeof su);                                      \
    memcpy(&c, cnt + i, sizeof c);                                        \
    memcpy(&x, nrm + i, sizeof x);                                        \
    memcpy(&w, acc + i, sizeof w);                                        \
    V m = su / c, g = x / m, d = g / (w * 0.125);                         \
    V o = g / a + d / b;                                                  \
    memcpy(out + i, &o, sizeof o);                                        \
  }

__attribute__((target("avx512f"))) static void
divs_512(const double *sum, const double *cnt, const double *nrm,
         const double *acc, double *out, uint32_t n, double a, double b) {
  DIV_BODY(v8d, 8)
}

__attribute__((target("avx2"))) static void
divs_256(const double *sum, const double *cnt, const double *nrm,
         const double *acc, double *out, uint32_t n, double a, double b) {
  DIV_BODY(v4d, 4)
}

static void divs_1(const double *sum, const double *cnt, const double *nrm,
                   const double *acc, double *out, uint32_t n, double a,
                   double b) {
  for (uint32_t i = 0; i < n; i++) {
    double m = sum[i] / cnt[i], g = nrm[i] / m, d = g / (acc[i] * 0.125);
    out[i] = g / a + d / b;
  }
}

static double div_floor(uint32_t n, int reps) {
  double *v = malloc(5 * (size_t)n * sizeof *v);
  for (size_t i = 0; i < 5 * (size_t)n; i++)
    v[i] = 1.0 + (double)(i % 97) * 0.01;
  int l = policy_simd_get();
  double t0 = now_s();
  for (int r = 0; r < reps; r++) {
    if (l == POLICY_SIMD_AVX512)
      divs_512(v, v + n, v + 2 * n, v + 3 * n, v + 4 * n, n, 2.0, 2.0);
    else if (l == POLICY_SIMD_AVX2)
      divs_256(v, v + n, v + 2 * n, v + 3 * n, v + 4 * n, n, 2.0, 2.0);
    else
      divs_1(v, v + n, v + 2 * n, v + 3 * n, v + 4 * n, n, 2.0, 2.0);
    v[r % n] += v[4 * (size_t)n + (size_t)r % n] * 1e-300; /* keep it */
  }
  double dt = (now_s() - t0) / reps;
  free(v);
  return dt;
}

/* The floor: read cnt+sum+window and write the scores for every unit. */
static double stream_floor(uint32_t n, uint32_t window, int reps) {
  size_t per = 8 + 8 + 8 * (size_t)window + 3 * 8;
  double *a = malloc(per * n), acc = 0;
  memset(a, 1, per * n);
  size_t words = per * n / 8;
  double t0 = now_s();
  for (int r = 0; r < reps; r++) {
    /* four independent lanes: bound by memory, not by add latency */
    double l0 = 0, l1 = 0, l2 = 0, l3 = 0;
    size_t i = 0;
    for (; i + 4 <= words; i += 4) {
      l0 += a[i];
      l1 += a[i + 1];
      l2 += a[i + 2];
      l3 += a[i + 3];
    }
    acc += l0 + l1 + l2 + l3;
    a[r % words] = acc; /* keep the loop */
  }
  double dt = (now_s() - t0) / reps;
  free(a);
  if (acc == 42)
    puts("");
  return dt;
}

/* One engine of n units under the defaults, or with the optional rules
 * off (rules 0: the first defaults' rule); returns the ms per step. */
static double run_rules(uint32_t n, int steps, int rules, int report);

static void run(uint32_t n, int steps) { (void)run_rules(n, steps, 1, 1); }

/* The optional rules' cost (docs/policy.md: the mean horizon, the
 * job-relative rule and confirm_steps, on by default): the same engine and norms with them
 * off, as a ratio measured in this run. */
static void rules_cost(uint32_t n, int steps) {
  double off = run_rules(n, steps, 0, 0), on = run_rules(n, steps, 1, 0);
  /* the floor streams what the first rule reads and writes: the rule
   * without the optional ones is held to it (issue 14's 2x, at 10k units:
   * at 1M the cache misses of the pool and the events are beyond it); the
   * job-relative rule's medians (a selection over the step's values) are
   * work the floor does not model, their cost the ratio on / off */
  policy_params d;
  policy_params_default(&d);
  double floor = stream_floor(n, d.window, steps) * 1e3;
  printf("policy %8u units: optional rules on %.3f ms/step, off %.3f "
         "ms/step = %.2fx the state-streaming floor%s: on / off %.2fx\n",
         n, on, off, off / floor, n == 10000 ? " (target <= 2x)" : "",
         on / off);
}

static double run_rules(uint32_t n, int steps, int rules, int report) {
  policy_params prm;
  policy_params_default(&prm);
  if (!rules) {
    prm.mean_horizon = 0;
    prm.job_relative = 0;
    prm.confirm_steps = 0;
  }
  policy *p = NULL;
  if (policy_create(&prm, n, &p) != 0) {
    fprintf(stderr, "policy_create failed\n");
    exit(1);
  }
  double *norm = malloc(n * sizeof *norm), *scale = malloc(n * sizeof *scale);
  unsigned seed = 1;
  for (uint32_t u = 0; u < n; u++)
    scale[u] = pow(10, (rand_r(&seed) % 4000) / 1000.0 - 2);
  /* warm the statistics past warm-up and fill the windows */
  policy_result r;
  uint64_t t = 1;
  for (; t <= 30; t++) {
    fill(norm, scale, n, t, &seed);
    policy_step(p, t, norm, NULL, &r);
  }
  double spent = 0;
  uint64_t pool = 0;
  for (int i = 0; i < steps; i++, t++) {
    fill(norm, scale, n, t, &seed); /* not timed */
    double t0 = now_s();
    policy_step(p, t, norm, NULL, &r);
    spent += now_s() - t0;
    pool += r.n_pool;
  }
  double per_step = spent / steps;
  if (!report) {
    policy_destroy(&p);
    free(norm);
    free(scale);
    return per_step * 1e3;
  }
  double floor = stream_floor(n, prm.window, steps);
  printf("policy %8u units: %8.3f ms/step, %6.2f ns/unit-step "
         "(mean pool %.0f); state-streaming floor %.3f ms: %.2fx floor\n",
         n, per_step * 1e3, per_step * 1e9 / n, (double)pool / steps,
         floor * 1e3, per_step / floor);
  if (n == 10000)
    printf("policy 10k-unit step: %.3f ms = %.1f%% of the 1 ms target\n",
           per_step * 1e3, per_step * 1e3 * 100);
  double divs = div_floor(n, n >= 1000000 ? 20 : 2000);
  printf("policy %8u units: the spec's 5 divisions per unit alone (%s): "
         "%.3f ms: the step is %.2fx that\n",
         n, policy_simd_name(policy_simd_get()), divs * 1e3,
         per_step / divs);
  /* a snapshot (gnmrd takes one every snapshot_every steps, on its loop)
   * against a copy of the same bytes */
  size_t len = policy_export_size(p), got;
  void *buf = malloc(len), *copy = malloc(len);
  int reps = n >= 1000000 ? 5 : 200;
  /* untimed, once: both buffers' pages mapped before either is timed (a
   * first touch costs a page fault per page, 12 us each on some VMs,
   * which gnmrd pays once: its snapshot buffers are reused) */
  policy_export(p, buf, len, &got);
  memcpy(copy, buf, len);
  double e0 = now_s();
  for (int i = 0; i < reps; i++)
    policy_export(p, buf, len, &got);
  double exp_s = (now_s() - e0) / reps;
  e0 = now_s();
  for (int i = 0; i < reps; i++) {
    memcpy(copy, buf, len);
    ((volatile char *)copy)[i % len] ^= 0; /* keep the copy */
  }
  double cp_s = (now_s() - e0) / reps;
  printf("policy %8u units: export %.3f ms (%.1f ns/unit, %.1f MB); memcpy "
         "of the same bytes %.3f ms: %.2fx memcpy\n",
         n, exp_s * 1e3, exp_s * 1e9 / n, len / 1e6, cp_s * 1e3,
         exp_s / cp_s);
  free(buf);
  free(copy);
  snap_handover(p, norm, scale, n, (uint64_t)steps, exp_s);
  free(norm);
  free(scale);
  policy_destroy(&p);
  return per_step * 1e3;
}

/* The measured signal's cost (docs/policy.md, "Measured signal"): every
 * unit measured at every step (the recipe's error beside its norm) against
 * the same engine and norms without measures, as a ratio measured in this
 * run. A measured job keeps a second set of statistics and windows and
 * leaves the SIMD path (the scalar step scores both signals). */
static double run_measured(uint32_t n, int steps, int measured) {
  policy_params prm;
  policy_params_default(&prm);
  policy *p = NULL;
  if (policy_create(&prm, n, &p) != 0) {
    fprintf(stderr, "policy_create failed\n");
    exit(1);
  }
  double *norm = malloc(n * sizeof *norm), *scale = malloc(n * sizeof *scale);
  double *meas = malloc(n * sizeof *meas);
  unsigned seed = 1;
  for (uint32_t u = 0; u < n; u++)
    scale[u] = pow(10, (rand_r(&seed) % 4000) / 1000.0 - 2);
  policy_result r;
  double spent = 0;
  uint64_t t = 1;
  for (int i = 0; i < 30 + steps; i++, t++) {
    fill(norm, scale, n, t, &seed); /* not timed */
    for (uint32_t u = 0; u < n; u++) /* a relative error near 5% */
      meas[u] = isfinite(norm[u]) ? 0.05 * (0.5 + norm[u] / (scale[u] + norm[u]))
                                  : INFINITY;
    double t0 = now_s();
    if (measured)
      policy_step_measured(p, t, norm, NULL, meas, &r);
    else
      policy_step(p, t, norm, NULL, &r);
    if (i >= 30)
      spent += now_s() - t0;
  }
  policy_destroy(&p);
  free(norm);
  free(scale);
  free(meas);
  return spent / steps * 1e3;
}

static void measure_cost(uint32_t n, int steps) {
  double off = run_measured(n, steps, 0), on = run_measured(n, steps, 1);
  printf("policy %8u units: every unit measured %.3f ms/step, norms only "
         "%.3f ms/step: %.2fx (target <= 4x)\n", n, on, off, on / off);
}

int main(void) {
  printf("policy SIMD path: %s (GNMR_POLICY_SIMD=off|avx2|avx512 narrows "
         "it)\n", policy_simd_name(policy_simd_get()));
  run(10000, 2000);
  run(1000000, 20);
  rules_cost(10000, 2000);
  rules_cost(1000000, 20);
  measure_cost(10000, 2000);
  measure_cost(1000000, 20);
  return 0;
}
