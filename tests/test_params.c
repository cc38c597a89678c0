/* SPDX-License-Identifier: MIT */
/* test_params.c — the parameter table (gnmr/params.h) and everything
 * generated from it: defaults, validation by kind, comparison, the public
 * and wire conversions, options and settings, the agent's GNMR_* variables
 * and the committed python/gnmr/_params.py. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "gnmr/agent.h"
#include "gnmr/error.h"
#include "params.h"
#include "wire.h"

/* docs/policy.md, "Defaults": the measured signal's thresholds */
#define MEASURE_ALPHA_DEFAULT 4.0
#define MEASURE_BETA_DEFAULT 3.0

START_TEST(defaults_are_the_specs) {
  policy_params p;
  policy_params_default(&p);
  ck_assert(p.alpha == 6 && p.beta == 8); /* docs/policy.md, Defaults */
  ck_assert_uint_eq(p.window, 8);
  ck_assert_uint_eq(p.max_active, 4);
  ck_assert_uint_eq(p.lock_steps, 4);
  ck_assert_uint_eq(p.warmup_steps, 5);
  ck_assert(isnan(p.early_alpha) && isnan(p.early_beta));
  ck_assert_uint_eq(p.early_steps, 0);
  ck_assert_uint_eq(p.mean_horizon, 20);
  ck_assert_uint_eq(p.job_relative, 1);
  ck_assert_uint_eq(p.confirm_steps, 2);
  ck_assert(p.measure_alpha == MEASURE_ALPHA_DEFAULT &&
            p.measure_beta == MEASURE_BETA_DEFAULT);
  ck_assert_int_eq(policy_params_validate(&p, NULL), GNMR_OK);
  gnmr_params g;
  gnmr_params_default(&g);
  ck_assert(g.early_alpha == 0 && g.alpha == 6 && g.window == 8);
  ck_assert_int_eq(GNMR_NPARAMS, 15);
  ck_assert_uint_eq(p.same_step, 0);
}
END_TEST

START_TEST(validation_follows_each_kind) {
  policy_params p;
  const char *what;
  static const double bad[] = {0, -1, INFINITY, NAN};
  for (int i = 0; i < GNMR_NPARAMS; i++) {
    if (!policy_param_is_f64(i))
      continue;
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
      policy_params_default(&p);
      policy_param_set_f64(&p, i, bad[k]);
      int rv = policy_params_validate(&p, &what);
      if (isnan(bad[k]) && policy_param_inherits(i) >= 0) {
        ck_assert_int_eq(rv, GNMR_OK); /* unset: inherits */
        continue;
      }
      if (bad[k] == 0 && policy_param_table[i].kind == POLICY_PK_SIGNAL) {
        ck_assert_int_eq(rv, GNMR_OK); /* a signal's 0: off */
        continue;
      }
      ck_assert_int_eq(rv, GNMR_E_INVAL);
      ck_assert_str_eq(what, policy_param_table[i].name);
    }
  }
  policy_params_default(&p);
  p.window = 0;
  ck_assert_int_eq(policy_params_validate(&p, &what), GNMR_E_INVAL);
  ck_assert_str_eq(what, "window");
  p.window = POLICY_MAX_WINDOW;
  ck_assert_int_eq(policy_params_validate(&p, &what), GNMR_OK);
  p.window = POLICY_MAX_WINDOW + 1;
  ck_assert_int_eq(policy_params_validate(&p, &what), GNMR_E_RANGE);
  policy_params_default(&p);
  p.max_active = UINT32_MAX;
  p.warmup_steps = UINT64_MAX;
  ck_assert_int_eq(policy_params_validate(&p, &what), GNMR_OK);
  ck_assert_int_eq(policy_params_validate(NULL, &what), GNMR_E_INVAL);
}
END_TEST

START_TEST(equality_and_inheritance) {
  policy_params a, b;
  policy_params_default(&a);
  b = a;
  ck_assert(policy_params_equal(&a, &b));
  b.early_alpha = 2.0; /* the same value as inherited, but set */
  ck_assert(!policy_params_equal(&a, &b));
  int ea = -1;
  for (int i = 0; i < GNMR_NPARAMS; i++)
    if (strcmp(policy_param_table[i].name, "early_alpha") == 0)
      ea = i;
  ck_assert_int_ge(ea, 0);
  a.alpha = 3.5;
  ck_assert(policy_param_value(&a, ea) == 3.5); /* unset: alpha's value */
  ck_assert(policy_param_value(&b, ea) == 2.0);
  for (int i = 0; i < GNMR_NPARAMS; i++) {
    policy_params x, y;
    policy_params_default(&x);
    y = x;
    if (policy_param_is_f64(i))
      policy_param_set_f64(&y, i, 7.25);
    else
      policy_param_set_u64(&y, i, 7);
    ck_assert_msg(!policy_params_equal(&x, &y), "%s not compared",
                  policy_param_table[i].name);
  }
}
END_TEST

START_TEST(public_and_wire_conversions_round_trip) {
  for (int i = 0; i < GNMR_NPARAMS; i++) {
    policy_params p, back;
    gnmr_params g;
    Gnmr__Params w;
    policy_params_default(&p);
    if (policy_param_is_f64(i))
      policy_param_set_f64(&p, i, 1.5 + i);
    else
      policy_param_set_u64(&p, i, 100u + (unsigned)i);
    policy_params_to_public(&p, &g);
    policy_params_from_public(&g, &back);
    ck_assert_msg(policy_params_equal(&p, &back), "%s via gnmr_params",
                  policy_param_table[i].name);
    gnmr__params_to_wire(&p, &w);
    gnmr__params_from_wire(&w, &back);
    ck_assert_msg(policy_params_equal(&p, &back), "%s via the wire",
                  policy_param_table[i].name);
  }
  /* unset thresholds: NAN inside, 0 in gnmr_params and on the wire */
  policy_params p, back;
  gnmr_params g;
  Gnmr__Params w;
  policy_params_default(&p);
  policy_params_to_public(&p, &g);
  gnmr__params_to_wire(&p, &w);
  ck_assert(g.early_alpha == 0 && g.early_beta == 0);
  ck_assert(w.early_alpha == 0 && w.early_beta == 0);
  ck_assert(w.alpha == 6 && w.window == 8 && w.warmup_steps == 5);
  ck_assert(w.mean_horizon == 20 && w.job_relative == 1 &&
            w.confirm_steps == 2);
  gnmr__params_from_wire(&w, &back);
  ck_assert(isnan(back.early_alpha) && policy_params_equal(&p, &back));
}
END_TEST

START_TEST(options_settings_and_messages) {
  policy_params p;
  char err[256];
  policy_params_default(&p);
  ck_assert_int_eq(gnmr__policy_opts_find("max-active"),
                   gnmr__policy_opts_find("max_active"));
  ck_assert_int_eq(gnmr__policy_opts_find("nope"), -1);
  char s1[] = "max-active=7", s2[] = "early_alpha=1.5";
  char *ok[] = {s1, s2};
  ck_assert_int_eq(gnmr__policy_settings_apply(&p, ok, 2, err, sizeof err),
                   0);
  ck_assert_uint_eq(p.max_active, 7);
  ck_assert(p.early_alpha == 1.5);
  char s3[] = "gamma=1";
  char *unknown[] = {s3};
  ck_assert_int_eq(
      gnmr__policy_settings_apply(&p, unknown, 1, err, sizeof err),
      GNMR_E_INVAL);
  ck_assert_str_eq(err, "unknown parameter 'gamma' (alpha, beta, window, "
                        "max_active, lock_steps, warmup_steps, early_alpha, "
                        "early_beta, early_steps, mean_horizon, "
                        "job_relative, confirm_steps, measure_alpha, measure_beta, "
                   "same_step)");
  char s4[] = "window=0", s5[] = "alpha=-1", s6[] = "lock_steps=4294967296";
  char *w0[] = {s4}, *neg[] = {s5}, *big[] = {s6};
  ck_assert_int_ne(gnmr__policy_settings_apply(&p, w0, 1, err, sizeof err),
                   0);
  /* settings are named as the user wrote them: key=value, not --flag */
  ck_assert_str_eq(err, "window must be from 1 to 65536");
  ck_assert_int_ne(gnmr__policy_settings_apply(&p, neg, 1, err, sizeof err),
                   0);
  ck_assert_str_eq(err, "alpha=-1: expected a finite number > 0");
  ck_assert_int_ne(gnmr__policy_settings_apply(&p, big, 1, err, sizeof err),
                   0);
  ck_assert_str_eq(err, "lock_steps=4294967296: expected an integer from 0 "
                        "to 4294967295");
  char s7[] = "max-active=abc", *dash[] = {s7};
  ck_assert_int_ne(gnmr__policy_settings_apply(&p, dash, 1, err, sizeof err),
                   0);
  ck_assert_str_eq(err, "max-active=abc: expected an integer from 0 to "
                        "4294967295");
  /* options keep the option form */
  policy_params o = p;
  ck_assert_int_ne(gnmr__policy_opts_apply(&o, gnmr__policy_opts_find("alpha"),
                                           "abc", err, sizeof err), 0);
  ck_assert_str_eq(err, "--alpha 'abc': expected a finite number > 0");
  ck_assert_uint_eq(p.max_active, 7); /* nothing changed */
  ck_assert(strstr(GNMR_POLICY_OPTS_USAGE, "[--max-active N]") != NULL);
  ck_assert(strstr(GNMR_POLICY_OPTS_USAGE, "[--early-alpha X]") != NULL);
  /* the optional rules: a count and a flag of 0 or 1, nothing else */
  ck_assert(strstr(GNMR_POLICY_OPTS_USAGE, "[--job-relative 0|1]") != NULL);
  ck_assert(strstr(GNMR_POLICY_OPTS_USAGE, "[--confirm-steps N]") != NULL);
  char r1[] = "mean_horizon=0", r2[] = "job-relative=0",
       r3[] = "confirm-steps=3", *rules[] = {r1, r2, r3};
  ck_assert_int_eq(
      gnmr__policy_settings_apply(&p, rules, 3, err, sizeof err), 0);
  ck_assert(p.mean_horizon == 0 && p.job_relative == 0 &&
            p.confirm_steps == 3);
  static const char *const bad_flag[] = {"job_relative=2", "job_relative=-1",
                                         "job_relative=1x", "job_relative=",
                                         "mean_horizon=-5",
                                         "mean_horizon=18446744073709551616",
                                         "confirm_steps=4294967296",
                                         "confirm_steps=-1",
                                         "confirm_steps=two"};
  for (size_t i = 0; i < sizeof bad_flag / sizeof bad_flag[0]; i++) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s", bad_flag[i]);
    char *one[] = {buf};
    ck_assert_msg(gnmr__policy_settings_apply(&p, one, 1, err, sizeof err) !=
                      0,
                  "%s was taken", bad_flag[i]);
    ck_assert(strlen(err) > 0);
  }
  ck_assert(p.mean_horizon == 0 && p.job_relative == 0 &&
            p.confirm_steps == 3); /* unchanged */
  policy_params v;
  policy_params_default(&v);
  v.job_relative = 7; /* as a peer might send it */
  const char *what = NULL;
  ck_assert_int_eq(policy_params_validate(&v, &what), GNMR_E_INVAL);
  ck_assert_str_eq(what, "job_relative");
}
END_TEST

START_TEST(every_parameter_has_its_agent_variable) {
  for (int i = 0; i < GNMR_NPARAMS; i++) {
    gnmr_agent_config c;
    const char *bad = NULL;
    memset(&c, 0, sizeof c);
    ck_assert_int_eq(setenv(policy_param_table[i].env, "3", 1), 0);
    ck_assert_int_eq(gnmr_agent_config_from_env(&c, &bad), GNMR_OK);
    unsetenv(policy_param_table[i].env);
    policy_params p;
    policy_params_from_public(&c.params, &p);
    ck_assert_msg(policy_param_value(&p, i) == 3, "%s did not set %s",
                  policy_param_table[i].env, policy_param_table[i].name);
    ck_assert_int_eq(setenv(policy_param_table[i].env, "x3", 1), 0);
    ck_assert_int_eq(gnmr_agent_config_from_env(&c, &bad), GNMR_E_INVAL);
    ck_assert_str_eq(bad, policy_param_table[i].env);
    unsetenv(policy_param_table[i].env);
  }
}
END_TEST

START_TEST(python_table_is_generated_and_current) {
  const char *dir = getenv("GNMR_SOURCE_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/python/gnmr/_params.py", dir ? dir : ".");
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  static char have[8192], want[8192];
  size_t n = fread(have, 1, sizeof have - 1, f);
  fclose(f);
  have[n] = '\0';
  int len = policy_params_python(want, sizeof want);
  ck_assert_int_gt(len, 0);
  ck_assert_msg(strcmp(have, want) == 0,
                "%s is stale: run `make python-params`", path);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("params");
  TCase *tc = tcase_create("params");
  tcase_add_test(tc, defaults_are_the_specs);
  tcase_add_test(tc, validation_follows_each_kind);
  tcase_add_test(tc, equality_and_inheritance);
  tcase_add_test(tc, public_and_wire_conversions_round_trip);
  tcase_add_test(tc, options_settings_and_messages);
  tcase_add_test(tc, every_parameter_has_its_agent_variable);
  tcase_add_test(tc, python_table_is_generated_and_current);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
