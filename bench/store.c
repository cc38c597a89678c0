/* SPDX-License-Identifier: MIT */
/* bench/store.c — the history store: events persisted per second through
 * gnmrd's writer thread (store_put from the "loop" thread, batched commits
 * by the writer), against the limit measured in the same run: raw batched
 * SQLite inserts of the same rows into the same schema. Also reports the
 * worst time store_put() took on the loop side (it must never wait on
 * SQLite). Target: >= 200k events/s.
 *
 * Then the same against PostgreSQL (a throwaway cluster started by
 * scripts/pg_tmp.sh, Unix socket, fsync off as in the tests), against raw
 * COPY of the same rows into a copy of the events table (same columns,
 * same indexes) in the same run. */
#include <libpq-fe.h>
#include <math.h>
#include <sqlite3.h>

#include "benchutil.h"
#include "gnmr/error.h"
#include "store.h"

#define RECORDS 5000
#define EVENTS_PER 100

static store_rec *make_rec(uint64_t step) {
  store_rec *r = store_rec_new(REC_STEP, "bench");
  r->pass = 1;
  r->step = step;
  r->reports = 8;
  r->active = strdup("1 2 3");
  r->n = 3;
  r->events = calloc(EVENTS_PER, sizeof *r->events);
  r->n_events = EVENTS_PER;
  for (int i = 0; i < EVENTS_PER; i++)
    r->events[i] = (store_event){.unit = (uint32_t)i,
                                 .kind = 1,
                                 .outcome = 1,
                                 .norm = 1.5,
                                 .g = 2.5,
                                 .d = 3.5,
                                 .s = 1.25,
                                 .x = NAN,
                                 .gm = NAN,
                                 .dm = NAN};
  return r;
}

static double raw_inserts(const char *dir) {
  char path[512];
  sqlite3 *db;
  snprintf(path, sizeof path, "%s/raw.db", dir);
  sqlite3_open(path, &db);
  sqlite3_exec(db,
               "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
               "CREATE TABLE events(job TEXT, pass INTEGER, step INTEGER,"
               " kind TEXT, unit INTEGER, outcome TEXT, norm REAL, g REAL,"
               " d REAL, s REAL, count INTEGER, detail TEXT, at INTEGER);"
               "CREATE INDEX events_by_step ON events(job, step);",
               NULL, NULL, NULL);
  sqlite3_stmt *st;
  sqlite3_prepare_v2(db,
                     "INSERT INTO events VALUES(?,?,?,?,?,?,?,?,?,?,?,NULL,?)",
                     -1, &st, NULL);
  double t0 = bu_now();
  for (int r = 0; r < RECORDS; r++) {
    if (r % 500 == 0)
      sqlite3_exec(db, "BEGIN", NULL, NULL, NULL);
    for (int i = 0; i < EVENTS_PER; i++) {
      sqlite3_bind_text(st, 1, "bench", -1, SQLITE_STATIC);
      sqlite3_bind_int64(st, 2, 1);
      sqlite3_bind_int64(st, 3, r + 1);
      sqlite3_bind_text(st, 4, "exceed", -1, SQLITE_STATIC);
      sqlite3_bind_int64(st, 5, i);
      sqlite3_bind_text(st, 6, "selected", -1, SQLITE_STATIC);
      sqlite3_bind_double(st, 7, 1.5);
      sqlite3_bind_double(st, 8, 2.5);
      sqlite3_bind_double(st, 9, 3.5);
      sqlite3_bind_double(st, 10, 1.25);
      sqlite3_bind_int64(st, 11, 0);
      sqlite3_bind_int64(st, 12, 0);
      sqlite3_step(st);
      sqlite3_reset(st);
    }
    if (r % 500 == 499)
      sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
  }
  double dt = bu_now() - t0;
  sqlite3_finalize(st);
  sqlite3_close(db);
  return dt;
}

/* Raw COPY of the same rows into raw_events (events' columns and
 * indexes), RECORDS/500 transactions as the SQLite limit has. */
static double raw_copy(const char *url) {
  PGconn *c = PQconnectdb(url);
  if (PQstatus(c) != CONNECTION_OK) {
    PQfinish(c);
    return -1;
  }
  PQclear(PQexec(c, "SET client_min_messages=warning;"
                    "DROP TABLE IF EXISTS raw_events;"
                    "CREATE TABLE raw_events (LIKE events INCLUDING ALL);"));
  char line[256];
  double t0 = bu_now();
  for (int r = 0; r < RECORDS; r++) {
    if (r % 500 == 0) {
      PQclear(PQexec(c, "BEGIN"));
      PQclear(PQexec(c, "COPY raw_events(job, pass, step, kind, unit, "
                        "outcome, norm, g, d, s, count, at, run) FROM "
                        "STDIN"));
    }
    for (int i = 0; i < EVENTS_PER; i++) {
      int n = snprintf(line, sizeof line,
                       "bench\t1\t%d\texceed\t%d\tselected\t1.5\t2.5\t"
                       "3.5\t1.25\t0\t0\t1\n",
                       r + 1, i);
      PQputCopyData(c, line, n);
    }
    if (r % 500 == 499) {
      PQputCopyEnd(c, NULL);
      PQclear(PQgetResult(c));
      PQclear(PQexec(c, "COMMIT"));
    }
  }
  double dt = bu_now() - t0;
  PQclear(PQexec(c, "DROP TABLE raw_events"));
  PQfinish(c);
  return dt;
}

/* Events/s through the store at where; worst store_put() in *worst. */
static double through_store(const char *where, double *worst,
                            uint64_t *batches) {
  char err[512];
  store *s;
  if (store_open(where, 100, 0, &s, err, sizeof err) != GNMR_OK) {
    fprintf(stderr, "store: %s\n", err);
    return -1;
  }
  store_rec **recs = malloc(RECORDS * sizeof *recs);
  for (int r = 0; r < RECORDS; r++)
    recs[r] = make_rec((uint64_t)r + 1); /* built outside the timing */
  double worst_put = 0, t0 = bu_now();
  for (int r = 0; r < RECORDS; r++) {
    double p0 = bu_now();
    store_put(s, recs[r]);
    double p = bu_now() - p0;
    if (p > worst_put)
      worst_put = p;
  }
  store_stats st;
  /* polled every 200 us, not spun: a spinning loop took one of the two
   * cores the writer and the server share (the raw limit waits for
   * nothing), 19% of the run's cycles in clock_gettime */
  for (;;) {
    store_get_stats(s, &st);
    if (st.records >= RECORDS || st.errors != 0 || bu_now() - t0 >= 120)
      break;
    nanosleep(&(struct timespec){0, 200000}, NULL);
  }
  double dt = bu_now() - t0;
  store_close(&s);
  free(recs);
  *worst = worst_put;
  *batches = st.batches;
  return st.records < RECORDS ? -1 : dt;
}

static int pg_part(void) {
  char dir[] = "/tmp/gnmr-bench-pg-XXXXXX", cmd[256], url[256];
  if (mkdtemp(dir) == NULL || rmdir(dir) != 0)
    return 1;
  snprintf(cmd, sizeof cmd, "scripts/pg_tmp.sh start '%s' >/dev/null", dir);
  if (system(cmd) != 0) {
    printf("store pg: no PostgreSQL server to start (scripts/deps.sh check "
           "installs postgresql): not measured\n");
    return 0;
  }
  snprintf(url, sizeof url, "postgresql://gnmr@/gnmr?host=%s", dir);
  double worst;
  uint64_t batches;
  double dt = through_store(url, &worst, &batches);
  double raw = raw_copy(url);
  double ev = (double)RECORDS * EVENTS_PER;
  if (dt > 0 && raw > 0)
    printf("store pg %d step records x %d events: %.0f events/s persisted "
           "in %llu batches; raw COPY into the same table %.0f events/s "
           "(constant text, no number formatted): %.0f%% of raw "
           "(target >= 50%%)\n",
           RECORDS, EVENTS_PER, ev / dt, (unsigned long long)batches,
           ev / raw, 100 * raw / dt);
  printf("store pg worst store_put() on the loop thread: %.1f us\n",
         worst * 1e6);
  snprintf(cmd, sizeof cmd,
           "scripts/pg_tmp.sh stop '%s' >/dev/null; rm -rf '%s'", dir, dir);
  return system(cmd) != 0 || dt < 0 || raw < 0;
}

int main(void) {
  char dir[] = "/tmp/gnmr-bench-store-XXXXXX";
  if (mkdtemp(dir) == NULL)
    return 1;
  double worst_put;
  uint64_t batches;
  double dt = through_store(dir, &worst_put, &batches);
  if (dt < 0)
    return 1;
  double raw = raw_inserts(dir);
  double ev = (double)RECORDS * EVENTS_PER;
  printf("store %d step records x %d events, persisted in %llu batches: "
         "%.0f events/s (target >= 200000); raw batched SQLite inserts %.0f "
         "events/s: %.0f%% of raw\n",
         RECORDS, EVENTS_PER, (unsigned long long)batches, ev / dt,
         ev / raw, 100 * raw / dt);
  printf("store worst store_put() on the loop thread: %.1f us (it never "
         "waits on SQLite)\n", worst_put * 1e6);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    return 1;
  return pg_part();
}
