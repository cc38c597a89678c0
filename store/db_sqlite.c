/* SPDX-License-Identifier: MIT */
/* db_sqlite.c — the SQLite backend of db.h: each call is SQLite's own.
 * Connections wait up to 5 s on a lock (busy timeout); the writer's uses
 * WAL with synchronous=NORMAL, which survives a crash of gnmrd. */
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "db.h"
#include "gnmr/error.h"

typedef struct lite {
  db_conn base;
  sqlite3 *h;
} lite;

typedef struct lite_stmt {
  db_stmt base;
  sqlite3_stmt *st;
} lite_stmt;

static const struct db_ops lite_ops;

#define H(d) (((lite *)(d))->h)
#define S(s) (((lite_stmt *)(s))->st)

int db__sqlite_open(const char *path, unsigned flags, db_conn **out, char *err,
                    size_t errlen) {
  lite *l = calloc(1, sizeof *l);
  if (l == NULL)
    return GNMR_E_NOMEM;
  l->base.ops = &lite_ops;
  l->base.kind = DB_SQLITE;
  int f = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX;
  if (flags & DB_CREATE)
    f |= SQLITE_OPEN_CREATE;
  if (sqlite3_open_v2(path, &l->h, f, NULL) != SQLITE_OK) {
    snprintf(err, errlen, "%s: %s", path,
             l->h ? sqlite3_errmsg(l->h) : "cannot open");
    sqlite3_close(l->h);
    free(l);
    return GNMR_E_STORE;
  }
  sqlite3_busy_timeout(l->h, 5000);
  *out = &l->base;
  return GNMR_OK;
}

struct sqlite3 *db_sqlite_handle(db_conn *d) {
  return d != NULL && d->kind == DB_SQLITE ? H(d) : NULL;
}

void db_checkpoint(db_conn *d, int truncate) {
  if (d != NULL && d->kind == DB_SQLITE)
    sqlite3_wal_checkpoint_v2(H(d), NULL,
                              truncate ? SQLITE_CHECKPOINT_TRUNCATE
                                       : SQLITE_CHECKPOINT_PASSIVE,
                              NULL, NULL);
}

int db_streams_blobs(db_conn *d) { return d != NULL && d->kind == DB_SQLITE; }

int db_blob_write(db_conn *d, const char *table, const char *column,
                  int64_t rowid, const void *data, size_t len, size_t piece) {
  sqlite3_blob *b;
  if (!db_streams_blobs(d) || len > INT_MAX || piece == 0)
    return GNMR_E_UNSUPPORTED;
  if (sqlite3_blob_open(H(d), "main", table, column, rowid, 1, &b) !=
      SQLITE_OK)
    return GNMR_E_STORE;
  int rc = SQLITE_OK;
  for (size_t at = 0; rc == SQLITE_OK && at < len;) {
    size_t n = len - at < piece ? len - at : piece;
    rc = sqlite3_blob_write(b, (const char *)data + at, (int)n, (int)at);
    at += n;
  }
  if (sqlite3_blob_close(b) != SQLITE_OK || rc != SQLITE_OK)
    return GNMR_E_STORE;
  return GNMR_OK;
}

static int lite_exec(db_conn *d, const char *sql) {
  return sqlite3_exec(H(d), sql, NULL, NULL, NULL) == SQLITE_OK
             ? GNMR_OK
             : GNMR_E_STORE;
}
static const char *lite_errmsg(db_conn *d) { return sqlite3_errmsg(H(d)); }
static int lite_begin(db_conn *d) { return lite_exec(d, "BEGIN IMMEDIATE"); }
static int lite_error_class(db_conn *d) {
  int ec = sqlite3_errcode(H(d));
  return ec == SQLITE_CORRUPT || ec == SQLITE_NOTADB ? DB_ERR_DAMAGED : 0;
}
static int lite_reconnect(db_conn *d) {
  (void)d;
  return GNMR_OK;
}
static void lite_close(db_conn *d) {
  sqlite3_close(H(d));
  free(d);
}

static int lite_prepare(db_conn *d, const char *sql, int stream, db_stmt **out) {
  (void)stream; /* SQLite always reads row by row */
  lite_stmt *s = calloc(1, sizeof *s);
  *out = NULL;
  if (s == NULL)
    return GNMR_E_NOMEM;
  if (sqlite3_prepare_v2(H(d), sql, -1, &s->st, NULL) != SQLITE_OK) {
    free(s);
    return GNMR_E_STORE;
  }
  s->base.ops = &lite_ops;
  s->base.owner = d;
  *out = &s->base;
  return GNMR_OK;
}
static void lite_finalize(db_stmt *st) {
  sqlite3_finalize(S(st));
  free(st);
}
static void lite_reset(db_stmt *st) { sqlite3_reset(S(st)); }
static void lite_bind_int64(db_stmt *st, int i, int64_t v) {
  sqlite3_bind_int64(S(st), i, (sqlite3_int64)v);
}
static void lite_bind_double(db_stmt *st, int i, double v) {
  sqlite3_bind_double(S(st), i, v); /* SQLite keeps +-Inf */
}
static void lite_bind_text(db_stmt *st, int i, const char *v) {
  sqlite3_bind_text(S(st), i, v, -1, SQLITE_STATIC);
}
static void lite_bind_blob(db_stmt *st, int i, const void *v, size_t n) {
  sqlite3_bind_blob64(S(st), i, v, (sqlite3_uint64)n, SQLITE_STATIC);
}
static void lite_bind_null(db_stmt *st, int i) { sqlite3_bind_null(S(st), i); }
static int lite_step(db_stmt *st) {
  int rc = sqlite3_step(S(st));
  return rc == SQLITE_ROW ? DB_ROW : rc == SQLITE_DONE ? DB_DONE : GNMR_E_STORE;
}
static int lite_column_count(db_stmt *st) {
  return sqlite3_column_count(S(st));
}
static const char *lite_column_name(db_stmt *st, int c) {
  return sqlite3_column_name(S(st), c);
}
static int lite_column_type(db_stmt *st, int c) {
  switch (sqlite3_column_type(S(st), c)) {
  case SQLITE_INTEGER:
    return DB_INT;
  case SQLITE_FLOAT:
    return DB_FLOAT;
  case SQLITE_TEXT:
    return DB_TEXT;
  case SQLITE_BLOB:
    return DB_BLOB;
  default:
    return DB_NULL;
  }
}
static int64_t lite_column_int64(db_stmt *st, int c) {
  return (int64_t)sqlite3_column_int64(S(st), c);
}
static double lite_column_double(db_stmt *st, int c) {
  return sqlite3_column_double(S(st), c);
}
static const char *lite_column_text(db_stmt *st, int c) {
  return (const char *)sqlite3_column_text(S(st), c);
}
static const void *lite_column_blob(db_stmt *st, int c) {
  return sqlite3_column_blob(S(st), c);
}
static size_t lite_column_bytes(db_stmt *st, int c) {
  return (size_t)sqlite3_column_bytes(S(st), c);
}

static const struct db_ops lite_ops = {
    lite_exec,        lite_errmsg,        lite_begin,
    lite_error_class, lite_reconnect,     lite_close,
    lite_prepare,     lite_finalize,      lite_reset,
    lite_bind_int64,  lite_bind_double,   lite_bind_text,
    lite_bind_blob,   lite_bind_null,     lite_step,
    lite_column_count, lite_column_name,  lite_column_type,
    lite_column_int64, lite_column_double, lite_column_text,
    lite_column_blob, lite_column_bytes,
};
