/* SPDX-License-Identifier: MIT */
/* policyutil.h — what the engine's suites share (test_policy.c,
 * test_policy_state.c): parameters in one call, an engine that must be
 * made, a step whose active set comes back as text, event lookups. */
#ifndef GNMR_POLICYUTIL_H
#define GNMR_POLICYUTIL_H

#include <check.h>
#include <stdio.h>
#include <string.h>

#include "gnmr/error.h"
#include "policy.h"

#define R POLICY_REPORTED
#define NR POLICY_NOT_REPORTED
#define MS POLICY_MISSING

static inline policy_params params(double a, double b, uint32_t w, uint32_t k,
                            uint32_t l, uint64_t wu) {
  policy_params p;
  policy_params_default(&p);
  p.alpha = a;
  p.beta = b;
  p.window = w;
  p.max_active = k;
  p.lock_steps = l;
  p.warmup_steps = wu;
  p.mean_horizon = 0; /* the normative rule: the optional rules off */
  p.job_relative = 0;
  p.confirm_steps = 0;
  p.measure_alpha = 0;
  p.measure_beta = 0;
  return p;
}

static inline policy *make(const policy_params *p, uint32_t n) {
  policy *e = NULL;
  ck_assert_int_eq(policy_create(p, n, &e), GNMR_OK);
  ck_assert_ptr_nonnull(e);
  return e;
}

/* Runs one step and returns the active set as a string "1 3 5". */
static inline const char *step(policy *e, uint64_t t, const double *n,
                        const uint8_t *in, policy_result *res) {
  static char buf[256];
  policy_result local;
  policy_result *r = res ? res : &local;
  ck_assert_int_eq(policy_step(e, t, n, in, r), GNMR_OK);
  buf[0] = '\0';
  for (uint32_t i = 0; i < r->n_active; i++) {
    size_t l = strlen(buf);
    snprintf(buf + l, sizeof buf - l, i ? " %u" : "%u", r->active[i]);
  }
  return buf;
}

/* step() with each unit's measure. */
static inline const char *step_m(policy *e, uint64_t t, const double *n,
                          const uint8_t *in, const double *x,
                          policy_result *res) {
  static char buf[256];
  ck_assert_int_eq(policy_step_measured(e, t, n, in, x, res), GNMR_OK);
  buf[0] = '\0';
  for (uint32_t i = 0; i < res->n_active; i++) {
    size_t l = strlen(buf);
    snprintf(buf + l, sizeof buf - l, i ? " %u" : "%u", res->active[i]);
  }
  return buf;
}

static inline int count_events(const policy_result *r, int kind, uint32_t unit) {
  int c = 0;
  for (uint32_t i = 0; i < r->n_events; i++)
    if (r->events[i].kind == kind &&
        (unit == UINT32_MAX || r->events[i].unit == unit))
      c++;
  return c;
}

static inline const policy_event *find_event(const policy_result *r, int kind,
                                      uint32_t unit) {
  for (uint32_t i = 0; i < r->n_events; i++)
    if (r->events[i].kind == kind && r->events[i].unit == unit)
      return &r->events[i];
  return NULL;
}

#endif /* GNMR_POLICYUTIL_H */
