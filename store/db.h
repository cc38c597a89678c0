/* SPDX-License-Identifier: MIT */
/* db.h — the one interface the store speaks to its database, with two
 * backends: SQLite (db_sqlite.c, the embedded default: a file path) and
 * PostgreSQL through libpq (db_pg.c: a "postgresql://" or "postgres://"
 * URL). The store's SQL is written once, in the subset both understand:
 * "?" and "?N" parameters (the PostgreSQL backend rewrites them to "$N"),
 * ON CONFLICT upserts, quoted "window", and a "rowid" column that
 * PostgreSQL's schema declares (BIGSERIAL) where SQLite has its own. Only
 * the schema (DDL) and the connection's settings differ per backend.
 *
 * The calls follow SQLite's statement API: prepare, bind (1-based), step
 * (DB_ROW until DB_DONE), read columns (0-based), reset, finalize. A
 * statement's text and blob columns stay valid until the next step, reset
 * or finalize; a bound text or blob must stay valid until the statement
 * is stepped (SQLite reads it in place). A connection belongs to one
 * thread at a time: it may pass from thread to thread (opened on one,
 * used by a writer thread, closed on a third), but a call through db.c
 * while another thread is inside one on the same connection or one of its
 * statements aborts, naming both threads (db.c). */
#ifndef GNMRD_DB_H
#define GNMRD_DB_H

#include <stddef.h>
#include <stdint.h>

typedef struct db db_conn;
typedef struct db_stmt db_stmt;

enum db_kind { DB_SQLITE = 1, DB_PG = 2 };
enum db_type { DB_NULL = 0, DB_INT, DB_FLOAT, DB_TEXT, DB_BLOB };
enum { DB_ROW = 100, DB_DONE = 101 }; /* db_step; errors: GNMR_E_STORE */

/* open flags */
#define DB_CREATE 1u /* SQLite: create the file (the writer) */

/* Whether target names a PostgreSQL database (a postgresql:// or
 * postgres:// URL) rather than a SQLite file. */
int db_target_is_pg(const char *target);

/* target, with a URL's password replaced by "***": for logs and messages. */
void db_target_display(const char *target, char *out, size_t cap);

/* Opens a connection. Errors: GNMR_E_STORE (err says why: the target and
 * the server's or SQLite's message), GNMR_E_NOMEM. */
int db_open(const char *target, unsigned flags, db_conn **out, char *err,
            size_t errlen);
/* NULL-safe; nulls *dp. Finalizes nothing: finalize first. */
void db_close(db_conn **dp);
int db_kind(const db_conn *d);

/* Runs one or more statements without results. 0 or GNMR_E_STORE. */
int db_exec(db_conn *d, const char *sql);
/* The last error's text ("" when none). */
const char *db_errmsg(db_conn *d);

/* Transactions. SQLite's begin takes the write lock at once (IMMEDIATE). */
int db_begin(db_conn *d);
int db_commit(db_conn *d);
int db_rollback(db_conn *d); /* quiet when no transaction is open */

/* The last error cannot be cured by retrying on this connection: SQLite's
 * file is damaged (1), or PostgreSQL's connection is gone (2: the caller
 * reconnects with db_reconnect). 0 otherwise. */
int db_error_class(db_conn *d);
#define DB_ERR_DAMAGED 1
#define DB_ERR_CONNECTION 2
/* Re-establishes a lost PostgreSQL connection (statements prepared on it
 * are prepared again when next run). 0 or GNMR_E_STORE. */
int db_reconnect(db_conn *d);

/* Statements. A streamed statement (PostgreSQL: single-row mode) reads its
 * rows one at a time from the server instead of all at once; the
 * connection runs nothing else until it is done, reset or finalized. */
int db_prepare(db_conn *d, const char *sql, db_stmt **out);
int db_prepare_stream(db_conn *d, const char *sql, db_stmt **out);
void db_finalize(db_stmt *st); /* NULL-safe */
void db_reset(db_stmt *st);    /* keeps the bindings */
void db_bind_int64(db_stmt *st, int i, int64_t v);
void db_bind_double(db_stmt *st, int i, double v); /* NaN: bind NULL */
void db_bind_text(db_stmt *st, int i, const char *v); /* NULL: NULL */
void db_bind_blob(db_stmt *st, int i, const void *v, size_t n);
void db_bind_null(db_stmt *st, int i);
int db_step(db_stmt *st);

int db_column_count(db_stmt *st);
const char *db_column_name(db_stmt *st, int c);
int db_column_type(db_stmt *st, int c);
int64_t db_column_int64(db_stmt *st, int c);
double db_column_double(db_stmt *st, int c);
const char *db_column_text(db_stmt *st, int c); /* NULL for NULL */
const void *db_column_blob(db_stmt *st, int c);
size_t db_column_bytes(db_stmt *st, int c);

/* The backends, behind the calls above (db.c dispatches). */
struct db_ops {
  int (*exec)(db_conn *, const char *);
  const char *(*errmsg)(db_conn *);
  int (*begin)(db_conn *);
  int (*error_class)(db_conn *);
  int (*reconnect)(db_conn *);
  void (*close)(db_conn *);
  int (*prepare)(db_conn *, const char *, int stream, db_stmt **);
  void (*finalize)(db_stmt *);
  void (*reset)(db_stmt *);
  void (*bind_int64)(db_stmt *, int, int64_t);
  void (*bind_double)(db_stmt *, int, double);
  void (*bind_text)(db_stmt *, int, const char *);
  void (*bind_blob)(db_stmt *, int, const void *, size_t);
  void (*bind_null)(db_stmt *, int);
  int (*step)(db_stmt *);
  int (*column_count)(db_stmt *);
  const char *(*column_name)(db_stmt *, int);
  int (*column_type)(db_stmt *, int);
  int64_t (*column_int64)(db_stmt *, int);
  double (*column_double)(db_stmt *, int);
  const char *(*column_text)(db_stmt *, int);
  const void *(*column_blob)(db_stmt *, int);
  size_t (*column_bytes)(db_stmt *, int);
};

/* Every connection and statement starts with its backend's ops. user is
 * the thread inside a call on the connection (0: none), depth its calls
 * (db.c; zero from the backend's calloc). */
struct db {
  const struct db_ops *ops;
  int kind;
  _Atomic unsigned long user;
  unsigned depth;
};
struct db_stmt {
  const struct db_ops *ops;
  db_conn *owner;
};

int db__sqlite_open(const char *path, unsigned flags, db_conn **out, char *err,
                    size_t errlen);
int db__pg_open(const char *url, unsigned flags, db_conn **out, char *err,
                size_t errlen);

/* The SQLite connection under d (DB_SQLITE only; NULL otherwise). */
struct sqlite3 *db_sqlite_handle(db_conn *d);

/* SQLite-only maintenance; nothing (or GNMR_E_UNSUPPORTED) elsewhere.
 * db_checkpoint: a WAL checkpoint, passive or truncating the log.
 * db_streams_blobs: whether db_blob_write works on d. db_blob_write:
 * writes len bytes into the blob column of table's row rowid (made with
 * zeroblob(len)) in pieces of `piece` bytes, so that a large value is
 * never copied into one record buffer. */
void db_checkpoint(db_conn *d, int truncate);
/* PostgreSQL only (GNMR_E_UNSUPPORTED elsewhere; db_copies says which):
 * db_copy_in runs sql, a COPY ... FROM STDIN in text format, with len
 * bytes of its rows (each a line of tab-separated fields, escaped as
 * COPY's text format reads them, \N for NULL): one round trip for any
 * number of rows, where an INSERT binds every value. GNMR_OK, or
 * GNMR_E_STORE with db_errmsg and db_error_class as for any statement. */
int db_copies(const db_conn *d);
int db_copy_in(db_conn *d, const char *sql, const char *data, size_t len);
int db_streams_blobs(db_conn *d);
int db_blob_write(db_conn *d, const char *table, const char *column,
                  int64_t rowid, const void *data, size_t len, size_t piece);

/* A fault window for tests: GNMR_STORE_FAULT=readonly:MS or full:MS makes
 * a SQLite store refuse writes (read-only) or run out of pages (disk
 * full) from its open for MS milliseconds, then recover;
 * readonly-while:/ABS/PATH refuses writes while that file exists (a test
 * starts and ends the fault at a point of its choosing). NULL when unset
 * or malformed; *what says which, for the log. db_fault_tick applies or
 * lifts it on d (the writer calls it before each batch). Decided: the
 * fault is SQLite's own (PRAGMA query_only / max_page_count), not a
 * wrapper of db_ops that invents errors, so the retry path meets the
 * codes and messages a real read-only or full database gives;
 * PostgreSQL's tests make a real server refuse (test_pg). */
typedef struct db_fault db_fault;
db_fault *db_fault_from_env(char *what, size_t cap);
void db_fault_tick(db_fault *f, db_conn *d);
void db_fault_free(db_fault **f);

#endif /* GNMRD_DB_H */
