/* SPDX-License-Identifier: MIT */
/* test_pg.c — the PostgreSQL store against a real server: a throwaway
 * cluster (scripts/pg_tmp.sh: initdb in a temporary directory, a Unix
 * socket, an unprivileged user) that this suite starts and stops. Each test
 * has a database of its own.
 *   - the shared traces give the same decisions and history as SQLite,
 *     gnmrctl --store reads them with no gnmrd up, and deploy/grafana's
 *     views and every panel's query run on them;
 *   - the server killed and restarted mid-job: nothing lost;
 *   - the active gnmrd SIGKILLed mid-job: the standby takes over, and its
 *     decisions are those of one gnmrd restarted on the same data;
 *   - a wrong URL or password, a schema newer than gnmrd's, a standby
 *     without PostgreSQL: clear errors; a read-only and a full database:
 *     logged, retried, nothing lost. */
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>

#include "db.h"
#include "gnmr/error.h"
#include "store_schema.h"
#include "rawpeer.h"
#include "storeutil.h"
#include "validate.h" /* GNMR_MAX_HELD */

static char pg_dir[64]; /* the cluster's directory (its socket is there) */

/* Runs a shell command built from fmt; its exit status. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
  char cmd[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* psql as the cluster's owner on database db. */
static void psql(const char *db, const char *sql) {
  ck_assert_msg(sh("PGOPTIONS='-c client_min_messages=warning' psql -q -X "
                   "-v ON_ERROR_STOP=1 -h '%s' -U gnmr -d '%s' "
                   "-c \"%s\" >/dev/null",
                   pg_dir, db, sql) == 0,
                "psql: %s", sql);
}

/* psql's unaligned output of sql on database db (the caller frees); NULL
 * when psql failed. */
static char *psql_out(const char *db, const char *sql) {
  char path[] = "/tmp/gnmr-sql-XXXXXX", out[64];
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, sql, strlen(sql)), (ssize_t)strlen(sql));
  close(fd);
  snprintf(out, sizeof out, "%s.out", path);
  int rc = sh("psql -X -A -t -q -v ON_ERROR_STOP=1 -h '%s' -U gnmr -d '%s' "
              "-f '%s' >'%s' 2>&1",
              pg_dir, db, path, out);
  char *text = tu_read_file(out, NULL);
  unlink(path);
  unlink(out);
  if (rc != 0) {
    fprintf(stderr, "psql: %s\n%s\n", sql, text ? text : "");
    free(text);
    return NULL;
  }
  return text;
}

/* A fresh database for one test; its URL in url. */
static void fresh_db(const char *name, char *url, size_t cap) {
  char sql[128];
  snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s", name);
  psql("postgres", sql);
  snprintf(sql, sizeof sql, "CREATE DATABASE %s", name);
  psql("postgres", sql);
  snprintf(url, cap, "postgresql://gnmr@/%s?host=%s", name, pg_dir);
}

static run_result ctl_store(const char *store, char **args) {
  char *argv[32];
  int n = 0;
  argv[n++] = "gnmrctl";
  argv[n++] = "--store";
  argv[n++] = (char *)store;
  for (int i = 0; args[i] && n < 31; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  return tu_run("gnmrctl", argv, NULL);
}

/* The lines of text, sorted: the history of two runs holds the same
 * events, but agents join in the order they happen to connect. */
static int cmp_line(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}
static char *sorted_lines(const char *text) {
  char *copy = strdup(text), **lines = NULL, *save = NULL;
  size_t n = 0, len = 0;
  for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    lines = realloc(lines, (n + 1) * sizeof *lines);
    lines[n++] = l;
    len += strlen(l) + 1;
  }
  qsort(lines, n, sizeof *lines, cmp_line);
  char *out = calloc(1, len + 1);
  for (size_t i = 0; i < n; i++) {
    strcat(out, lines[i]);
    strcat(out, "\n");
  }
  free(lines);
  free(copy);
  return out;
}

/* Runs a trace through gnmrd (store: NULL for SQLite) and returns its
 * decisions and sorted history, read back through gnmrd. */
static void run_trace(const char *store, const char *trace, const char *job,
                      char **decisions, char **history) {
  tu_daemon d = {0};
  char *extra[] = {"--store", (char *)store, NULL};
  tu_daemon_start_in(&d, NULL, NULL, NULL, store ? extra : NULL);
  char tp[512];
  snprintf(tp, sizeof tp, "%s/%s", tu_traces(), trace);
  char *argv[] = {"gnmr-sim", "--agents", d.agents, "--job", (char *)job,
                  "--ranks", "3", "--shards", "2", "--trace", tp,
                  "--barrier-ms", "20000", "--timeout-ms", "30000",
                  TU_FIRST_DEFAULTS, NULL};
  run_result r = tu_run("gnmr-sim", argv, NULL);
  ck_assert_msg(r.code == 0, "sim: %s", r.err);
  int rows = count_lines(r.out) - 1;
  tu_run_free(&r);
  *decisions = decisions_csv(&d, job, rows);
  char *h[] = {"history", (char *)job, "--csv", "--limit", "1000000", NULL};
  r = ctl(&d, h);
  ck_assert_int_eq(r.code, 0);
  *history = sorted_lines(r.out);
  tu_run_free(&r);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}

START_TEST(traces_give_the_same_decisions_and_history_as_sqlite) {
  char url[256];
  fresh_db("same", url, sizeof url);
  static const struct {
    const char *trace, *expect;
  } cases[] = {{"small.csv", "small.defaults.decisions.csv"},
               {"burst.csv", NULL}};
  /* valgrind runs the first trace only (each run is four processes) */
  size_t n_cases = getenv("GNMR_VALGRIND") != NULL ? 1 : 2;
  for (size_t i = 0; i < n_cases; i++) {
    char job[16], *dl, *hl, *dp, *hp;
    snprintf(job, sizeof job, "same-%zu", i);
    run_trace(NULL, cases[i].trace, job, &dl, &hl);
    run_trace(url, cases[i].trace, job, &dp, &hp);
    ck_assert_msg(strcmp(dl, dp) == 0, "%s: decisions differ",
                  cases[i].trace);
    ck_assert_msg(strcmp(hl, hp) == 0, "%s: history differs",
                  cases[i].trace);
    ck_assert_int_gt(count_lines(hp), 10);
    if (cases[i].expect != NULL) {
      char p[512];
      snprintf(p, sizeof p, "%s/%s", tu_traces(), cases[i].expect);
      char *want = tu_read_file(p, NULL);
      ck_assert_msg(strcmp(dp, want) == 0, "decisions differ from %s", p);
      free(want);
    }
    free(dl);
    free(hl);
    free(dp);
    free(hp);
  }
  /* with no gnmrd up, gnmrctl --store reads the same answers */
  char *jobs[] = {"jobs", "--csv", NULL};
  run_result r = ctl_store(url, jobs);
  ck_assert_msg(r.code == 0, "%s", r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "same-0,finished,1,200,3,"));
  if (n_cases > 1)
    ck_assert_ptr_nonnull(strstr(r.out, "same-1,finished,1,"));
  tu_run_free(&r);
  char *dec[] = {"decisions", "same-0", "--csv", NULL};
  r = ctl_store(url, dec);
  ck_assert_int_eq(r.code, 0);
  char p[512];
  snprintf(p, sizeof p, "%s/small.defaults.decisions.csv", tu_traces());
  char *want = tu_read_file(p, NULL);
  ck_assert_str_eq(r.out, want);
  free(want);
  tu_run_free(&r);
  char *ex[] = {"export", "same-0", NULL};
  r = ctl_store(url, ex);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "\"events\": ["));
  ck_assert_ptr_nonnull(strstr(r.out, "\"kind\": \"exceed\""));
  tu_run_free(&r);
  /* deploy/grafana: the views apply, and every panel's query runs (with
   * Grafana's macro and variable filled in) and the step panels have rows */
  char vp[512];
  snprintf(vp, sizeof vp, "%s/deploy/grafana/views.sql",
           getenv("GNMR_SOURCE_DIR"));
  ck_assert_int_eq(sh("psql -X -q -v ON_ERROR_STOP=1 -h '%s' -U gnmr -d same "
                      "-f '%s' >/dev/null",
                      pg_dir, vp),
                   0);
  snprintf(vp, sizeof vp, "%s/deploy/grafana/gnmr-store-dashboard.json",
           getenv("GNMR_SOURCE_DIR"));
  json_error_t je;
  json_t *dash = json_load_file(vp, 0, &je);
  ck_assert_msg(dash != NULL, "%s:%d: %s", vp, je.line, je.text);
  json_t *panels = json_object_get(dash, "panels"), *pn;
  size_t pi;
  ck_assert_int_ge(json_array_size(panels), 4);
  json_array_foreach(panels, pi, pn) {
    const char *raw = json_string_value(json_object_get(
        json_array_get(json_object_get(pn, "targets"), 0), "rawSql"));
    ck_assert_ptr_nonnull(raw);
    char sql[2048];
    size_t o = 0;
    for (const char *q = raw; *q && o < sizeof sql - 32;) {
      if (strncmp(q, "$__timeFilter(time)", 19) == 0) {
        o += (size_t)snprintf(sql + o, sizeof sql - o, "time IS NOT NULL");
        q += 19;
      } else if (strncmp(q, "$job", 4) == 0) {
        o += (size_t)snprintf(sql + o, sizeof sql - o, "same-0");
        q += 4;
      } else {
        sql[o++] = *q++;
      }
    }
    sql[o] = '\0';
    char *rows = psql_out("same", sql);
    ck_assert_msg(rows != NULL, "panel '%s': its query fails",
                  json_string_value(json_object_get(pn, "title")));
    if (pi == 0 || pi >= 4) /* steps, and the fleet tables */
      ck_assert_msg(count_lines(rows) > 0, "panel '%s' is empty",
                    json_string_value(json_object_get(pn, "title")));
    free(rows);
  }
  json_decref(dash);
  /* fleet-wide: every exceed of a unit across runs, straight in SQL */
  char *ex_rows = psql_out("same", "SELECT sum(exceeds) FROM "
                                   "gnmr_unit_exceeds WHERE job='same-0'");
  ck_assert_ptr_nonnull(ex_rows);
  ck_assert_int_gt(atoi(ex_rows), 0);
  free(ex_rows);
  /* status, units and top from the last snapshot, with no gnmrd: the
   * promotions per unit add up to the history's promote events */
  char *st[] = {"status", "same-0", "--json", NULL};
  r = ctl_store(url, st);
  ck_assert_msg(r.code == 0 && strstr(r.out, "\"state\": \"finished\"") &&
                    strstr(r.out, "\"step\": 200"),
                "status: exit %d\n%s%s", r.code, r.out, r.err);
  tu_run_free(&r);
  char *un[] = {"units", "same-0", "--csv", NULL};
  r = ctl_store(url, un);
  ck_assert_msg(r.code == 0, "units: %s", r.err);
  long promoted = 0, max_promoted = 0;
  for (char *line = strchr(r.out, '\n'); line && line[1]; ) {
    char *end = strchr(line + 1, '\n');
    if (end == NULL)
      break;
    *end = '\0';
    long k = atol(strrchr(line + 1, ',') + 1);
    promoted += k;
    max_promoted = k > max_promoted ? k : max_promoted;
    line = end;
  }
  tu_run_free(&r);
  char *pr[] = {"history", "same-0", "--kind", "promote", "--limit",
                "100000", "--csv", NULL};
  r = ctl_store(url, pr);
  ck_assert_int_eq(r.code, 0);
  ck_assert_int_gt(promoted, 0);
  ck_assert_int_eq(promoted, count_lines(r.out) - 1);
  tu_run_free(&r);
  char *tp[] = {"top", "same-0", "--limit", "1", "--csv", NULL};
  r = ctl_store(url, tp);
  ck_assert_int_eq(r.code, 0);
  ck_assert_int_eq(count_lines(r.out), 2);
  ck_assert_int_eq(atol(strrchr(r.out, ',') + 1), max_promoted);
  tu_run_free(&r);
  /* a change needs gnmrd */
  char *set[] = {"set", "same-0", "alpha=3", NULL};
  r = ctl_store(url, set);
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "goes to gnmrd"));
  tu_run_free(&r);
}
END_TEST

START_TEST(server_killed_and_restarted_mid_job_loses_nothing) {
  char url[256];
  fresh_db("restart", url, sizeof url);
  tu_daemon d = {0};
  char *extra[] = {"--store", url, NULL};
  tu_daemon_start_in(&d, NULL, NULL, NULL, extra);
  gnmr_agent *a = open_agent(d.agents, "pg-restart");
  for (uint64_t t = 1; t <= 30; t++)
    step_agent(a, t);
  free(decisions_csv(&d, "pg-restart", 30));
  ck_assert_int_eq(sh("'%s/scripts/pg_tmp.sh' kill '%s'",
                      getenv("GNMR_SOURCE_DIR"), pg_dir), 0);
  for (uint64_t t = 31; t <= 60; t++)
    step_agent(a, t); /* decisions never wait on the store */
  tu_sleep_ms(300);
  ck_assert_int_eq(sh("'%s/scripts/pg_tmp.sh' start '%s' >/dev/null",
                      getenv("GNMR_SOURCE_DIR"), pg_dir), 0);
  for (uint64_t t = 61; t <= 80; t++)
    step_agent(a, t);
  char *csv = decisions_csv(&d, "pg-restart", 80); /* polls: backoff */
  ck_assert_int_eq(count_lines(csv), 81);
  free(csv);
  ck_assert_int_gt(tu_counter(&d, "store_errors"), 0);
  ck_assert_int_eq(tu_counter(&d, "store_dropped"), 0);
  /* the restart ended the leadership's session too: taken again (by the
   * leadership's own thread, in its own time) */
  char *log = tu_daemon_log_wait(&d, "LEADER-REGAINED", 10000);
  ck_assert_msg(log != NULL, "no LEADER-REGAINED; gnmrd's log ends:\n%s",
                tu_daemon_log_tail(&d));
  ck_assert_ptr_nonnull(strstr(log, "STORE-COMMIT"));
  ck_assert_ptr_nonnull(strstr(log, "connected again"));
  free(log);
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Issue 62 on PostgreSQL (test_durability has it on SQLite): with every
 * commit of steps refused (a trigger raises, as a server that refuses
 * writes), gnmrd sends at most GNMR_MAX_HELD (1024) decisions past its
 * durable mark, the most an agent holds, and the steps after wait for the
 * store. SIGKILLed and restarted on the same database with the writes
 * allowed again, it takes the agent's held decisions back: every
 * decision the agent acted on is in the history, once. */
START_TEST(no_more_decisions_go_undurable_than_agents_hold) {
  char url[256], ep[200];
  fresh_db("durable", url, sizeof url);
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  char *extra[] = {"--store", url, NULL};
  tu_daemon_start_in(&d, ep, NULL, d.dir, extra);
  psql("durable", "CREATE FUNCTION refuse() RETURNS trigger AS "
                  "\\$\\$BEGIN RAISE EXCEPTION 'cannot execute INSERT in a "
                  "read-only transaction' USING ERRCODE = '25006'; "
                  "END\\$\\$ LANGUAGE plpgsql");
  psql("durable", "CREATE TRIGGER refuse BEFORE INSERT ON steps FOR EACH "
                  "ROW EXECUTE FUNCTION refuse()");
  gnmr_agent *a = open_agent(ep, "pg-held-cap");
  enum { N = GNMR_MAX_HELD + 6 };
  char **seen = calloc(N + 11, sizeof *seen);
  ck_assert_ptr_nonnull(seen);
  uint64_t got = report_and_wait(a, N, GNMR_MAX_HELD, seen);
  ck_assert_uint_eq(got, GNMR_MAX_HELD); /* then the steps waited */
  ck_assert_int_ge(tu_counter(&d, "durable_waits"), 1);
  ck_assert_int_gt(tu_counter(&d, "store_errors"), 0);
  tu_daemon_stop(&d, SIGKILL);
  psql("durable", "DROP TRIGGER refuse ON steps");
  tu_daemon_start_in(&d, ep, NULL, d.dir, extra);
  for (uint64_t t = N + 1; t <= N + 10; t++) { /* gnmrd is back */
    step_agent(a, t);
    seen[t] = acted(a, 4, 0);
  }
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  char *rows = psql_out("durable", "SELECT step, active, reports FROM "
                                   "steps WHERE job='pg-held-cap' ORDER BY "
                                   "step, pass");
  ck_assert_ptr_nonnull(rows);
  uint64_t restored = 0, n = 0;
  int *count = calloc(N + 11, sizeof *count);
  ck_assert_ptr_nonnull(count);
  for (char *line = strtok(rows, "\n"); line != NULL;
       line = strtok(NULL, "\n")) {
    char *bar1 = strchr(line, '|'), *bar2 = bar1 ? strchr(bar1 + 1, '|') : 0;
    ck_assert_msg(bar2 != NULL, "a row: %s", line);
    *bar1 = *bar2 = '\0';
    uint64_t t = strtoull(line, NULL, 10);
    ck_assert_uint_le(t, N + 10);
    restored += strcmp(bar2 + 1, "0") == 0;
    n++;
    if (seen[t] != NULL) {
      ck_assert_msg(strcmp(bar1 + 1, seen[t]) == 0,
                    "step %llu: acted on {%s}, the history has {%s}",
                    (unsigned long long)t, seen[t], bar1 + 1);
      count[t]++;
    }
  }
  ck_assert_uint_eq(restored, GNMR_MAX_HELD); /* all from the agent */
  for (uint64_t t = 1; t <= N + 10; t++) {
    if (seen[t] == NULL)
      continue; /* no decision came: the agent acted on its fallback */
    ck_assert_msg(count[t] == 1, "step %llu: acted on {%s}, the history "
                  "has %d rows of it", (unsigned long long)t, seen[t],
                  count[t]);
    free(seen[t]);
  }
  printf("PostgreSQL, every commit refused: %llu decisions sent, the "
         "steps after waited; after a SIGKILL the history has all %llu "
         "(%llu rows)\n", (unsigned long long)got,
         (unsigned long long)got, (unsigned long long)n);
  free(count);
  free(seen);
  free(rows);
  tu_rmrf(d.dir);
}
END_TEST

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

START_TEST(standby_takes_over_with_the_decisions_of_a_restart) {
  char url[256], eps[400], epa[160], epb[160];
  fresh_db("takeover", url, sizeof url);
  tu_daemon a = {0}, b = {0};
  snprintf(a.dir, sizeof a.dir, "%s", tu_tmpdir());
  snprintf(b.dir, sizeof b.dir, "%s", tu_tmpdir());
  snprintf(epa, sizeof epa, "ipc://%s/agents.sock", a.dir);
  snprintf(epb, sizeof epb, "ipc://%s/agents.sock", b.dir);
  snprintf(eps, sizeof eps, "%s,%s", epa, epb);
  char *active[] = {"--store", url, "--snapshot-every", "10", NULL};
  char *standby[] = {"--store", url, "--snapshot-every", "10", "--standby",
                     NULL};
  tu_daemon_start_in(&a, epa, NULL, a.dir, active);
  tu_daemon_spawn_in(&b, epb, NULL, b.dir, standby);
  /* a second active one is refused */
  {
    tu_daemon c = {0};
    tu_daemon_spawn_in(&c, NULL, NULL, NULL, active);
    int st;
    ck_assert_int_eq(waitpid(c.pid, &st, 0), c.pid);
    tu_track_daemon(c.pid, 0);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    char *log = tu_daemon_log(&c);
    ck_assert_ptr_nonnull(strstr(log, "another gnmrd is active"));
    free(log);
    tu_rmrf(c.dir);
  }
  gnmr_agent *ag = open_agent(eps, "pg-takeover");
  for (uint64_t t = 1; t <= 35; t++)
    step_agent(ag, t);
  char *before = decisions_csv(&a, "pg-takeover", 35);
  /* the report of step 36 reaches the active gnmrd's socket, which dies
   * before reading it (stopped, then killed): the agent sends it again to
   * the standby once it serves, so step 36 is decided all the same */
  double s36[4];
  sums(36, s36);
  kill(a.pid, SIGSTOP);
  ck_assert_int_eq(gnmr_agent_report_sums(ag, 36, s36, NULL, NULL), GNMR_OK);
  tu_sleep_ms(100); /* forwarded into the stopped gnmrd's connection */
  double t0 = now_s();
  tu_daemon_stop(&a, SIGKILL);
  ck_assert_msg(gnmr_agent_wait(ag, 36, 10000 * tu_slow()) == GNMR_OK,
                "step 36, sent to the gnmrd that died, was never decided");
  double failover = now_s() - t0;
  tu_daemon_wait_ready(&b, 5000); /* it took the lock, restored, bound */
  fprintf(stderr, "failover: SIGKILL to the standby's first decision "
          "%.0f ms\n", failover * 1e3);
  ck_assert_msg(failover < 5.0 * tu_slow(), "failover took %.1f s", failover);
  for (uint64_t t = 37; t <= 80; t++)
    step_agent(ag, t);
  char *after = decisions_csv(&b, "pg-takeover", 80);
  ck_assert_msg(strncmp(after, before, strlen(before)) == 0,
                "steps 1-35 changed after the takeover");
  /* what one gnmrd restarted on the same data decides: the engine from
   * the snapshot at step 30, then steps 36..80 (test_store.c's restart) */
  uint64_t steps[75];
  size_t n = 0;
  for (uint64_t t = 1; t <= 30; t++)
    steps[n++] = t;
  for (uint64_t t = 36; t <= 80; t++)
    steps[n++] = t;
  static char want[8192];
  engine_rows(steps, n, want, sizeof want, 36);
  ck_assert_msg(strstr(after, want) != NULL,
                "the standby's decisions differ from a restart's:\n%s\nvs\n"
                "%s", after, want);
  char *h[] = {"history", "pg-takeover", "--kind", "job_resumed", "--csv",
               NULL};
  run_result r = ctl(&b, h);
  ck_assert_int_eq(r.code, 0);
  /* pass 2 begins after step 35, the last committed: never decided again */
  ck_assert_ptr_nonnull(strstr(r.out, "2,35,job_resumed"));
  tu_run_free(&r);
  free(before);
  free(after);
  gnmr_agent_close(&ag);
  ck_assert_int_eq(tu_daemon_stop(&b, SIGTERM), 0);
  tu_rmrf(a.dir);
  tu_rmrf(b.dir);
}
END_TEST

/* The active gnmrd's session ends while it is stopped (SIGSTOP); the
 * standby takes over; the old one, continued, finds the lock taken and
 * stops serving (exit 3) instead of deciding next to the new one. */
START_TEST(a_deposed_active_stops_serving) {
  char url[256];
  fresh_db("deposed", url, sizeof url);
  tu_daemon a = {0}, b = {0};
  char *active[] = {"--store", url, NULL};
  char *standby[] = {"--store", url, "--standby", NULL};
  tu_daemon_start_in(&a, NULL, NULL, NULL, active);
  tu_daemon_spawn_in(&b, NULL, NULL, NULL, standby);
  tu_sleep_ms(300); /* standing by */
  kill(a.pid, SIGSTOP);
  psql("postgres", "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE "
                   "locktype='advisory' AND granted AND classid = 1196313938 AND "
                   "database=(SELECT oid FROM pg_database WHERE "
                   "datname='deposed')");
  tu_daemon_wait_ready(&b, 5000);
  kill(a.pid, SIGCONT);
  int st;
  ck_assert_int_eq(waitpid(a.pid, &st, 0), a.pid);
  tu_track_daemon(a.pid, 0);
  a.pid = 0;
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 3, "exit %d",
                WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  char *log = tu_daemon_log(&a);
  ck_assert_ptr_nonnull(strstr(log, "another gnmrd took over the store"));
  free(log);
  ck_assert_int_eq(tu_daemon_stop(&b, SIGTERM), 0);
  tu_rmrf(a.dir);
  tu_rmrf(b.dir);
}
END_TEST

/* One leader at a time (issue 47): the round saw a deposed active keep
 * deciding for 0.18 s while the standby already served (333, then 97
 * decisions from the old leader after the new one's first). Here the
 * active's leadership session is terminated 20 times while a rank steps
 * on it; a second connection of the rank joins whichever gnmrd serves
 * next. Every decision the deposed gnmrd sent must arrive before the
 * first one its successor sent, and carry an older term. The roles then
 * swap (the deposed one, exit 3, comes back as the standby). */
typedef struct fence_side {
  tu_daemon d;
  char ep[160];
  raw_peer p;
  int open;
} fence_side;

static void fence_spawn(fence_side *f, const char *url, int standby) {
  char *args[] = {"--store", (char *)url, "--standby", NULL};
  if (!standby)
    args[2] = NULL;
  tu_daemon_spawn_in(&f->d, f->ep, NULL, f->d.dir, args);
}

/* One report of rank 0 for step t through f's connection; never blocks
 * (a deposed gnmrd that exited leaves the connection without a peer). */
static void fence_report(fence_side *f, uint64_t t) {
  double s[4]; /* sums() writes four units' sums; the job has two */
  sums(t, s);
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Report r = GNMR__REPORT__INIT;
  r.job = "fence";
  r.step = t;
  r.n_sumsq = 2;
  r.sumsq = s;
  env.body_case = GNMR__ENVELOPE__BODY_REPORT;
  env.report = &r;
  uint8_t *buf;
  size_t len;
  ck_assert_int_eq(gnmr__wire_encode(&env, &buf, &len), GNMR_OK);
  zmq_send(f->p.sock, buf, len, ZMQ_DONTWAIT);
  free(buf);
}

static int fence_ready(const tu_daemon *d) {
  char out[128];
  snprintf(out, sizeof out, "%s/out", d->dir);
  char *txt = tu_read_file(out, NULL);
  int ready = txt != NULL && strstr(txt, "gnmrd: admin ") != NULL;
  free(txt);
  return ready;
}

START_TEST(a_deposed_leader_never_decides_after_its_successor) {
  char url[256];
  fresh_db("fence", url, sizeof url);
  fence_side side[2] = {0};
  static char *units[] = {"u0", "u1"};
  for (int i = 0; i < 2; i++) {
    const char *dir = tu_tmpdir();
    snprintf(side[i].d.dir, sizeof side[i].d.dir, "%s", dir);
    snprintf(side[i].ep, sizeof side[i].ep, "ipc://%s/agents.sock", dir);
  }
  fence_spawn(&side[0], url, 0);
  tu_daemon_wait_ready(&side[0].d, 20000);
  fence_spawn(&side[1], url, 1);
  side[0].p = raw_open(side[0].ep);
  side[0].open = 1;
  hello(&side[0].p, "fence", 0, 1, units, 2, 2.0);
  Gnmr__Envelope *e = expect_body(&side[0].p, GNMR__ENVELOPE__BODY_WELCOME);
  uint64_t step = e->welcome->last_step + 1, term = e->welcome->term;
  gnmr__wire_free(&e);
  int act = 0, failovers = 0, late = 0;
  long old_total = 0;
  double worst_gap = 1e9;
  /* under valgrind (every gnmrd too) 4 rounds: each start takes seconds */
  int rounds = tu_slow() > 1 ? 4 : 20;
  for (int round = 0; round < rounds; round++) {
    fence_side *a = &side[act], *b = &side[1 - act];
    for (int k = 0; k < 5; k++, step++) { /* stepping on the active */
      fence_report(a, step);
      e = expect_body(&a->p, GNMR__ENVELOPE__BODY_DECISION);
      ck_assert_uint_eq(e->decision->term, term);
      gnmr__wire_free(&e);
    }
    psql("postgres", "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE "
                     "locktype='advisory' AND granted AND classid = "
                     "1196313938 AND database=(SELECT oid FROM pg_database "
                     "WHERE datname='fence')");
    /* the rank goes on stepping on the old leader while it answers, and
     * joins the new one once that serves */
    double t_old_last = 0, t_new_first = 0,
           until = now_s() + (tu_slow() > 1 ? 40.0 : 15.0);
    int b_hello = 0, b_decided = 0, waiting_a = 0;
    uint64_t a_step = step, b_step = 0, new_term = 0;
    if (b->open)
      raw_close(&b->p);
    b->open = 0;
    while (now_s() < until && b_decided < 5) {
      if (!waiting_a) {
        fence_report(a, a_step);
        waiting_a = 1;
      }
      Gnmr__Envelope *m = raw_recv(&a->p, 10);
      if (m != NULL) {
        if (m->body_case == GNMR__ENVELOPE__BODY_DECISION) {
          ck_assert_uint_eq(m->decision->term, term);
          t_old_last = now_s();
          old_total++;
          if (t_new_first > 0)
            late++;
          if (m->decision->step == a_step) {
            a_step++;
            waiting_a = 0;
            tu_sleep_ms(2); /* a step every few ms, as a fast job */
          }
        }
        gnmr__wire_free(&m);
      }
      if (!b_hello && fence_ready(&b->d)) {
        b->p = raw_open(b->ep);
        b->open = 1;
        hello(&b->p, "fence", 0, 1, units, 2, 2.0);
        b_hello = 1;
      }
      if (!b_hello)
        continue;
      while ((m = raw_recv(&b->p, 10)) != NULL) {
        if (m->body_case == GNMR__ENVELOPE__BODY_WELCOME) {
          b_step = m->welcome->last_step + 1;
          new_term = m->welcome->term;
          fence_report(b, b_step);
        } else if (m->body_case == GNMR__ENVELOPE__BODY_DECISION &&
                   m->decision->step == b_step) {
          ck_assert_uint_gt(m->decision->term, term);
          ck_assert_uint_eq(m->decision->term, new_term);
          if (t_new_first == 0)
            t_new_first = now_s();
          b_step++;
          if (++b_decided < 5)
            fence_report(b, b_step);
        }
        gnmr__wire_free(&m);
        if (b_decided >= 5)
          break;
      }
    }
    if (getenv("GNMR_PG_VERBOSE") != NULL)
      fprintf(stderr, "round %d: old leader's last at %+.0f ms, new one's "
              "first at %+.0f ms (from the new one's first hello: %d), "
              "b_decided %d\n", round,
              t_old_last > 0 ? (t_old_last - until) * 1e3 : 0.0,
              t_new_first > 0 ? (t_new_first - until) * 1e3 : 0.0, b_hello,
              b_decided);
    if (b_decided == 0) {
      /* the old leader took its lock again first (its new session won the
       * race): still one leader; try again */
      ck_assert_msg(!fence_ready(&b->d), "round %d: the standby serves "
                    "but decided nothing", round);
      step = a_step;
      continue;
    }
    failovers++;
    ck_assert_msg(late == 0, "round %d: %d decisions of the old leader "
                  "(term %llu) arrived after the new one's first", round,
                  late, (unsigned long long)term);
    if (t_old_last > 0 && t_new_first - t_old_last < worst_gap)
      worst_gap = t_new_first - t_old_last;
    int st;
    ck_assert_int_eq(waitpid(a->d.pid, &st, 0), a->d.pid);
    tu_track_daemon(a->d.pid, 0);
    a->d.pid = 0;
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 3, "round %d: the "
                  "deposed gnmrd's exit %d", round,
                  WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    raw_close(&a->p);
    a->open = 0;
    fence_spawn(a, url, 1); /* back as the standby */
    step = b_step;
    term = new_term;
    act = 1 - act;
  }
  fprintf(stderr, "fencing: %d failovers of %d terminations; %ld decisions "
          "from deposed leaders, 0 after a successor's first; the smallest "
          "gap between them %.0f ms\n", failovers, rounds, old_total,
          worst_gap * 1e3);
  /* who takes the lock after a termination is a race (the old leader's
   * new session or the standby's poll); under valgrind the old one wins
   * it more often: there one failover is asked for, the rule above held
   * in every round either way */
  int need = tu_slow() > 1 ? 1 : rounds * 3 / 4;
  ck_assert_msg(failovers >= need, "only %d failovers of %d", failovers,
                rounds);
  for (int i = 0; i < 2; i++) {
    if (side[i].open)
      raw_close(&side[i].p);
    tu_daemon_stop(&side[i].d, SIGTERM);
    tu_rmrf(side[i].d.dir);
  }
}
END_TEST

/* Two gnmrd groups share one database, each in its own schema: both are
 * active (one leadership per schema), and each schema holds its own
 * history with its own run ids. */
START_TEST(two_groups_share_a_database_in_two_schemas) {
  char url[256], u1[400], u2[400];
  fresh_db("groups", url, sizeof url);
  psql("groups", "CREATE SCHEMA g1; CREATE SCHEMA g2");
  snprintf(u1, sizeof u1, "%s&options=-c%%20search_path%%3Dg1", url);
  snprintf(u2, sizeof u2, "%s&options=-c%%20search_path%%3Dg2", url);
  tu_daemon a = {0}, b = {0};
  char *e1[] = {"--store", u1, NULL}, *e2[] = {"--store", u2, NULL};
  tu_daemon_start_in(&a, NULL, NULL, NULL, e1);
  tu_daemon_start_in(&b, NULL, NULL, NULL, e2); /* not refused */
  gnmr_agent *x = open_agent(a.agents, "in-g1"), *y = open_agent(b.agents,
                                                                 "in-g2");
  for (uint64_t t = 1; t <= 5; t++) {
    step_agent(x, t);
    step_agent(y, t);
  }
  free(decisions_csv(&a, "in-g1", 5));
  free(decisions_csv(&b, "in-g2", 5));
  gnmr_agent_close(&x);
  gnmr_agent_close(&y);
  /* finished once each gnmrd has the Bye (the close does not wait) */
  tu_wait_counter(&a, "jobs_finished", 1);
  tu_wait_counter(&b, "jobs_finished", 1);
  ck_assert_int_eq(tu_daemon_stop(&a, SIGTERM), 0);
  ck_assert_int_eq(tu_daemon_stop(&b, SIGTERM), 0);
  char *jobs[] = {"jobs", "--csv", NULL};
  run_result r = ctl_store(u1, jobs);
  ck_assert_int_eq(r.code, 0);
  ck_assert_msg(strstr(r.out, "in-g1,finished,1,5,") != NULL, "%s", r.out);
  ck_assert_ptr_null(strstr(r.out, "in-g2"));
  tu_run_free(&r);
  char *g2 = psql_out("groups", "SELECT name, run FROM g2.jobs");
  ck_assert_ptr_nonnull(g2);
  ck_assert_str_eq(g2, "in-g2|1\n");
  free(g2);
  tu_rmrf(a.dir);
  tu_rmrf(b.dir);
}
END_TEST

/* An export bigger than a chunk streams from PostgreSQL too: the cursor
 * stays open across chunks (single-row mode) and the JSON is whole. */
START_TEST(a_large_export_streams_from_postgresql) {
  char url[256];
  fresh_db("bigexport", url, sizeof url);
  tu_daemon d = {0};
  char *extra[] = {"--store", url, NULL};
  tu_daemon_start_in(&d, NULL, NULL, NULL, extra); /* the schema */
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
  const int n = getenv("GNMR_VALGRIND") ? 5000 : 60000;
  char sql[512];
  psql("bigexport", "INSERT INTO jobs(run, name, reporters, barrier_ms, "
                    "state, pass, last_step) VALUES(1, 'big', 1, 1000, "
                    "'finished', 1, 1000); INSERT INTO units VALUES('big', "
                    "1, 0, 'layer.0')");
  snprintf(sql, sizeof sql,
           "INSERT INTO events(job, run, pass, step, kind, unit, outcome, "
           "norm, g, d, s, count, at) SELECT 'big', 1, 1, 1 + i / 200, "
           "'exceed', 0, 'dropped', 1.5, 3, 'Infinity', 3, 0, 0 FROM "
           "generate_series(0, %d) AS i",
           n - 1);
  psql("bigexport", sql);
  char *ex[] = {"export", "big", NULL};
  run_result r = ctl_store(url, ex);
  ck_assert_msg(r.code == 0, "%s", r.err);
  if (!getenv("GNMR_VALGRIND"))
    ck_assert_uint_gt(strlen(r.out), 2u << 20); /* several chunks */
  json_error_t je;
  json_t *v = json_loads(r.out, 0, &je);
  ck_assert_msg(v != NULL, "not JSON at line %d: %s", je.line, je.text);
  json_t *evs = json_object_get(v, "events");
  ck_assert_uint_eq(json_array_size(evs), (size_t)n);
  ck_assert_str_eq(json_string_value(json_object_get(
                       json_array_get(evs, n - 1), "d")),
                   "inf");
  json_decref(v);
  tu_run_free(&r);
  /* and through gnmrd's admin endpoint, chunk by chunk */
  tu_daemon_start_in(&d, NULL, NULL, NULL, extra);
  r = ctl(&d, ex);
  ck_assert_msg(r.code == 0, "%s", r.err);
  v = json_loads(r.out, 0, &je);
  ck_assert_ptr_nonnull(v);
  ck_assert_uint_eq(json_array_size(json_object_get(v, "events")),
                    (size_t)n);
  json_decref(v);
  tu_run_free(&r);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Starts gnmrd with extra and expects it to exit 1 or 2 with `want` on
 * stderr, and never `never` (a password). */
static void refused(char **extra, int code, const char *want,
                    const char *never) {
  tu_daemon d = {0};
  tu_daemon_spawn_in(&d, NULL, NULL, NULL, extra);
  int st;
  ck_assert_int_eq(waitpid(d.pid, &st, 0), d.pid);
  tu_track_daemon(d.pid, 0);
  char *log = tu_daemon_log(&d);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == code,
                "exit %d, not %d: %s", WEXITSTATUS(st), code, log);
  ck_assert_msg(strstr(log, want) != NULL, "'%s' not in: %s", want, log);
  if (never != NULL)
    ck_assert_msg(strstr(log, never) == NULL, "'%s' shown: %s", never, log);
  free(log);
  tu_rmrf(d.dir);
}

START_TEST(bad_urls_passwords_and_schemas_are_refused_clearly) {
  char url[256], bad[300];
  fresh_db("refused", url, sizeof url);
  snprintf(bad, sizeof bad, "postgresql://gnmr@/nosuchdb?host=%s", pg_dir);
  char *e1[] = {"--store", bad, NULL};
  refused(e1, 1, "database \"nosuchdb\" does not exist", NULL);
  snprintf(bad, sizeof bad, "postgresql://secret:hunter2@/refused?host=%s",
           pg_dir);
  char *e2[] = {"--store", bad, NULL};
  refused(e2, 1, "password authentication failed for user \"secret\"",
          "hunter2");
  char *e3[] = {"--store", "/var/lib/gnmr/gnmr.db", NULL};
  refused(e3, 2, "is not a postgresql:// URL", NULL);
  char *e4[] = {"--standby", NULL};
  refused(e4, 2, "standby needs a PostgreSQL store", NULL);
  /* a schema from a newer gnmrd: refused, and left as it was */
  tu_daemon d = {0};
  char *ok[] = {"--store", url, NULL};
  tu_daemon_start_in(&d, NULL, NULL, NULL, ok);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
  psql("refused", "UPDATE meta SET value='99' WHERE key='schema'");
  char newer[96];
  snprintf(newer, sizeof newer,
           "database schema 99 is newer than this gnmrd (%d)",
           STORE_SCHEMA_VERSION);
  refused(ok, 1, newer, NULL);
  char *jobs[] = {"jobs", NULL};
  run_result r = ctl_store(url, jobs); /* readers do not migrate */
  ck_assert_int_eq(r.code, 0);
  tu_run_free(&r);
  snprintf(bad, sizeof bad, "postgresql://secret:hunter2@/refused?host=%s",
           pg_dir);
  r = ctl_store(bad, jobs);
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_nonnull(strstr(r.err, "password authentication failed"));
  ck_assert_ptr_null(strstr(r.err, "hunter2"));
  tu_run_free(&r);
}
END_TEST

/* The server refuses the writes for a while: a read-only database, then a
 * full one (a trigger raising disk_full, PostgreSQL's own error for it). */
START_TEST(read_only_and_full_databases_are_retried_losing_nothing) {
  static const char *const db[] = {"readonly", "diskfull"};
  static const char *const msg[] = {"read-only transaction",
                                    "No space left on device"};
  char url[256];
  fresh_db(db[_i], url, sizeof url);
  tu_daemon d = {0};
  char *extra[] = {"--store", url, NULL};
  tu_daemon_start_in(&d, NULL, NULL, NULL, extra);
  gnmr_agent *a = open_agent(d.agents, "pg-fault");
  for (uint64_t t = 1; t <= 20; t++)
    step_agent(a, t);
  free(decisions_csv(&d, "pg-fault", 20));
  char sql[512];
  if (_i == 0) {
    /* for new sessions; the writer's is ended so that it reconnects */
    psql("postgres", "ALTER DATABASE readonly SET "
                     "default_transaction_read_only = on");
    psql("postgres", "SELECT pg_terminate_backend(pid) FROM "
                     "pg_stat_activity WHERE datname='readonly' AND "
                     "application_name='gnmrd'");
  } else {
    psql("diskfull", "CREATE FUNCTION full_disk() RETURNS trigger AS "
                 "\\$\\$BEGIN RAISE EXCEPTION 'could not extend file: No "
                 "space left on device' USING ERRCODE = 'disk_full'; "
                 "END\\$\\$ LANGUAGE plpgsql");
    psql("diskfull", "CREATE TRIGGER full_disk BEFORE INSERT ON steps FOR "
                 "EACH ROW EXECUTE FUNCTION full_disk()");
  }
  for (uint64_t t = 21; t <= 60; t++)
    step_agent(a, t); /* the daemon keeps deciding */
  /* the server's own refusal reaches the log (after the reconnection) */
  char *log = tu_daemon_log_wait(&d, msg[_i], 10000);
  ck_assert_msg(log != NULL, "the log never showed '%s'", msg[_i]);
  ck_assert_ptr_nonnull(strstr(log, "STORE-COMMIT"));
  free(log);
  ck_assert_int_gt(tu_counter(&d, "store_errors"), 0);
  if (_i == 0) {
    psql("postgres", "ALTER DATABASE readonly SET "
                     "default_transaction_read_only = off");
    snprintf(sql, sizeof sql, "SELECT pg_terminate_backend(pid) FROM "
             "pg_stat_activity WHERE datname='readonly' AND "
             "application_name='gnmrd'");
    psql("postgres", sql);
  } else {
    psql("diskfull", "DROP TRIGGER full_disk ON steps");
  }
  char *csv = decisions_csv(&d, "pg-fault", 60);
  ck_assert_int_eq(count_lines(csv), 61);
  free(csv);
  ck_assert_int_eq(tu_counter(&d, "store_dropped"), 0);
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* ---- the database interface: both backends give the same answers ------- */

/* Runs the same statements on a connection and returns what they read, as
 * text: types, NULL, +-Inf, a blob with NUL bytes, a parameter bound but
 * not named in the SQL, a streamed read, and errors. */
static char *exercise(db_conn *d) {
  static char out[4096];
  size_t o = 0;
  db_stmt *st;
  out[0] = '\0';
  ck_assert_int_eq(db_exec(d, "CREATE TABLE t(i BIGINT, x DOUBLE PRECISION,"
                              " s TEXT, b BYTEA)"), GNMR_OK);
  ck_assert_int_eq(db_begin(d), GNMR_OK);
  ck_assert_int_eq(db_prepare(d, "INSERT INTO t VALUES(?,?,?,?)", &st),
                   GNMR_OK);
  static const unsigned char blob[] = {0, 1, 0xff, 0, '\\', 'x'};
  for (int k = 0; k < 4; k++) { /* one statement, run again and again */
    db_bind_int64(st, 1, k == 3 ? INT64_MIN : (int64_t)k * 4000000000LL);
    db_bind_double(st, 2, k == 1 ? INFINITY : k == 2 ? NAN : -1.5e-300);
    db_bind_text(st, 3, k == 2 ? NULL : "h\xc3\xa9 'q' \"d\" ?");
    db_bind_blob(st, 4, blob, k == 1 ? 0 : sizeof blob);
    ck_assert_int_eq(db_step(st), DB_DONE);
    db_reset(st);
  }
  db_finalize(st);
  ck_assert_int_eq(db_commit(d), GNMR_OK);
  /* ?2 is bound but left out of the SQL, as the history's filters are */
  ck_assert_int_eq(db_prepare(d, "SELECT i, x, s, b FROM t WHERE i >= ?1 "
                                 "ORDER BY i LIMIT ?3", &st), GNMR_OK);
  db_bind_int64(st, 1, INT64_MIN);
  db_bind_text(st, 2, "unused");
  db_bind_int64(st, 3, 10);
  int rc;
  while ((rc = db_step(st)) == DB_ROW) {
    ck_assert_int_eq(db_column_count(st), 4);
    o += (size_t)snprintf(out + o, sizeof out - o, "%s=%d:%lld %s=%d:%.17g "
                          "%s=%d:%s %s=%d:",
                          db_column_name(st, 0), db_column_type(st, 0),
                          (long long)db_column_int64(st, 0),
                          db_column_name(st, 1), db_column_type(st, 1),
                          db_column_double(st, 1), db_column_name(st, 2),
                          db_column_type(st, 2),
                          db_column_text(st, 2) ? db_column_text(st, 2)
                                                : "(null)",
                          db_column_name(st, 3), db_column_type(st, 3));
    const unsigned char *b = db_column_blob(st, 3);
    for (size_t i = 0; i < db_column_bytes(st, 3); i++)
      o += (size_t)snprintf(out + o, sizeof out - o, "%02x", b[i]);
    o += (size_t)snprintf(out + o, sizeof out - o, "\n");
  }
  ck_assert_int_eq(rc, DB_DONE);
  db_finalize(st);
  /* streamed, and stopped half-way: the connection stays usable */
  ck_assert_int_eq(db_prepare_stream(d, "SELECT i FROM t ORDER BY i", &st),
                   GNMR_OK);
  ck_assert_int_eq(db_step(st), DB_ROW);
  o += (size_t)snprintf(out + o, sizeof out - o, "first %lld\n",
                        (long long)db_column_int64(st, 0));
  db_finalize(st);
  ck_assert_int_eq(db_prepare(d, "SELECT count(*) FROM t", &st), GNMR_OK);
  ck_assert_int_eq(db_step(st), DB_ROW);
  o += (size_t)snprintf(out + o, sizeof out - o, "count %lld\n",
                        (long long)db_column_int64(st, 0));
  db_finalize(st);
  /* errors: a bad statement, a constraint; the connection goes on */
  st = NULL;
  if (db_prepare(d, "SELECT nosuch FROM t", &st) == GNMR_OK)
    ck_assert_int_lt(db_step(st), 0);
  db_finalize(st);
  ck_assert_str_ne(db_errmsg(d), "");
  ck_assert_int_eq(db_error_class(d), 0);
  ck_assert_int_eq(db_exec(d, "DROP TABLE t"), GNMR_OK);
  return out;
}

START_TEST(both_backends_give_the_same_answers) {
  char url[256], err[512], path[128];
  fresh_db("dbapi", url, sizeof url);
  db_conn *pg = NULL, *lite = NULL;
  ck_assert_int_eq(db_open(url, 0, &pg, err, sizeof err), GNMR_OK);
  ck_assert_int_eq(db_kind(pg), DB_PG);
  const char *dir = tu_tmpdir();
  snprintf(path, sizeof path, "%s/t.db", dir);
  ck_assert_int_eq(db_open(path, DB_CREATE, &lite, err, sizeof err), GNMR_OK);
  ck_assert_int_eq(db_kind(lite), DB_SQLITE);
  char *a = strdup(exercise(pg)), *b = strdup(exercise(lite));
  ck_assert_msg(strcmp(a, b) == 0, "PostgreSQL:\n%s\nSQLite:\n%s", a, b);
  ck_assert_ptr_nonnull(strstr(a, "x=2:inf"));
  ck_assert_ptr_nonnull(strstr(a, "s=0:(null)"));
  ck_assert_ptr_nonnull(strstr(a, "i=1:-9223372036854775808"));
  ck_assert_ptr_nonnull(strstr(a, "b=4:0001ff005c78"));
  free(a);
  free(b);
  /* a lost connection is told apart, and reconnecting cures it */
  psql("postgres", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                   "WHERE datname='dbapi' AND application_name='gnmrd'");
  ck_assert_int_ne(db_exec(pg, "SELECT 1"), GNMR_OK);
  ck_assert_int_eq(db_error_class(pg), DB_ERR_CONNECTION);
  ck_assert_int_eq(db_reconnect(pg), GNMR_OK);
  ck_assert_int_eq(db_exec(pg, "SELECT 1"), GNMR_OK);
  db_close(&pg);
  db_close(&lite);
  tu_rmrf(dir);
  /* targets that cannot open: the reason, never a password */
  static const char *const bad[] = {
      "postgresql://gnmr:s3cret@/dbapi?host=/nonexistent",
      "postgresql://%zz", "postgres://", "/nonexistent/dir/gnmr.db"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    db_conn *d = NULL;
    err[0] = '\0';
    ck_assert_int_eq(db_open(bad[i], 0, &d, err, sizeof err), GNMR_E_STORE);
    ck_assert_ptr_null(d);
    ck_assert_msg(err[0] != '\0', "%s: no reason", bad[i]);
    ck_assert_msg(strstr(err, "s3cret") == NULL, "password shown: %s", err);
  }
}
END_TEST

/* db_copy_in (PostgreSQL's COPY, the writer's events since issue 64):
 * rows arrive as written (escapes, NULL, the extremes of a bigint, +-Inf,
 * -0); a malformed row is refused with the server's reason and leaves
 * the connection usable; SQLite says it has no COPY. Through gnmrd, a job
 * name with a backslash and a space keeps them in its events. */
START_TEST(copy_rows_arrive_as_written_and_bad_ones_are_refused) {
  char url[256], err[512], path[128];
  fresh_db("copyin", url, sizeof url);
  db_conn *pg = NULL, *lite = NULL;
  ck_assert_int_eq(db_open(url, 0, &pg, err, sizeof err), GNMR_OK);
  ck_assert(db_copies(pg));
  const char *dir = tu_tmpdir();
  snprintf(path, sizeof path, "%s/t.db", dir);
  ck_assert_int_eq(db_open(path, DB_CREATE, &lite, err, sizeof err), GNMR_OK);
  ck_assert(!db_copies(lite));
  ck_assert_int_eq(db_copy_in(lite, "COPY t FROM STDIN", "1\n", 2),
                   GNMR_E_UNSUPPORTED);
  db_close(&lite);
  tu_rmrf(dir);
  ck_assert_int_eq(db_exec(pg, "CREATE TABLE t(a TEXT, b BIGINT, c DOUBLE "
                               "PRECISION)"),
                   GNMR_OK);
  static const char rows[] = "x\\\\y\\tz\\n\t-9223372036854775808\tInfinity\n"
                             "\\N\t2\t-0\n"
                             "\xc3\xa9\t9223372036854775807\t-Infinity\n";
  ck_assert_int_eq(db_copy_in(pg, "COPY t(a, b, c) FROM STDIN", rows,
                              sizeof rows - 1),
                   GNMR_OK);
  db_stmt *st;
  ck_assert_int_eq(db_prepare(pg, "SELECT a, b, c FROM t ORDER BY b", &st),
                   GNMR_OK);
  ck_assert_int_eq(db_step(st), DB_ROW);
  ck_assert_str_eq(db_column_text(st, 0), "x\\y\tz\n");
  ck_assert(db_column_int64(st, 1) == INT64_MIN);
  ck_assert(isinf(db_column_double(st, 2)) && db_column_double(st, 2) > 0);
  ck_assert_int_eq(db_step(st), DB_ROW);
  ck_assert_ptr_null(db_column_text(st, 0));
  ck_assert(db_column_int64(st, 1) == 2);
  ck_assert(db_column_double(st, 2) == 0 && signbit(db_column_double(st, 2)));
  ck_assert_int_eq(db_step(st), DB_ROW);
  ck_assert_str_eq(db_column_text(st, 0), "\xc3\xa9");
  ck_assert(db_column_int64(st, 1) == INT64_MAX);
  ck_assert_int_eq(db_step(st), DB_DONE);
  db_finalize(st);
  /* malformed: too few fields, a number that is not one; in a
   * transaction, which the refusal aborts and a rollback ends */
  static const char *const bad[] = {"only-one\n", "a\tnot-a-number\t1\n"};
  static const char *const why[] = {"missing data", "invalid input syntax"};
  for (int k = 0; k < 2; k++) {
    ck_assert_int_eq(db_begin(pg), GNMR_OK);
    ck_assert_int_eq(db_copy_in(pg, "COPY t(a, b, c) FROM STDIN", bad[k],
                                strlen(bad[k])),
                     GNMR_E_STORE);
    ck_assert_msg(strstr(db_errmsg(pg), why[k]) != NULL, "%s",
                  db_errmsg(pg));
    ck_assert_int_eq(db_rollback(pg), GNMR_OK);
  }
  ck_assert_int_eq(db_copy_in(pg, "COPY nosuch FROM STDIN", "1\n", 2),
                   GNMR_E_STORE);
  ck_assert_int_eq(db_exec(pg, "SELECT 1"), GNMR_OK);
  char *n = psql_out("copyin", "SELECT count(*) FROM t");
  ck_assert_str_eq(n, "3\n");
  free(n);
  db_close(&pg);
  /* through gnmrd's writer */
  tu_daemon d = {0};
  char *extra[] = {"--store", url, NULL};
  tu_daemon_start_in(&d, NULL, NULL, NULL, extra);
  gnmr_agent *a = open_agent(d.agents, "back\\slash job");
  for (uint64_t t = 1; t <= 30; t++)
    step_agent(a, t);
  free(decisions_csv(&d, "back\\slash job", 30));
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  n = psql_out("copyin", "SELECT DISTINCT job FROM events");
  ck_assert_ptr_nonnull(n);
  ck_assert_str_eq(n, "back\\slash job\n");
  free(n);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(urls_are_shown_without_their_password) {
  static const struct {
    const char *in, *out;
  } cases[] = {
      {"postgresql://u:pw@h/db", "postgresql://u:***@h/db"},
      {"postgres://u@h:5432/db?sslmode=require",
       "postgres://u@h:5432/db?sslmode=require"},
      {"postgresql://h/db?user=u&password=pw&sslmode=x",
       "postgresql://h/db?user=u&password=***&sslmode=x"},
      {"postgresql://u:p@ss@h/db", "postgresql://u:***@ss@h/db"},
      {"postgresql://", "postgresql://"},
      {"postgresql://:@/", "postgresql://:***@/"},
      {"/var/lib/gnmr/gnmr.db", "/var/lib/gnmr/gnmr.db"},
      {"", ""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char out[256];
    db_target_display(cases[i].in, out, sizeof out);
    ck_assert_msg(strcmp(out, cases[i].out) == 0, "%s -> %s, not %s",
                  cases[i].in, out, cases[i].out);
  }
  char tiny[8];
  db_target_display("postgresql://u:pw@h/db", tiny, sizeof tiny);
  ck_assert_int_eq(strlen(tiny), 7);
  ck_assert(db_target_is_pg("postgres://x") && db_target_is_pg("postgresql://"));
  ck_assert(!db_target_is_pg("postgresq://x") && !db_target_is_pg(NULL) &&
            !db_target_is_pg("/tmp/postgresql://"));
}
END_TEST

/* A connection belongs to one thread at a time (db.h): a call from a
 * second thread while a first is inside one aborts, naming both, rather
 * than interleaving two threads' statements on one connection. Each
 * backend in a child process: a thread runs a slow query, the main
 * thread calls meanwhile; a connection handed from thread to thread in
 * turn (opened here, used by a thread, closed here) is not refused. */
typedef struct slow_call {
  db_conn *d;
  const char *sql;
  atomic_int done;
} slow_call;

static void *run_slow(void *arg) {
  slow_call *c = arg;
  (void)db_exec(c->d, c->sql);
  atomic_store(&c->done, 1);
  return NULL;
}

START_TEST(a_connection_used_by_two_threads_at_once_aborts) {
  char url[256], err[512], path[128], log[160];
  fresh_db("twothreads", url, sizeof url);
  const char *dir = tu_tmpdir();
  snprintf(path, sizeof path, "%s/t.db", dir);
  snprintf(log, sizeof log, "%s/stderr", dir);
  static const char *const slow[] = {
      "SELECT pg_sleep(3)",
      "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
      "WHERE x < 400000000) SELECT count(*) FROM c"};
  for (int k = 0; k < 2; k++) {
    const char *target = k == 0 ? url : path;
    db_conn *d = NULL;
    /* handed over in turn: fine */
    ck_assert_int_eq(db_open(target, DB_CREATE, &d, err, sizeof err), GNMR_OK);
    slow_call quick = {d, "SELECT 1", 0};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, run_slow, &quick), 0);
    pthread_join(t, NULL);
    ck_assert_int_eq(db_exec(d, "SELECT 1"), GNMR_OK);
    db_close(&d);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      if (freopen(log, "w", stderr) == NULL ||
          db_open(target, DB_CREATE, &d, err, sizeof err) != GNMR_OK)
        _exit(3);
      slow_call c = {d, slow[k], 0};
      if (pthread_create(&t, NULL, run_slow, &c) != 0)
        _exit(4);
      while (!atomic_load(&c.done)) { /* until one of the two is refused */
        (void)db_exec(d, "SELECT 1");
        usleep(1000);
      }
      _exit(0); /* never refused */
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    size_t text_len;
    char *text = tu_read_file(log, &text_len);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT,
                  "%s: the second thread was let in (status %#x): %s",
                  k == 0 ? "PostgreSQL" : "SQLite", st, text ? text : "");
    ck_assert_ptr_nonnull(text);
    ck_assert_ptr_nonnull(strstr(text, "used by two threads at once"));
    free(text);
  }
  tu_rmrf(dir);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("pg");
  TCase *tc = tcase_create("postgresql");
  tcase_set_timeout(tc, 600);
  if (getenv("GNMR_PG_ONLY_FENCING") != NULL) { /* a quicker look */
    tcase_add_test(tc, a_deposed_leader_never_decides_after_its_successor);
    suite_add_tcase(s, tc);
    return s;
  }
  tcase_add_test(tc, both_backends_give_the_same_answers);
  tcase_add_test(tc, urls_are_shown_without_their_password);
  tcase_add_test(tc, copy_rows_arrive_as_written_and_bad_ones_are_refused);
  tcase_add_test(tc, a_connection_used_by_two_threads_at_once_aborts);
  tcase_add_test(tc, traces_give_the_same_decisions_and_history_as_sqlite);
  tcase_add_test(tc, server_killed_and_restarted_mid_job_loses_nothing);
  tcase_add_test(tc, no_more_decisions_go_undurable_than_agents_hold);
  tcase_add_test(tc, standby_takes_over_with_the_decisions_of_a_restart);
  tcase_add_test(tc, a_deposed_active_stops_serving);
  tcase_add_test(tc, a_deposed_leader_never_decides_after_its_successor);
  tcase_add_test(tc, two_groups_share_a_database_in_two_schemas);
  tcase_add_test(tc, a_large_export_streams_from_postgresql);
  tcase_add_test(tc, bad_urls_passwords_and_schemas_are_refused_clearly);
  tcase_add_loop_test(
      tc, read_only_and_full_databases_are_retried_losing_nothing, 0, 2);
  suite_add_tcase(s, tc);
  return s;
}

/* The cluster lives as long as the suite: started here, stopped after. */
int main(void) {
  const char *src = getenv("GNMR_SOURCE_DIR");
  if (src == NULL) {
    fprintf(stderr, "test_pg: GNMR_SOURCE_DIR is not set (make test sets "
                    "it): scripts/pg_tmp.sh starts the server\n");
    return 1;
  }
  snprintf(pg_dir, sizeof pg_dir, "/tmp/gnmr-pg-XXXXXX");
  if (mkdtemp(pg_dir) == NULL || rmdir(pg_dir) != 0)
    return 1;
  if (sh("'%s/scripts/pg_tmp.sh' start '%s' >/dev/null", src, pg_dir) != 0) {
    fprintf(stderr, "test_pg: cannot start a PostgreSQL cluster in %s "
                    "(scripts/deps.sh check installs postgresql)\n", pg_dir);
    return 1;
  }
  int rc = tu_check_main(suite());
  sh("'%s/scripts/pg_tmp.sh' stop '%s'; rm -rf '%s'", src, pg_dir, pg_dir);
  return rc;
}
