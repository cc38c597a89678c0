/* SPDX-License-Identifier: MIT */
/* storeutil.h — what the history's tests share (test_store.c, test_pg.c):
 * gnmrctl against a daemon, a one-rank agent with a known series of sums,
 * and the engine's own decisions for those steps, to compare a restored
 * job's with. */
#ifndef GNMR_TEST_STOREUTIL_H
#define GNMR_TEST_STOREUTIL_H

#include <math.h>

#include "gnmr/agent.h"
#include "policy.h"
#include "testutil.h"

/* gnmrctl's queries wait 3 s by default; under valgrind (gnmrctl and
 * gnmrd both run under it, two suites at once on two CPUs) a query that
 * sets no --timeout-ms of its own waits 60 s, right after the command so
 * that the test's own arguments are parsed as they would be alone. */
static inline int ctl_is_query(const char *cmd) {
  static const char *q[] = {"jobs",   "status", "units",  "top",
                            "history", "decisions", "set", "export",
                            "finish", "runs"};
  for (size_t i = 0; cmd != NULL && i < sizeof q / sizeof q[0]; i++)
    if (strcmp(cmd, q[i]) == 0)
      return 1;
  return 0;
}

static inline run_result ctl(const tu_daemon *d, char **args) {
  char *argv[34];
  int n = 0, own = 0;
  static char admin[300];
  snprintf(admin, sizeof admin, "--admin=%s", d->admin);
  argv[n++] = "gnmrctl";
  argv[n++] = admin;
  for (int i = 0; args[i]; i++)
    own |= strncmp(args[i], "--timeout-ms", 12) == 0;
  for (int i = 0; args[i] && n < 33; i++) {
    argv[n++] = args[i];
    if (i == 0 && !own && ctl_is_query(args[0]) &&
        getenv("GNMR_VALGRIND") != NULL) {
      argv[n++] = "--timeout-ms";
      argv[n++] = "60000";
    }
  }
  argv[n] = NULL;
  return tu_run("gnmrctl", argv, NULL);
}

static inline int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++)
    n += *s == '\n';
  return n;
}

/* Polls `decisions JOB --csv` until it has rows+1 lines (committed); the
 * store may be retrying after a fault with up to 5 s of backoff. */
static inline char *decisions_csv(const tu_daemon *d, const char *job, int rows) {
  for (int i = 0; i < 1500; i++) {
    /* a short wait each time: a query the daemon is slow to answer is
     * asked again */
    char *args[] = {"decisions", (char *)job, "--csv", "--timeout-ms", "5000",
                    NULL};
    run_result r = ctl(d, args);
    if (r.code == 0 && count_lines(r.out) >= rows + 1) {
      free(r.err);
      return r.out;
    }
    tu_run_free(&r);
    tu_sleep_ms(20);
  }
  ck_abort_msg("decisions of %s never reached %d rows", job, rows);
  return NULL;
}

/* The sums of squares of step t for 4 units: steady, with spikes. */
static inline void sums(uint64_t t, double *s) {
  for (int u = 0; u < 4; u++) {
    double n = (u + 1) * (1.0 + 0.05 * (double)((t * 7 + (uint64_t)u) % 5));
    if ((t + (uint64_t)u * 11) % 13 == 0)
      n *= 6;
    s[u] = n * n;
  }
}

static inline gnmr_agent *open_agent(const char *ep, const char *job) {
  static const char *names[] = {"q", "k", "v", "o"};
  gnmr_agent_config c = {0};
  c.endpoint = ep;
  c.job = job;
  c.reporters = 1;
  c.unit_names = names;
  c.n_units = 4;
  gnmr_params_default(&c.params);
  c.params.alpha = c.params.beta = 2; /* the first defaults: the spikes */
  c.params.mean_horizon = 0;          /* here are sized for them */
  c.params.job_relative = 0;
  c.params.confirm_steps = 0;
  c.params.warmup_steps = 0;
  c.params.max_active = 2;
  c.params.lock_steps = 2;
  c.barrier_ms = 5000;
  gnmr_agent *a;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  return a;
}

/* The active set an agent acts on after a decision, as the history writes
 * it ("3 17 2051"): its units' routes, offset by base (its first id). */
static inline char *acted(gnmr_agent *a, uint32_t n, uint32_t base) {
  uint8_t *r = malloc(n);
  char *out = malloc((size_t)n * 11 + 1);
  ck_assert(r && out);
  ck_assert_uint_eq(gnmr_agent_routes(a, r, n), n);
  size_t off = 0;
  out[0] = '\0';
  for (uint32_t u = 0; u < n; u++)
    if (r[u] == GNMR_ROUTE_HIGH)
      off += (size_t)sprintf(out + off, off ? " %u" : "%u", base + u);
  free(r);
  return out;
}

/* Reports steps 1..n (sums()) and waits for each decision: up to 10 s
 * (60 s under valgrind) for the first `patient` steps, 300 ms after;
 * seen[t] is the set acted on when step t's decision came (the caller
 * frees it). Returns how many came. */
static inline uint64_t report_and_wait(gnmr_agent *a, uint64_t n,
                                       uint64_t patient, char **seen) {
  uint64_t got = 0;
  for (uint64_t t = 1; t <= n; t++) {
    double sq[4];
    sums(t, sq);
    ck_assert_int_eq(gnmr_agent_report_sums(a, t, sq, NULL, NULL), GNMR_OK);
    int ms = t <= patient ? (getenv("GNMR_VALGRIND") ? 60000 : 10000) : 300;
    if (gnmr_agent_wait(a, t, ms) == GNMR_OK) {
      got++;
      seen[t] = acted(a, 4, 0);
    }
  }
  return got;
}

static inline void step_agent(gnmr_agent *a, uint64_t t) {
  double s[4];
  sums(t, s);
  ck_assert_int_eq(gnmr_agent_report_sums(a, t, s, NULL, NULL), GNMR_OK);
  int ms = getenv("GNMR_VALGRIND") != NULL ? 60000 : 10000;
  int rv = gnmr_agent_wait(a, t, ms);
  if (rv != GNMR_OK) {
    gnmr_agent_stats st = {0};
    gnmr_agent_stats_get(a, &st);
    ck_abort_msg("no decision for step %llu in %d ms (%s): reports sent %llu, "
                 "dropped %llu, stale %llu, decisions %llu, hellos %llu, "
                 "errors %llu (last %d)", (unsigned long long)t, ms,
                 gnmr_strerror(rv), (unsigned long long)st.reports_sent,
                 (unsigned long long)st.reports_dropped,
                 (unsigned long long)st.reports_stale,
                 (unsigned long long)st.decisions,
                 (unsigned long long)st.hellos,
                 (unsigned long long)st.errors, st.last_error);
  }
}

/* The engine's decision rows for the given steps, as gnmrd computes them
 * (norm = sqrt(sumsq)). */
static inline void engine_rows(const uint64_t *steps, size_t n, char *out,
                        size_t cap, uint64_t from_row) {
  policy_params p;
  policy_params_default(&p);
  p.alpha = p.beta = 2; /* as open_agent's */
  p.mean_horizon = 0;
  p.job_relative = 0;
  p.confirm_steps = 0;
  p.warmup_steps = 0;
  p.max_active = 2;
  p.lock_steps = 2;
  policy *e;
  ck_assert_int_eq(policy_create(&p, 4, &e), GNMR_OK);
  size_t off = 0;
  out[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    double s[4], norm[4];
    policy_result r;
    sums(steps[i], s);
    for (int u = 0; u < 4; u++)
      norm[u] = sqrt(s[u]);
    ck_assert_int_eq(policy_step(e, steps[i], norm, NULL, &r), GNMR_OK);
    if (steps[i] < from_row)
      continue;
    off += (size_t)snprintf(out + off, cap - off, "%llu,",
                            (unsigned long long)steps[i]);
    for (uint32_t k = 0; k < r.n_active; k++)
      off += (size_t)snprintf(out + off, cap - off, k ? " %u" : "%u",
                              r.active[k]);
    off += (size_t)snprintf(out + off, cap - off, "\n");
  }
  policy_destroy(&e);
}

#endif /* GNMR_TEST_STOREUTIL_H */
