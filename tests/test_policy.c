/* SPDX-License-Identifier: MIT */
/* test_policy.c — the GNMR engine against docs/policy.md: the worked
 * example value by value, one test per rule, and API misuse
 * (its state across calls: test_policy_state.c; random traces against a
 * naive reference: test_policy_ref.c). */
#include <check.h>

#include "check_main.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policyutil.h"

/* ---- the worked example of docs/policy.md -------------------------------- */
START_TEST(worked_example_matches_spec_table) {
  policy_params p = params(2, 2, 2, 1, 1, 0);
  policy *e = make(&p, 1);
  const double n[] = {1, 1, 1, 5, 2, 2};
  const double g[] = {NAN, 1, 1, 5, 1, 1};
  const double d[] = {NAN, 1, 1, 5, 1.0 / 3, 1.0 / 3};
  const double s[] = {0, 0.5, 0.5, 2.5, 0.5, 0.5};
  const char *act[] = {"", "", "", "0", "0", ""};
  const uint32_t lock_after[] = {0, 0, 0, 1, 0, 0};
  for (int t = 0; t < 6; t++) {
    policy_result r;
    policy_unit_info info;
    ck_assert_str_eq(step(e, t + 1, &n[t], NULL, &r), act[t]);
    if (isnan(g[t]))
      ck_assert(isnan(r.g[0]));
    else
      ck_assert_double_eq_tol(r.g[0], g[t], 1e-12);
    if (isnan(d[t]))
      ck_assert(isnan(r.d[0]));
    else
      ck_assert_double_eq_tol(r.d[0], d[t], 1e-12);
    ck_assert_double_eq_tol(r.s[0], s[t], 1e-12);
    ck_assert_int_eq(policy_unit(e, 0, &info), GNMR_OK);
    ck_assert_uint_eq(info.lock, lock_after[t]);
  }
  policy_destroy(&e);
  ck_assert_ptr_null(e);
}
END_TEST

/* ---- step rules 1-3 -------------------------------------------------------- */
START_TEST(first_report_has_no_history_and_scores_zero) {
  policy_params p = params(2, 2, 8, 4, 4, 0);
  policy *e = make(&p, 1);
  policy_result r;
  double n = 1e6;
  step(e, 1, &n, NULL, &r);
  ck_assert_double_eq(r.s[0], 0);
  ck_assert(isnan(r.g[0]));
  policy_unit_info info;
  policy_unit(e, 0, &info);
  ck_assert_uint_eq(info.cnt, 1);
  ck_assert_double_eq(info.mean, 1e6);
  policy_destroy(&e);
}
END_TEST

START_TEST(first_delta_is_one_when_window_empty) {
  policy_params p = params(100, 0.5, 8, 4, 4, 0);
  policy *e = make(&p, 1);
  policy_result r;
  double n = 1;
  step(e, 1, &n, NULL, &r);
  step(e, 2, &n, NULL, &r);
  ck_assert_double_eq(r.d[0], 1);
  ck_assert_double_eq(r.s[0], 2); /* d / beta = 1 / 0.5 */
  policy_destroy(&e);
}
END_TEST

START_TEST(idle_zero_norm_scores_zero_and_keeps_state) {
  policy_params p = params(2, 2, 8, 4, 4, 0);
  policy *e = make(&p, 1);
  policy_result r;
  double n = 3, z = 0;
  step(e, 1, &n, NULL, &r);
  step(e, 2, &z, NULL, &r);
  ck_assert_double_eq(r.s[0], 0);
  policy_unit_info info;
  policy_unit(e, 0, &info);
  ck_assert_uint_eq(info.cnt, 1);
  ck_assert_double_eq(info.mean, 3);
  ck_assert_int_eq(count_events(&r, POLICY_EV_MISSING, 0), 0);
  /* the next real report compares with the mean before the idle step */
  double n2 = 7;
  step(e, 3, &n2, NULL, &r);
  ck_assert_double_eq_tol(r.g[0], 7.0 / 3, 1e-12);
  policy_destroy(&e);
}
END_TEST

START_TEST(not_reported_scores_zero_and_keeps_state) {
  policy_params p = params(2, 2, 8, 4, 4, 0);
  policy *e = make(&p, 1);
  policy_result r;
  double n = 3;
  uint8_t nr = NR;
  step(e, 1, &n, NULL, &r);
  step(e, 2, &n, &nr, &r);
  ck_assert_double_eq(r.s[0], 0);
  ck_assert_int_eq(count_events(&r, POLICY_EV_MISSING, 0), 0);
  policy_unit_info info;
  policy_unit(e, 0, &info);
  ck_assert_uint_eq(info.cnt, 1);
  policy_destroy(&e);
}
END_TEST

START_TEST(missing_shard_scores_zero_and_emits_missing_event) {
  policy_params p = params(2, 2, 8, 4, 4, 0);
  policy *e = make(&p, 2);
  policy_result r;
  double n[2] = {3, 3};
  uint8_t in[2] = {R, MS};
  step(e, 1, n, NULL, &r);
  n[1] = 1000; /* ignored: the unit is missing */
  step(e, 2, n, in, &r);
  ck_assert_double_eq(r.s[1], 0);
  ck_assert_int_eq(count_events(&r, POLICY_EV_MISSING, 1), 1);
  ck_assert_int_eq(count_events(&r, POLICY_EV_MISSING, 0), 0);
  policy_unit_info info;
  policy_unit(e, 1, &info);
  ck_assert_uint_eq(info.cnt, 1);
  policy_destroy(&e);
}
END_TEST

START_TEST(nonfinite_norm_is_risky_with_infinite_score_and_no_update) {
  const double bad[] = {NAN, INFINITY, -INFINITY};
  for (int i = 0; i < 3; i++) {
    policy_params p = params(2, 2, 8, 4, 4, 0);
    policy *e = make(&p, 1);
    policy_result r;
    double n = 2;
    step(e, 1, &n, NULL, &r);
    /* even with no history a non-finite norm is risky */
    ck_assert_str_eq(step(e, 2, &bad[i], NULL, &r), "0");
    ck_assert(isinf(r.s[0]) && r.s[0] > 0);
    ck_assert_uint_eq(r.n_risky, 1);
    ck_assert_int_eq(count_events(&r, POLICY_EV_NONFINITE, 0), 1);
    const policy_event *ev = find_event(&r, POLICY_EV_EXCEED, 0);
    ck_assert_ptr_nonnull(ev);
    ck_assert_int_eq(ev->outcome, POLICY_OUT_SELECTED);
    policy_unit_info info;
    policy_unit(e, 0, &info);
    ck_assert_uint_eq(info.cnt, 1);
    ck_assert_double_eq(info.mean, 2);
    policy_destroy(&e);
  }
}
END_TEST

START_TEST(nonfinite_ranks_above_every_finite_score) {
  policy_params p = params(2, 2, 8, 1, 0, 0);
  policy *e = make(&p, 2);
  double n[2] = {1, 1};
  step(e, 1, n, NULL, NULL);
  n[0] = 1e300; /* g = 1e300, a huge finite score */
  n[1] = NAN;
  ck_assert_str_eq(step(e, 2, n, NULL, NULL), "1");
  policy_destroy(&e);
}
END_TEST

START_TEST(each_unit_is_judged_against_its_own_history) {
  /* unit 0 lives at 1e-3, unit 1 at 1e3: a raw-norm policy would pick 1 */
  policy_params p = params(2, 2, 8, 1, 0, 0);
  policy *e = make(&p, 2);
  double n[2] = {1e-3, 1e3};
  for (int t = 1; t <= 5; t++)
    ck_assert_str_eq(step(e, t, n, NULL, NULL), "");
  n[0] = 5e-3;
  ck_assert_str_eq(step(e, 6, n, NULL, NULL), "0");
  policy_destroy(&e);
}
END_TEST

START_TEST(window_keeps_only_last_delta_values) {
  policy_params p = params(1e9, 1e9, 2, 1, 0, 0);
  policy *e = make(&p, 1);
  policy_result r;
  /* norms 1, 1, 4, 1, 1: g at t=3 is 4 (m=1). At t=5 with window 2 the
   * window holds only the g of t=3 and t=4, not the g of t=2. */
  const double n[] = {1, 1, 4, 1, 1};
  for (int t = 0; t < 5; t++)
    step(e, t + 1, &n[t], NULL, &r);
  /* m before t=5: (1+1+4+1)/4 = 1.75; g5 = 1/1.75;
   * g3 = 4/1 = 4, g4 = 1/2 = 0.5; window [4, 0.5] */
  double g5 = 1 / 1.75;
  ck_assert_double_eq_tol(r.g[0], g5, 1e-12);
  ck_assert_double_eq_tol(r.d[0], g5 / ((4 + 0.5) / 2), 1e-12);
  policy_destroy(&e);
}
END_TEST

/* confirm_steps (docs/policy.md, optional rules): a finite exceedance is
 * risky once the unit has exceeded that many decided steps in a row; a
 * non-finite norm at once; a step without an exceedance (or without a
 * report) ends the run; the run counts through the warm-up; 0 and 1 are
 * the plain rule. */
START_TEST(confirm_steps_waits_for_exceedances_in_a_row) {
  policy_params p = params(2, 1e9, 1, 4, 0, 0);
  p.confirm_steps = 2;
  double one = 1, nan = NAN, x[] = {10, 100, 1000};
  uint8_t nr = NR;
  policy_result r;
  /* one step's spike: an exceedance, not risky, no event */
  policy *e = make(&p, 1);
  step(e, 1, &one, NULL, NULL);
  ck_assert_str_eq(step(e, 2, &x[1], NULL, &r), "");
  ck_assert_uint_eq(r.n_risky, 0);
  ck_assert_ptr_null(find_event(&r, POLICY_EV_EXCEED, 0));
  policy_destroy(&e);
  /* two in a row (the second g = 100 / 5.5): risky at the second */
  e = make(&p, 1);
  step(e, 1, &one, NULL, NULL);
  ck_assert_str_eq(step(e, 2, &x[0], NULL, NULL), "");
  ck_assert_str_eq(step(e, 3, &x[1], NULL, &r), "0");
  ck_assert_uint_eq(r.n_risky, 1);
  ck_assert_ptr_nonnull(find_event(&r, POLICY_EV_EXCEED, 0));
  policy_destroy(&e);
  /* a non-finite norm at once */
  e = make(&p, 1);
  step(e, 1, &one, NULL, NULL);
  ck_assert_str_eq(step(e, 2, &nan, NULL, NULL), "0");
  policy_destroy(&e);
  /* a step not reported ends the run */
  e = make(&p, 1);
  step(e, 1, &one, NULL, NULL);
  ck_assert_str_eq(step(e, 2, &x[0], NULL, NULL), "");
  step(e, 3, &one, &nr, NULL);
  ck_assert_str_eq(step(e, 4, &x[1], NULL, NULL), "");
  /* "in a row" is of decided steps: their numbers may skip */
  ck_assert_str_eq(step(e, 9, &x[2], NULL, NULL), "0");
  policy_destroy(&e);
  /* the run counts through the warm-up */
  p.warmup_steps = 2;
  e = make(&p, 1);
  step(e, 1, &one, NULL, NULL);
  ck_assert_str_eq(step(e, 2, &x[0], NULL, NULL), "");
  ck_assert_str_eq(step(e, 3, &x[1], NULL, NULL), "0");
  policy_destroy(&e);
  /* 0 and 1: the plain rule */
  for (uint32_t c = 0; c <= 1; c++) {
    p = params(2, 1e9, 1, 4, 0, 0);
    p.confirm_steps = c;
    e = make(&p, 1);
    step(e, 1, &one, NULL, NULL);
    ck_assert_str_eq(step(e, 2, &x[1], NULL, NULL), "0");
    policy_destroy(&e);
  }
}
END_TEST

START_TEST(risky_when_either_ratio_exceeds_its_threshold) {
  /* g above alpha alone */
  policy_params p = params(2, 1e9, 8, 4, 0, 0);
  policy *e = make(&p, 1);
  double n = 1, big = 2.5;
  step(e, 1, &n, NULL, NULL);
  ck_assert_str_eq(step(e, 2, &big, NULL, NULL), "0");
  policy_destroy(&e);
  /* d above beta alone (g below alpha) */
  p = params(1e9, 1.5, 8, 4, 0, 0);
  e = make(&p, 1);
  step(e, 1, &n, NULL, NULL);
  step(e, 2, &n, NULL, NULL);
  double mid = 1.8; /* g = 1.8, window [1] -> d = 1.8 > 1.5 */
  ck_assert_str_eq(step(e, 3, &mid, NULL, NULL), "0");
  policy_destroy(&e);
  /* exactly at the threshold is not risky: s > 1 strictly */
  p = params(2, 1e9, 8, 4, 0, 0);
  e = make(&p, 1);
  double two = 2;
  step(e, 1, &n, NULL, NULL);
  policy_result r;
  ck_assert_str_eq(step(e, 2, &two, NULL, &r), "");
  ck_assert_double_eq(r.s[0], 1);
  policy_destroy(&e);
}
END_TEST

/* ---- selection ------------------------------------------------------------- */
START_TEST(warmup_selects_nobody_but_builds_statistics) {
  policy_params p = params(2, 2, 8, 4, 3, 3);
  policy *e = make(&p, 1);
  policy_result r;
  double n = 1, big = 10;
  step(e, 1, &n, NULL, &r);
  step(e, 2, &n, NULL, &r);
  ck_assert_str_eq(step(e, 3, &big, NULL, &r), ""); /* risky, t <= T_w */
  ck_assert_uint_eq(r.n_risky, 1);
  ck_assert_uint_eq(r.n_pool, 0);
  const policy_event *ev = find_event(&r, POLICY_EV_EXCEED, 0);
  ck_assert_ptr_nonnull(ev);
  ck_assert_int_eq(ev->outcome, POLICY_OUT_WARMUP);
  policy_unit_info info;
  policy_unit(e, 0, &info);
  ck_assert_uint_eq(info.cnt, 3); /* statistics were built */
  ck_assert_uint_eq(info.lock, 0);
  /* first step after warm-up selects */
  double huge = 100;
  ck_assert_str_eq(step(e, 4, &huge, NULL, &r), "0");
  policy_destroy(&e);
}
END_TEST

START_TEST(warmup_leaves_locks_unchanged) {
  policy_params p = params(2, 2, 8, 4, 3, 0);
  policy *e = make(&p, 1);
  double n = 1, big = 10;
  step(e, 1, &n, NULL, NULL);
  ck_assert_str_eq(step(e, 2, &big, NULL, NULL), "0"); /* lock = 3 */
  p.warmup_steps = 100; /* retuned into a warm-up phase */
  ck_assert_int_eq(policy_set_params(e, &p), GNMR_OK);
  policy_result r;
  ck_assert_str_eq(step(e, 3, &n, NULL, &r), "");
  ck_assert_int_eq(count_events(&r, POLICY_EV_DEMOTE, 0), 1);
  policy_unit_info info;
  policy_unit(e, 0, &info);
  ck_assert_uint_eq(info.lock, 3);
  policy_destroy(&e);
}
END_TEST

START_TEST(early_thresholds_apply_until_early_steps) {
  policy_params p = params(2, 1e9, 8, 4, 0, 0);
  p.early_alpha = 5;
  p.early_steps = 3;
  policy *e = make(&p, 1);
  double n = 1, spike = 3; /* g = 3: above 2, below 5 */
  step(e, 1, &n, NULL, NULL);
  step(e, 2, &n, NULL, NULL);
  ck_assert_str_eq(step(e, 3, &spike, NULL, NULL), ""); /* t <= T_1 */
  policy_destroy(&e);
  e = make(&p, 1);
  step(e, 1, &n, NULL, NULL);
  step(e, 2, &n, NULL, NULL);
  step(e, 3, &n, NULL, NULL);
  ck_assert_str_eq(step(e, 4, &spike, NULL, NULL), "0"); /* t > T_1 */
  policy_destroy(&e);
}
END_TEST

START_TEST(early_beta_defaults_to_beta) {
  policy_params p = params(1e9, 2, 8, 4, 0, 0);
  p.early_alpha = 1e9;
  p.early_steps = 100; /* early phase, early_beta unset = beta = 2 */
  policy *e = make(&p, 1);
  double n = 1, spike = 3;
  step(e, 1, &n, NULL, NULL);
  step(e, 2, &n, NULL, NULL);
  ck_assert_str_eq(step(e, 3, &spike, NULL, NULL), "0");
  policy_destroy(&e);
}
END_TEST

START_TEST(ties_go_to_smaller_unit_id) {
  policy_params p = params(2, 2, 8, 2, 0, 0);
  policy *e = make(&p, 5);
  double n[5] = {1, 1, 1, 1, 1};
  step(e, 1, n, NULL, NULL);
  double m[5] = {1, 9, 9, 9, 9}; /* four equal scores, budget 2 */
  ck_assert_str_eq(step(e, 2, m, NULL, NULL), "1 2");
  policy_destroy(&e);
  e = make(&p, 5);
  step(e, 1, n, NULL, NULL);
  double inf[5] = {INFINITY, 1, NAN, INFINITY, 1};
  ck_assert_str_eq(step(e, 2, inf, NULL, NULL), "0 2");
  policy_destroy(&e);
}
END_TEST

START_TEST(budget_zero_selects_nobody_and_drops_every_risky_unit) {
  policy_params p = params(2, 2, 8, 0, 4, 0);
  policy *e = make(&p, 3);
  policy_result r;
  double n[3] = {1, 1, 1}, m[3] = {9, 1, NAN};
  step(e, 1, n, NULL, NULL);
  ck_assert_str_eq(step(e, 2, m, NULL, &r), "");
  ck_assert_uint_eq(r.n_risky, 2);
  ck_assert_int_eq(find_event(&r, POLICY_EV_EXCEED, 0)->outcome,
                   POLICY_OUT_DROPPED);
  ck_assert_int_eq(find_event(&r, POLICY_EV_EXCEED, 2)->outcome,
                   POLICY_OUT_DROPPED);
  ck_assert_int_eq(count_events(&r, POLICY_EV_BUDGET_SATURATED, UINT32_MAX),
                   1);
  /* dropped units get no lock */
  policy_unit_info info;
  policy_unit(e, 0, &info);
  ck_assert_uint_eq(info.lock, 0);
  policy_destroy(&e);
}
END_TEST

START_TEST(budget_saturation_keeps_the_top_scores) {
  policy_params p = params(2, 2, 8, 3, 0, 0);
  policy *e = make(&p, 8);
  policy_result r;
  double n[8], m[8] = {3, 1, 8, 4, 1, 6, 5, 1};
  for (int i = 0; i < 8; i++)
    n[i] = 1;
  step(e, 1, n, NULL, NULL);
  ck_assert_str_eq(step(e, 2, m, NULL, &r), "2 5 6");
  ck_assert_uint_eq(r.n_pool, 5);
  const policy_event *sat =
      find_event(&r, POLICY_EV_BUDGET_SATURATED, UINT32_MAX);
  ck_assert_ptr_nonnull(sat);
  ck_assert_uint_eq(sat->count, 5);
  ck_assert_int_eq(find_event(&r, POLICY_EV_EXCEED, 0)->outcome,
                   POLICY_OUT_DROPPED);
  ck_assert_int_eq(find_event(&r, POLICY_EV_EXCEED, 3)->outcome,
                   POLICY_OUT_DROPPED);
  ck_assert_int_eq(find_event(&r, POLICY_EV_EXCEED, 5)->outcome,
                   POLICY_OUT_SELECTED);
  policy_destroy(&e);
}
END_TEST

START_TEST(pool_equal_to_budget_is_not_saturated) {
  policy_params p = params(2, 2, 8, 2, 0, 0);
  policy *e = make(&p, 3);
  policy_result r;
  double n[3] = {1, 1, 1}, m[3] = {5, 5, 1};
  step(e, 1, n, NULL, NULL);
  ck_assert_str_eq(step(e, 2, m, NULL, &r), "0 1");
  ck_assert_int_eq(count_events(&r, POLICY_EV_BUDGET_SATURATED, UINT32_MAX),
                   0);
  policy_destroy(&e);
}
END_TEST

/* ---- locks ----------------------------------------------------------------- */
START_TEST(lock_keeps_calm_unit_active_for_lock_steps) {
  policy_params p = params(2, 1e9, 8, 4, 3, 0);
  policy *e = make(&p, 1);
  double n = 1, big = 100;
  step(e, 1, &n, NULL, NULL);
  ck_assert_str_eq(step(e, 2, &big, NULL, NULL), "0"); /* lock 3 */
  /* calm: mean is now ~50, norm 1 gives g ~ 0.02 */
  ck_assert_str_eq(step(e, 3, &n, NULL, NULL), "0"); /* lock 2 */
  ck_assert_str_eq(step(e, 4, &n, NULL, NULL), "0"); /* lock 1 */
  ck_assert_str_eq(step(e, 5, &n, NULL, NULL), "0"); /* lock 0 */
  ck_assert_str_eq(step(e, 6, &n, NULL, NULL), "");
  policy_destroy(&e);
}
END_TEST

START_TEST(lock_zero_releases_unit_the_next_calm_step) {
  policy_params p = params(2, 1e9, 8, 4, 0, 0);
  policy *e = make(&p, 1);
  double n = 1, big = 100;
  step(e, 1, &n, NULL, NULL);
  ck_assert_str_eq(step(e, 2, &big, NULL, NULL), "0");
  ck_assert_str_eq(step(e, 3, &n, NULL, NULL), "");
  policy_destroy(&e);
}
END_TEST

START_TEST(lock_refreshes_when_selected_unit_is_risky_again) {
  policy_params p = params(2, 1e9, 8, 4, 2, 0);
  policy *e = make(&p, 1);
  policy_unit_info info;
  double n = 1, big = 100, nan = NAN;
  step(e, 1, &n, NULL, NULL);
  step(e, 2, &big, NULL, NULL); /* lock 2 */
  step(e, 3, &n, NULL, NULL);   /* lock 1 */
  policy_unit(e, 0, &info);
  ck_assert_uint_eq(info.lock, 1);
  ck_assert_str_eq(step(e, 4, &nan, NULL, NULL), "0"); /* risky: refresh */
  policy_unit(e, 0, &info);
  ck_assert_uint_eq(info.lock, 2);
  policy_destroy(&e);
}
END_TEST

START_TEST(lock_counts_down_on_missing_and_idle_steps) {
  policy_params p = params(2, 1e9, 8, 4, 2, 0);
  policy *e = make(&p, 1);
  double n = 1, big = 100, z = 0;
  uint8_t nr = NR;
  step(e, 1, &n, NULL, NULL);
  step(e, 2, &big, NULL, NULL);                       /* lock 2 */
  ck_assert_str_eq(step(e, 3, &n, &nr, NULL), "0");   /* lock 1 */
  ck_assert_str_eq(step(e, 4, &z, NULL, NULL), "0");  /* lock 0 */
  ck_assert_str_eq(step(e, 5, &z, NULL, NULL), "");
  policy_destroy(&e);
}
END_TEST

START_TEST(risky_unit_dropped_by_budget_keeps_its_lock) {
  /* unit 0 selected (lock 3); then 1 and 2 outrank it while 0 is still
   * risky: 0 is dropped and its lock stays at 3 (the "unchanged" rule). */
  policy_params p = params(2, 1e9, 8, 2, 3, 0);
  policy *e = make(&p, 3);
  policy_unit_info info;
  double n[3] = {1, 1, 1};
  step(e, 1, n, NULL, NULL);
  double a[3] = {10, 1, 1};
  ck_assert_str_eq(step(e, 2, a, NULL, NULL), "0");
  double b[3] = {30, INFINITY, INFINITY}; /* 0 still risky: g = 30/5.5 */
  policy_result r;
  ck_assert_str_eq(step(e, 3, b, NULL, &r), "1 2");
  ck_assert(r.s[0] > 1);
  policy_unit(e, 0, &info);
  ck_assert_uint_eq(info.lock, 3);
  policy_destroy(&e);
}
END_TEST

START_TEST(locked_calm_unit_competes_in_pool_by_score) {
  /* a lock-held calm unit is in the pool but ranks by its (low) score */
  policy_params p = params(2, 1e9, 8, 1, 5, 0);
  policy *e = make(&p, 2);
  double n[2] = {1, 1};
  step(e, 1, n, NULL, NULL);
  double a[2] = {10, 1};
  ck_assert_str_eq(step(e, 2, a, NULL, NULL), "0");
  double b[2] = {1, 10}; /* 0 calm with lock, 1 risky: 1 wins */
  policy_result r;
  ck_assert_str_eq(step(e, 3, b, NULL, &r), "1");
  ck_assert_uint_eq(r.n_pool, 2);
  ck_assert_int_eq(count_events(&r, POLICY_EV_BUDGET_SATURATED, UINT32_MAX),
                   1);
  ck_assert_int_eq(count_events(&r, POLICY_EV_PROMOTE, 1), 1);
  ck_assert_int_eq(count_events(&r, POLICY_EV_DEMOTE, 0), 1);
  policy_unit_info info;
  policy_unit(e, 0, &info);
  ck_assert_uint_eq(info.lock, 4); /* counted down though not selected */
  policy_destroy(&e);
}
END_TEST

START_TEST(promote_and_demote_events_follow_active_set_changes) {
  policy_params p = params(2, 1e9, 8, 4, 0, 0);
  policy *e = make(&p, 2);
  policy_result r;
  double n[2] = {1, 1};
  step(e, 1, n, NULL, NULL);
  double a[2] = {10, 1};
  step(e, 2, a, NULL, &r);
  ck_assert_int_eq(count_events(&r, POLICY_EV_PROMOTE, 0), 1);
  ck_assert_int_eq(count_events(&r, POLICY_EV_DEMOTE, UINT32_MAX), 0);
  double b[2] = {100, 1}; /* still risky: no new promote */
  step(e, 3, b, NULL, &r);
  ck_assert_int_eq(count_events(&r, POLICY_EV_PROMOTE, UINT32_MAX), 0);
  step(e, 4, n, NULL, &r);
  ck_assert_int_eq(count_events(&r, POLICY_EV_DEMOTE, 0), 1);
  policy_unit_info info;
  policy_unit(e, 0, &info);
  ck_assert_uint_eq(info.promotions, 1);
  policy_destroy(&e);
}
END_TEST

/* ---- API misuse -------------------------------------------------------------- */
START_TEST(bad_parameters_are_error_codes) {
  policy_params p;
  const char *what;
  policy *e = (policy *)1;
  struct {
    size_t off;
    double v;
    const char *name;
  } bad_d[] = {
      {offsetof(policy_params, alpha), 0, "alpha"},
      {offsetof(policy_params, alpha), -1, "alpha"},
      {offsetof(policy_params, alpha), NAN, "alpha"},
      {offsetof(policy_params, beta), INFINITY, "beta"},
      {offsetof(policy_params, early_alpha), 0, "early_alpha"},
      {offsetof(policy_params, early_beta), -INFINITY, "early_beta"},
  };
  for (size_t i = 0; i < sizeof bad_d / sizeof bad_d[0]; i++) {
    policy_params_default(&p);
    memcpy((char *)&p + bad_d[i].off, &bad_d[i].v, sizeof(double));
    ck_assert_int_eq(policy_params_validate(&p, &what), GNMR_E_INVAL);
    ck_assert_str_eq(what, bad_d[i].name);
    ck_assert_int_eq(policy_create(&p, 4, &e), GNMR_E_INVAL);
    ck_assert_ptr_null(e);
  }
  policy_params_default(&p);
  p.window = 0;
  ck_assert_int_eq(policy_create(&p, 4, &e), GNMR_E_INVAL);
  p.window = POLICY_MAX_WINDOW + 1;
  ck_assert_int_eq(policy_create(&p, 4, &e), GNMR_E_RANGE);
  policy_params_default(&p);
  ck_assert_int_eq(policy_create(&p, POLICY_MAX_UNITS + 1, &e), GNMR_E_RANGE);
  ck_assert_int_eq(policy_create(NULL, 4, &e), GNMR_E_INVAL);
  ck_assert_int_eq(policy_create(&p, 4, NULL), GNMR_E_INVAL);
  /* validation of good defaults */
  ck_assert_int_eq(policy_params_validate(&p, &what), GNMR_OK);
  ck_assert_ptr_null(what);
}
END_TEST

START_TEST(bad_step_input_is_rejected_without_changing_state) {
  policy_params p = params(2, 2, 8, 4, 4, 0);
  policy *e = make(&p, 2);
  policy_result r;
  double n[2] = {1, 1}, neg[2] = {1, -1};
  uint8_t bad_in[2] = {R, 7};
  ck_assert_int_eq(policy_step(e, 0, n, NULL, &r), GNMR_E_INVAL);
  ck_assert_int_eq(policy_step(e, 1, neg, NULL, &r), GNMR_E_INVAL);
  ck_assert_int_eq(policy_step(e, 1, n, bad_in, &r), GNMR_E_INVAL);
  ck_assert_int_eq(policy_step(e, 1, NULL, NULL, &r), GNMR_E_INVAL);
  ck_assert_int_eq(policy_step(e, 1, n, NULL, NULL), GNMR_E_INVAL);
  ck_assert_int_eq(policy_step(NULL, 1, n, NULL, &r), GNMR_E_INVAL);
  policy_unit_info info;
  policy_unit(e, 0, &info);
  ck_assert_uint_eq(info.cnt, 0);
  ck_assert_uint_eq(policy_last_step(e), 0);
  ck_assert_int_eq(policy_unit(e, 2, &info), GNMR_E_NOUNIT);
  ck_assert_int_eq(policy_resize(e, 1), GNMR_E_INVAL);
  policy_destroy(&e);
  policy_destroy(&e); /* NULL-safe */
  policy_destroy(NULL);
}
END_TEST

/* The measured signal (docs/policy.md): each unit's measure against its
 * own mean and window, whatever its level; the event says which signal;
 * no measure, an exact one (0) and a not-finite one; the rule off. */
START_TEST(measured_signal_judges_each_unit_against_its_own_measure) {
  policy_params p = params(2, 2, 4, 4, 1, 0);
  p.measure_alpha = 2;
  policy *e = make(&p, 3);
  policy_result r;
  double n[3] = {1, 1, 1};
  /* unit 0 fine (1%), unit 1 coarse (50%: any single bound's maker),
   * unit 2 fine */
  double x[3] = {0.01, 0.5, 0.01};
  for (uint64_t t = 1; t <= 5; t++)
    ck_assert_int_eq(policy_step_measured(e, t, n, NULL, x, &r), GNMR_OK);
  ck_assert_uint_eq(r.n_risky, 0);
  ck_assert(r.gm != NULL && fabs(r.gm[1] - 1) < 1e-12);
  policy_unit_info info;
  ck_assert_int_eq(policy_unit(e, 1, &info), GNMR_OK);
  ck_assert_uint_eq(info.mcnt, 5);
  ck_assert(fabs(info.mmean - 0.5) < 1e-12);
  /* unit 0 trebles (3% < unit 1's everyday 50%); unit 1 goes to 60% */
  double y[3] = {0.03, 0.6, 0.01};
  ck_assert_str_eq(step_m(e, 6, n, NULL, y, &r), "0");
  const policy_event *ev = find_event(&r, POLICY_EV_EXCEED, 0);
  ck_assert_ptr_nonnull(ev);
  ck_assert_uint_eq(ev->signal, POLICY_SIGNAL_MEASURE);
  ck_assert_str_eq(policy_signal_name(ev->signal), "measure");
  ck_assert(fabs(r.gm[0] - 3) < 1e-12 && fabs(r.sm[0] - 1.5) < 1e-12);
  ck_assert(r.s[0] == r.sm[0]);
  ck_assert_ptr_null(find_event(&r, POLICY_EV_EXCEED, 1));
  /* the norm and the measure at once: both named */
  double nn[3] = {1, 1, 9}, z[3] = {0.01, 0.5, 0.05};
  step_m(e, 7, nn, NULL, z, &r);
  ev = find_event(&r, POLICY_EV_EXCEED, 2);
  ck_assert_ptr_nonnull(ev);
  ck_assert_uint_eq(ev->signal, POLICY_SIGNAL_NORM | POLICY_SIGNAL_MEASURE);
  /* no measure (NaN) and an exact one (0): scored 0, nothing learnt */
  double none[3] = {NAN, 0, 0.01};
  ck_assert_int_eq(policy_unit(e, 0, &info), GNMR_OK);
  uint64_t c0 = info.mcnt;
  step_m(e, 8, n, NULL, none, &r);
  ck_assert(r.sm[0] == 0 && r.sm[1] == 0 && isnan(r.gm[0]));
  ck_assert_int_eq(policy_unit(e, 0, &info), GNMR_OK);
  ck_assert_uint_eq(info.mcnt, c0);
  /* a low path that would not be finite: risky at once, by the measure */
  double bad[3] = {0.01, INFINITY, 0.01};
  step_m(e, 9, n, NULL, bad, &r);
  ev = find_event(&r, POLICY_EV_EXCEED, 1);
  ck_assert(ev != NULL && ev->signal == POLICY_SIGNAL_MEASURE &&
            isinf(r.s[1]));
  ck_assert_int_eq(count_events(&r, POLICY_EV_NONFINITE, 1), 0);
  /* a unit not reported has no measure either */
  uint8_t in[3] = {NR, R, R};
  double jump[3] = {1, 0.5, 0.01};
  step_m(e, 10, n, in, jump, &r);
  ck_assert(r.sm[0] == 0 && isnan(r.gm[0]));
  /* a negative measure is refused, nothing changed */
  double neg[3] = {0.01, -1, 0.01};
  ck_assert_int_eq(policy_step_measured(e, 11, n, NULL, neg, &r),
                   GNMR_E_INVAL);
  ck_assert_uint_eq(policy_last_step(e), 10);
  policy_destroy(&e);
  /* the rule off: a measure changes nothing, and none is kept */
  policy_params off = params(2, 2, 4, 4, 1, 0);
  policy *a = make(&off, 3), *b = make(&off, 3);
  for (uint64_t t = 1; t <= 7; t++) {
    policy_result ra, rb;
    const double *m = t == 6 ? y : x;
    ck_assert_str_eq(step_m(a, t, n, NULL, m, &ra), step(b, t, n, NULL, &rb));
    ck_assert_ptr_null(ra.sm);
  }
  policy_destroy(&a);
  policy_destroy(&b);
}
END_TEST

/* Confirmed exceedances hold back a norm's, not the measure's: with
 * C = 3, a unit whose measure trebles is risky at once, one whose norm
 * does waits for its third step in a row. */
START_TEST(the_measure_needs_no_confirmation) {
  policy_params p = params(2, 1e9, 4, 4, 1, 0);
  p.measure_alpha = 2;
  p.confirm_steps = 3;
  policy *e = make(&p, 2);
  policy_result r;
  double n[2] = {1, 1}, x[2] = {0.1, 0.1};
  for (uint64_t t = 1; t <= 4; t++)
    step_m(e, t, n, NULL, x, &r);
  double hn[2] = {1, 9}, hx[2] = {0.5, 0.1};
  ck_assert_str_eq(step_m(e, 5, hn, NULL, hx, &r), "0");
  ck_assert_uint_eq(r.n_risky, 1);
  ck_assert(r.s[1] > 1); /* unit 1 exceeds by its norm: not yet risky */
  ck_assert_ptr_null(find_event(&r, POLICY_EV_EXCEED, 1));
  policy_destroy(&e);
}
END_TEST

/* The same-step bound: a measure just above it scores above 1 at the
 * next step, one just below does not (docs/policy.md, "Same-step mode"). */
START_TEST(measure_bound_is_where_the_next_step_turns_risky) {
  for (int beta_on = 0; beta_on <= 1; beta_on++) {
    policy_params p = params(1e9, 1e9, 3, 4, 1, 0);
    p.measure_alpha = 2.5;
    p.measure_beta = beta_on ? 1.5 : 0;
    double n[1] = {1}, x[1];
    for (int side = 0; side <= 1; side++) {
      policy *e = make(&p, 1);
      policy_result r;
      ck_assert(isinf(policy_measure_bound(e, 0)));
      static const double lv[] = {0.2, 0.25, 0.22, 0.3, 0.2};
      for (uint64_t t = 1; t <= 5; t++) {
        x[0] = lv[t - 1];
        step_m(e, t, n, NULL, x, &r);
      }
      double bound = policy_measure_bound(e, 0);
      ck_assert(bound > 0.2 && isfinite(bound));
      if (!beta_on)
        ck_assert(fabs(bound - 2.5 * 0.234) < 1e-12);
      x[0] = side ? bound * (1 + 1e-9) : bound * (1 - 1e-9);
      step_m(e, 6, n, NULL, x, &r);
      ck_assert_int_eq(r.sm[0] > 1, side);
      policy_destroy(&e);
    }
  }
  policy_params off = params(2, 2, 3, 4, 1, 0);
  policy *e = make(&off, 1);
  ck_assert(isinf(policy_measure_bound(e, 0)));
  ck_assert(isinf(policy_measure_bound(e, 5)));
  policy_destroy(&e);
}
END_TEST

START_TEST(zero_units_steps_cleanly) {
  policy_params p = params(2, 2, 8, 4, 4, 0);
  policy *e = make(&p, 0);
  policy_result r;
  ck_assert_int_eq(policy_step(e, 1, NULL, NULL, &r), GNMR_OK);
  ck_assert_uint_eq(r.n_active, 0);
  policy_destroy(&e);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("policy");
  TCase *tc = tcase_create("spec");
  tcase_add_test(tc, worked_example_matches_spec_table);
  tcase_add_test(tc, first_report_has_no_history_and_scores_zero);
  tcase_add_test(tc, first_delta_is_one_when_window_empty);
  tcase_add_test(tc, idle_zero_norm_scores_zero_and_keeps_state);
  tcase_add_test(tc, not_reported_scores_zero_and_keeps_state);
  tcase_add_test(tc, missing_shard_scores_zero_and_emits_missing_event);
  tcase_add_test(tc,
                 nonfinite_norm_is_risky_with_infinite_score_and_no_update);
  tcase_add_test(tc, nonfinite_ranks_above_every_finite_score);
  tcase_add_test(tc, each_unit_is_judged_against_its_own_history);
  tcase_add_test(tc, window_keeps_only_last_delta_values);
  tcase_add_test(tc, risky_when_either_ratio_exceeds_its_threshold);
  tcase_add_test(tc, warmup_selects_nobody_but_builds_statistics);
  tcase_add_test(tc, warmup_leaves_locks_unchanged);
  tcase_add_test(tc, early_thresholds_apply_until_early_steps);
  tcase_add_test(tc, early_beta_defaults_to_beta);
  tcase_add_test(tc, ties_go_to_smaller_unit_id);
  tcase_add_test(tc, budget_zero_selects_nobody_and_drops_every_risky_unit);
  tcase_add_test(tc, budget_saturation_keeps_the_top_scores);
  tcase_add_test(tc, pool_equal_to_budget_is_not_saturated);
  tcase_add_test(tc, lock_keeps_calm_unit_active_for_lock_steps);
  tcase_add_test(tc, lock_zero_releases_unit_the_next_calm_step);
  tcase_add_test(tc, lock_refreshes_when_selected_unit_is_risky_again);
  tcase_add_test(tc, lock_counts_down_on_missing_and_idle_steps);
  tcase_add_test(tc, risky_unit_dropped_by_budget_keeps_its_lock);
  tcase_add_test(tc, locked_calm_unit_competes_in_pool_by_score);
  tcase_add_test(tc, promote_and_demote_events_follow_active_set_changes);
  suite_add_tcase(s, tc);
  tc = tcase_create("api");
  tcase_add_test(tc, bad_parameters_are_error_codes);
  tcase_add_test(tc, bad_step_input_is_rejected_without_changing_state);
  tcase_add_test(tc, zero_units_steps_cleanly);
  tcase_add_test(tc, measured_signal_judges_each_unit_against_its_own_measure);
  tcase_add_test(tc, measure_bound_is_where_the_next_step_turns_risky);
  tcase_add_test(tc, the_measure_needs_no_confirmation);
  tcase_add_test(tc, confirm_steps_waits_for_exceedances_in_a_row);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
