/* SPDX-License-Identifier: MIT */
/* db.c — the store's database interface (db.h): the target's backend, and
 * each call handed to it. */
#include "db.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"

/* Which thread uses a connection is asserted here, where the threads
 * meet: gnmrd's loop opens the store, its writer thread commits on that
 * connection, libuv's pool reads with others. Every call claims the
 * connection for the calling thread and gives it back on return (nested
 * calls of the same thread count); a second thread that finds it claimed
 * aborts, naming both, instead of interleaving two threads' statements on
 * one SQLite or libpq connection (which corrupts the results silently or
 * crashes later, far from the cause). Two atomic operations a call. */
static void enter(db_conn *d) {
  unsigned long self = (unsigned long)pthread_self(), was = 0;
  if (atomic_compare_exchange_strong(&d->user, &was, self)) {
    d->depth = 1;
    return;
  }
  if (was == self) {
    d->depth++;
    return;
  }
  fprintf(stderr,
          "gnmr: a store connection used by two threads at once "
          "(thread %#lx, inside a call, and thread %#lx): a "
          "connection belongs to one thread at a time (db.h)\n",
          was, self);
  fflush(stderr);
  abort();
}

static void leave(db_conn *d) {
  if (--d->depth == 0)
    atomic_store(&d->user, 0);
}

/* A call on d, claimed around it. */
#define ON(d, call)                                                            \
  do {                                                                         \
    enter(d);                                                                  \
    call;                                                                      \
    leave(d);                                                                  \
  } while (0)

int db_open(const char *target, unsigned flags, db_conn **out, char *err,
            size_t errlen) {
  *out = NULL;
  if (target == NULL || target[0] == '\0') {
    snprintf(err, errlen, "no store given");
    return GNMR_E_STORE;
  }
  if (db_target_is_pg(target))
    return db__pg_open(target, flags, out, err, errlen);
  return db__sqlite_open(target, flags, out, err, errlen);
}

void db_close(db_conn **dp) {
  db_conn *d = *dp;
  if (d != NULL) {
    *dp = NULL;
    enter(d); /* never given back: freed */
    d->ops->close(d);
  }
}
int db_kind(const db_conn *d) { return d->kind; }
int db_exec(db_conn *d, const char *sql) {
  int rv;
  ON(d, rv = d->ops->exec(d, sql));
  return rv;
}
const char *db_errmsg(db_conn *d) {
  const char *m;
  ON(d, m = d->ops->errmsg(d));
  return m;
}
int db_begin(db_conn *d) {
  int rv;
  ON(d, rv = d->ops->begin(d));
  return rv;
}
int db_commit(db_conn *d) { return db_exec(d, "COMMIT"); }
int db_rollback(db_conn *d) { return db_exec(d, "ROLLBACK"); }
int db_error_class(db_conn *d) {
  int rv;
  ON(d, rv = d->ops->error_class(d));
  return rv;
}
int db_reconnect(db_conn *d) {
  int rv;
  ON(d, rv = d->ops->reconnect(d));
  return rv;
}

int db_prepare(db_conn *d, const char *sql, db_stmt **out) {
  int rv;
  ON(d, rv = d->ops->prepare(d, sql, 0, out));
  return rv;
}
int db_prepare_stream(db_conn *d, const char *sql, db_stmt **out) {
  int rv;
  ON(d, rv = d->ops->prepare(d, sql, 1, out));
  return rv;
}
void db_finalize(db_stmt *st) {
  if (st != NULL) {
    db_conn *d = st->owner;
    ON(d, st->ops->finalize(st));
  }
}
void db_reset(db_stmt *st) { ON(st->owner, st->ops->reset(st)); }
void db_bind_int64(db_stmt *st, int i, int64_t v) {
  ON(st->owner, st->ops->bind_int64(st, i, v));
}
void db_bind_double(db_stmt *st, int i, double v) {
  if (v != v)
    ON(st->owner, st->ops->bind_null(st, i));
  else
    ON(st->owner, st->ops->bind_double(st, i, v));
}
void db_bind_text(db_stmt *st, int i, const char *v) {
  if (v == NULL)
    ON(st->owner, st->ops->bind_null(st, i));
  else
    ON(st->owner, st->ops->bind_text(st, i, v));
}
void db_bind_blob(db_stmt *st, int i, const void *v, size_t n) {
  ON(st->owner, st->ops->bind_blob(st, i, v, n));
}
void db_bind_null(db_stmt *st, int i) {
  ON(st->owner, st->ops->bind_null(st, i));
}
int db_step(db_stmt *st) {
  int rv;
  ON(st->owner, rv = st->ops->step(st));
  return rv;
}
int db_column_count(db_stmt *st) {
  int n;
  ON(st->owner, n = st->ops->column_count(st));
  return n;
}
const char *db_column_name(db_stmt *st, int c) {
  const char *n;
  ON(st->owner, n = st->ops->column_name(st, c));
  return n;
}
int db_column_type(db_stmt *st, int c) {
  int t;
  ON(st->owner, t = st->ops->column_type(st, c));
  return t;
}
int64_t db_column_int64(db_stmt *st, int c) {
  int64_t v;
  ON(st->owner, v = st->ops->column_int64(st, c));
  return v;
}
double db_column_double(db_stmt *st, int c) {
  double v;
  ON(st->owner, v = st->ops->column_double(st, c));
  return v;
}
const char *db_column_text(db_stmt *st, int c) {
  const char *v;
  ON(st->owner, v = st->ops->column_text(st, c));
  return v;
}
const void *db_column_blob(db_stmt *st, int c) {
  const void *v;
  ON(st->owner, v = st->ops->column_blob(st, c));
  return v;
}
size_t db_column_bytes(db_stmt *st, int c) {
  size_t n;
  ON(st->owner, n = st->ops->column_bytes(st, c));
  return n;
}
