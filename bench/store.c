/* SPDX-License-Identifier: MIT */
/* bench/store.c — the history store: events persisted per second through
 * gnmrd's writer thread (store_put from the "loop" thread, batched commits
 * by the writer), against the limit measured in the same run: raw batched
 * SQLite inserts of the same rows into the same schema. Also reports the
 * worst time store_put() took on the loop side (it must never wait on
 * SQLite). Target: >= 200k events/s. */
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
    r->events[i] = (store_event){(uint32_t)i, 1, 1, 0, 1.5, 2.5, 3.5, 1.25};
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

int main(void) {
  char dir[] = "/tmp/gnmr-bench-store-XXXXXX", err[256];
  if (mkdtemp(dir) == NULL)
    return 1;
  store *s;
  if (store_open(dir, 100, 0, &s, err, sizeof err) != GNMR_OK) {
    fprintf(stderr, "store: %s\n", err);
    return 1;
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
  do {
    store_get_stats(s, &st);
  } while (st.records < RECORDS && st.errors == 0 && bu_now() - t0 < 120);
  double dt = bu_now() - t0;
  store_close(&s);
  free(recs);
  double raw = raw_inserts(dir);
  double ev = (double)RECORDS * EVENTS_PER;
  printf("store %d step records x %d events: %.0f events/s persisted in %llu "
         "batches (target >= 200000); raw batched SQLite inserts %.0f "
         "events/s: %.0f%% of raw\n",
         RECORDS, EVENTS_PER, ev / dt, (unsigned long long)st.batches,
         ev / raw, 100 * raw / dt);
  printf("store worst store_put() on the loop thread: %.1f us (it never "
         "waits on SQLite)\n", worst_put * 1e6);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    return 1;
  return 0;
}
