/* SPDX-License-Identifier: MIT */
/* test_store.c — the history and its queries against a real gnmrd:
 * decisions --csv after gnmr-sim equals the expected file; a SIGKILL in the
 * middle of a job loses no committed step and the job continues from its
 * snapshot exactly as the engine would; live parameter changes; query
 * filters and every kind of bad query; readers while the daemon writes. */
#include <jansson.h>
#include <sqlite3.h>

#include "storeutil.h"

START_TEST(decisions_csv_after_sim_equals_expected_file) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  static const struct {
    const char *trace, *expect, *opts[8];
    int rows;
  } cases[] = {
      {"small.csv", "small.defaults.decisions.csv", {NULL}, 200},
      {"moe_idle.csv", "moe_idle.k2_l6.decisions.csv",
       {"--max-active", "2", "--lock-steps", "6", NULL}, 300},
  };
  for (size_t i = 0; i < 2; i++) {
    char tp[512], ep[512], job[16];
    snprintf(tp, sizeof tp, "%s/%s", tu_traces(), cases[i].trace);
    snprintf(ep, sizeof ep, "%s/%s", tu_traces(), cases[i].expect);
    snprintf(job, sizeof job, "csv-%zu", i);
    char *argv[48] = {"gnmr-sim", "--agents", d.agents, "--job", job,
                      "--ranks", "3", "--shards", "2", "--trace", tp,
                      "--barrier-ms", "20000", "--timeout-ms", "30000",
                      TU_FIRST_DEFAULTS};
    int n = 15 + TU_FIRST_DEFAULTS_N;
    for (int k = 0; cases[i].opts[k]; k++)
      argv[n++] = (char *)cases[i].opts[k];
    argv[n] = NULL;
    run_result r = tu_run("gnmr-sim", argv, NULL);
    ck_assert_msg(r.code == 0, "sim: %s", r.err);
    tu_run_free(&r);
    char *got = decisions_csv(&d, job, cases[i].rows);
    char *want = tu_read_file(ep, NULL);
    ck_assert_msg(strcmp(got, want) == 0, "%s: stored decisions differ",
                  cases[i].trace);
    free(got);
    free(want);
  }
  /* jobs lists both, finished */
  char *args[] = {"jobs", "--csv", NULL};
  run_result r = ctl(&d, args);
  /* a job's finished state is committed after its last decision */
  for (int i = 0; i < 200 * tu_slow() &&
                  (r.code != 0 || !strstr(r.out, "csv-1,finished,"));
       i++) {
    tu_run_free(&r);
    tu_sleep_ms(50);
    r = ctl(&d, args);
  }
  ck_assert_int_eq(r.code, 0);
  ck_assert_msg(strstr(r.out, "csv-0,finished,1,200,3,") != NULL, "%s",
                r.out);
  ck_assert_ptr_nonnull(strstr(r.out, "csv-1,finished,1,300,3,"));
  tu_run_free(&r);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Sparse unit ids across a SIGKILL: the job's units are slots in id
 * order (7, 12, 300000, 4e9 here, named k, o, v, q), its snapshot carries
 * the id table, and after the restart the decisions are the engine's on
 * those slots, reported as ids. */
static const char *sparse_names[] = {"q", "k", "v", "o"};
static const uint32_t sparse_ids[] = {4000000000u, 7, 300000, 12};
static const int slot_of_agent[] = {3, 0, 2, 1}; /* by id order */

static void sparse_rows(const uint64_t *steps, size_t n, char *out,
                        size_t cap, uint64_t from_row) {
  static const uint32_t id_of_slot[] = {7, 12, 300000, 4000000000u};
  policy_params p;
  policy_params_default(&p);
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
      norm[slot_of_agent[u]] = sqrt(s[u]);
    ck_assert_int_eq(policy_step(e, steps[i], norm, NULL, &r), GNMR_OK);
    if (steps[i] < from_row)
      continue;
    off += (size_t)snprintf(out + off, cap - off, "%llu,",
                            (unsigned long long)steps[i]);
    for (uint32_t k = 0; k < r.n_active; k++)
      off += (size_t)snprintf(out + off, cap - off, k ? " %u" : "%u",
                              id_of_slot[r.active[k]]);
    off += (size_t)snprintf(out + off, cap - off, "\n");
  }
  policy_destroy(&e);
}

START_TEST(sparse_unit_ids_survive_a_sigkill_through_the_snapshot) {
  tu_daemon d = {0};
  char ep[160];
  char *every10[] = {"--snapshot-every", "10", NULL};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  tu_daemon_start_in(&d, ep, NULL, d.dir, every10);
  gnmr_agent_config c = {0};
  c.endpoint = ep;
  c.job = "sparse-job";
  c.reporters = 1;
  c.unit_names = sparse_names;
  c.unit_ids = sparse_ids;
  c.n_units = 4;
  gnmr_params_default(&c.params);
  c.params.warmup_steps = 0;
  c.params.max_active = 2;
  c.params.lock_steps = 2;
  c.barrier_ms = 5000;
  gnmr_agent *a;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  for (uint64_t t = 1; t <= 35; t++)
    step_agent(a, t);
  char *before = decisions_csv(&d, "sparse-job", 35);
  tu_daemon_stop(&d, SIGKILL);
  tu_daemon_start_in(&d, ep, NULL, d.dir, every10);
  for (uint64_t t = 36; t <= 80; t++)
    step_agent(a, t);
  char *after = decisions_csv(&d, "sparse-job", 80);
  ck_assert_msg(strncmp(after, before, strlen(before)) == 0,
                "steps 1-35 changed after the restart");
  uint64_t steps[75];
  size_t n = 0;
  for (uint64_t t = 1; t <= 30; t++)
    steps[n++] = t;
  for (uint64_t t = 36; t <= 80; t++)
    steps[n++] = t;
  static char want[8192], first[4096];
  sparse_rows(steps, 30, first, sizeof first, 1);
  ck_assert_msg(strstr(before, first) != NULL,
                "decisions before the kill are not the engine's on id-ordered "
                "slots:\n%s\nvs\n%s", before, first);
  sparse_rows(steps, n, want, sizeof want, 36);
  ck_assert_msg(strstr(after, want) != NULL,
                "decisions after the restart differ from the engine "
                "restored from its snapshot:\n%s\nvs\n%s", after, want);
  char *uargs[] = {"units", "sparse-job", "--json", NULL};
  run_result r = ctl(&d, uargs);
  ck_assert_int_eq(r.code, 0);
  ck_assert_msg(strstr(r.out, "4000000000") && strstr(r.out, "300000"),
                "%s", r.out);
  tu_run_free(&r);
  gnmr_agent_close(&a);
  free(before);
  free(after);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* A snapshot over 1 MiB goes into SQLite through the incremental blob
 * API (and its buffer, over 2 MiB, is a reused mapping with the id table
 * written in its room): the stored bytes are exactly the export of an
 * engine that saw the same steps, followed by the job's id table, and
 * gnmrd resumes from them after a SIGKILL. */
/* Waits (up to 120 s: valgrind runs gnmrd too) until the store has
 * committed job's snapshot of step. */
static void wait_snapshot_row(const tu_daemon *d, const char *job,
                              uint64_t step) {
  char path[512], sql[256];
  snprintf(path, sizeof path, "%s/data/gnmr.db", d->dir);
  snprintf(sql, sizeof sql, "SELECT 1 FROM snapshots WHERE job='%s' AND "
           "step=%llu", job, (unsigned long long)step);
  for (int i = 0; i < 2400; i++) {
    sqlite3 *db;
    int found = 0;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
      sqlite3_stmt *st;
      sqlite3_busy_timeout(db, 1000);
      if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK) {
        found = sqlite3_step(st) == SQLITE_ROW;
        sqlite3_finalize(st);
      }
    }
    sqlite3_close(db);
    if (found)
      return;
    tu_sleep_ms(50);
  }
  ck_abort_msg("job %s: no snapshot of step %llu committed", job,
               (unsigned long long)step);
}

static double big_sum(uint32_t u, uint64_t t) {
  double s = 1.0 + (double)((u * 7u + (uint32_t)t * 13u) % 17u);
  return (u + t) % 997 == 0 ? s * 400.0 : s;
}

START_TEST(large_snapshot_streams_into_sqlite_and_restores) {
  enum { N = 30000, LAST = 25, SNAP = 20 };
  tu_daemon d = {0};
  char ep[160], db_path[512];
  char *every10[] = {"--snapshot-every", "10", NULL};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  tu_daemon_start_in(&d, ep, NULL, d.dir, every10);
  static char name_pool[N][8];
  static const char *names[N];
  static uint32_t ids[N];
  for (uint32_t u = 0; u < N; u++) {
    snprintf(name_pool[u], sizeof name_pool[u], "u%u", u);
    names[u] = name_pool[u];
    ids[u] = 1 + 3 * u; /* not 0..N-1: the snapshot carries the id table */
  }
  gnmr_agent_config c = {0};
  c.endpoint = ep;
  c.job = "big-snap";
  c.reporters = 1;
  c.unit_names = names;
  c.unit_ids = ids;
  c.n_units = N;
  gnmr_params_default(&c.params);
  c.params.warmup_steps = 0;
  c.params.max_active = 2;
  c.params.lock_steps = 2;
  c.barrier_ms = 10000;
  gnmr_agent *a;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  static double s[N], norm[N];
  policy_params p;
  policy_params_default(&p);
  p.warmup_steps = 0;
  p.max_active = 2;
  p.lock_steps = 2;
  policy *e;
  ck_assert_int_eq(policy_create(&p, N, &e), GNMR_OK);
  size_t want_len = 0;
  unsigned char *want = NULL;
  /* step 10's snapshot is committed before step 20's is due; the store
   * frees it a moment after the commit (a WAL checkpoint may come in
   * between), so step 20's may wait a step or a few: snap is the step
   * that took it */
  uint64_t snap = 0, t = 0;
  while (t < LAST || (snap == 0 && t < LAST + 200)) {
    t++;
    for (uint32_t u = 0; u < N; u++) {
      s[u] = big_sum(u, t);
      norm[u] = sqrt(s[u]);
    }
    ck_assert_int_eq(gnmr_agent_report_sums(a, t, s, NULL, NULL), GNMR_OK);
    ck_assert_msg(gnmr_agent_wait(a, t, 20000 * tu_slow()) == GNMR_OK,
                  "no decision for step %llu", (unsigned long long)t);
    policy_result r;
    ck_assert_int_eq(policy_step(e, t, norm, NULL, &r), GNMR_OK);
    if (t == SNAP - 10)
      wait_snapshot_row(&d, "big-snap", t);
    if (t >= SNAP && snap == 0 && tu_counter(&d, "snapshots_early") == 2) {
      snap = t; /* counted before the decision was sent */
      size_t cap = policy_export_size(e);
      want = malloc(cap);
      ck_assert_int_eq(policy_export(e, want, cap, &want_len), GNMR_OK);
    }
  }
  policy_destroy(&e);
  ck_assert_msg(snap != 0, "no second snapshot by step %llu",
                (unsigned long long)t);
  ck_assert_uint_gt(want_len, (size_t)2 << 20);
  /* both large snapshots were serialized on a worker; the second waited
   * one step for each step it came after step 20 */
  long long early = tu_counter(&d, "snapshots_early"),
            deferred = tu_counter(&d, "snapshots_deferred");
  ck_assert_msg(early == 2 && deferred == (long long)(snap - SNAP),
                "snapshots_early %lld (want 2), snapshots_deferred %lld "
                "(want %llu)", early, deferred,
                (unsigned long long)(snap - SNAP));
  tu_sleep_ms(500); /* the writer commits; SIGKILL takes no final one */
  tu_daemon_stop(&d, SIGKILL);
  snprintf(db_path, sizeof db_path, "%s/data/gnmr.db", d.dir);
  sqlite3 *db;
  ck_assert_int_eq(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL),
                   SQLITE_OK);
  sqlite3_stmt *st;
  ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT step, state FROM snapshots"
                                          " WHERE job='big-snap' ORDER BY"
                                          " step DESC LIMIT 1",
                                      -1, &st, NULL),
                   SQLITE_OK);
  ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
  ck_assert_int_eq(sqlite3_column_int64(st, 0), (long long)snap);
  const unsigned char *got = sqlite3_column_blob(st, 1);
  size_t got_len = (size_t)sqlite3_column_bytes(st, 1);
  /* the export, then N ids (u32 LE), N, "GNMRSID1" */
  ck_assert_uint_eq(got_len, want_len + (size_t)N * 4 + 4 + 8);
  ck_assert_msg(memcmp(got, want, want_len) == 0,
                "the stored snapshot differs from the engine's export");
  const unsigned char *tr = got + want_len;
  for (uint32_t u = 0; u <= N; u++) {
    uint32_t v = (uint32_t)tr[4 * u] | (uint32_t)tr[4 * u + 1] << 8 |
                 (uint32_t)tr[4 * u + 2] << 16 | (uint32_t)tr[4 * u + 3] << 24;
    ck_assert_uint_eq(v, u < N ? ids[u] : (uint32_t)N);
  }
  ck_assert(memcmp(tr + 4 * ((size_t)N + 1), "GNMRSID1", 8) == 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  free(want);
  /* gnmrd resumes from it */
  tu_daemon_start_in(&d, ep, NULL, d.dir, every10);
  for (uint64_t end = t + 2; t < end;) {
    t++;
    for (uint32_t u = 0; u < N; u++)
      s[u] = big_sum(u, t);
    ck_assert_int_eq(gnmr_agent_report_sums(a, t, s, NULL, NULL), GNMR_OK);
    ck_assert_msg(gnmr_agent_wait(a, t, 20000 * tu_slow()) == GNMR_OK,
                  "no decision for step %llu", (unsigned long long)t);
  }
  char *hargs[] = {"history", "big-snap", "--kind", "job_resumed", "--csv",
                   NULL};
  run_result r = ctl(&d, hargs);
  ck_assert_int_eq(r.code, 0);
  char at[48];
  snprintf(at, sizeof at, "snapshot at step %llu", (unsigned long long)snap);
  ck_assert_msg(strstr(r.out, at) != NULL, "%s", r.out);
  tu_run_free(&r);
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* A large job (snapshots over 1 MiB) has one snapshot in the store's
 * hands at a time: while the store cannot commit (a read-only database
 * for a while), its due snapshots wait instead of queueing, its steps go
 * on being decided and recorded, and once the store writes again the
 * next due snapshot is taken. */
START_TEST(large_snapshots_wait_for_the_store) {
  enum { N = 30000 };
  int slow = getenv("GNMR_VALGRIND") != NULL;
  tu_daemon d = {0};
  char ep[160];
  char *every2[] = {"--snapshot-every", "2", NULL};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  /* room for the join and 12 steps inside the fault, sanitized too */
  setenv("GNMR_STORE_FAULT",
         slow ? "readonly:30000"
              : getenv("GNMR_SANITIZED") ? "readonly:8000" : "readonly:3000",
         1);
  tu_daemon_start_in(&d, ep, NULL, d.dir, every2);
  unsetenv("GNMR_STORE_FAULT");
  static char name_pool[N][8];
  static const char *names[N];
  for (uint32_t u = 0; u < N; u++) {
    snprintf(name_pool[u], sizeof name_pool[u], "u%u", u);
    names[u] = name_pool[u];
  }
  gnmr_agent_config c = {0};
  c.endpoint = ep;
  c.job = "wait-job";
  c.reporters = 1;
  c.unit_names = names;
  c.n_units = N;
  gnmr_params_default(&c.params);
  c.barrier_ms = 10000;
  gnmr_agent *a;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  static double s[N];
  uint64_t t = 0;
  for (; t < 12; ) { /* inside the fault: nothing commits */
    t++;
    for (uint32_t u = 0; u < N; u++)
      s[u] = big_sum(u, t);
    ck_assert_int_eq(gnmr_agent_report_sums(a, t, s, NULL, NULL), GNMR_OK);
    ck_assert_int_eq(gnmr_agent_wait(a, t, 20000 * tu_slow()), GNMR_OK);
  }
  ck_assert_int_gt(tu_counter(&d, "store_errors"), 0);
  long early = tu_counter(&d, "snapshots_early");
  ck_assert_int_eq(early, 1); /* step 2's; 4, 6, ... waited for it */
  ck_assert_int_ge(tu_counter(&d, "snapshots_deferred"), 5);
  /* the store writes again: a later step takes the owed snapshot */
  for (int i = 0; i < (slow ? 2400 : 600) &&
                  tu_counter(&d, "snapshots_early") == early;
       i++) {
    tu_sleep_ms(50);
    t++;
    for (uint32_t u = 0; u < N; u++)
      s[u] = big_sum(u, t);
    ck_assert_int_eq(gnmr_agent_report_sums(a, t, s, NULL, NULL), GNMR_OK);
    ck_assert_int_eq(gnmr_agent_wait(a, t, 20000 * tu_slow()), GNMR_OK);
  }
  ck_assert_int_gt(tu_counter(&d, "snapshots_early"), early);
  /* every step is in the history, none dropped */
  char *csv = decisions_csv(&d, "wait-job", (int)t);
  ck_assert_int_eq(count_lines(csv), (int)t + 1);
  free(csv);
  ck_assert_int_eq(tu_counter(&d, "store_dropped"), 0);
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* `gnmrctl --store DIR` of a run whose gnmrd was killed: the store says
 * "running" for ever (issue 63). With no gnmrd holding DIR's lock it is
 * said as "interrupted" in jobs and runs; while a gnmrd serves the store,
 * a live run reads "running". */
static run_result store_read(const char *dir, char *cmd, char *arg) {
  char opt[1200];
  snprintf(opt, sizeof opt, "--store=%s", dir);
  char *with_job[] = {"gnmrctl", opt, cmd, arg, "--json", NULL};
  char *without[] = {"gnmrctl", opt, cmd, "--json", NULL};
  return tu_run("gnmrctl", arg != NULL ? with_job : without, NULL);
}

START_TEST(a_killed_run_reads_interrupted_from_the_store) {
  tu_daemon d = {0};
  char ep[160];
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  tu_daemon_start_in(&d, ep, NULL, d.dir, NULL);
  gnmr_agent *a = open_agent(ep, "killed-run");
  for (uint64_t t = 1; t <= 12; t++)
    step_agent(a, t);
  tu_sleep_ms(1200); /* committed */
  char data[1100];
  snprintf(data, sizeof data, "%s/data", d.dir);
  run_result r = store_read(data, "jobs", NULL);
  ck_assert_msg(r.code == 0 && strstr(r.out, "\"state\": \"running\""),
                "served: exit %d\n%s%s", r.code, r.out, r.err);
  tu_run_free(&r);
  tu_daemon_stop(&d, SIGKILL);
  gnmr_agent_close(&a);
  r = store_read(data, "jobs", NULL);
  ck_assert_msg(r.code == 0 && strstr(r.out, "\"state\": \"interrupted\"") &&
                    !strstr(r.out, "\"running\""),
                "after the kill: exit %d\n%s%s", r.code, r.out, r.err);
  tu_run_free(&r);
  r = store_read(data, "runs", "killed-run");
  ck_assert_msg(r.code == 0 && strstr(r.out, "\"state\": \"interrupted\""),
                "runs: exit %d\n%s%s", r.code, r.out, r.err);
  tu_run_free(&r);
  /* status and units with no gnmrd, from what the store kept */
  r = store_read(data, "status", "killed-run");
  ck_assert_msg(r.code == 0 && strstr(r.out, "\"state\": \"interrupted\"") &&
                    strstr(r.out, "\"job\": \"killed-run\""),
                "status: exit %d\n%s%s", r.code, r.out, r.err);
  tu_run_free(&r);
  r = store_read(data, "units", "killed-run");
  ck_assert_msg(r.code == 0 && strstr(r.out, "\"promotions\"") &&
                    strstr(r.out, "\"g\": null"),
                "units: exit %d\n%s%s", r.code, r.out, r.err);
  tu_run_free(&r);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(sigkill_loses_no_committed_step_and_job_continues_from_snapshot) {
  tu_daemon d = {0};
  char ep[160];
  char *every10[] = {"--snapshot-every", "10", NULL};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  tu_daemon_start_in(&d, ep, NULL, d.dir, every10);
  gnmr_agent *a = open_agent(ep, "crash-job");
  for (uint64_t t = 1; t <= 35; t++)
    step_agent(a, t);
  char *before = decisions_csv(&d, "crash-job", 35);
  tu_daemon_stop(&d, SIGKILL);
  /* restart on the same data directory; the agent keeps stepping */
  tu_daemon_start_in(&d, ep, NULL, d.dir, every10);
  for (uint64_t t = 36; t <= 80; t++)
    step_agent(a, t);
  char *after = decisions_csv(&d, "crash-job", 80);
  /* every step committed before the kill is still there */
  ck_assert_msg(strncmp(after, before, strlen(before)) == 0,
                "steps 1-35 changed after the restart");
  /* after the restart: the engine from the snapshot at step 30 on, then
   * steps 36..80 (31..35 were decided but are not in the snapshot) */
  uint64_t steps[75];
  size_t n = 0;
  for (uint64_t t = 1; t <= 30; t++)
    steps[n++] = t;
  for (uint64_t t = 36; t <= 80; t++)
    steps[n++] = t;
  static char want[8192];
  engine_rows(steps, n, want, sizeof want, 36);
  ck_assert_msg(strstr(after, want) != NULL,
                "decisions after the restart differ from the engine "
                "restored from its snapshot:\n%s\nvs\n%s", after, want);
  /* the history shows the resume and both passes: pass 2 begins after
   * step 35, the last one decided (and committed) before the kill, so
   * steps 31..35 are never decided a second time */
  char *hargs[] = {"history", "crash-job", "--kind", "job_resumed", "--csv",
                   NULL};
  run_result r = ctl(&d, hargs);
  ck_assert_msg(r.code == 0, "history: exit %d: %s", r.code, r.err);
  ck_assert_msg(strstr(r.out, "2,35,job_resumed") != NULL &&
                    strstr(r.out, "snapshot at step 30, steps decided to "
                                  "35") != NULL,
                "no resume from the snapshot at step 30 in:\n%s\n"
                "gnmrd's log ends:\n%s", r.out, tu_daemon_log_tail(&d));
  tu_run_free(&r);
  char *sargs[] = {"status", "crash-job", "--json", NULL};
  r = ctl(&d, sargs);
  ck_assert_msg(r.code == 0, "status: exit %d: %s", r.code, r.err);
  ck_assert_msg(strstr(r.out, "\"pass\": 2") != NULL &&
                    strstr(r.out, "\"step\": 80") != NULL,
                "status after the restart:\n%s", r.out);
  tu_run_free(&r);
  free(before);
  free(after);
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(live_job_views_and_parameter_changes) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  gnmr_agent *a = open_agent(d.agents, "live-job");
  uint64_t t = 1;
  for (; t <= 20; t++)
    step_agent(a, t);
  char *st[] = {"status", "live-job", NULL};
  run_result r = ctl(&d, st);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "step           20"));
  ck_assert_ptr_nonnull(strstr(r.out, "max_active    2"));
  tu_run_free(&r);
  char *un[] = {"units", "live-job", "--csv", NULL};
  r = ctl(&d, un);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "id,name,shards,reports,mean,"));
  ck_assert_ptr_nonnull(strstr(r.out, "\n0,q,1,20,"));
  ck_assert_int_eq(count_lines(r.out), 5);
  tu_run_free(&r);
  char *top[] = {"top", "live-job", "--limit", "2", "--json", NULL};
  r = ctl(&d, top);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "\"promotions\""));
  tu_run_free(&r);
  char *watch[] = {"watch", "live-job", "--count", "2", "--interval-ms", "50",
                   NULL};
  r = ctl(&d, watch);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "gnmr job live-job  pass 1  step 20"));
  ck_assert_ptr_nonnull(strstr(r.out, "TOP UNITS"));
  tu_run_free(&r);

  /* set: budget 0 from the next step on, recorded in the history */
  char *set[] = {"set", "live-job", "max_active=0", "alpha=1.5", NULL};
  r = ctl(&d, set);
  ck_assert_msg(r.code == 0, "set: %s", r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "max_active    0"));
  tu_run_free(&r);
  for (; t <= 40; t++) {
    step_agent(a, t);
    ck_assert_int_eq(gnmr_agent_route(a, 0), GNMR_ROUTE_LOW);
    ck_assert_int_eq(gnmr_agent_route(a, 1), GNMR_ROUTE_LOW);
  }
  char *csv = decisions_csv(&d, "live-job", 40);
  ck_assert_ptr_nonnull(strstr(csv, "\n21,\n"));
  ck_assert_ptr_nonnull(strstr(csv, "\n40,\n"));
  free(csv);
  char *hist[] = {"history", "live-job", "--kind", "params_changed", "--csv",
                  NULL};
  r = ctl(&d, hist);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "max_active=0 alpha=1.5"));
  tu_run_free(&r);
  /* bad settings change nothing */
  static const char *const bad[][3] = {{"max_active=-1", NULL},
                                       {"alpha=0", NULL},
                                       {"nosuch=1", NULL},
                                       {"window", NULL},
                                       {"window=0", NULL}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *b[] = {"set", "live-job", (char *)bad[i][0], NULL};
    r = ctl(&d, b);
    ck_assert_msg(r.code == 1, "set %s: exit %d", bad[i][0], r.code);
    ck_assert(strlen(r.err) > 0);
    tu_run_free(&r);
  }
  r = ctl(&d, st);
  ck_assert_ptr_nonnull(strstr(r.out, "max_active    0"));
  ck_assert_ptr_nonnull(strstr(r.out, "alpha         1.5"));
  tu_run_free(&r);
  /* the history filters */
  char *byunit[] = {"history", "live-job", "--unit", "k", "--kind", "exceed",
                    "--from", "1", "--to", "20", "--csv", NULL};
  r = ctl(&d, byunit);
  ck_assert_int_eq(r.code, 0);
  const char *line = strchr(r.out, '\n') + 1;
  int rows = 0;
  for (; *line; line = strchr(line, '\n') + 1, rows++) {
    ck_assert_ptr_nonnull(strstr(line, ",exceed,1,k,"));
    long step = strtol(strchr(line, ',') + 1, NULL, 10);
    ck_assert(step >= 1 && step <= 20);
  }
  ck_assert_int_gt(rows, 0);
  tu_run_free(&r);
  char *exp[] = {"export", "live-job", NULL};
  r = ctl(&d, exp);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "\"steps\""));
  ck_assert_ptr_nonnull(strstr(r.out, "\"events\""));
  ck_assert_ptr_nonnull(strstr(r.out, "\"name\": \"q\""));
  {
    /* each unit's promotions and exceedances are the history's, and
     * unit_stats holds each unit's mean from the last snapshot */
    json_error_t je;
    json_t *doc = json_loads(r.out, 0, &je);
    ck_assert_msg(doc != NULL, "export is not JSON: %s", je.text);
    json_t *units = json_object_get(doc, "units"), *ev, *u;
    json_t *stats = json_object_get(doc, "unit_stats");
    size_t i;
    long want[2][4] = {{0}}, got[2][4] = {{0}};
    json_array_foreach(json_object_get(doc, "events"), i, ev) {
      const char *kind = json_string_value(json_object_get(ev, "kind"));
      json_int_t id = json_integer_value(json_object_get(ev, "unit"));
      if (kind != NULL && id >= 0 && id < 4)
        want[strcmp(kind, "exceed") == 0][id] +=
            !strcmp(kind, "promote") || !strcmp(kind, "exceed");
    }
    ck_assert_int_eq(json_array_size(units), 4);
    json_array_foreach(units, i, u) {
      got[0][i] = json_integer_value(json_object_get(u, "promotions"));
      got[1][i] = json_integer_value(json_object_get(u, "exceeds"));
    }
    for (int k = 0; k < 4; k++) {
      ck_assert_int_eq(got[0][k], want[0][k]);
      ck_assert_int_eq(got[1][k], want[1][k]);
    }
    ck_assert_int_gt(want[0][0] + want[0][1] + want[0][2] + want[0][3], 0);
    ck_assert_int_eq(json_array_size(stats), 4);
    json_array_foreach(stats, i, u) {
      ck_assert(json_is_real(json_object_get(u, "mean")));
      ck_assert_int_gt(json_integer_value(json_object_get(u, "reports")), 0);
    }
    json_decref(doc);
  }
  /* the replay of what was reported, with the export as its schedule
   * (the job's parameters, then the set before step 21), equals live */
  char exp_path[200], trace_path[200];
  snprintf(exp_path, sizeof exp_path, "%s/export.json", d.dir);
  snprintf(trace_path, sizeof trace_path, "%s/trace.csv", d.dir);
  tu_write_file(exp_path, r.out);
  tu_run_free(&r);
  FILE *tf = fopen(trace_path, "w");
  fputs("step,unit,norm\n", tf);
  for (uint64_t k = 1; k <= 40; k++) {
    double s[4];
    sums(k, s);
    for (int u = 0; u < 4; u++)
      fprintf(tf, "%llu,%d,%.17g\n", (unsigned long long)k, u, sqrt(s[u]));
  }
  fclose(tf);
  char *rp[] = {"gnmrctl", "replay", "--schedule", exp_path, trace_path,
                NULL};
  r = tu_run("gnmrctl", rp, NULL);
  ck_assert_msg(r.code == 0, "replay: %s", r.err);
  char *live = decisions_csv(&d, "live-job", 40);
  ck_assert_str_eq(r.out, live);
  tu_run_free(&r);
  /* without the schedule the replay differs after the set */
  char *rp0[] = {"gnmrctl", "replay", "--warmup-steps", "0",
                 "--max-active", "2", "--lock-steps", "2", trace_path, NULL};
  r = tu_run("gnmrctl", rp0, NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_str_ne(r.out, live);
  free(live);
  tu_run_free(&r);
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(bad_queries_and_unreachable_daemon_fail_clearly) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  gnmr_agent *a = open_agent(d.agents, "q-job");
  for (uint64_t t = 1; t <= 3; t++)
    step_agent(a, t);
  free(decisions_csv(&d, "q-job", 3));
  static const struct {
    const char *args[8];
    int code;
    const char *err;
  } cases[] = {
      {{"history", "nojob", NULL}, 1, "unknown job 'nojob'"},
      {{"decisions", "nojob", NULL}, 1, "unknown job"},
      {{"status", "nojob", NULL}, 1, "unknown job 'nojob'"},
      {{"units", "nojob", NULL}, 1, "unknown job"},
      {{"set", "nojob", "alpha=3", NULL}, 1, "no running job 'nojob'"},
      {{"history", "q-job", "--kind", "bogus", NULL}, 1, "unknown event kind"},
      {{"history", "q-job", "--unit", "zz", NULL}, 1, "has no unit 'zz'"},
      {{"history", "q-job", "--from", "9", "--to", "3", NULL}, 2,
       "is below --from"},
      {{"history", "q-job", "--from", "x", NULL}, 2, "not a valid number"},
      {{"history", "q-job", "--from", "18446744073709551615", NULL}, 1,
       "above the largest step"},
      {{"decisions", "q-job", "--to", "9223372036854775808", NULL}, 1,
       "above the largest step"},
      {{"history", NULL}, 2, "missing JOB"},
      {{"jobs", "extra", NULL}, 2, "unexpected argument"},
      {{"set", "q-job", NULL}, 2, "at least one key=value"},
      {{"status", "q-job", "--csv", NULL}, 2, "--csv is not available"},
      {{"decisions", "q-job", "--bogus", NULL}, 2,
       "unrecognized option '--bogus'\n(gnmrctl decisions --help"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    run_result r = ctl(&d, (char **)cases[i].args);
    ck_assert_msg(r.code == cases[i].code, "case %zu (%s): exit %d: %s", i,
                  cases[i].args[0], r.code, r.err);
    ck_assert_msg(strstr(r.err, cases[i].err) != NULL,
                  "case %zu: stderr '%s' lacks '%s'", i, r.err,
                  cases[i].err);
    tu_run_free(&r);
  }
  /* no daemon: a clear message, at once */
  char *argv[] = {"gnmrctl", "--admin", "ipc:///nonexistent/admin.sock",
                  "jobs", "--timeout-ms", "300", NULL};
  run_result r = tu_run("gnmrctl", argv, NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_nonnull(strstr(r.err, "nothing listens at"));
  tu_run_free(&r);
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(readers_while_the_daemon_writes) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  char tp[512];
  snprintf(tp, sizeof tp, "%s/burst.csv", tu_traces());
  char path[512], out[128];
  snprintf(path, sizeof path, "%s/gnmr-sim", tu_bin_dir());
  snprintf(out, sizeof out, "%s/sim.out", d.dir);
  char *argv[] = {path, "--agents", d.agents, "--job", "busy", "--ranks",
                  "4", "--shards", "2", "--trace", tp, "--barrier-ms",
                  "20000", "--timeout-ms", "30000", NULL};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  ck_assert_int_eq(posix_spawn(&pid, path, &fa, NULL, argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  /* query while the job runs (at least 3 times, however fast it ends) */
  int queries = 0, st = 0, done = 0;
  while (!done || queries < 3) {
    if (!done && waitpid(pid, &st, WNOHANG) == pid)
      done = 1;
    char *args[] = {"history", "busy", "--limit", "50", "--csv", NULL};
    run_result r = ctl(&d, args);
    /* the job may not exist for the first few milliseconds */
    ck_assert_msg(r.code == 0 || strstr(r.err, "unknown job") != NULL,
                  "query failed while writing: %s", r.err);
    tu_run_free(&r);
    queries++;
  }
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  free(decisions_csv(&d, "busy", 400));
  ck_assert_int_eq(tu_counter(&d, "store_errors"), 0);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* loop 0: a full disk; 1: a read-only database file */
START_TEST(store_errors_are_logged_counted_and_retried_losing_nothing) {
  /* valgrind slows start-up: give the fault window room to be seen */
  int slow = getenv("GNMR_VALGRIND") != NULL;
  const char *fault[] = {slow ? "full:8000" : "full:1500",
                         slow ? "readonly:8000" : "readonly:1500"};
  static const char *const msg[] = {"database or disk is full",
                                    "attempt to write a readonly database"};
  tu_daemon d = {0};
  setenv("GNMR_STORE_FAULT", fault[_i], 1);
  tu_daemon_start(&d);
  unsetenv("GNMR_STORE_FAULT");
  gnmr_agent *a = open_agent(d.agents, "full-job");
  for (uint64_t t = 1; t <= 150; t++)
    step_agent(a, t); /* the daemon keeps deciding */
  ck_assert_int_ge(tu_counter(&d, "steps_decided"), 150);
  ck_assert_int_gt(tu_counter(&d, "store_errors"), 0);
  /* once writes succeed again, every step is there: nothing dropped */
  char *csv = decisions_csv(&d, "full-job", 150);
  ck_assert_int_eq(count_lines(csv), 151);
  free(csv);
  ck_assert_int_eq(tu_counter(&d, "store_dropped"), 0);
  char *log = tu_daemon_log(&d);
  ck_assert_ptr_nonnull(strstr(log, "STORE-COMMIT"));
  ck_assert_msg(strstr(log, msg[_i]) != NULL, "log lacks '%s'", msg[_i]);
  free(log);
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* With the store full and a small queue cap, records are dropped (the
 * decisions go on), counted, and the history then says which steps it
 * lacks: a history_gap event of the run naming the first and last step
 * dropped. The job's own row is never dropped: the run is known. */
START_TEST(a_full_queue_says_which_steps_the_history_lacks) {
  int slow = getenv("GNMR_VALGRIND") != NULL;
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  char conf[300];
  snprintf(conf, sizeof conf, "%s/gnmrd.conf", d.dir);
  tu_write_file(conf, "[limits]\nstore_queue_mb = 1\n");
  char *extra[] = {"--config", conf, NULL};
  setenv("GNMR_STORE_FAULT", slow ? "full:20000" : "full:4000", 1);
  tu_daemon_start_in(&d, NULL, NULL, d.dir, extra);
  unsetenv("GNMR_STORE_FAULT");
  /* 2048 units: each snapshot (every 10 steps) is about 200 KB */
  char *argv[] = {"gnmr-sim", "--agents", d.agents, "--job", "gap",
                  "--ranks", "1", "--units", "2048", "--steps", "200",
                  "--timeout-ms", "60000", NULL};
  run_result r = tu_run("gnmr-sim", argv, NULL);
  ck_assert_msg(r.code == 0, "%s", r.err);
  ck_assert_int_eq(count_lines(r.out), 201); /* every step decided */
  tu_run_free(&r);
  ck_assert_int_gt(tu_counter(&d, "store_dropped"), 0);
  /* once the store takes writes again, the queue drains */
  for (int i = 0; i < 600 && tu_counter(&d, "store_queued") != 0; i++)
    tu_sleep_ms(100);
  ck_assert_int_eq(tu_counter(&d, "store_queued"), 0);
  char *hist[] = {"history", "gap", "--kind", "history_gap", "--csv", NULL};
  r = ctl(&d, hist);
  ck_assert_msg(r.code == 0, "%s", r.err);
  /* the gaps' ranges: every step inside one was dropped */
  char in_gap[201] = {0};
  int gaps = 0;
  for (const char *g = strstr(r.out, "steps "); g != NULL;
       g = strstr(g + 1, "steps ")) {
    unsigned long long first = 0, last = 0, recs = 0;
    ck_assert_msg(sscanf(g, "steps %llu-%llu: %llu records", &first, &last,
                         &recs) == 3, "%s", g);
    ck_assert(first >= 1 && first <= last && last <= 200 && recs > 0);
    for (unsigned long long st = first; st <= last; st++)
      in_gap[st] = 1;
    gaps++;
  }
  ck_assert_msg(gaps > 0, "no history_gap event: %s", r.out);
  ck_assert_msg(strstr(r.out, "store queue was full"), "%s", r.out);
  tu_run_free(&r);
  /* every step missing from the decisions lies inside the gap */
  char *args[] = {"decisions", "gap", "--csv", NULL};
  r = ctl(&d, args);
  ck_assert_msg(r.code == 0, "%s", r.err);
  char seen[201] = {0};
  int stored = 0;
  for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
    unsigned long long st;
    if (sscanf(line, "%llu,", &st) == 1 && st >= 1 && st <= 200) {
      seen[st] = 1;
      stored++;
    }
  }
  tu_run_free(&r);
  ck_assert_msg(stored < 200, "nothing was dropped (%d steps stored)",
                stored);
  for (unsigned long long st = 1; st <= 200; st++)
    ck_assert_msg(seen[st] != in_gap[st], "step %llu is %s", st,
                  seen[st] ? "stored inside a gap"
                           : "missing outside every gap");
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Issue 47: a neighbour job whose every unit is risky every step filled
 * the shared store queue, and every other job's records were dropped
 * with its own (5,655 records of every job; a victim then kept 341 of
 * 7,696 steps). Now each run has a share: once the queue is half full, a
 * run over its share sheds first. While a 2048-unit job floods a queue of
 * 1 MB with the database full, a small job's steps are all kept. */
START_TEST(one_jobs_flood_does_not_drop_another_jobs_records) {
  int slow = getenv("GNMR_VALGRIND") != NULL;
  tu_daemon d = {0};
  char ep[200], conf[300];
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  snprintf(conf, sizeof conf, "%s/gnmrd.conf", d.dir);
  tu_write_file(conf, "[limits]\nstore_queue_mb = 1\n");
  char *extra[] = {"--config", conf, NULL};
  setenv("GNMR_STORE_FAULT", slow ? "full:30000" : "full:8000", 1);
  tu_daemon_start_in(&d, ep, NULL, d.dir, extra);
  unsetenv("GNMR_STORE_FAULT");
  char path[512];
  snprintf(path, sizeof path, "%s/gnmr-sim", tu_bin_dir());
  char *argv[] = {path, "--agents", ep, "--job", "flood", "--ranks", "1",
                  "--units", "2048", "--steps", "400", "--timeout-ms",
                  "60000", NULL};
  pid_t sim;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  ck_assert_int_eq(posix_spawn(&sim, path, &fa, NULL, argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  for (int i = 0; i < 400 * tu_slow() && tu_counter(&d, "store_dropped") == 0;
       i++)
    tu_sleep_ms(10);
  ck_assert_int_gt(tu_counter(&d, "store_dropped"), 0); /* shedding */
  gnmr_agent *a = open_agent(ep, "small");
  for (uint64_t t = 1; t <= 40; t++) {
    step_agent(a, t);
    tu_sleep_ms(20);
  }
  gnmr_agent_close(&a);
  int st;
  ck_assert_int_eq(waitpid(sim, &st, 0), sim);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  for (int i = 0; i < 600 * tu_slow() && tu_counter(&d, "store_queued") != 0;
       i++)
    tu_sleep_ms(100);
  char *gap[] = {"history", "small", "--kind", "history_gap", "--csv", NULL};
  run_result r = ctl(&d, gap);
  ck_assert_msg(r.code == 0 && strstr(r.out, "store queue was full") == NULL,
                "the small job lost records: %s%s", r.out, r.err);
  tu_run_free(&r);
  char *dec[] = {"decisions", "small", "--csv", NULL};
  r = ctl(&d, dec);
  ck_assert_msg(r.code == 0, "%s", r.err);
  ck_assert_msg(count_lines(r.out) == 41, "the small job's history has %d "
                "lines, not 41:\n%s", count_lines(r.out), r.out);
  tu_run_free(&r);
  char *fgap[] = {"history", "flood", "--kind", "history_gap", "--csv",
                  NULL};
  r = ctl(&d, fgap);
  ck_assert_msg(r.code == 0 && strstr(r.out, "store queue was full"),
                "the flood shed nothing: %s", r.out);
  tu_run_free(&r);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Issue 47: a file renamed over the database under a running gnmrd made
 * the writer commit into the old, unlinked inode: the history lost
 * without a word. The writer now checks that the file is the one it
 * opened before each batch: it says so, counts, keeps the records, and
 * commits them once the file is back. */
START_TEST(a_database_replaced_under_gnmrd_loses_nothing_silently) {
  tu_daemon d = {0};
  char ep[200], db[300], keep[300], junk[300];
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  tu_daemon_start_in(&d, ep, NULL, d.dir, NULL);
  snprintf(db, sizeof db, "%s/data/gnmr.db", d.dir);
  snprintf(keep, sizeof keep, "%s/data/kept.db", d.dir);
  snprintf(junk, sizeof junk, "%s/data/junk", d.dir);
  gnmr_agent *a = open_agent(ep, "moved");
  for (uint64_t t = 1; t <= 10; t++)
    step_agent(a, t);
  for (int i = 0; i < 100 * tu_slow() && tu_counter(&d, "store_queued") != 0;
       i++)
    tu_sleep_ms(50);
  ck_assert_int_eq(link(db, keep), 0); /* so that it can come back */
  tu_write_file(junk, "not a database\n");
  ck_assert_int_eq(rename(junk, db), 0);
  for (uint64_t t = 11; t <= 20; t++)
    step_agent(a, t);
  char *log = tu_daemon_log_wait(&d, "STORE-REPLACED", 10000 * tu_slow());
  ck_assert_msg(log != NULL && strstr(log, "no longer the one gnmrd opened"),
                "no STORE-REPLACED line:\n%s", tu_daemon_log_tail(&d));
  free(log);
  ck_assert_int_gt(tu_counter(&d, "store_errors"), 0);
  ck_assert_int_gt(tu_counter(&d, "store_queued"), 0);
  ck_assert_int_eq(rename(keep, db), 0); /* back */
  for (int i = 0; i < 300 * tu_slow() && tu_counter(&d, "store_queued") != 0;
       i++)
    tu_sleep_ms(50);
  ck_assert_int_eq(tu_counter(&d, "store_queued"), 0);
  gnmr_agent_close(&a);
  char *dec[] = {"decisions", "moved", "--csv", NULL};
  run_result r = ctl(&d, dec);
  ck_assert_msg(r.code == 0 && count_lines(r.out) == 21, "%d lines:\n%s%s",
                count_lines(r.out), r.out, r.err);
  tu_run_free(&r);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(repeated_sigkill_loses_no_committed_step_and_agents_never_stall) {
  tu_daemon d = {0};
  char ep[160];
  char *every5[] = {"--snapshot-every", "5", NULL};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  tu_daemon_start_in(&d, ep, NULL, d.dir, every5);
  gnmr_agent *a = open_agent(ep, "kill-job");
  uint64_t t = 0;
  char *committed = NULL;
  int rows = 0;
  for (int round = 0; round < 3; round++) {
    /* step while the daemon is up; the agent re-joins by itself */
    int decided = 0;
    while (decided < 12) {
      double s[4];
      struct timespec t0, t1;
      sums(++t, s);
      clock_gettime(CLOCK_MONOTONIC, &t0);
      ck_assert_int_eq(gnmr_agent_report_sums(a, t, s, NULL, NULL), GNMR_OK);
      int rv = gnmr_agent_wait(a, t, 100);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      double w = (double)(t1.tv_sec - t0.tv_sec) +
                 (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
      ck_assert_msg(w < 1.0 * tu_slow(), "the agent stalled %.2f s at step %llu", w,
                    (unsigned long long)t);
      decided += rv == GNMR_OK;
    }
    /* what is committed now must survive every later kill */
    char *args[] = {"decisions", "kill-job", "--csv", NULL};
    run_result r = ctl(&d, args);
    ck_assert_int_eq(r.code, 0);
    ck_assert_int_ge(count_lines(r.out), rows + 1);
    if (committed != NULL)
      ck_assert_msg(strncmp(r.out, committed, strlen(committed)) == 0,
                    "committed steps changed after a restart");
    free(committed);
    committed = r.out;
    rows = count_lines(r.out) - 1;
    free(r.err);
    tu_daemon_stop(&d, SIGKILL);
    tu_daemon_start_in(&d, ep, NULL, d.dir, every5);
  }
  free(committed);
  char *st[] = {"status", "kill-job", "--json", NULL};
  run_result r;
  int live = 0;
  for (int i = 0; i < 100 && !live; i++) { /* re-joins after the restart */
    double s[4];
    sums(++t, s);
    gnmr_agent_report_sums(a, t, s, NULL, NULL);
    live = gnmr_agent_wait(a, t, 200) == GNMR_OK;
  }
  ck_assert(live);
  r = ctl(&d, st);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "\"pass\": 4"));
  tu_run_free(&r);
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Jobs in lockstep snapshot in different steps: each at a phase set by
 * its run id (run 1 at multiples of snapshot_every, run 2 one step
 * earlier, ...), so the store's writer gets them in turn. */
START_TEST(jobs_in_lockstep_snapshot_in_different_steps) {
  tu_daemon d = {0};
  char ep[160], db_path[300];
  char *every5[] = {"--snapshot-every", "5", NULL};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  tu_daemon_start_in(&d, ep, NULL, d.dir, every5);
  gnmr_agent *a = open_agent(ep, "phase-a"), *b = open_agent(ep, "phase-b");
  for (uint64_t t = 1; t <= 12; t++) {
    step_agent(a, t);
    step_agent(b, t);
  }
  tu_sleep_ms(500); /* the writer commits; SIGKILL takes no final one */
  tu_daemon_stop(&d, SIGKILL);
  gnmr_agent_close(&a);
  gnmr_agent_close(&b);
  snprintf(db_path, sizeof db_path, "%s/data/gnmr.db", d.dir);
  sqlite3 *db;
  ck_assert_int_eq(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL),
                   SQLITE_OK);
  sqlite3_stmt *st;
  /* which job's Hello came first (run 1) is up to the agents' threads */
  ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT run, step FROM snapshots "
                                          "ORDER BY run, step",
                                      -1, &st, NULL),
                   SQLITE_OK);
  char got[256] = "";
  size_t off = 0;
  while (sqlite3_step(st) == SQLITE_ROW && off < sizeof got - 40)
    off += (size_t)snprintf(got + off, sizeof got - off, "%lld/%lld ",
                            (long long)sqlite3_column_int64(st, 0),
                            (long long)sqlite3_column_int64(st, 1));
  sqlite3_finalize(st);
  ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT COUNT(DISTINCT job) FROM "
                                          "snapshots",
                                      -1, &st, NULL),
                   SQLITE_OK);
  ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
  ck_assert_int_eq(sqlite3_column_int(st, 0), 2);
  sqlite3_finalize(st);
  sqlite3_close(db);
  ck_assert_str_eq(got, "1/5 1/10 2/4 2/9 ");
  tu_rmrf(d.dir);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("store");
  TCase *tc = tcase_create("history");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, decisions_csv_after_sim_equals_expected_file);
  tcase_add_test(tc,
                 sigkill_loses_no_committed_step_and_job_continues_from_snapshot);
  tcase_add_test(tc, a_killed_run_reads_interrupted_from_the_store);
  tcase_add_test(tc, sparse_unit_ids_survive_a_sigkill_through_the_snapshot);
  tcase_add_test(tc, large_snapshot_streams_into_sqlite_and_restores);
  tcase_add_test(tc, large_snapshots_wait_for_the_store);
  tcase_add_test(tc, jobs_in_lockstep_snapshot_in_different_steps);
  tcase_add_test(tc, live_job_views_and_parameter_changes);
  tcase_add_test(tc, bad_queries_and_unreachable_daemon_fail_clearly);
  tcase_add_test(tc, readers_while_the_daemon_writes);
  tcase_add_test(
      tc, repeated_sigkill_loses_no_committed_step_and_agents_never_stall);
  tcase_add_loop_test(
      tc, store_errors_are_logged_counted_and_retried_losing_nothing, 0, 2);
  tcase_add_test(tc, a_full_queue_says_which_steps_the_history_lacks);
  tcase_add_test(tc, one_jobs_flood_does_not_drop_another_jobs_records);
  tcase_add_test(tc, a_database_replaced_under_gnmrd_loses_nothing_silently);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
