/* SPDX-License-Identifier: MIT */
/* db.c — the store's database interface (db.h): the target's backend, and
 * each call handed to it. */
#include "db.h"

#include <stdio.h>
#include <string.h>

#include "gnmr/error.h"

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
    d->ops->close(d);
  }
}
int db_kind(const db_conn *d) { return d->kind; }
int db_exec(db_conn *d, const char *sql) { return d->ops->exec(d, sql); }
const char *db_errmsg(db_conn *d) { return d->ops->errmsg(d); }
int db_begin(db_conn *d) { return d->ops->begin(d); }
int db_commit(db_conn *d) { return d->ops->exec(d, "COMMIT"); }
int db_rollback(db_conn *d) { return d->ops->exec(d, "ROLLBACK"); }
int db_error_class(db_conn *d) { return d->ops->error_class(d); }
int db_reconnect(db_conn *d) { return d->ops->reconnect(d); }

int db_prepare(db_conn *d, const char *sql, db_stmt **out) {
  return d->ops->prepare(d, sql, 0, out);
}
int db_prepare_stream(db_conn *d, const char *sql, db_stmt **out) {
  return d->ops->prepare(d, sql, 1, out);
}
void db_finalize(db_stmt *st) {
  if (st != NULL)
    st->ops->finalize(st);
}
void db_reset(db_stmt *st) { st->ops->reset(st); }
void db_bind_int64(db_stmt *st, int i, int64_t v) {
  st->ops->bind_int64(st, i, v);
}
void db_bind_double(db_stmt *st, int i, double v) {
  if (v != v)
    st->ops->bind_null(st, i);
  else
    st->ops->bind_double(st, i, v);
}
void db_bind_text(db_stmt *st, int i, const char *v) {
  if (v == NULL)
    st->ops->bind_null(st, i);
  else
    st->ops->bind_text(st, i, v);
}
void db_bind_blob(db_stmt *st, int i, const void *v, size_t n) {
  st->ops->bind_blob(st, i, v, n);
}
void db_bind_null(db_stmt *st, int i) { st->ops->bind_null(st, i); }
int db_step(db_stmt *st) { return st->ops->step(st); }
int db_column_count(db_stmt *st) { return st->ops->column_count(st); }
const char *db_column_name(db_stmt *st, int c) {
  return st->ops->column_name(st, c);
}
int db_column_type(db_stmt *st, int c) { return st->ops->column_type(st, c); }
int64_t db_column_int64(db_stmt *st, int c) {
  return st->ops->column_int64(st, c);
}
double db_column_double(db_stmt *st, int c) {
  return st->ops->column_double(st, c);
}
const char *db_column_text(db_stmt *st, int c) {
  return st->ops->column_text(st, c);
}
const void *db_column_blob(db_stmt *st, int c) {
  return st->ops->column_blob(st, c);
}
size_t db_column_bytes(db_stmt *st, int c) {
  return st->ops->column_bytes(st, c);
}
