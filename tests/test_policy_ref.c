/* SPDX-License-Identifier: MIT */
/* test_policy_ref.c — random traces through the engine and through a naive
 * reference written from docs/policy.md independently: the same active
 * sets, step after step. */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "check_main.h"
#include "policyutil.h"

/* ---- a naive reference, written from the spec independently ---------------- */
typedef struct ref_unit {
  uint64_t cnt;
  double sum;
  double win[64];
  uint32_t wlen;
  uint32_t lock;
  uint64_t xend; /* confirm_steps: the newest exceedance, and the steps */
  uint32_t xlen; /* in a row up to it */
} ref_unit;

static const double *ref_s; /* for qsort */
static int ref_cmp(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  if (ref_s[x] != ref_s[y])
    return ref_s[x] > ref_s[y] ? -1 : 1;
  return x < y ? -1 : 1;
}
static int u32_cmp(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

static int dbl_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The job-relative rule, by sorting: the lower medians of the step's g and
 * non-NaN d (at least 1), and the scores of every unit with a g again. */
static void ref_relative(uint32_t n, double a, double b, const double *gs,
                         const double *ds, const ref_unit *u, double *s) {
  double vg[256], vd[256];
  uint32_t ng = 0, nd = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (isnan(gs[i]))
      continue;
    vg[ng++] = gs[i];
    if (!isnan(ds[i]))
      vd[nd++] = ds[i];
  }
  qsort(vg, ng, sizeof vg[0], dbl_cmp);
  qsort(vd, nd, sizeof vd[0], dbl_cmp);
  double mg = ng > 1 && vg[(ng - 1) / 2] > 1 ? vg[(ng - 1) / 2] : 1;
  double md = nd > 1 && vd[(nd - 1) / 2] > 1 ? vd[(nd - 1) / 2] : 1;
  if (mg == 1 && md == 1)
    return;
  for (uint32_t i = 0; i < n; i++) {
    if (isnan(gs[i]) || !(s[i] > 1 || u[i].lock > 0))
      continue; /* only the candidates are rescored */
    double x = gs[i] / (a * mg), y = ds[i] / (b * md);
    s[i] = isnan(y) || x > y ? x : y;
  }
}

/* One step of the spec over the units; writes A_t (ascending) into act. */
static uint32_t ref_step(ref_unit *u, uint32_t n, uint64_t t,
                         const policy_params *p, const double *norm,
                         const uint8_t *in, double *s, uint32_t *act) {
  double a = (t <= p->early_steps && !isnan(p->early_alpha)) ? p->early_alpha
                                                             : p->alpha;
  double b = (t <= p->early_steps && !isnan(p->early_beta)) ? p->early_beta
                                                            : p->beta;
  uint32_t pool[256], np = 0;
  double gs[256], ds[256];
  for (uint32_t i = 0; i < n; i++) {
    gs[i] = ds[i] = NAN;
    s[i] = 0;
    if (in[i] != R || norm[i] == 0)
      continue;
    if (!isfinite(norm[i])) {
      s[i] = INFINITY;
      continue;
    }
    if (u[i].cnt > 0) {
      double g = norm[i] / (u[i].sum / u[i].cnt), d = 1;
      if (u[i].wlen > 0) {
        double acc = 0;
        for (uint32_t k = 0; k < u[i].wlen; k++)
          acc += u[i].win[k];
        d = g / (acc / u[i].wlen);
      }
      s[i] = g / a > d / b ? g / a : d / b;
      gs[i] = g;
      ds[i] = d;
      if (u[i].wlen == p->window) {
        memmove(u[i].win, u[i].win + 1, (p->window - 1) * sizeof(double));
        u[i].wlen--;
      }
      u[i].win[u[i].wlen++] = g;
    }
    if (p->mean_horizon != 0 && u[i].cnt >= p->mean_horizon) {
      u[i].sum = (u[i].sum - u[i].sum / u[i].cnt) + norm[i];
    } else {
      u[i].sum += norm[i];
      u[i].cnt++;
    }
  }
  if (p->job_relative)
    ref_relative(n, a, b, gs, ds, u, s);
  /* confirm_steps: a finite exceedance is risky after that many steps in
   * a row (steps here are 1, 2, 3, ...: the one before t is t - 1) */
  uint8_t risky[256] = {0};
  for (uint32_t i = 0; i < n; i++) {
    if (!(s[i] > 1))
      continue;
    u[i].xlen = t > 1 && u[i].xend == t - 1 ? u[i].xlen + 1 : 1;
    u[i].xend = t;
    risky[i] = isinf(s[i]) || u[i].xlen >= p->confirm_steps;
  }
  if (t <= p->warmup_steps)
    return 0;
  for (uint32_t i = 0; i < n; i++)
    if (risky[i] || u[i].lock > 0)
      pool[np++] = i;
  ref_s = s;
  qsort(pool, np, sizeof pool[0], ref_cmp);
  uint32_t k = np < p->max_active ? np : p->max_active;
  uint8_t in_a[256] = {0};
  for (uint32_t i = 0; i < k; i++) {
    act[i] = pool[i];
    in_a[pool[i]] = 1;
  }
  qsort(act, k, sizeof act[0], u32_cmp);
  for (uint32_t i = 0; i < n; i++) {
    if (in_a[i] && risky[i])
      u[i].lock = p->lock_steps;
    else if (u[i].lock > 0 && !risky[i])
      u[i].lock--;
  }
  return k;
}

static double rnd(unsigned *seed) { return (double)rand_r(seed) / RAND_MAX; }

START_TEST(random_traces_match_naive_reference) {
  unsigned seed = 12345 + (unsigned)_i;
  int relative_moved = 0, confirmed = 0;
  for (int trial = 0; trial < 40; trial++) {
    uint32_t n = 1 + (uint32_t)(rnd(&seed) * 40);
    policy_params p;
    policy_params_default(&p);
    p.alpha = 1.2 + rnd(&seed) * 2;
    p.beta = 1.2 + rnd(&seed) * 2;
    p.window = 1 + (uint32_t)(rnd(&seed) * 10);
    p.max_active = (uint32_t)(rnd(&seed) * 6);
    p.lock_steps = (uint32_t)(rnd(&seed) * 5);
    p.warmup_steps = (uint64_t)(rnd(&seed) * 12);
    if (rnd(&seed) < 0.5) {
      p.early_alpha = 2 + rnd(&seed) * 3;
      p.early_steps = (uint64_t)(rnd(&seed) * 40);
    }
    /* the optional rules (docs/policy.md), alone and together */
    if (rnd(&seed) < 0.5)
      p.mean_horizon = 1 + (uint64_t)(rnd(&seed) * 30);
    p.job_relative = rnd(&seed) < 0.5;
    p.confirm_steps = (uint32_t)(rnd(&seed) * 4); /* 0 and 1: off */
    policy *e = make(&p, n);
    ref_unit *ru = calloc(n, sizeof *ru);
    double scale[256], norm[256], s[256];
    uint8_t in[256];
    uint32_t act[256];
    for (uint32_t i = 0; i < n; i++)
      scale[i] = pow(10, rnd(&seed) * 6 - 3);
    for (uint64_t t = 1; t <= 120; t++) {
      /* a job-wide rise now and then: the medians above 1 */
      double job = rnd(&seed) < 0.08 ? 2 + 10 * rnd(&seed) : 1;
      for (uint32_t i = 0; i < n; i++) {
        double x = rnd(&seed);
        in[i] = x < 0.05 ? NR : x < 0.08 ? MS : R;
        norm[i] = scale[i] * job * (0.8 + 0.4 * rnd(&seed));
        x = rnd(&seed);
        if (x < 0.06)
          norm[i] *= 3 + 20 * rnd(&seed); /* transient spike */
        else if (x < 0.08)
          norm[i] = 0; /* idle */
        else if (x < 0.09)
          norm[i] = rnd(&seed) < 0.5 ? NAN : INFINITY;
      }
      uint32_t k = ref_step(ru, n, t, &p, norm, in, s, act);
      policy_result r;
      ck_assert_int_eq(policy_step(e, t, norm, in, &r), GNMR_OK);
      ck_assert_uint_eq(r.n_active, k);
      for (uint32_t i = 0; i < k; i++)
        ck_assert_uint_eq(r.active[i], act[i]);
      for (uint32_t i = 0; i < n; i++)
        ck_assert(r.s[i] == s[i]);
      relative_moved += p.job_relative && job > 1 && k > 0;
      for (uint32_t i = 0; i < n; i++) /* a run of exceedances promoted */
        confirmed += p.confirm_steps > 1 && ru[i].xend == t &&
                     ru[i].xlen >= p.confirm_steps && isfinite(s[i]);
    }
    policy_destroy(&e);
    free(ru);
  }
  ck_assert_int_gt(relative_moved, 0); /* the rules were exercised */
  ck_assert_int_gt(confirmed, 0);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("policy_ref");
  TCase *tc = tcase_create("reference");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, random_traces_match_naive_reference, 0, 5);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
