/* SPDX-License-Identifier: MIT */
/* test_durability.c — what a SIGKILL of gnmrd can cost the history
 * (docs/reliability.md, "What a SIGKILL can cost"): every decision an agent
 * acted on is in the history after the restart, whether the store had
 * committed it or not (agents hold what gnmrd has not said is committed and
 * send it in their next Hello), and no step is decided a second time. Each
 * test reads the history's rows straight from the SQLite file. */
#include <sqlite3.h>

#include "storeutil.h"
#include "validate.h" /* GNMR_MAX_HELD */

/* The steps table of a store: "pass step active" per row, in step order. */
typedef struct rows {
  uint64_t n, restored; /* restored: rows without reports (from agents) */
  uint64_t *step;
  uint32_t *pass;
  char **active;
} rows;

static void rows_read(const char *dir, uint64_t run, rows *out) {
  char path[400];
  sqlite3 *db;
  sqlite3_stmt *st;
  snprintf(path, sizeof path, "%s/data/gnmr.db", dir);
  memset(out, 0, sizeof *out);
  ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL),
                   SQLITE_OK);
  ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT pass, step, active, "
                                          "reports FROM steps WHERE run=? "
                                          "ORDER BY step, pass", -1, &st,
                                          NULL),
                   SQLITE_OK);
  sqlite3_bind_int64(st, 1, (sqlite3_int64)run);
  uint64_t cap = 0;
  while (sqlite3_step(st) == SQLITE_ROW) {
    if (out->n == cap) {
      cap = cap ? cap * 2 : 256;
      out->step = realloc(out->step, cap * sizeof *out->step);
      out->pass = realloc(out->pass, cap * sizeof *out->pass);
      out->active = realloc(out->active, cap * sizeof *out->active);
      ck_assert(out->step && out->pass && out->active);
    }
    out->pass[out->n] = (uint32_t)sqlite3_column_int64(st, 0);
    out->step[out->n] = (uint64_t)sqlite3_column_int64(st, 1);
    const char *a = (const char *)sqlite3_column_text(st, 2);
    out->active[out->n] = strdup(a ? a : "");
    out->restored += sqlite3_column_int64(st, 3) == 0;
    out->n++;
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
}

static void rows_free(rows *r) {
  for (uint64_t i = 0; i < r->n; i++)
    free(r->active[i]);
  free(r->step);
  free(r->pass);
  free(r->active);
  memset(r, 0, sizeof *r);
}

/* The rows of step: how many, and whether one has active set want. */
static int rows_have(const rows *h, uint64_t step, const char *want,
                     int *count) {
  int found = 0;
  *count = 0;
  for (uint64_t i = 0; i < h->n; i++)
    if (h->step[i] == step) {
      (*count)++;
      found |= strcmp(h->active[i], want) == 0;
    }
  return found;
}

/* Steps 1..n each have exactly one row, with the active set the agent
 * acted on (seen[t], freed here), in pass 1 up to step split and in pass
 * later after it. */
static void rows_check(const rows *h, char **seen, uint64_t n, uint64_t split,
                       uint32_t later) {
  for (uint64_t t = 1; t <= n; t++) {
    int count;
    ck_assert_msg(rows_have(h, t, seen[t], &count) && count == 1,
                  "step %llu: the agent acted on {%s}; the history has %d "
                  "rows of it, none or others", (unsigned long long)t,
                  seen[t], count);
    ck_assert_uint_eq(h->pass[t - 1], t <= split ? 1 : later);
    free(seen[t]);
  }
}

/* With the store failing every commit, nothing of the job is in the
 * database when gnmrd is killed: not its run, not one of its 20 decided
 * steps. Before agents held their decisions, the restarted gnmrd knew no
 * such job; now the agent's next Hello brings the 20 decisions back, the
 * run goes on under its id, and the new pass starts after step 20. */
START_TEST(decisions_survive_a_kill_before_any_commit) {
  tu_daemon d = {0};
  char ep[160];
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  setenv("GNMR_STORE_FAULT", "readonly:600000", 1);
  tu_daemon_start_in(&d, ep, NULL, d.dir, NULL);
  unsetenv("GNMR_STORE_FAULT");
  gnmr_agent *a = open_agent(ep, "uncommitted");
  char *seen[31] = {0};
  for (uint64_t t = 1; t <= 20; t++) {
    step_agent(a, t);
    seen[t] = acted(a, 4, 0);
  }
  tu_daemon_stop(&d, SIGKILL);
  tu_daemon_start_in(&d, ep, NULL, d.dir, NULL);
  for (uint64_t t = 21; t <= 30; t++) {
    step_agent(a, t);
    seen[t] = acted(a, 4, 0);
  }
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0); /* commits the rest */
  rows h;
  rows_read(d.dir, 1, &h);
  ck_assert_uint_eq(h.restored, 20); /* steps 1-20 came from the agent */
  ck_assert_msg(h.n == 30, "the history has %llu steps of run 1, not 30; "
                "gnmrd's log ends:\n%s", (unsigned long long)h.n,
                tu_daemon_log_tail(&d));
  rows_check(&h, seen, 30, 20, 2);
  rows_free(&h);
  /* and the history says where those steps came from */
  char data[400];
  snprintf(data, sizeof data, "%s/data", d.dir);
  run_result r = tu_run("gnmrctl", (char *[]){"gnmrctl", "--store", data,
                                              "history", "uncommitted",
                                              "--kind", "decisions_restored",
                                              "--csv", NULL}, NULL);
  ck_assert_msg(r.code == 0 && strstr(r.out, "pass 1 steps 1-20: 20 "
                                             "decisions restored from rank 0"),
                "history: exit %d\n%s%s", r.code, r.out, r.err);
  tu_run_free(&r);
  tu_rmrf(d.dir);
}
END_TEST

/* One number from the store at dir (the first column of sql's first row,
 * run bound to ?), or -1 when there is no such row or no database yet. */
static int64_t db_number(const char *dir, const char *sql, uint64_t run) {
  char path[400];
  sqlite3 *db;
  sqlite3_stmt *st;
  int64_t v = -1;
  snprintf(path, sizeof path, "%s/data/gnmr.db", dir);
  if (access(path, F_OK) != 0)
    return -1;
  if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
      sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK) {
    sqlite3_bind_int64(st, 1, (sqlite3_int64)run);
    if (sqlite3_step(st) == SQLITE_ROW &&
        sqlite3_column_type(st, 0) != SQLITE_NULL)
      v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
  }
  sqlite3_close(db);
  return v;
}

/* Waits (up to a minute, ten under valgrind) for db_number to reach want. */
static void db_wait_for(const char *dir, const char *sql, uint64_t run,
                        int64_t want) {
  int64_t v = -1;
  for (int i = 0; i < 600 * tu_slow(); i++) {
    if ((v = db_number(dir, sql, run)) == want)
      return;
    tu_sleep_ms(100);
  }
  ck_abort_msg("%s: %lld, not %lld", sql, (long long)v, (long long)want);
}

/* A restart that commits the job's new pass and nothing else, then a kill:
 * the history's job row says pass 2, its steps end in pass 1, and the
 * agent still holds pass 1's uncommitted decisions. The next gnmrd must
 * take them: what the history holds is what its steps hold, not what the
 * job row's pass suggests (before: those steps were taken for committed,
 * skipped, and the agent told to forget them; found under valgrind, where
 * a slow writer leaves exactly this behind). Deterministic: the store
 * refuses writes while a file exists, and gnmrd 2 serves an endpoint the
 * agent does not know, so it restores the job and nothing else. */
START_TEST(held_decisions_of_an_older_pass_survive_a_restart_that_committed_only_the_job) {
  tu_daemon d = {0};
  char ep[160], other[160], fault[300], env[320];
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  snprintf(other, sizeof other, "ipc://%s/other.sock", d.dir);
  snprintf(fault, sizeof fault, "%s/readonly", d.dir);
  snprintf(env, sizeof env, "readonly-while:%s", fault);
  setenv("GNMR_STORE_FAULT", env, 1);
  static const char steps_sql[] = "SELECT COUNT(*) FROM steps WHERE run=?";
  static const char pass_sql[] = "SELECT pass FROM jobs WHERE run=?";
  char *seen[26] = {0};
  /* gnmrd 1: step 1 committed, then the store refuses; steps 2-20 acted on */
  tu_daemon_start_in(&d, ep, NULL, d.dir, NULL);
  gnmr_agent *a = open_agent(ep, "older-pass");
  step_agent(a, 1);
  seen[1] = acted(a, 4, 0);
  db_wait_for(d.dir, steps_sql, 1, 1);
  FILE *f = fopen(fault, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  for (uint64_t t = 2; t <= 20; t++) {
    step_agent(a, t);
    seen[t] = acted(a, 4, 0);
  }
  tu_daemon_stop(&d, SIGKILL);
  ck_assert_int_eq(db_number(d.dir, steps_sql, 1), 1);
  /* gnmrd 2, which the agent cannot reach: it restores the job, commits
   * its pass 2, and is killed */
  unlink(fault);
  tu_daemon_start_in(&d, other, NULL, d.dir, NULL);
  db_wait_for(d.dir, pass_sql, 1, 2);
  tu_daemon_stop(&d, SIGKILL);
  /* gnmrd 3: the agent comes back with steps 2-20 of pass 1 */
  tu_daemon_start_in(&d, ep, NULL, d.dir, NULL);
  unsetenv("GNMR_STORE_FAULT");
  for (uint64_t t = 21; t <= 25; t++) {
    step_agent(a, t);
    seen[t] = acted(a, 4, 0);
  }
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  rows h;
  rows_read(d.dir, 1, &h);
  ck_assert_msg(h.n == 25 && h.restored == 19,
                "the history has %llu steps of run 1 (%llu restored), not "
                "25 (19); gnmrd's log ends:\n%s", (unsigned long long)h.n,
                (unsigned long long)h.restored, tu_daemon_log_tail(&d));
  rows_check(&h, seen, 25, 20, 3);
  rows_free(&h);
  tu_rmrf(d.dir);
}
END_TEST

/* 4096 units on two ranks (2048 each, ids 0..2047 and 2048..4095), gnmrd
 * SIGKILLed 20 times at random points of the run and restarted on the
 * same data: every decision either rank acted on is in the history with
 * the active set it acted on, and no step has two rows. Prints what was
 * measured (docs/reliability.md quotes it). */
#define BIG_UNITS 2048u

static gnmr_agent *open_big(const char *ep, uint32_t rank, char **names,
                            uint32_t *ids) {
  gnmr_agent_config c = {0};
  c.endpoint = ep;
  c.job = "kill-4k";
  c.rank = rank;
  c.reporters = 2;
  c.unit_names = (const char *const *)names;
  c.unit_ids = ids;
  c.n_units = BIG_UNITS;
  gnmr_params_default(&c.params);
  c.params.warmup_steps = 5;
  c.params.max_active = 64;
  c.barrier_ms = 1000;
  gnmr_agent *a;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  return a;
}

/* Step t's sums of squares for one rank: steady, with a spike on a few
 * units each step, so that the active set changes. */
static void big_sums(uint64_t t, uint32_t rank, double *s) {
  for (uint32_t u = 0; u < BIG_UNITS; u++) {
    uint32_t id = rank * BIG_UNITS + u;
    double n = 1.0 + 0.01 * (double)((t * 31 + id * 7) % 17);
    if ((t * 131 + id * 17) % 997 == 0)
      n *= 8;
    s[u] = n * n;
  }
}

START_TEST(twenty_sigkills_at_4k_units_lose_no_acted_on_decision) {
  tu_daemon d = {0};
  char ep[160];
  char *every[] = {"--snapshot-every", "25", NULL};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  /* 20 kills; under valgrind, where each start of gnmrd takes seconds, 4 */
  int kills = tu_slow() > 1 ? 4 : 20, wait_ms = 2000 * tu_slow();
  char **names[2];
  uint32_t *ids[2];
  for (uint32_t r = 0; r < 2; r++) {
    names[r] = malloc(BIG_UNITS * sizeof *names[r]);
    ids[r] = malloc(BIG_UNITS * sizeof *ids[r]);
    for (uint32_t u = 0; u < BIG_UNITS; u++) {
      char n[32];
      snprintf(n, sizeof n, "layers.%u.mlp", r * BIG_UNITS + u);
      names[r][u] = strdup(n);
      ids[r][u] = r * BIG_UNITS + u;
    }
  }
  tu_daemon_start_in(&d, ep, NULL, d.dir, every);
  gnmr_agent *a[2] = {open_big(ep, 0, names[0], ids[0]),
                      open_big(ep, 1, names[1], ids[1])};
  /* what each rank acted on, by step */
  enum { MAX_STEPS = 4000 };
  char **seen[2];
  for (int r = 0; r < 2; r++)
    seen[r] = calloc(MAX_STEPS + 1, sizeof *seen[r]);
  double *s = malloc(BIG_UNITS * sizeof *s);
  unsigned seed = 20261204u;
  uint64_t t = 0, acted_on = 0;
  char kills_at[256] = ""; /* the steps after which gnmrd was killed */
  size_t klen = 0;
  for (int k = 0; k <= kills; k++) {
    /* steps until the next kill: a few to a few dozen */
    int steps = 5 + (int)(rand_r(&seed) % 40);
    for (int i = 0; i < steps && t < MAX_STEPS; i++) {
      t++;
      for (uint32_t r = 0; r < 2; r++) {
        big_sums(t, r, s);
        ck_assert_int_eq(gnmr_agent_report_sums(a[r], t, s, NULL, NULL),
                         GNMR_OK);
      }
      for (uint32_t r = 0; r < 2; r++)
        if (gnmr_agent_wait(a[r], t, wait_ms) == GNMR_OK &&
            gnmr_agent_decided_step(a[r]) == t) {
          seen[r][t] = acted(a[r], BIG_UNITS, r * BIG_UNITS);
          acted_on++;
        }
    }
    if (k == kills)
      break;
    /* killed at once after a decision, or a little later: the writer's
     * batch may be in flight, queued, or committed */
    tu_sleep_ms((int)(rand_r(&seed) % 3));
    if (klen + 24 < sizeof kills_at)
      klen += (size_t)snprintf(kills_at + klen, sizeof kills_at - klen, " %llu",
                               (unsigned long long)t);
    tu_daemon_stop(&d, SIGKILL);
    tu_daemon_start_in(&d, ep, NULL, d.dir, every);
  }
  for (int r = 0; r < 2; r++)
    gnmr_agent_close(&a[r]);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  rows h;
  rows_read(d.dir, 1, &h);
  uint64_t lost = 0, twice = 0, differ = 0;
  char which[512] = ""; /* the lost steps, for the failure's message */
  size_t wlen = 0;
  for (uint64_t st = 1; st <= t; st++) {
    int count = 0, any = 0;
    for (int r = 0; r < 2; r++) {
      if (seen[r][st] == NULL)
        continue;
      any = 1;
      /* a rank's units are its share of the row's active set */
      int found = 0, c = 0;
      for (uint64_t i = 0; i < h.n; i++) {
        if (h.step[i] != st)
          continue;
        c++;
        char mine[BIG_UNITS * 11 + 1];
        size_t off = 0;
        mine[0] = '\0';
        char *copy = strdup(h.active[i]), *save = NULL;
        for (char *tok = strtok_r(copy, " ", &save); tok;
             tok = strtok_r(NULL, " ", &save)) {
          unsigned long id = strtoul(tok, NULL, 10);
          if (id / BIG_UNITS == (unsigned long)r)
            off += (size_t)sprintf(mine + off, off ? " %lu" : "%lu", id);
        }
        free(copy);
        found |= strcmp(mine, seen[r][st]) == 0;
      }
      count = c;
      if (c > 0 && !found)
        differ++;
    }
    if (any && count == 0) {
      lost++;
      if (wlen + 24 < sizeof which)
        wlen += (size_t)snprintf(which + wlen, sizeof which - wlen, " %llu%s",
                                 (unsigned long long)st,
                                 seen[0][st] && seen[1][st] ? ""
                                 : seen[0][st]        ? "(r0)"
                                                      : "(r1)");
    }
    if (count > 1)
      twice++;
  }
  printf("durability: %d SIGKILLs at %u units: %llu steps, %llu decisions "
         "acted on (per rank), %llu history rows (%llu restored from "
         "agents); lost %llu, differing %llu, decided twice %llu\n", kills,
         2 * BIG_UNITS, (unsigned long long)t, (unsigned long long)acted_on,
         (unsigned long long)h.n, (unsigned long long)h.restored,
         (unsigned long long)lost,
         (unsigned long long)differ, (unsigned long long)twice);
  if (lost != 0 || differ != 0 || twice != 0)
    ck_abort_msg("%llu acted-on steps missing from the history (%s), %llu "
                 "with another active set, %llu decided twice (killed after "
                 "steps%s); gnmrd's data and log kept in %s; its log "
                 "ends:\n%s",
                 (unsigned long long)lost, which, (unsigned long long)differ,
                 (unsigned long long)twice, kills_at, d.dir,
                 tu_daemon_log_tail(&d));
  ck_assert_uint_gt(acted_on, (uint64_t)t); /* most steps were decided */
  rows_free(&h);
  for (int r = 0; r < 2; r++) {
    for (uint64_t st = 0; st <= MAX_STEPS; st++)
      free(seen[r][st]);
    free(seen[r]);
    for (uint32_t u = 0; u < BIG_UNITS; u++)
      free(names[r][u]);
    free(names[r]);
    free(ids[r]);
  }
  free(s);
  tu_rmrf(d.dir);
}
END_TEST

/* With the store failing every commit, gnmrd sends at most GNMR_MAX_HELD
 * (1024) decisions past its durable mark, the most an agent holds: the
 * steps after wait for the store (the agent's waits time out, its routes
 * fall back) instead of being acted on where a kill loses them. Before,
 * it decided on, the agent held its newest 1024, and a kill lost every
 * older one it had acted on (the noisy neighbour's finding, issue 62:
 * there another job's records kept the store behind). After the kill,
 * every decision the agent received is in the history. */
START_TEST(no_more_decisions_go_undurable_than_agents_hold) {
  tu_daemon d = {0};
  char ep[160];
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  setenv("GNMR_STORE_FAULT", "readonly:600000", 1);
  tu_daemon_start_in(&d, ep, NULL, d.dir, NULL);
  unsetenv("GNMR_STORE_FAULT");
  gnmr_agent *a = open_agent(ep, "held-cap");
  enum { N = GNMR_MAX_HELD + 6 };
  char **seen = calloc(N + 11, sizeof *seen);
  uint64_t got = report_and_wait(a, N, GNMR_MAX_HELD, seen);
  ck_assert_uint_eq(got, GNMR_MAX_HELD); /* then the steps waited */
  ck_assert_uint_eq(gnmr_agent_decided_step(a), GNMR_MAX_HELD);
  char opt[300];
  snprintf(opt, sizeof opt, "--admin=%s", d.admin);
  run_result st = tu_run("gnmrctl", (char *[]){"gnmrctl", opt, "stats",
                                               NULL}, NULL);
  const char *w = strstr(st.out, "durable_waits ");
  ck_assert_msg(st.code == 0 && w != NULL && atoll(w + 14) >= 1,
                "gnmrctl stats: exit %d\n%s%s", st.code, st.out, st.err);
  tu_run_free(&st);
  tu_daemon_stop(&d, SIGKILL);
  tu_daemon_start_in(&d, ep, NULL, d.dir, NULL);
  for (uint64_t t = N + 1; t <= N + 10; t++) { /* gnmrd is back */
    step_agent(a, t);
    seen[t] = acted(a, 4, 0);
  }
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  rows h;
  rows_read(d.dir, 1, &h);
  ck_assert_uint_eq(h.restored, GNMR_MAX_HELD); /* all from the agent */
  for (uint64_t t = 1; t <= N + 10; t++) {
    if (seen[t] == NULL)
      continue; /* no decision came: the agent acted on its fallback */
    int count;
    ck_assert_msg(rows_have(&h, t, seen[t], &count) && count == 1,
                  "step %llu: acted on {%s}, the history has %d rows of it",
                  (unsigned long long)t, seen[t], count);
    free(seen[t]);
  }
  free(seen);
  rows_free(&h);
  tu_rmrf(d.dir);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("durability");
  TCase *tc = tcase_create("sigkill");
  tcase_set_timeout(tc, 900);
  tcase_add_test(tc, decisions_survive_a_kill_before_any_commit);
  tcase_add_test(
      tc,
      held_decisions_of_an_older_pass_survive_a_restart_that_committed_only_the_job);
  tcase_add_test(tc, twenty_sigkills_at_4k_units_lose_no_acted_on_decision);
  tcase_add_test(tc, no_more_decisions_go_undurable_than_agents_hold);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
