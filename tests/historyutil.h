/* SPDX-License-Identifier: MIT */
/* historyutil.h — a large history written straight into a gnmrd's SQLite
 * database, for the tests of what reads it back in chunks (test_runs.c,
 * test_security.c). */
#ifndef GNMR_TEST_HISTORYUTIL_H
#define GNMR_TEST_HISTORYUTIL_H

#include <sqlite3.h>

#include "testutil.h"

/* A finished job "big" of one unit with `events` exceed events, 200 a
 * step, written straight into a new gnmrd's database (d stopped). */
static inline void big_history(tu_daemon *d, int EVENTS) {
  tu_daemon_start(d); /* the schema */
  ck_assert_int_eq(tu_daemon_stop(d, SIGTERM), 0);
  char path[200];
  snprintf(path, sizeof path, "%s/data/gnmr.db", d->dir);
  sqlite3 *db;
  sqlite3_stmt *st;
  ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
  ck_assert_int_eq(sqlite3_exec(db, "BEGIN; INSERT INTO jobs(run, name, "
                                    "reporters, barrier_ms, state, pass, "
                                    "last_step) VALUES(1, 'big', 1, 1000, "
                                    "'finished', 1, 1000);"
                                    "INSERT INTO units VALUES('big', 1, 0,"
                                    " 'layer.0');",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  ck_assert_int_eq(sqlite3_prepare_v2(db, "INSERT INTO events(job, run, "
                                          "pass, step, kind, unit, outcome,"
                                          " norm, g, d, s, count, at) VALUES("
                                          "'big', 1, 1, ?, 'exceed', 0, "
                                          "'dropped', 1.5, 3, 3, 3, 0, 0)",
                                      -1, &st, NULL),
                   SQLITE_OK);
  for (int i = 0; i < EVENTS; i++) {
    sqlite3_bind_int64(st, 1, 1 + i / 200);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_DONE);
    sqlite3_reset(st);
  }
  sqlite3_finalize(st);
  ck_assert_int_eq(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
}

#endif
