/* SPDX-License-Identifier: MIT */
/* test_core.c — gnmrd's decision core (daemon/core.h) driven directly, with
 * no process, socket or loop: rank-order shard sums, the barrier and its
 * deadline, late, duplicate and far reports, observers, unit registration
 * conflicts, restarts of training (passes), the one-publication-per-step
 * guard and a restore. Time is an argument, so every case is exact. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "core.h"
#include "gnmr/error.h"
#include "hmap.h"
#include "validate.h"
#include "wire.h"

/* Held reports are tokens counted on release: every accepted report must
 * be released exactly once (ASan and valgrind see a leak or a double free
 * otherwise). */
static int released;
static void release(void *owner) {
  released++;
  free(owner);
}

static core_registry reg;
static policy_params prm;

static void setup(void) {
  memset(&reg, 0, sizeof reg);
  policy_params_default(&prm);
  prm.warmup_steps = 0;
  prm.confirm_steps = 1; /* the spikes here last one step */
  released = 0;
}

static void teardown(void) { core_registry_clear(&reg); }

static core_job *new_job(const char *name, uint32_t reporters,
                         uint32_t barrier_ms) {
  core_job *j = core_job_new(&reg, name, &prm, reporters, barrier_ms, release);
  ck_assert_ptr_nonnull(j);
  return j;
}

static void join(core_job *j, uint32_t rank, const char *const *names,
                 size_t n) {
  char why[160];
  ck_assert_int_eq(core_register_units(j, &j->ranks[rank], names, n, NULL, 1,
                                       why, sizeof why),
                   GNMR_OK);
  core_join(j, rank, 0);
}

/* A report of rank at step with the given sums of squares. */
static int report(core_job *j, uint32_t rank, uint64_t step,
                  const double *sumsq, uint64_t now) {
  int resumed;
  char detail[128];
  core_report rep = {malloc(1), sumsq, NULL, NULL, NULL, NULL, NULL};
  int rc = core_report_step(j, rank, step, &rep, (core_clock){now, now * 1000},
                            &resumed, detail, sizeof detail);
  if (rc != CORE_ACCEPTED)
    free(rep.owner);
  return rc;
}

static void join_ids(core_job *j, uint32_t rank, const char *const *names,
                     size_t n, const uint32_t *ids) {
  char why[160];
  ck_assert_int_eq(core_register_units(j, &j->ranks[rank], names, n, ids, 1,
                                       why, sizeof why),
                   GNMR_OK);
  core_join(j, rank, 0);
}

static const char *const one[] = {"w"};
static const char *const two[] = {"a", "b"};

START_TEST(shards_are_summed_in_rank_order_not_arrival_order) {
  /* (1 + e) + e == 1 but (e + e) + 1 > 1 in doubles: the order shows */
  static const double big[] = {1.0}, tiny[] = {1e-16};
  core_job *j = new_job("sum", 3, 100);
  for (uint32_t r = 0; r < 3; r++)
    join(j, r, one, 1);
  ck_assert_uint_eq(j->shards[0], 3);
  ck_assert_int_eq(report(j, 2, 1, tiny, 0), CORE_ACCEPTED);
  ck_assert_int_eq(report(j, 1, 1, tiny, 0), CORE_ACCEPTED);
  ck_assert_int_eq(report(j, 0, 1, big, 0), CORE_ACCEPTED);
  core_outcome o;
  ck_assert_int_eq(core_decide_next(j, 0, &o), 1);
  ck_assert_int_eq(o.by_deadline, 0);
  ck_assert_uint_eq(o.reports, 3);
  ck_assert_uint_eq(o.missing, 0);
  ck_assert_int_eq(o.input[0], POLICY_REPORTED);
  ck_assert(j->acc[0] == (1.0 + 1e-16) + 1e-16); /* the sum itself */
  ck_assert(j->acc[0] == 1.0);
  ck_assert(j->acc[0] != (1e-16 + 1e-16) + 1.0);
  ck_assert(o.norm[0] == 1.0);
  ck_assert_int_eq(core_decide_next(j, 0, &o), 0);
  ck_assert_int_eq(released, 3);
}
END_TEST

/* With node_ranks N a unit's shards are summed node by node (each
 * node's in rank order, then the nodes' sums in node order), the sums a
 * reporter standing for each node (one partial sum a unit) makes: a job
 * of 4 ranks, 2 a node, and a job of its 2 nodes' sums decide the same
 * bits; the plain order differs. A node that is not full (5 ranks, 2 a
 * node: the last alone) and a unit held on some ranks only. */
START_TEST(shards_are_summed_node_by_node_as_a_relay_sums_them) {
  static const double big[] = {1.0, 2.0}, tiny[] = {1e-16, 3.0};
  static const char *const wx[] = {"w", "x"};
  core_job *j = new_job("nodes", 4, 100);
  j->node_ranks = 2;
  for (uint32_t r = 0; r < 4; r++)
    join(j, r, r == 1 || r == 2 ? wx : one, r == 1 || r == 2 ? 2 : 1);
  ck_assert_int_eq(report(j, 3, 1, tiny, 0), CORE_ACCEPTED);
  ck_assert_int_eq(report(j, 2, 1, tiny, 0), CORE_ACCEPTED);
  ck_assert_int_eq(report(j, 1, 1, tiny, 0), CORE_ACCEPTED);
  ck_assert_int_eq(report(j, 0, 1, big, 0), CORE_ACCEPTED);
  core_outcome o;
  ck_assert_int_eq(core_decide_next(j, 0, &o), 1);
  ck_assert_uint_eq(o.missing, 0);
  double node0 = (0.0 + 1.0) + 1e-16, node1 = (0.0 + 1e-16) + 1e-16;
  ck_assert(j->acc[0] == (0.0 + node0) + node1);
  ck_assert(j->acc[0] != ((1.0 + 1e-16) + 1e-16) + 1e-16); /* rank order */
  ck_assert(j->acc[1] == 6.0);                              /* x: 3 + 3 */
  double grouped = j->acc[0];
  /* what relays send: each node's partial sum, as one reporter each */
  core_job *k = new_job("relayed", 2, 100);
  join(k, 0, wx, 2);
  join(k, 1, wx, 2);
  double p0[] = {node0, 3.0}, p1[] = {node1, 3.0};
  ck_assert_int_eq(report(k, 0, 1, p0, 0), CORE_ACCEPTED);
  ck_assert_int_eq(report(k, 1, 1, p1, 0), CORE_ACCEPTED);
  ck_assert_int_eq(core_decide_next(k, 0, &o), 1);
  ck_assert(k->acc[0] == grouped);
  ck_assert(k->acc[1] == 6.0);
  /* 5 ranks, 2 a node: nodes {0, 1}, {2, 3}, {4} */
  core_job *f = new_job("ragged", 5, 100);
  f->node_ranks = 2;
  for (uint32_t r = 0; r < 5; r++)
    join(f, r, one, 1);
  for (uint32_t r = 0; r < 5; r++)
    ck_assert_int_eq(report(f, r, 1, r == 4 ? big : tiny, 0), CORE_ACCEPTED);
  ck_assert_int_eq(core_decide_next(f, 0, &o), 1);
  double n01 = (0.0 + 1e-16) + 1e-16;
  ck_assert(f->acc[0] == ((0.0 + n01) + n01) + 1.0);
  ck_assert_int_eq(released, 11);
}
END_TEST

/* Report.missing: a reporter that knows a unit's value incomplete (a
 * node's shard that did not come) makes that unit missing at the step,
 * its other units as reported. */
START_TEST(a_shard_said_missing_makes_its_unit_missing) {
  static const double s0[] = {1.0, 4.0}, s1[] = {3.0, 5.0};
  static const int mis[] = {0, 1};
  core_job *j = new_job("miss", 2, 10);
  join(j, 0, two, 2);
  join(j, 1, two, 2);
  int resumed;
  char d[64];
  core_report r0 = {malloc(1), s0, NULL, NULL, NULL, NULL, NULL},
              r1 = {malloc(1), s1, NULL, NULL, NULL, NULL, mis};
  core_clock t = {0, 0};
  ck_assert_int_eq(core_report_step(j, 0, 1, &r0, t, &resumed, d, sizeof d),
                   CORE_ACCEPTED);
  ck_assert_int_eq(core_report_step(j, 1, 1, &r1, t, &resumed, d, sizeof d),
                   CORE_ACCEPTED);
  core_outcome o;
  ck_assert_int_eq(core_decide_next(j, 0, &o), 1);
  ck_assert_int_eq(o.input[0], POLICY_REPORTED);
  ck_assert(o.norm[0] == 2.0);
  ck_assert_int_eq(o.input[1], POLICY_MISSING);
  ck_assert_uint_eq(o.missing, 1);
}
END_TEST

START_TEST(deadline_decides_with_missing_shards) {
  static const double s[] = {4.0, 9.0};
  core_job *j = new_job("deadline", 2, 100);
  join(j, 0, two, 2);
  join(j, 1, two, 2);
  core_outcome o;
  /* before the first decision a deadline waits for every rank's first
   * report: rank 1 has said nothing yet */
  ck_assert_int_eq(report(j, 0, 1, s, 1000), CORE_ACCEPTED);
  ck_assert_int_eq(core_decide_next(j, 5000, &o), 0);
  ck_assert_uint_eq(core_next_deadline(j), UINT64_MAX);
  ck_assert_int_eq(report(j, 1, 1, s, 5000), CORE_ACCEPTED);
  ck_assert_int_eq(core_decide_next(j, 5000, &o), 1);
  ck_assert_uint_eq(o.step, 1);
  ck_assert_int_eq(o.by_deadline, 0);
  /* from then on the deadline decides a step alone */
  ck_assert_int_eq(report(j, 0, 2, s, 1000), CORE_ACCEPTED);
  ck_assert_int_eq(core_decide_next(j, 1099, &o), 0);
  ck_assert_uint_eq(core_next_deadline(j), 1100);
  ck_assert_int_eq(core_decide_next(j, 1100, &o), 1);
  ck_assert_uint_eq(o.step, 2);
  ck_assert_int_eq(o.by_deadline, 1);
  ck_assert_uint_eq(o.missing, 2);
  ck_assert_int_eq(o.input[0], POLICY_MISSING);
  ck_assert_int_eq(o.input[1], POLICY_MISSING);
  ck_assert_uint_eq(core_next_deadline(j), UINT64_MAX);
  /* the late half is dropped, not decided again */
  ck_assert_int_eq(report(j, 1, 2, s, 1200), CORE_LATE);
  ck_assert_uint_eq(j->last_decided, 2);
}
END_TEST

START_TEST(steps_are_decided_in_order) {
  static const double s[] = {1.0};
  core_job *j = new_job("order", 2, 50);
  join(j, 0, one, 1);
  join(j, 1, one, 1);
  /* step 3 is complete, step 2 is not: 2 goes first, by its deadline */
  ck_assert_int_eq(report(j, 0, 2, s, 0), CORE_ACCEPTED);
  ck_assert_int_eq(report(j, 0, 3, s, 10), CORE_ACCEPTED);
  ck_assert_int_eq(report(j, 1, 3, s, 10), CORE_ACCEPTED);
  core_outcome o;
  ck_assert_int_eq(core_decide_next(j, 10, &o), 1);
  ck_assert_uint_eq(o.step, 2);
  ck_assert_int_eq(o.by_deadline, 1);
  ck_assert_int_eq(core_decide_next(j, 10, &o), 1);
  ck_assert_uint_eq(o.step, 3);
  ck_assert_int_eq(o.by_deadline, 0);
  ck_assert_int_eq(core_decide_next(j, 10, &o), 0);
}
END_TEST

/* Steps decided before a restart stay decided: adopting step 4 drops the
 * pending steps up to it (their reports released), keeps the later ones,
 * never moves the last decided step down, and makes reports up to it
 * late. */
START_TEST(adopted_steps_stay_decided) {
  static const double s[] = {1.0};
  core_job *j = new_job("adopt", 2, 50);
  join(j, 0, one, 1);
  join(j, 1, one, 1);
  ck_assert_int_eq(report(j, 0, 3, s, 0), CORE_ACCEPTED);
  ck_assert_int_eq(report(j, 0, 4, s, 0), CORE_ACCEPTED);
  ck_assert_int_eq(report(j, 0, 5, s, 0), CORE_ACCEPTED);
  ck_assert_int_eq(core_restart_adopt_decided(j, 4), 1);
  ck_assert_int_eq(released, 2); /* steps 3 and 4 */
  ck_assert_uint_eq(j->last_decided, 4);
  ck_assert_uint_eq(j->n_pend, 1);
  ck_assert(core_is_pending(j, 5) && !core_is_pending(j, 4));
  ck_assert_int_eq(core_restart_adopt_decided(j, 2), 0); /* never down */
  ck_assert_uint_eq(j->last_decided, 4);
  ck_assert_int_eq(report(j, 1, 4, s, 0), CORE_LATE);
  ck_assert_int_eq(report(j, 1, 5, s, 0), CORE_ACCEPTED);
  core_outcome o;
  ck_assert_int_eq(core_decide_next(j, 0, &o), 1);
  ck_assert_uint_eq(o.step, 5);
}
END_TEST

START_TEST(duplicate_far_and_full_reports_are_refused) {
  static const double s[] = {1.0};
  core_job *j = new_job("refuse", 2, 1000);
  join(j, 0, one, 1);
  join(j, 1, one, 1);
  ck_assert_int_eq(report(j, 0, 1, s, 0), CORE_ACCEPTED);
  ck_assert_int_eq(report(j, 0, 1, s, 0), CORE_DUPLICATE);
  ck_assert_int_eq(report(j, 1, 1, s, 0), CORE_ACCEPTED);
  core_outcome o;
  ck_assert_int_eq(core_decide_next(j, 0, &o), 1);
  ck_assert_int_eq(report(j, 0, 2 + CORE_MAX_AHEAD, s, 0), CORE_TOO_FAR);
  for (uint64_t t = 2; t < 2 + CORE_MAX_PENDING; t++)
    ck_assert_int_eq(report(j, 0, t, s, 0), CORE_ACCEPTED);
  ck_assert_uint_eq(j->n_pend, CORE_MAX_PENDING);
  ck_assert_int_eq(report(j, 0, 2 + CORE_MAX_PENDING, s, 0), CORE_FULL);
  /* a job freed with reports held releases each of them */
  core_job_free(&reg, &j);
  ck_assert_ptr_null(core_find(&reg, "refuse"));
  ck_assert_int_eq(released, 2 + CORE_MAX_PENDING);
}
END_TEST

/* Issue 47: before the job's first decision one rank's report at step
 * 2^53 + 1 made that step the first decided one (by its deadline), and
 * every later report of the job was late. Now it is refused when another
 * rank has reported (the job is where its ranks are), and, taken first,
 * it is dropped once a step of the others is decided. */
START_TEST(one_rank_far_ahead_cannot_freeze_the_job) {
  static const double s[] = {1.0};
  const uint64_t far = (1ull << 53) + 1;
  core_job *j = new_job("far", 2, 100);
  join(j, 0, one, 1);
  join(j, 1, one, 1);
  ck_assert_int_eq(report(j, 1, 1, s, 0), CORE_ACCEPTED);
  ck_assert_int_eq(report(j, 0, far, s, 0), CORE_TOO_FAR);
  ck_assert_int_eq(report(j, 0, 1 + CORE_MAX_AHEAD, s, 0), CORE_ACCEPTED);
  ck_assert_int_eq(report(j, 0, 2 + CORE_MAX_AHEAD, s, 0), CORE_TOO_FAR);
  core_job_free(&reg, &j);
  ck_assert_int_eq(released, 2);
  /* the far report first, before any other rank's: taken, then dropped
   * when step 1 is decided; the job goes on */
  released = 0;
  j = new_job("far2", 2, 100);
  join(j, 0, one, 1);
  join(j, 1, one, 1);
  ck_assert_int_eq(report(j, 0, far, s, 0), CORE_ACCEPTED);
  ck_assert_int_eq(report(j, 1, 1, s, 10), CORE_ACCEPTED);
  core_outcome o;
  ck_assert_int_eq(core_decide_next(j, 100, &o), 1);
  ck_assert_uint_eq(o.step, 1);
  ck_assert_uint_eq(j->far_dropped, 1);
  ck_assert_uint_eq(j->n_pend, 0);
  ck_assert_int_eq(released, 2);
  ck_assert_int_eq(core_decide_next(j, 1000, &o), 0);
  ck_assert_uint_eq(j->last_decided, 1);
  ck_assert_int_eq(report(j, 1, 2, s, 1000), CORE_ACCEPTED);
  ck_assert_int_eq(report(j, 0, 2, s, 1000), CORE_ACCEPTED);
  ck_assert_int_eq(core_decide_next(j, 1000, &o), 1);
  ck_assert_uint_eq(o.step, 2);
  ck_assert_int_eq(o.by_deadline, 0);
  /* the far report first and its deadline long past before any other
   * rank reports: not decided alone (it was: the job froze at it) */
  released = 0;
  core_job *j3 = new_job("far3", 2, 100);
  join(j3, 0, one, 1);
  join(j3, 1, one, 1);
  ck_assert_int_eq(report(j3, 0, far, s, 0), CORE_ACCEPTED);
  ck_assert_int_eq(core_decide_next(j3, 60000, &o), 0);
  ck_assert_uint_eq(core_next_deadline(j3), UINT64_MAX);
  ck_assert_uint_eq(j3->last_decided, 0);
  ck_assert_int_eq(report(j3, 1, 1, s, 60000), CORE_ACCEPTED);
  ck_assert_int_eq(report(j3, 0, 1, s, 60000), CORE_ACCEPTED);
  ck_assert_int_eq(core_decide_next(j3, 60000, &o), 1);
  ck_assert_uint_eq(o.step, 1);
  ck_assert_uint_eq(j3->far_dropped, 1);
  ck_assert_int_eq(report(j3, 0, 2, s, 60000), CORE_ACCEPTED);
  ck_assert_int_eq(report(j3, 1, 2, s, 60000), CORE_ACCEPTED);
  ck_assert_int_eq(core_decide_next(j3, 60000, &o), 1);
  ck_assert_uint_eq(o.step, 2);
  core_job_free(&reg, &j3);
}
END_TEST

START_TEST(layout_unknown_until_every_rank_joined) {
  static const double s[] = {1.0, 1.0};
  core_job *j = new_job("layout", 2, 10);
  join(j, 0, two, 2);
  /* a job decided up to step 5 before (restored): its deadlines decide */
  ck_assert_int_eq(core_restart_adopt_decided(j, 5), 1);
  ck_assert_int_eq(report(j, 0, 6, s, 0), CORE_ACCEPTED);
  core_outcome o;
  ck_assert_int_eq(core_decide_next(j, 10, &o), 1);
  /* rank 1 may hold shards of these units: never a partial norm */
  ck_assert_uint_eq(o.missing, 2);
  ck_assert_int_eq(o.input[0], POLICY_MISSING);
  join(j, 1, one, 1); /* "w": a third unit, no shard of a or b */
  static const double w[] = {1.0};
  ck_assert_int_eq(report(j, 0, 7, s, 20), CORE_ACCEPTED);
  ck_assert_int_eq(report(j, 1, 7, w, 20), CORE_ACCEPTED);
  ck_assert_int_eq(core_decide_next(j, 20, &o), 1);
  ck_assert_uint_eq(o.missing, 0);
  ck_assert(o.norm[0] == 1.0 && o.norm[2] == 1.0);
}
END_TEST

START_TEST(not_reported_nonfinite_and_partial) {
  static const double s0[] = {1.0, 4.0}, s1[] = {3.0, 5.0};
  static const uint64_t nf[] = {0, 1};
  static const int nr0[] = {1, 0}, nr1[] = {1, 0};
  core_job *j = new_job("flags", 2, 10);
  join(j, 0, two, 2);
  join(j, 1, two, 2);
  int resumed;
  char d[64];
  core_report r0 = {malloc(1), s0, NULL, nr0, NULL, NULL, NULL},
              r1 = {malloc(1), s1, nf, nr1, NULL, NULL, NULL};
  core_clock t = {0, 0};
  ck_assert_int_eq(core_report_step(j, 0, 1, &r0, t, &resumed, d, sizeof d),
                   CORE_ACCEPTED);
  ck_assert_int_eq(core_report_step(j, 1, 1, &r1, t, &resumed, d, sizeof d),
                   CORE_ACCEPTED);
  core_outcome o;
  ck_assert_int_eq(core_decide_next(j, 0, &o), 1);
  ck_assert_int_eq(o.input[0], POLICY_NOT_REPORTED); /* no shard had it */
  ck_assert_int_eq(o.input[1], POLICY_REPORTED);
  ck_assert(isnan(o.norm[1])); /* one shard was not finite */
  /* one shard reported, the other not: the unit is missing */
  static const int nr_half[] = {0, 0};
  core_report h0 = {malloc(1), s0, NULL, nr_half, NULL, NULL, NULL},
              h1 = {malloc(1), s1, NULL, nr1, NULL, NULL, NULL};
  ck_assert_int_eq(core_report_step(j, 0, 2, &h0, t, &resumed, d, sizeof d),
                   CORE_ACCEPTED);
  ck_assert_int_eq(core_report_step(j, 1, 2, &h1, t, &resumed, d, sizeof d),
                   CORE_ACCEPTED);
  ck_assert_int_eq(core_decide_next(j, 0, &o), 1);
  ck_assert_int_eq(o.input[0], POLICY_MISSING);
  ck_assert_int_eq(o.input[1], POLICY_REPORTED);
  ck_assert(o.norm[1] == 3.0);
}
END_TEST

/* A sharded unit's measure is its largest shard's; a shard with none
 * (NaN) adds nothing; a unit with a missing shard has none either. */
START_TEST(a_sharded_units_measure_is_its_largest_shards) {
  static const double s0[] = {1.0, 4.0}, s1[] = {3.0, 5.0};
  static const double m0[] = {0.2, NAN}, m1[] = {0.5, NAN};
  static const double m2[] = {NAN, 0.3};
  core_job *j = new_job("measure", 2, 10);
  join(j, 0, two, 2);
  join(j, 1, two, 2);
  int resumed;
  char d[64];
  core_clock t = {0, 0};
  core_report r0 = {malloc(1), s0, NULL, NULL, NULL, m0, NULL},
              r1 = {malloc(1), s1, NULL, NULL, NULL, m1, NULL};
  ck_assert_int_eq(core_report_step(j, 0, 1, &r0, t, &resumed, d, sizeof d),
                   CORE_ACCEPTED);
  ck_assert_int_eq(core_report_step(j, 1, 1, &r1, t, &resumed, d, sizeof d),
                   CORE_ACCEPTED);
  core_outcome o;
  ck_assert_int_eq(core_decide_next(j, 0, &o), 1);
  ck_assert(o.measure[0] == 0.5 && isnan(o.measure[1]));
  /* rank 1 without measures: rank 0's alone; then rank 1 missing */
  core_report h0 = {malloc(1), s0, NULL, NULL, NULL, m2, NULL},
              h1 = {malloc(1), s1, NULL, NULL, NULL, NULL, NULL};
  ck_assert_int_eq(core_report_step(j, 0, 2, &h0, t, &resumed, d, sizeof d),
                   CORE_ACCEPTED);
  ck_assert_int_eq(core_report_step(j, 1, 2, &h1, t, &resumed, d, sizeof d),
                   CORE_ACCEPTED);
  ck_assert_int_eq(core_decide_next(j, 0, &o), 1);
  ck_assert(isnan(o.measure[0]) && o.measure[1] == 0.3);
  /* no rank with a measure: none given to the engine */
  core_report n0 = {malloc(1), s0, NULL, NULL, NULL, NULL, NULL},
              n1 = {malloc(1), s1, NULL, NULL, NULL, NULL, NULL};
  ck_assert_int_eq(core_report_step(j, 0, 3, &n0, t, &resumed, d, sizeof d),
                   CORE_ACCEPTED);
  ck_assert_int_eq(core_report_step(j, 1, 3, &n1, t, &resumed, d, sizeof d),
                   CORE_ACCEPTED);
  ck_assert_int_eq(core_decide_next(j, 0, &o), 1);
  ck_assert_ptr_null(o.measure);
  core_report g0 = {malloc(1), s0, NULL, NULL, NULL, m0, NULL};
  ck_assert_int_eq(core_report_step(j, 0, 4, &g0, t, &resumed, d, sizeof d),
                   CORE_ACCEPTED);
  ck_assert_int_eq(core_decide_next(j, 100, &o), 1); /* by its deadline */
  ck_assert_int_eq(o.input[0], POLICY_MISSING);
  ck_assert(isnan(o.measure[0]));
}
END_TEST

START_TEST(byes_lower_the_barrier_and_finish_the_job) {
  static const double s[] = {1.0};
  core_job *j = new_job("bye", 2, 1000);
  join(j, 0, one, 1);
  join(j, 1, one, 1);
  ck_assert_int_eq(report(j, 0, 1, s, 0), CORE_ACCEPTED);
  core_outcome o;
  ck_assert_int_eq(core_decide_next(j, 0, &o), 0);
  ck_assert_int_eq(core_bye(j, 1), 0);
  ck_assert_int_eq(core_decide_next(j, 0, &o), 1); /* 1 of 1 expected */
  ck_assert_int_eq(o.by_deadline, 0);
  core_join(j, 1, 1); /* rank 1 is back */
  ck_assert_uint_eq(j->byes, 0);
  ck_assert_int_eq(core_bye(j, 0), 0);
  ck_assert_int_eq(core_bye(j, 0), 0); /* a second Bye counts once */
  ck_assert_int_eq(core_bye(j, 1), 1);
}
END_TEST

START_TEST(registration_is_all_or_nothing) {
  core_job *j = new_job("units", 3, 10);
  char why[160];
  static const char *const ab[] = {"a", "b"};
  static const uint32_t ids_ab[] = {5, 2};
  ck_assert_int_eq(core_register_units(j, &j->ranks[0], ab, 2, ids_ab, 1, why,
                                       sizeof why),
                   GNMR_OK);
  ck_assert_uint_eq(j->n_units, 2); /* two slots, in id order: 2, 5 */
  ck_assert_uint_eq(j->unit_id[0], 2);
  ck_assert_uint_eq(j->unit_id[1], 5);
  ck_assert_str_eq(j->unit_names[1], "a");
  ck_assert_uint_eq(core_slot(j, 5), 1);
  ck_assert_uint_eq(core_slot(j, 3), UINT32_MAX);
  /* the same name under another id */
  static const char *const a_only[] = {"a"};
  static const uint32_t id7[] = {7};
  ck_assert_int_eq(core_register_units(j, &j->ranks[1], a_only, 1, id7, 1,
                                       why, sizeof why),
                   GNMR_E_MISMATCH);
  ck_assert(strstr(why, "'a' has id 5") != NULL);
  /* a taken id, after a good new name: nothing of it stays */
  static const char *const cd[] = {"c", "d"};
  static const uint32_t ids_cd[] = {9, 2};
  ck_assert_int_eq(core_register_units(j, &j->ranks[1], cd, 2, ids_cd, 1, why,
                                       sizeof why),
                   GNMR_E_MISMATCH);
  ck_assert_uint_eq(j->n_units, 2);
  ck_assert_int_eq(hmap_get(&j->unit_ids, "c", 1, NULL), 0);
  ck_assert_ptr_null(j->ranks[1].ids);
  /* two new names asking for one id in one call */
  static const uint32_t ids_same[] = {40, 40};
  ck_assert_int_eq(core_register_units(j, &j->ranks[1], cd, 2, ids_same, 1,
                                       why, sizeof why),
                   GNMR_E_MISMATCH);
  ck_assert(strstr(why, "unit id 40 is already taken") != NULL);
  ck_assert_uint_eq(j->n_units, 2);
  ck_assert_int_eq(hmap_get(&j->unit_ids, "d", 1, NULL), 0);
  /* a job's unit count is capped, not its ids; UINT32_MAX is no unit */
  static const uint32_t big[] = {POLICY_MAX_UNITS};
  ck_assert_int_eq(core_register_units(j, &j->ranks[1], a_only + 0, 1,
                                       big, 1, why, sizeof why),
                   GNMR_E_MISMATCH); /* "a" is 5 */
  static const char *const z[] = {"z"}, *const zy[] = {"z", "y"};
  static const uint32_t big2[] = {POLICY_MAX_UNITS, 4000000000u};
  j->max_units = 3;
  ck_assert_int_eq(core_register_units(j, &j->ranks[1], zy, 2, big2, 1, why,
                                       sizeof why),
                   GNMR_E_RANGE);
  ck_assert(strstr(why, "at most 3 units") != NULL);
  j->max_units = POLICY_MAX_UNITS;
  static const uint32_t id_max32[] = {UINT32_MAX};
  ck_assert_int_eq(core_register_units(j, &j->ranks[1], z, 1, id_max32, 1,
                                       why, sizeof why),
                   GNMR_E_RANGE);
  ck_assert_uint_eq(j->n_units, 2);
  /* shards: a second rank with the same names adds a shard each */
  ck_assert_int_eq(core_register_units(j, &j->ranks[1], ab, 2, NULL, 1, why,
                                       sizeof why),
                   GNMR_OK);
  ck_assert_uint_eq(j->shards[core_slot(j, 5)], 2);
  ck_assert_uint_eq(j->shards[core_slot(j, 2)], 2);
  ck_assert(core_same_units(j, &j->ranks[1], ab, 2, ids_ab));
  ck_assert(!core_same_units(j, &j->ranks[1], cd, 2, NULL));
}
END_TEST

START_TEST(observers_add_no_shard_and_slots_are_reused) {
  core_job *j = new_job("obs", 1, 10);
  join(j, 0, two, 2);
  char why[160];
  uint32_t slot;
  int full;
  core_rank *o = core_observer_slot(j, &slot, &full);
  ck_assert_ptr_nonnull(o);
  ck_assert_uint_eq(slot, 0);
  ck_assert_int_eq(core_register_units(j, o, two, 2, NULL, 0, why,
                                       sizeof why),
                   GNMR_OK);
  o->joined = 1;
  ck_assert_uint_eq(j->shards[0], 1);
  ck_assert_uint_eq(j->shards[1], 1);
  core_rank *o2 = core_observer_slot(j, &slot, &full);
  ck_assert_uint_eq(slot, 1);
  o2->joined = 1;
  core_disconnect(&j->observers[0], 1); /* slot 0 is free again */
  ck_assert_ptr_eq(core_observer_slot(j, &slot, &full), &j->observers[0]);
  ck_assert_uint_eq(slot, 0);
  ck_assert_ptr_null(j->observers[0].ids); /* zeroed for its new owner */
  for (uint32_t i = 0; i < CORE_MAX_OBSERVERS; i++) {
    core_rank *x = core_observer_slot(j, &slot, &full);
    if (x == NULL)
      break;
    x->joined = 1;
  }
  ck_assert_uint_eq(j->n_observers, CORE_MAX_OBSERVERS);
  ck_assert_ptr_null(core_observer_slot(j, &slot, &full));
  ck_assert_int_eq(full, 1);
}
END_TEST

START_TEST(a_rank_back_below_its_step_starts_a_new_pass) {
  static const double s[] = {1.0};
  core_job *j = new_job("pass", 1, 10);
  join(j, 0, one, 1);
  core_outcome o;
  for (uint64_t t = 1; t <= 5; t++) {
    ck_assert_int_eq(report(j, 0, t, s, t), CORE_ACCEPTED);
    ck_assert_int_eq(core_decide_next(j, t, &o), 1);
    ck_assert_int_eq(o.republish, 0);
  }
  /* only late (not rejoined): dropped */
  ck_assert_int_eq(report(j, 0, 3, s, 6), CORE_LATE);
  ck_assert_uint_eq(j->pass, 1);
  /* rejoined and back at step 3: a checkpoint restart, pass 2 */
  core_join(j, 0, 0);
  int resumed;
  char detail[128];
  core_report rep = {malloc(1), s, NULL, NULL, NULL, NULL, NULL};
  ck_assert_int_eq(core_report_step(j, 0, 3, &rep, (core_clock){7, 7},
                                    &resumed, detail, sizeof detail),
                   CORE_ACCEPTED);
  ck_assert_int_eq(resumed, 1);
  ck_assert_str_eq(detail, "pass 2: training restarted at step 3 after "
                           "step 5");
  ck_assert_uint_eq(j->pass, 2);
  ck_assert_int_eq(core_decide_next(j, 7, &o), 1);
  ck_assert_uint_eq(o.step, 3);
  ck_assert_int_eq(o.republish, 0); /* a new pass may decide step 3 again */
  ck_assert_int_eq(o.rv, GNMR_OK);
  /* within one pass a step is published once, whatever goes wrong above */
  j->last_decided = 2;
  ck_assert_int_eq(report(j, 0, 3, s, 8), CORE_ACCEPTED);
  ck_assert_int_eq(core_decide_next(j, 8, &o), 1);
  ck_assert_int_eq(o.republish, 1);
  ck_assert_uint_eq(j->pub_step, 3);
}
END_TEST

START_TEST(restore_rebuilds_units_ranks_and_statistics) {
  static const double s[] = {1.0, 2.0};
  core_job *j = new_job("before", 2, 10);
  join(j, 0, two, 2);
  join(j, 1, two, 2);
  core_outcome o;
  for (uint64_t t = 1; t <= 3; t++) {
    ck_assert_int_eq(report(j, 0, t, s, 0), CORE_ACCEPTED);
    ck_assert_int_eq(report(j, 1, t, s, 0), CORE_ACCEPTED);
    ck_assert_int_eq(core_decide_next(j, 0, &o), 1);
  }
  size_t len = policy_export_size(j->pol), got;
  void *snap = malloc(len);
  ck_assert_int_eq(policy_export(j->pol, snap, len, &got), GNMR_OK);
  policy *pol;
  ck_assert_int_eq(policy_import(snap, got, &pol), GNMR_OK);
  free(snap);
  core_job *r = new_job("after", 2, 10);
  char *names[] = {"a", "b"};
  uint32_t n[] = {2, 0}, ids0[] = {0, 1};
  uint32_t *ids[] = {ids0, NULL};
  ck_assert_int_eq(
      core_restart_restore(r, pol, NULL, 2, ids0, names, 2, n, ids), GNMR_OK);
  ck_assert_uint_eq(r->last_decided, 3);
  ck_assert_uint_eq(r->n_units, 2);
  ck_assert_uint_eq(r->shards[0], 1); /* rank 1 never joined: no shard yet */
  ck_assert_int_eq(r->ranks[0].ever, 1);
  ck_assert_int_eq(r->ranks[1].ever, 0);
  ck_assert_uint_eq(r->ranks[0].last_step, UINT64_MAX);
  uint64_t v;
  ck_assert(hmap_get(&r->unit_ids, "b", 1, &v) && v == 1);
  policy_unit_info a, b;
  ck_assert_int_eq(policy_unit(j->pol, 1, &a), GNMR_OK);
  ck_assert_int_eq(policy_unit(r->pol, 1, &b), GNMR_OK);
  ck_assert_uint_eq(a.cnt, b.cnt);
  ck_assert(a.mean == b.mean);
  /* a rank id list that points past the units is not trusted */
  core_job *bad = new_job("bad", 1, 10);
  uint32_t n1[] = {1}, far[] = {9};
  uint32_t *fids[] = {far};
  ck_assert_int_eq(
      core_restart_restore(bad, NULL, NULL, 2, ids0, names, 1, n1, fids),
      GNMR_OK);
  ck_assert_int_eq(bad->ranks[0].ever, 0);
}
END_TEST

/* Units are slots in id order: memory follows the units that exist. A
 * unit whose id falls between others moves the later ones, statistics
 * and registrations with them; decisions and restores speak ids. */
START_TEST(sparse_ids_take_slots_in_id_order) {
  core_job *j = new_job("sparse", 1, 10);
  char why[160];
  static const char *const ac[] = {"a", "c"};
  static const uint32_t ids_ac[] = {4000000000u, 10};
  join_ids(j, 0, ac, 2, ids_ac);
  ck_assert_uint_eq(j->n_units, 2);
  ck_assert_uint_eq(policy_units(j->pol), 2);
  ck_assert(!core_dense(j));
  core_outcome o;
  double spike[] = {1.0, 1.0};
  for (uint64_t t = 1; t <= 12; t++) {
    spike[0] = t == 12 ? 50.0 : 1.0 + 0.01 * (double)t; /* "a" spikes */
    ck_assert_int_eq(report(j, 0, t, spike, 0), CORE_ACCEPTED);
    ck_assert_int_eq(core_decide_next(j, 0, &o), 1);
  }
  ck_assert_uint_eq(o.res.n_active, 1);
  ck_assert_uint_eq(o.active_ids[0], 4000000000u); /* an id, not a slot */
  ck_assert_uint_eq(o.unit_id[o.res.active[0]], 4000000000u);
  policy_unit_info before_a, before_c, after_a, after_c, b_new;
  ck_assert_int_eq(policy_unit(j->pol, core_slot(j, 4000000000u), &before_a),
                   GNMR_OK);
  ck_assert_int_eq(policy_unit(j->pol, core_slot(j, 10), &before_c), GNMR_OK);
  /* an observer brings "b" with id 20: between 10 and 4e9 */
  static const char *const ab[] = {"a", "b"};
  static const uint32_t ids_ab[] = {4000000000u, 20};
  uint32_t oslot;
  int full;
  core_rank *ob = core_observer_slot(j, &oslot, &full);
  ck_assert_int_eq(core_register_units(j, ob, ab, 2, ids_ab, 0, why,
                                       sizeof why),
                   GNMR_OK);
  ck_assert_uint_eq(ob->slots[0], 2);
  ck_assert_uint_eq(ob->slots[1], 1);
  ck_assert_uint_eq(j->n_units, 3);
  ck_assert_uint_eq(j->unit_id[0], 10);
  ck_assert_uint_eq(j->unit_id[1], 20);
  ck_assert_uint_eq(j->unit_id[2], 4000000000u);
  ck_assert_str_eq(j->unit_names[2], "a");
  ck_assert_uint_eq(j->ranks[0].slots[0], 2); /* rank 0's "a" moved */
  ck_assert_uint_eq(j->ranks[0].slots[1], 0);
  ck_assert_uint_eq(j->shards[2], 1); /* an observer adds no shard */
  ck_assert_uint_eq(j->shards[1], 0);
  ck_assert_int_eq(policy_unit(j->pol, 2, &after_a), GNMR_OK);
  ck_assert_int_eq(policy_unit(j->pol, 0, &after_c), GNMR_OK);
  ck_assert_int_eq(policy_unit(j->pol, 1, &b_new), GNMR_OK);
  ck_assert_uint_eq(after_a.cnt, before_a.cnt);
  ck_assert(after_a.mean == before_a.mean && after_a.active);
  ck_assert_uint_eq(after_c.cnt, before_c.cnt);
  ck_assert_uint_eq(b_new.cnt, 0);
  /* a restore from a snapshot that knew only c and a (ids 10, 4e9):
   * built from j's engine without "b" */
  size_t len = policy_export_size(j->pol), got;
  void *snap = malloc(len);
  policy *pol = NULL;
  static const uint32_t snap_ids[] = {10, 4000000000u};
  ck_assert_int_eq(policy_export(j->pol, snap, len, &got), GNMR_OK);
  ck_assert_int_eq(policy_import(snap, got, &pol), GNMR_OK);
  ck_assert_int_eq(policy_remap(pol, 2, (uint32_t[]){0, UINT32_MAX, 1}),
                   GNMR_OK);
  ck_assert_int_eq(policy_remap(pol, 2, (uint32_t[]){1, 1}), GNMR_E_INVAL);
  free(snap);
  core_job *r = new_job("sparse-back", 2, 10);
  char *names[] = {"a", "b", "c"};
  uint32_t uids[] = {4000000000u, 20, 10};
  uint32_t n[] = {2, 2}, r0[] = {4000000000u, 10}, r1[] = {4000000000u, 20};
  uint32_t *rids[] = {r0, r1};
  ck_assert_int_eq(
      core_restart_restore(r, pol, snap_ids, 3, uids, names, 2, n, rids),
      GNMR_OK);
  ck_assert_uint_eq(r->n_units, 3);
  ck_assert_uint_eq(r->unit_id[1], 20);
  policy_unit_info ra, rb;
  ck_assert_int_eq(policy_unit(r->pol, 2, &ra), GNMR_OK);
  ck_assert_int_eq(policy_unit(r->pol, 1, &rb), GNMR_OK);
  ck_assert_uint_eq(ra.cnt, before_a.cnt);
  ck_assert(ra.active);
  ck_assert_uint_eq(rb.cnt, 0);
  ck_assert_uint_eq(r->shards[2], 2);
  ck_assert_uint_eq(r->ranks[1].slots[1], 1);
}
END_TEST

START_TEST(registry_finds_iterates_and_frees) {
  new_job("x", 1, 10);
  new_job("y", 1, 10);
  ck_assert_uint_eq(core_count(&reg), 2);
  ck_assert_str_eq(core_find(&reg, "y")->name, "y");
  ck_assert_ptr_null(core_find(&reg, "z"));
  size_t pos = 0, n = 0;
  while (core_next_job(&reg, &pos) != NULL)
    n++;
  ck_assert_uint_eq(n, 2);
  core_job *x = core_find(&reg, "x");
  core_job_free(&reg, &x);
  ck_assert_ptr_null(x); /* the caller's pointer is nulled */
  ck_assert_uint_eq(core_count(&reg), 1);
}
END_TEST

/* A new job's unit table made ahead (off the loop, for large Hellos) is
 * what registering the same names gives: ids, names, the map, the
 * rank's slots, the shards; it does not apply to a job with units or a
 * rank registered already, and it keeps max_units. */
START_TEST(a_prepared_unit_table_registers_as_the_names_would) {
  static const char *const names[] = {"q", "k", "v", "o"};
  char why[160];
  core_job *a = new_job("a", 2, 10), *b = new_job("b", 2, 10);
  core_prepared *p;
  ck_assert_int_eq(core_prepare_units(names, 4, &p), GNMR_OK);
  ck_assert_int_eq(core_register_prepared(a, &a->ranks[0], &p, 1, why,
                                          sizeof why), GNMR_OK);
  ck_assert_ptr_null(p); /* taken over */
  ck_assert_int_eq(core_register_units(b, &b->ranks[0], names, 4, NULL, 1,
                                       why, sizeof why), GNMR_OK);
  ck_assert_uint_eq(a->n_units, b->n_units);
  for (uint32_t i = 0; i < 4; i++) {
    uint64_t va, vb;
    ck_assert_uint_eq(a->unit_id[i], b->unit_id[i]);
    ck_assert_str_eq(a->unit_names[i], b->unit_names[i]);
    ck_assert_uint_eq(a->shards[i], b->shards[i]);
    ck_assert_uint_eq(a->ranks[0].ids[i], b->ranks[0].ids[i]);
    ck_assert_uint_eq(a->ranks[0].slots[i], b->ranks[0].slots[i]);
    ck_assert(hmap_get(&a->unit_ids, names[i], strlen(names[i]), &va));
    ck_assert(hmap_get(&b->unit_ids, names[i], strlen(names[i]), &vb));
    ck_assert_uint_eq(va, vb);
  }
  ck_assert(a->ranks[0].ever);
  /* the second rank registers the same names the usual way: shards 2 */
  ck_assert_int_eq(core_register_units(a, &a->ranks[1], names, 4, NULL, 1,
                                       why, sizeof why), GNMR_OK);
  ck_assert_uint_eq(a->shards[2], 2);
  /* not for a job that has units: 1, nothing changed, the table kept */
  ck_assert_int_eq(core_prepare_units(names, 4, &p), GNMR_OK);
  core_job *c = new_job("c", 2, 10);
  join(c, 0, two, 2);
  ck_assert_int_eq(core_register_prepared(c, &c->ranks[1], &p, 1, why,
                                          sizeof why), 1);
  ck_assert_ptr_nonnull(p);
  ck_assert_uint_eq(c->n_units, 2);
  /* past max_units: refused, as registering would be */
  core_job *e = new_job("e", 1, 10);
  e->max_units = 3;
  ck_assert_int_eq(core_register_prepared(e, &e->ranks[0], &p, 1, why,
                                          sizeof why), GNMR_E_RANGE);
  ck_assert_msg(strstr(why, "at most 3 units") != NULL, "%s", why);
  ck_assert_uint_eq(e->n_units, 0);
  core_prepared_free(&p); /* the caller's when not taken */
  ck_assert_ptr_null(p);
  core_prepared_free(&p); /* and again: nothing */
}
END_TEST

/* The map under the units' names: reserve, add, borrowed keys; names
 * that differ only in their digits (a model's) keep probe runs short. */
START_TEST(unit_name_map_reserves_adds_and_borrows) {
  enum { N = 1 << 16 };
  hmap m = {0};
  char **names = malloc(N * sizeof *names);
  ck_assert_int_eq(hmap_reserve(&m, N), GNMR_OK);
  size_t cap = m.cap;
  ck_assert_uint_ge(cap * 7, (size_t)N * 10);
  for (int i = 0; i < N; i++) {
    char nm[64];
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.down_proj",
             i / 64, i % 64);
    names[i] = strdup(nm);
    ck_assert_int_eq(hmap_add(&m, names[i], strlen(names[i]), (uint64_t)i),
                     GNMR_OK);
  }
  ck_assert_uint_eq(m.cap, cap); /* reserved: no growth while adding */
  ck_assert_uint_eq(m.live, N);
  size_t run = 0, longest = 0;
  for (size_t i = 0; i < m.cap; i++) {
    run = m.slots[i].key != NULL ? run + 1 : 0;
    longest = run > longest ? run : longest;
  }
  /* at most 70% full: runs of tens (34 for these names) */
  ck_assert_msg(longest < 200, "a probe run of %zu slots", longest);
  uint64_t v;
  ck_assert(hmap_get(&m, "model.layers.7.mlp.experts.3.down_proj", 38, &v));
  ck_assert_uint_eq(v, 7 * 64 + 3);
  ck_assert(!hmap_get(&m, "model.layers.7.mlp.experts.3.down_pro", 37, NULL));
  ck_assert_int_eq(hmap_put(&m, names[5], strlen(names[5]), 99), GNMR_OK);
  ck_assert(hmap_get(&m, names[5], strlen(names[5]), &v) && v == 99);
  ck_assert_uint_eq(m.live, N);
  ck_assert(hmap_del(&m, names[5], strlen(names[5])));
  ck_assert(!hmap_get(&m, names[5], strlen(names[5]), NULL));
  hmap_clear(&m); /* the map's own copies of the keys */
  /* borrowed keys: the map holds the caller's pointers and frees none
   * (valgrind and ASan see a double free or a leak otherwise) */
  hmap b = {0};
  b.borrowed = 1;
  for (int i = 0; i < 100; i++)
    ck_assert_int_eq(hmap_add(&b, names[i], strlen(names[i]), (uint64_t)i),
                     GNMR_OK);
  int ours = 0; /* the slot holds the caller's own pointer */
  for (size_t i = 0; i < b.cap; i++)
    ours += b.slots[i].key == names[7];
  ck_assert_int_eq(ours, 1);
  ck_assert(hmap_get(&b, names[42], strlen(names[42]), &v) && v == 42);
  ck_assert(hmap_del(&b, names[42], strlen(names[42])));
  hmap_clear(&b);
  ck_assert_int_eq(b.borrowed, 1); /* stays borrowed for reuse */
  for (int i = 0; i < N; i++)
    free(names[i]);
  free(names);
  /* an empty map answers without hashing, a reserve of 0 does nothing */
  hmap e = {0};
  ck_assert(!hmap_get(&e, "x", 1, NULL));
  ck_assert_int_eq(hmap_reserve(&e, 0), GNMR_OK);
  hmap_clear(&e);
}
END_TEST

/* SipHash: the reference's SipHash-2-4 vector (key 00..0f, message
 * 00..0e), so that the rounds and the padding are the algorithm's; the
 * keyed maps use SipHash-1-3 of the same code. */
START_TEST(siphash_gives_its_reference_vector) {
  unsigned char msg[15];
  for (int i = 0; i < 15; i++)
    msg[i] = (unsigned char)i;
  ck_assert_uint_eq(hmap__siphash(0x0706050403020100ull,
                                  0x0f0e0d0c0b0a0908ull, 2, 4, msg, 15),
                    0xa129ca6149be45e5ull);
  /* the empty message of the same key */
  ck_assert_uint_eq(hmap__siphash(0x0706050403020100ull,
                                  0x0f0e0d0c0b0a0908ull, 2, 4, msg, 0),
                    0x726fdb47dd0e0e31ull);
}
END_TEST

static uint64_t fnv1a(uint64_t h, const char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
  return h;
}

/* 2^BITS names that share FNV-1a's low BITS + 1 bits (a multicollision:
 * BITS pairs of 3-character blocks, each pair meeting in those bits, any
 * choice of one block of each pair): what a hostile peer can send in a
 * Hello. Names "u" + 3 * BITS characters, in one block of NUL-ended
 * strings; *names points into it. */
static char *colliding_names(int bits, char ***names) {
  enum { L = 1 + 3 * 20 };
  const uint64_t mask = (2ull << bits) - 1;
  static const char al[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  char pair[20][2][3];
  uint64_t state = fnv1a(1469598103934665603ull, "u", 1);
  for (int b = 0; b < bits; b++) {
    /* a birthday search among the 36^3 blocks from this state */
    static uint32_t seen[1 << 21];
    memset(seen, 0, sizeof seen);
    int found = 0;
    for (int x = 0; x < 36 * 36 * 36 && !found; x++) {
      char blk[3] = {al[x % 36], al[x / 36 % 36], al[x / 1296]};
      uint64_t low = fnv1a(state, blk, 3) & mask;
      if (seen[low] != 0) {
        int y = (int)seen[low] - 1;
        char other[3] = {al[y % 36], al[y / 36 % 36], al[y / 1296]};
        memcpy(pair[b][0], other, 3);
        memcpy(pair[b][1], blk, 3);
        state = fnv1a(state, blk, 3); /* its low bits: the pair's */
        found = 1;
      } else {
        seen[low] = (uint32_t)x + 1;
      }
    }
    ck_assert_msg(found, "no pair of blocks at %d", b);
  }
  size_t n = (size_t)1 << bits;
  char *block = malloc(n * (L + 1));
  *names = malloc(n * sizeof **names);
  ck_assert(block != NULL && *names != NULL);
  for (size_t i = 0; i < n; i++) {
    char *at = block + i * (L + 1);
    (*names)[i] = at;
    *at++ = 'u';
    for (int b = 0; b < bits; b++) {
      memcpy(at, pair[b][(i >> b) & 1], 3);
      at += 3;
    }
    *at = '\0';
  }
  return block;
}

/* A peer's unit names cannot all fall in one probe run: the maps that
 * hold them (a job's names, a prepared table, a Hello's duplicate check)
 * hash them with a per-process key. 2^15 names that share FNV-1a's low
 * 16 bits (the slot in a table of 2^16: every insert would probe past all
 * the names before it, 2^29 probes in all) spread under the keyed hash as
 * any names do; a keyed map finds each, and a duplicate among them is
 * still found. */
START_TEST(names_that_collide_under_fnv_do_not_under_the_keyed_hash) {
  enum { BITS = 15, N = 1 << BITS };
  char **names;
  char *block = colliding_names(BITS, &names);
  const uint64_t cap = 2 * N;
  uint64_t first = hmap_hash(names[0], strlen(names[0])) & (cap - 1);
  for (size_t i = 1; i < N; i++) /* the attack is real: one FNV slot */
    ck_assert_uint_eq(hmap_hash(names[i], strlen(names[i])) & (cap - 1),
                      first);
  /* linear probing of the keyed hashes into 2N slots: about 1.5 probes a
   * name, as for any names (one FNV run: N / 2 a name) */
  uint8_t *used = calloc(cap, 1);
  uint64_t probes = 0;
  for (size_t i = 0; i < N; i++) {
    uint64_t k = hmap_hash_keyed(names[i], strlen(names[i])) & (cap - 1);
    for (probes++; used[k]; k = (k + 1) & (cap - 1))
      probes++;
    used[k] = 1;
  }
  free(used);
  printf("colliding names: %d of them in one FNV-1a slot; keyed: %.2f "
         "probes a name\n", N, (double)probes / N);
  ck_assert_uint_lt(probes, 4 * (uint64_t)N);
  hmap m = {0};
  m.borrowed = 1;
  m.keyed = 1;
  for (size_t i = 0; i < N; i++)
    ck_assert_int_eq(hmap_add(&m, names[i], strlen(names[i]), i), GNMR_OK);
  uint64_t v = 0;
  for (size_t i = 0; i < N; i += 97)
    ck_assert(hmap_get(&m, names[i], strlen(names[i]), &v) && v == i);
  ck_assert_int_eq(hmap_del(&m, names[5], strlen(names[5])), 1);
  ck_assert(!hmap_get(&m, names[5], strlen(names[5]), NULL));
  hmap_clear(&m);
  ck_assert_int_eq(m.keyed, 1); /* kept through a clear, as borrowed */
  hmap_clear(&m);
  /* the core's maps of a job's names and of a prepared table are keyed,
   * and take the colliding names as any */
  char why[160];
  core_job *a = new_job("keyed", 2, 10);
  core_prepared *p;
  ck_assert_int_eq(core_prepare_units((const char *const *)names, N, &p),
                   GNMR_OK);
  ck_assert_int_eq(p->map.keyed, 1);
  ck_assert_int_eq(a->unit_ids.keyed, 1);
  ck_assert_int_eq(core_register_prepared(a, &a->ranks[0], &p, 1, why,
                                          sizeof why), GNMR_OK);
  ck_assert_int_eq(core_register_units(a, &a->ranks[1],
                                       (const char *const *)names, N, NULL, 1,
                                       why, sizeof why), GNMR_OK);
  ck_assert_uint_eq(a->n_units, N);
  ck_assert_uint_eq(a->shards[N - 1], 2);
  /* a Hello of them: accepted, and refused with one listed twice */
  Gnmr__Hello h = GNMR__HELLO__INIT;
  h.protocol = GNMR_PROTOCOL_VERSION;
  h.job = "collide";
  h.reporters = 1;
  h.n_units = N;
  h.units = names;
  policy_params defaults, out;
  policy_params_default(&defaults);
  uint32_t barrier = 0;
  const char *ref = NULL;
  char msg[256];
  ck_assert_int_eq(gnmr__validate_hello(&h, &defaults, 0, &out, &barrier,
                                        &ref, msg, sizeof msg), GNMR_OK);
  names[N - 1] = names[3];
  ck_assert_int_eq(gnmr__validate_hello(&h, &defaults, 0, &out, &barrier,
                                        &ref, msg, sizeof msg), GNMR_E_DUP);
  ck_assert_str_eq(ref, "units");
  free(names);
  free(block);
}
END_TEST

/* The Envelope of a Hello of n names, as bytes (the caller frees). */
static uint8_t *hello_envelope(char **names, size_t n, size_t *len) {
  Gnmr__Envelope e = GNMR__ENVELOPE__INIT;
  Gnmr__Hello h = GNMR__HELLO__INIT;
  h.protocol = GNMR_PROTOCOL_VERSION;
  h.job = "scan";
  h.reporters = 1;
  h.n_units = n;
  h.units = names;
  e.version = GNMR_PROTOCOL_VERSION;
  e.body_case = GNMR__ENVELOPE__BODY_HELLO;
  e.hello = &h;
  uint8_t *buf;
  ck_assert_int_eq(gnmr__wire_encode(&e, &buf, len), GNMR_OK);
  return buf;
}

/* Decoded and validated, as gnmrd judges a Hello: the code, and its
 * message in msg. */
static int judged(const uint8_t *buf, size_t len, char *msg, size_t cap) {
  Gnmr__Envelope *e = NULL;
  int rv = gnmr__wire_decode(buf, len, &e, msg, cap);
  if (rv != GNMR_OK)
    return rv;
  policy_params defaults, out;
  policy_params_default(&defaults);
  uint32_t barrier;
  const char *ref;
  rv = gnmr__validate_hello(e->hello, &defaults, 0, &out, &barrier, &ref,
                            msg, cap);
  gnmr__wire_free(&e);
  return rv;
}

/* Issue 62: a large Hello's duplicate names are found in its bytes before
 * it is decoded, with the decoder's own message; whatever the scan does
 * not read plainly (a name that is not valid, bytes cut short, a body
 * given twice) is left to the decoder. */
START_TEST(a_hellos_duplicate_names_are_found_in_its_bytes) {
  enum { N = 4096 };
  char **names = malloc(N * sizeof *names);
  for (int i = 0; i < N; i++) {
    names[i] = malloc(48);
    snprintf(names[i], 48, "model.layers.%d.mlp.experts.%d", i / 64, i % 64);
  }
  size_t len;
  const char *ref = NULL;
  char msg[256], want[256];
  uint8_t *b = hello_envelope(names, N, &len);
  ck_assert_int_eq(gnmr__hello_bytes_dup(b, len, &ref, msg, sizeof msg),
                   GNMR_OK);
  free(b);
  char *keep = names[N - 1];
  names[N - 1] = names[7];
  b = hello_envelope(names, N, &len);
  ck_assert_int_eq(gnmr__hello_bytes_dup(b, len, &ref, msg, sizeof msg),
                   GNMR_E_DUP);
  ck_assert_str_eq(ref, "units");
  ck_assert_int_eq(judged(b, len, want, sizeof want), GNMR_E_DUP);
  ck_assert_str_eq(msg, want); /* the decoder's own words */
  /* cut short anywhere: left to the decoder, which refuses it */
  for (size_t cut = 1; cut < 64; cut++)
    ck_assert_int_eq(gnmr__hello_bytes_dup(b, len - cut, &ref, msg,
                                           sizeof msg), GNMR_OK);
  /* the Envelope's body twice: the decoder keeps the last */
  uint8_t *twice = malloc(2 * len);
  memcpy(twice, b, len);
  memcpy(twice + len, b, len);
  ck_assert_int_eq(gnmr__hello_bytes_dup(twice, 2 * len, &ref, msg,
                                         sizeof msg), GNMR_OK);
  free(twice);
  free(b);
  /* a name with a control character, listed twice: not a valid name,
   * so the decoder's check says what is wrong (never the raw bytes in a
   * message) */
  char bad[] = "unit\x1b[31m";
  char *keep2 = names[N - 2];
  names[N - 1] = bad;
  names[N - 2] = bad;
  b = hello_envelope(names, N, &len);
  ck_assert_int_eq(gnmr__hello_bytes_dup(b, len, &ref, msg, sizeof msg),
                   GNMR_OK);
  ck_assert_int_eq(judged(b, len, want, sizeof want), GNMR_E_INVAL);
  free(b);
  names[N - 1] = keep;
  names[N - 2] = keep2;
  /* not a Hello, junk, nothing: nothing said */
  static const uint8_t junk[] = {0x52, 0x05, 0x2a, 0x03, 'a', 'b'};
  ck_assert_int_eq(gnmr__hello_bytes_dup(junk, sizeof junk, &ref, msg,
                                         sizeof msg), GNMR_OK);
  ck_assert_int_eq(gnmr__hello_bytes_dup(junk, 0, &ref, msg, sizeof msg),
                   GNMR_OK);
  for (int i = 0; i < N; i++)
    free(names[i]);
  free(names);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("core");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, shards_are_summed_in_rank_order_not_arrival_order);
  tcase_add_test(tc, shards_are_summed_node_by_node_as_a_relay_sums_them);
  tcase_add_test(tc, a_shard_said_missing_makes_its_unit_missing);
  tcase_add_test(tc, unit_name_map_reserves_adds_and_borrows);
  tcase_add_test(tc, a_prepared_unit_table_registers_as_the_names_would);
  tcase_add_test(tc, deadline_decides_with_missing_shards);
  tcase_add_test(tc, steps_are_decided_in_order);
  tcase_add_test(tc, adopted_steps_stay_decided);
  tcase_add_test(tc, duplicate_far_and_full_reports_are_refused);
  tcase_add_test(tc, layout_unknown_until_every_rank_joined);
  tcase_add_test(tc, not_reported_nonfinite_and_partial);
  tcase_add_test(tc, byes_lower_the_barrier_and_finish_the_job);
  tcase_add_test(tc, a_sharded_units_measure_is_its_largest_shards);
  tcase_add_test(tc, registration_is_all_or_nothing);
  tcase_add_test(tc, observers_add_no_shard_and_slots_are_reused);
  tcase_add_test(tc, a_rank_back_below_its_step_starts_a_new_pass);
  tcase_add_test(tc, restore_rebuilds_units_ranks_and_statistics);
  tcase_add_test(tc, sparse_ids_take_slots_in_id_order);
  tcase_add_test(tc, registry_finds_iterates_and_frees);
  tcase_add_test(tc, one_rank_far_ahead_cannot_freeze_the_job);
  tcase_add_test(tc, siphash_gives_its_reference_vector);
  tcase_add_test(tc, names_that_collide_under_fnv_do_not_under_the_keyed_hash);
  tcase_add_test(tc, a_hellos_duplicate_names_are_found_in_its_bytes);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
