/* SPDX-License-Identifier: MIT */
/* test_policy_state.c — the engine's state across calls: export/import
 * (both snapshot format versions), corrupt and truncated snapshots,
 * parameter changes with their effect on windows and budget, resize,
 * snapshots taken on another thread while the engine changes, and the
 * stable event names. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "check_main.h"
#include "policyutil.h"

/* ---- export / import, parameter changes, resize ------------------------------ */
static void fill_norms(double *norm, uint32_t n, uint64_t t) {
  for (uint32_t i = 0; i < n; i++) {
    norm[i] = 1.0 + 0.1 * (double)((t * 7 + i * 13) % 5);
    if ((t + i) % 17 == 0)
      norm[i] *= 8;
    if ((t * 3 + i) % 41 == 0)
      norm[i] = NAN;
  }
}

START_TEST(export_import_continues_identically) {
  policy_params p = params(1.8, 1.6, 4, 3, 2, 5);
  policy *a = make(&p, 20), *b = NULL;
  double norm[20];
  for (uint64_t t = 1; t <= 40; t++) {
    fill_norms(norm, 20, t);
    step(a, t, norm, NULL, NULL);
  }
  size_t need = policy_export_size(a), len = 0;
  unsigned char *buf = malloc(need);
  ck_assert_int_eq(policy_export(a, buf, need - 1, &len), GNMR_E_RANGE);
  ck_assert_int_eq(policy_export(a, buf, need, &len), GNMR_OK);
  ck_assert_uint_eq(len, need);
  ck_assert_int_eq(policy_import(buf, len, &b), GNMR_OK);
  ck_assert_uint_eq(policy_last_step(b), 40);
  ck_assert_uint_eq(policy_units(b), 20);
  for (uint64_t t = 41; t <= 120; t++) {
    policy_result ra, rb;
    fill_norms(norm, 20, t);
    char sa[256];
    strcpy(sa, step(a, t, norm, NULL, &ra));
    ck_assert_str_eq(step(b, t, norm, NULL, &rb), sa);
    ck_assert_uint_eq(ra.n_events, rb.n_events);
    ck_assert(memcmp(ra.events, rb.events,
                     ra.n_events * sizeof *ra.events) == 0);
  }
  free(buf);
  policy_destroy(&a);
  policy_destroy(&b);
}
END_TEST

/* The measured signal's statistics and windows are part of the state: a
 * job restored from a snapshot scores the measures as the one that went
 * on; a snapshot whose measure state does not hold together is refused;
 * turning the rule on starts it fresh, off drops it, both keeping the
 * norms' statistics. */
static void fill_measures(double *x, uint32_t n, uint64_t t) {
  for (uint32_t i = 0; i < n; i++) {
    x[i] = 0.01 * (1 + i) * (1.0 + 0.05 * (double)((t * 5 + i * 3) % 7));
    if ((t + 2 * i) % 13 == 0)
      x[i] *= 4;
    if ((t + i) % 11 == 0)
      x[i] = NAN;
  }
}

/* Seals len bytes of a snapshot as snapshot.c's layout comment says
 * (version 2 on): FNV-1a over little-endian 64-bit words in four lanes,
 * the tail zero-padded, the lanes and the length folded; little-endian
 * hosts. */
static void reseal(unsigned char *buf, size_t len) {
  const uint64_t off = 1469598103934665603ull, prime = 1099511628211ull;
  uint64_t h[4] = {off, off ^ 1, off ^ 2, off ^ 3}, w;
  size_t n = len - 8, i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 4; l++) {
      memcpy(&w, buf + i + 8 * l, 8);
      h[l] = (h[l] ^ w) * prime;
    }
  for (int l = 0; i < n; i += 8, l++) {
    w = 0;
    memcpy(&w, buf + i, n - i < 8 ? n - i : 8);
    h[l] = (h[l] ^ w) * prime;
  }
  uint64_t f = off;
  for (int l = 0; l < 4; l++)
    f = (f ^ h[l]) * prime;
  f = (f ^ (uint64_t)n) * prime;
  memcpy(buf + n, &f, 8);
}

START_TEST(measured_state_survives_a_snapshot) {
  policy_params p = params(1.8, 1.6, 4, 3, 2, 5);
  p.measure_alpha = 2;
  p.measure_beta = 2.5;
  p.mean_horizon = 6;
  p.job_relative = 1;
  p.same_step = 1;
  policy *a = make(&p, 12), *b = NULL, *c = NULL;
  double norm[12], x[12];
  policy_result ra, rb;
  for (uint64_t t = 1; t <= 30; t++) {
    fill_norms(norm, 12, t);
    fill_measures(x, 12, t);
    step_m(a, t, norm, NULL, x, &ra);
  }
  size_t need = policy_export_size(a), len = 0;
  unsigned char *buf = malloc(need);
  ck_assert_int_eq(policy_export(a, buf, need, &len), GNMR_OK);
  ck_assert_int_eq(policy_import(buf, len, &b), GNMR_OK);
  ck_assert(policy_params_equal(policy_get_params(b), &p));
  int measured_risky = 0;
  for (uint64_t t = 31; t <= 90; t++) {
    fill_norms(norm, 12, t);
    fill_measures(x, 12, t);
    char sa[256];
    strcpy(sa, step_m(a, t, norm, NULL, x, &ra));
    ck_assert_str_eq(step_m(b, t, norm, NULL, x, &rb), sa);
    ck_assert_uint_eq(ra.n_events, rb.n_events);
    ck_assert(memcmp(ra.events, rb.events,
                     ra.n_events * sizeof *ra.events) == 0);
    for (uint32_t i = 0; i < ra.n_events; i++)
      measured_risky += ra.events[i].kind == POLICY_EV_EXCEED &&
                        (ra.events[i].signal & POLICY_SIGNAL_MEASURE);
  }
  ck_assert_int_gt(measured_risky, 0);
  /* resealed as it was, it imports; a window value that is not a ratio
   * (negative), resealed, does not; nor does any cut */
  ck_assert_int_eq(policy_export(a, buf, need, &len), GNMR_OK);
  reseal(buf, len);
  ck_assert_int_eq(policy_import(buf, len, &c), GNMR_OK);
  policy_destroy(&c);
  size_t at = len - 8 - 8; /* the last unit's newest measure ratio */
  double neg = -1;
  memcpy(buf + at, &neg, 8);
  reseal(buf, len);
  ck_assert_int_eq(policy_import(buf, len, &c), GNMR_E_PARSE);
  ck_assert_ptr_null(c);
  for (size_t cut = 0; cut < len; cut += 7)
    ck_assert_int_ne(policy_import(buf, cut, &c), GNMR_OK);
  /* off: the measure's state goes, the norms' stays */
  policy_unit_info before, after;
  policy_unit(a, 3, &before);
  policy_params q = p;
  q.measure_alpha = q.measure_beta = 0;
  ck_assert_int_eq(policy_set_params(a, &q), GNMR_OK);
  policy_unit(a, 3, &after);
  ck_assert_uint_eq(after.cnt, before.cnt);
  ck_assert_uint_eq(after.mcnt, 0);
  ck_assert_uint_lt(policy_export_size(a), need);
  /* on again: fresh, no history */
  ck_assert_int_eq(policy_set_params(a, &p), GNMR_OK);
  policy_unit(a, 3, &after);
  ck_assert(after.mcnt == 0 && isnan(after.mmean));
  free(buf);
  policy_destroy(&a);
  policy_destroy(&b);
}
END_TEST

/* A version-1 snapshot (written by gnmrd before version 2: the bytes of
 * version 4 without the optional rules' parameters in the header and each
 * unit's run of exceedances, a byte-wise FNV-1a checksum) still imports,
 * to the same state with the rules off; an unknown version is VERSION,
 * not PARSE. */
static uint64_t fnv1a_bytes(const unsigned char *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* The bytes of a version-5 snapshot of n units (the measured rule off) in
 * version 1's layout, without the checksum: returns their length. */
static size_t v4_to_v1(const unsigned char *v4, uint32_t n,
                       unsigned char *out) {
  enum { HEAD2 = 8 + 4 + 4 + 4 * 8 + 3 * 4 + 3 * 8, RULES = 8 + 4 + 4 + 16 + 4 + 4,
         UNIT = 8 + 8 + 8 + 4 + 1 + 4, RUN = 8 + 4 };
  size_t at = HEAD2 + RULES, len = HEAD2;
  memcpy(out, v4, HEAD2);
  for (uint32_t u = 0; u < n; u++) {
    uint32_t wl;
    memcpy(&wl, v4 + at + UNIT - 4, 4); /* little-endian hosts */
    size_t one = UNIT + 8 * (size_t)wl;
    memcpy(out + len, v4 + at, one);
    len += one;
    at += one + RUN;
  }
  out[8] = 1;
  return len;
}

START_TEST(version_1_snapshots_still_import) {
  policy_params p = params(2, 2, 3, 2, 2, 0);
  policy *a = make(&p, 5), *b = NULL, *c = NULL;
  double norm[5];
  for (uint64_t t = 1; t <= 10; t++) {
    fill_norms(norm, 5, t);
    step(a, t, norm, NULL, NULL);
  }
  size_t len = policy_export_size(a), len2 = 0;
  unsigned char *v4 = malloc(len), *v1 = malloc(len), *again = malloc(len),
                *again1 = malloc(len);
  ck_assert_int_eq(policy_export(a, v4, len, &len), GNMR_OK);
  ck_assert_uint_eq(v4[8], 5); /* version 5 is written */
  size_t body = v4_to_v1(v4, 5, v1), len1 = body + 8;
  uint64_t h = fnv1a_bytes(v1, body);
  for (int i = 0; i < 8; i++)
    v1[body + i] = (unsigned char)(h >> (8 * i));
  ck_assert_int_eq(policy_import(v1, len1, &b), GNMR_OK);
  ck_assert_uint_eq(policy_get_params(b)->mean_horizon, 0);
  ck_assert_uint_eq(policy_get_params(b)->confirm_steps, 0);
  ck_assert_int_eq(policy_export(b, again, len, &len2), GNMR_OK);
  ck_assert_uint_eq(len2, len);
  /* the same state, but for the runs of exceedances version 1 had not */
  ck_assert_uint_eq(v4_to_v1(again, 5, again1), body);
  ck_assert_int_eq(memcmp(again1 + 9, v1 + 9, body - 9), 0);
  v1[len1 - 1] ^= 1; /* a version-1 checksum is checked too */
  ck_assert_int_eq(policy_import(v1, len1, &c), GNMR_E_PARSE);
  memcpy(v1, v4, len);
  v1[8] = 6; /* a future version, its checksum intact */
  h = fnv1a_bytes(v1, len - 8);
  for (int i = 0; i < 8; i++)
    v1[len - 8 + i] = (unsigned char)(h >> (8 * i));
  ck_assert_int_eq(policy_import(v1, len, &c), GNMR_E_VERSION);
  ck_assert_ptr_null(c);
  free(v1);
  free(v4);
  free(again);
  free(again1);
  policy_destroy(&a);
  policy_destroy(&b);
}
END_TEST

/* Version 4 keeps each unit's run of exceedances (confirm_steps): a job
 * restored from a snapshot decides the next steps as the one that went
 * on, a run that straddles the snapshot included. */
START_TEST(a_run_of_exceedances_survives_a_snapshot) {
  policy_params p = params(2, 1e9, 1, 4, 0, 0);
  p.confirm_steps = 2;
  policy *a = make(&p, 2), *b = NULL;
  double n[2] = {1, 1};
  step(a, 1, n, NULL, NULL);
  n[1] = 10; /* unit 1 exceeds: the run's first step */
  ck_assert_str_eq(step(a, 2, n, NULL, NULL), "");
  size_t len = policy_export_size(a);
  unsigned char *buf = malloc(len);
  ck_assert_int_eq(policy_export(a, buf, len, &len), GNMR_OK);
  ck_assert_int_eq(policy_import(buf, len, &b), GNMR_OK);
  n[1] = 100; /* its second: risky in both */
  ck_assert_str_eq(step(a, 3, n, NULL, NULL), "1");
  ck_assert_str_eq(step(b, 3, n, NULL, NULL), "1");
  policy_destroy(&b);
  free(buf);
  policy_destroy(&a);
}
END_TEST

START_TEST(import_rejects_truncated_and_corrupt_state) {
  policy_params p = params(2, 2, 3, 2, 2, 0);
  policy *a = make(&p, 5), *b = (policy *)1;
  double norm[5];
  for (uint64_t t = 1; t <= 10; t++) {
    fill_norms(norm, 5, t);
    step(a, t, norm, NULL, NULL);
  }
  size_t len = policy_export_size(a);
  unsigned char *buf = malloc(len), *cp = malloc(len);
  ck_assert_int_eq(policy_export(a, buf, len, &len), GNMR_OK);
  for (size_t cut = 0; cut < len; cut++) {
    ck_assert_int_ne(policy_import(buf, cut, &b), GNMR_OK);
    ck_assert_ptr_null(b);
  }
  for (size_t i = 0; i < len; i++) {
    memcpy(cp, buf, len);
    cp[i] ^= 0x5a;
    ck_assert_int_ne(policy_import(cp, len, &b), GNMR_OK);
    ck_assert_ptr_null(b);
  }
  ck_assert_int_eq(policy_import(NULL, 0, &b), GNMR_E_PARSE);
  ck_assert_int_eq(policy_import(buf, len, NULL), GNMR_E_INVAL);
  free(buf);
  free(cp);
  policy_destroy(&a);
}
END_TEST

START_TEST(set_params_keeps_newest_window_values_and_statistics) {
  policy_params p = params(1e9, 1e9, 4, 2, 2, 0);
  policy *e = make(&p, 1);
  policy_result r;
  const double n[] = {1, 2, 4, 8, 16};
  for (int t = 0; t < 5; t++)
    step(e, t + 1, &n[t], NULL, &r);
  /* g: t4 = 8/(7/3), t5 = 16/3.75; window 4 holds g2..g5 */
  double g4 = 8 / (7.0 / 3), g5 = 16 / 3.75;
  p.window = 2; /* keep the newest two: g4, g5 */
  ck_assert_int_eq(policy_set_params(e, &p), GNMR_OK);
  double x = 31;
  step(e, 6, &x, NULL, &r);
  double g6 = 31 / 6.2;
  ck_assert_double_eq_tol(r.g[0], g6, 1e-12);
  ck_assert_double_eq_tol(r.d[0], g6 / ((g4 + g5) / 2), 1e-12);
  /* growing the window keeps the values too: window 2 after g6 is [g5, g6] */
  p.window = 8;
  ck_assert_int_eq(policy_set_params(e, &p), GNMR_OK);
  step(e, 7, &x, NULL, &r);
  double g7 = 31 / (62.0 / 6);
  ck_assert_double_eq_tol(r.d[0], g7 / ((g5 + g6) / 2), 1e-12);
  /* a bad change is refused and nothing changes */
  p.alpha = -1;
  ck_assert_int_eq(policy_set_params(e, &p), GNMR_E_INVAL);
  ck_assert_double_eq(policy_get_params(e)->alpha, 1e9);
  policy_destroy(&e);
}
END_TEST

START_TEST(set_params_changes_budget_from_next_step) {
  policy_params p = params(2, 2, 8, 3, 0, 0);
  policy *e = make(&p, 4);
  double n[4] = {1, 1, 1, 1}, m[4] = {9, 8, 7, 1};
  step(e, 1, n, NULL, NULL);
  ck_assert_str_eq(step(e, 2, m, NULL, NULL), "0 1 2");
  p.max_active = 1;
  ck_assert_int_eq(policy_set_params(e, &p), GNMR_OK);
  double q[4] = {90, 80, 70, 1};
  policy_result r;
  ck_assert_str_eq(step(e, 3, q, NULL, &r), "0");
  ck_assert_int_eq(count_events(&r, POLICY_EV_DEMOTE, UINT32_MAX), 2);
  policy_destroy(&e);
}
END_TEST

START_TEST(resize_adds_units_without_history) {
  policy_params p = params(2, 2, 8, 4, 0, 0);
  policy *e = make(&p, 1);
  double n[2] = {1, 1};
  step(e, 1, n, NULL, NULL);
  ck_assert_int_eq(policy_resize(e, 2), GNMR_OK);
  ck_assert_uint_eq(policy_units(e), 2);
  policy_result r;
  double m[2] = {1, 50};
  step(e, 2, m, NULL, &r);
  ck_assert_double_eq(r.s[1], 0); /* first report of unit 1 */
  policy_unit_info info;
  policy_unit(e, 0, &info);
  ck_assert_uint_eq(info.cnt, 2);
  policy_destroy(&e);
}
END_TEST

/* ---- snapshots taken off the engine's thread (policy_snap_*) ------------- */

/* n units (several pieces, one partial) run for steps steps; the last
 * 3000 join 2 steps before the end, so their windows are short. */
static policy *busy_engine(uint32_t n, uint64_t steps, double *norm) {
  policy_params p = params(1.8, 1.6, 4, 3, 2, 5);
  policy *e = make(&p, n - 3000);
  for (uint64_t t = 1; t <= steps; t++) {
    if (t == steps - 1)
      ck_assert_int_eq(policy_resize(e, n), GNMR_OK);
    fill_norms(norm, policy_units(e), t);
    step(e, t, norm, NULL, NULL);
  }
  return e;
}

static unsigned char *export_now(const policy *e, size_t *len) {
  size_t need = policy_export_size(e);
  unsigned char *b = malloc(need);
  ck_assert_int_eq(policy_export(e, b, need, len), GNMR_OK);
  return b;
}

typedef struct taker {
  policy_snap *s;
  void *buf;
  size_t len;
  int rv;
} taker;

static void *take_main(void *arg) {
  taker *t = arg;
  t->rv = policy_snap_take(t->s, &t->buf, &t->len);
  return NULL;
}

/* Taken on another thread, with or without the engine changing at the
 * same time (its next step, a resize, new parameters, its destruction):
 * the bytes are always exactly policy_export()'s at begin. */
START_TEST(snapshot_off_thread_is_the_state_at_begin) {
  enum { N = 20000 }; /* 3 pieces */
  static double norm[N];
  for (int change = 0; change < 5; change++)
    for (int rep = 0; rep < 4; rep++) {
      policy *e = busy_engine(N, 12, norm);
      size_t want_len;
      unsigned char *want = export_now(e, &want_len);
      uint64_t snaps0, helped0, snaps1, helped1;
      policy_snap_counts(&snaps0, &helped0);
      taker t = {policy_snap_begin(e), NULL, 0, -1};
      ck_assert_ptr_nonnull(t.s);
      ck_assert_uint_eq(policy_snap_step(t.s), 12);
      ck_assert_uint_ge(policy_snap_size(t.s), want_len);
      pthread_t th;
      if (rep % 2 == 0) /* the taker first, or the change first */
        ck_assert_int_eq(pthread_create(&th, NULL, take_main, &t), 0);
      policy_params np = params(2.5, 1.2, 3, 1, 1, 0);
      fill_norms(norm, N, 13);
      if (change == 0)
        step(e, 13, norm, NULL, NULL);
      else if (change == 1)
        ck_assert_int_eq(policy_resize(e, N + 5), GNMR_OK);
      else if (change == 2)
        ck_assert_int_eq(policy_set_params(e, &np), GNMR_OK);
      else if (change == 3)
        policy_destroy(&e);
      else
        policy_snap_free(&(policy_snap *){policy_snap_begin(e)});
      if (rep % 2 == 1)
        ck_assert_int_eq(pthread_create(&th, NULL, take_main, &t), 0);
      pthread_join(th, NULL);
      ck_assert_int_eq(t.rv, GNMR_OK);
      ck_assert_uint_eq(t.len, want_len);
      ck_assert_msg(memcmp(t.buf, want, want_len) == 0,
                    "change %d rep %d: the bytes differ from the export at "
                    "begin", change, rep);
      policy_snap_counts(&snaps1, &helped1);
      ck_assert_uint_ge(snaps1, snaps0 + 1);
      if (rep % 2 == 1) /* the change came first: the owner wrote it */
        ck_assert_uint_ge(helped1, helped0 + 1);
      /* a second take gets nothing */
      void *again = NULL;
      size_t alen = 1;
      ck_assert_int_eq(policy_snap_take(t.s, &again, &alen), GNMR_E_INVAL);
      ck_assert_ptr_null(again);
      ck_assert_uint_eq(alen, 0);
      policy *back = NULL;
      ck_assert_int_eq(policy_import(t.buf, t.len, &back), GNMR_OK);
      ck_assert_uint_eq(policy_last_step(back), 12);
      policy_destroy(&back);
      policy_snap_free(&t.s); /* the bytes go with the handle */
      ck_assert_ptr_null(t.s);
      free(want);
      policy_destroy(&e);
    }
}
END_TEST

/* Nobody takes it: the engine goes on (the owed bytes are written at its
 * next change and freed with the last reference, whichever side drops
 * it), an engine of 0 units too. */
START_TEST(snapshot_never_taken_leaks_nothing) {
  static double norm[9000];
  policy *e = busy_engine(9000, 4, norm);
  policy_snap *s = policy_snap_begin(e);
  fill_norms(norm, 9000, 5);
  step(e, 5, norm, NULL, NULL);
  policy_snap_free(&s);
  s = policy_snap_begin(e);
  policy_snap_free(&s); /* the consumer first */
  step(e, 6, norm, NULL, NULL);
  policy_destroy(&e);
  policy_params p = params(1.8, 1.6, 4, 3, 2, 5);
  e = make(&p, 0);
  s = policy_snap_begin(e);
  void *b;
  size_t len;
  ck_assert_int_eq(policy_snap_take(s, &b, &len), GNMR_OK);
  ck_assert_uint_eq(len, policy_export_size(e));
  policy *back = NULL;
  ck_assert_int_eq(policy_import(b, len, &back), GNMR_OK);
  policy_destroy(&back);
  policy_snap_free(&s);
  policy_destroy(&e);
  ck_assert_ptr_null(policy_snap_begin(NULL));
  ck_assert_int_eq(policy_snap_take(NULL, &b, &len), GNMR_E_INVAL);
}
END_TEST

/* A snapshot of 2 MiB or more keeps its buffer for the next one
 * (mapped pages, touched once): the next snapshot reuses it, its bytes
 * are still exactly the export (nothing of the last one shows: the first
 * carried an id table after them), and no more than POLICY_SNAP_SPARES
 * wait. */
START_TEST(snapshot_buffers_are_reused_and_bounded) {
  enum { N = 60000, K = POLICY_SNAP_SPARES + 2 };
  static double norm[N];
  static uint32_t ids[N];
  policy *e = busy_engine(N, 12, norm);
  for (uint32_t i = 0; i < N; i++)
    ids[i] = 3 * i + 7; /* sparse, ascending */
  size_t first_len;
  unsigned char *first = export_now(e, &first_len);
  ck_assert_ptr_null(policy_snap_begin_ids(e, ids, N - 1)); /* not n */
  policy_snap *s = policy_snap_begin_ids(e, ids, N);
  ck_assert_ptr_nonnull(s);
  ck_assert_uint_ge(policy_snap_size(s), (size_t)2 << 20);
  void *b;
  size_t len;
  ck_assert_int_eq(policy_snap_take(s, &b, &len), GNMR_OK);
  /* the export, then the ids' table: split back as it was */
  ck_assert_uint_eq(len, first_len + policy_ids_size(N));
  ck_assert(memcmp(b, first, first_len) == 0);
  size_t pol_len;
  uint32_t *got, n_got;
  ck_assert_int_eq(policy_ids_split(b, len, &pol_len, &got, &n_got), GNMR_OK);
  ck_assert_uint_eq(pol_len, first_len);
  ck_assert_uint_eq(n_got, N);
  ck_assert(memcmp(got, ids, sizeof ids) == 0);
  free(got);
  free(first);
  policy_snap_free(&s);
  /* the engine lets go of it at its next change */
  fill_norms(norm, N, 13);
  step(e, 13, norm, NULL, NULL);
  uint32_t nb;
  uint64_t bytes, reused0, reused1;
  policy_snap_spares(&nb, &bytes, &reused0);
  ck_assert_uint_ge(nb, 1);
  ck_assert_uint_le(nb, POLICY_SNAP_SPARES);
  ck_assert_uint_ge(bytes, len);
  /* the next snapshot reuses a spare, and its bytes are this export's */
  size_t want_len;
  unsigned char *want = export_now(e, &want_len);
  s = policy_snap_begin(e);
  ck_assert_int_eq(policy_snap_take(s, &b, &len), GNMR_OK);
  policy_snap_spares(NULL, NULL, &reused1);
  ck_assert_uint_eq(reused1, reused0 + 1);
  ck_assert_uint_eq(len, want_len);
  ck_assert(memcmp(b, want, len) == 0);
  policy_snap_free(&s);
  free(want);
  /* K at once on engines of growing size, then all freed: at most
   * POLICY_SNAP_SPARES stay, the largest ones */
  static double big[N + 30000 * (K - 1)];
  policy *es[K];
  policy_snap *ss[K];
  uint64_t keep = 0; /* the sizes of the largest POLICY_SNAP_SPARES */
  for (int i = 0; i < K; i++) {
    es[i] = busy_engine(N + 30000u * (uint32_t)i, 10, big);
    ss[i] = policy_snap_begin(es[i]);
    ck_assert_ptr_nonnull(ss[i]);
    if (i >= K - POLICY_SNAP_SPARES)
      keep += policy_snap_size(ss[i]);
  }
  for (int i = 0; i < K; i++) {
    ck_assert_int_eq(policy_snap_take(ss[i], &b, &len), GNMR_OK);
    policy *back = NULL;
    ck_assert_int_eq(policy_import(b, len, &back), GNMR_OK);
    ck_assert_uint_eq(policy_units(back), N + 30000u * (uint32_t)i);
    policy_destroy(&back);
    policy_snap_free(&ss[i]);
    policy_destroy(&es[i]);
  }
  policy_snap_spares(&nb, &bytes, NULL);
  ck_assert_uint_eq(nb, POLICY_SNAP_SPARES);
  /* the largest ones are kept, not the first ones returned */
  ck_assert_uint_ge(bytes, keep);
  /* dropped (a large job ended): every one unmapped, the bytes said */
  ck_assert_uint_eq(policy_snap_spares_drop(), bytes);
  policy_snap_spares(&nb, &bytes, NULL);
  ck_assert_uint_eq(nb, 0);
  ck_assert_uint_eq(bytes, 0);
  ck_assert_uint_eq(policy_snap_spares_drop(), 0);
  policy_destroy(&e);
}
END_TEST

/* The unit id table after an export: written, split back off (the export's
 * own length, the ids), and refused when it does not hold together. */
START_TEST(id_table_round_trips_and_refuses_what_does_not_hold) {
  const uint32_t ids[3] = {5, 17, 4000000000u};
  uint8_t blob[64] = "export bytes";
  size_t len = 12, pol_len;
  ck_assert_uint_eq(policy_ids_size(3), 3 * 4 + 12);
  policy_ids_write(blob + len, ids, 3);
  len += policy_ids_size(3);
  uint32_t *got, n;
  ck_assert_int_eq(policy_ids_split(blob, len, &pol_len, &got, &n), GNMR_OK);
  ck_assert_uint_eq(pol_len, 12);
  ck_assert_uint_eq(n, 3);
  ck_assert(got[0] == 5 && got[1] == 17 && got[2] == 4000000000u);
  free(got);
  /* no table: every byte is the export's */
  ck_assert_int_eq(policy_ids_split(blob, 12, &pol_len, &got, &n), GNMR_OK);
  ck_assert(got == NULL && n == 0 && pol_len == 12);
  /* a count larger than the bytes */
  uint8_t bad[64];
  memcpy(bad, blob, len);
  bad[len - 12] = 200;
  ck_assert_int_eq(policy_ids_split(bad, len, &pol_len, &got, &n),
                   GNMR_E_PARSE);
  /* ids not ascending, and the reserved UINT32_MAX */
  const uint32_t down[2] = {9, 3}, max[1] = {UINT32_MAX};
  policy_ids_write(bad, down, 2);
  ck_assert_int_eq(policy_ids_split(bad, policy_ids_size(2), &pol_len, &got,
                                    &n),
                   GNMR_E_PARSE);
  policy_ids_write(bad, max, 1);
  ck_assert_int_eq(policy_ids_split(bad, policy_ids_size(1), &pol_len, &got,
                                    &n),
                   GNMR_E_PARSE);
}
END_TEST

START_TEST(event_names_are_stable) {
  ck_assert_str_eq(policy_event_name(POLICY_EV_EXCEED), "exceed");
  ck_assert_str_eq(policy_event_name(POLICY_EV_BUDGET_SATURATED),
                   "budget_saturated");
  ck_assert_str_eq(policy_event_name(99), "unknown");
  ck_assert_str_eq(policy_outcome_name(POLICY_OUT_DROPPED), "dropped");
  ck_assert_str_eq(gnmr_strerror(GNMR_E_PARSE), "malformed input");
  ck_assert_str_eq(gnmr_errname(GNMR_E_DUP), "GNMR_E_DUP");
  ck_assert_str_eq(gnmr_strerror(-9999), "unknown error");
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("policy_state");
  TCase *tc = tcase_create("state");
  tcase_add_test(tc, export_import_continues_identically);
  tcase_add_test(tc, import_rejects_truncated_and_corrupt_state);
  tcase_add_test(tc, version_1_snapshots_still_import);
  tcase_add_test(tc, a_run_of_exceedances_survives_a_snapshot);
  tcase_add_test(tc, measured_state_survives_a_snapshot);
  tcase_add_test(tc, set_params_keeps_newest_window_values_and_statistics);
  tcase_add_test(tc, set_params_changes_budget_from_next_step);
  tcase_add_test(tc, resize_adds_units_without_history);
  tcase_add_test(tc, event_names_are_stable);
  tcase_add_test(tc, id_table_round_trips_and_refuses_what_does_not_hold);
  tcase_add_test(tc, snapshot_off_thread_is_the_state_at_begin);
  tcase_add_test(tc, snapshot_never_taken_leaks_nothing);
  tcase_add_test(tc, snapshot_buffers_are_reused_and_bounded);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
