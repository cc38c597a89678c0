/* SPDX-License-Identifier: MIT */
/* store_apply.c — the store's schema (versioned migrations) and how each
 * record kind is written (store_rec, store.h). Writer thread only, inside
 * the batch's transaction. */
#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gnmr/error.h"
#include "store_sql.h"

/* Schema version 1. Migrations append statements; never edit one. */
static const char *const schema_v1 =
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);"
    "CREATE TABLE IF NOT EXISTS jobs(name TEXT PRIMARY KEY, reporters INTEGER,"
    " barrier_ms INTEGER, state TEXT, pass INTEGER, last_step INTEGER,"
    " alpha REAL, beta REAL, window INTEGER, max_active INTEGER,"
    " lock_steps INTEGER, warmup_steps INTEGER, early_alpha REAL,"
    " early_beta REAL, early_steps INTEGER, created_at INTEGER,"
    " updated_at INTEGER);"
    "CREATE TABLE IF NOT EXISTS params(job TEXT, pass INTEGER, from_step"
    " INTEGER, at INTEGER, alpha REAL, beta REAL, window INTEGER,"
    " max_active INTEGER, lock_steps INTEGER, warmup_steps INTEGER,"
    " early_alpha REAL, early_beta REAL, early_steps INTEGER);"
    "CREATE TABLE IF NOT EXISTS units(job TEXT, id INTEGER, name TEXT,"
    " PRIMARY KEY(job, id));"
    "CREATE TABLE IF NOT EXISTS rank_units(job TEXT, rank INTEGER,"
    " idx INTEGER, unit INTEGER, PRIMARY KEY(job, rank, idx));"
    "CREATE TABLE IF NOT EXISTS steps(job TEXT, pass INTEGER, step INTEGER,"
    " reports INTEGER, risky INTEGER, pool INTEGER, n_active INTEGER,"
    " active TEXT, missing INTEGER, by_deadline INTEGER, latency_us INTEGER,"
    " at INTEGER, PRIMARY KEY(job, pass, step));"
    "CREATE TABLE IF NOT EXISTS events(job TEXT, pass INTEGER, step INTEGER,"
    " kind TEXT, unit INTEGER, outcome TEXT, norm REAL, g REAL, d REAL,"
    " s REAL, count INTEGER, detail TEXT, at INTEGER);"
    "CREATE INDEX IF NOT EXISTS events_by_step ON events(job, step);"
    "CREATE TABLE IF NOT EXISTS snapshots(job TEXT, pass INTEGER,"
    " step INTEGER, state BLOB, PRIMARY KEY(job, pass, step));";

/* Schema version 2: who owns a job (the CURVE key that created it). */
static const char *const schema_v2 =
    "ALTER TABLE jobs ADD COLUMN owner TEXT;";

/* Schema version 3: runs. Each start of a job name is a run with an id
 * never reused (jobs.run), and every row of a run carries it, so that a
 * name used again never overwrites an earlier run's history. The jobs
 * table gets one row per run; a version-2 database's jobs become runs 1..n
 * in the order they were created. (Column lists frozen as of version 3.) */
static const char *const schema_v3 =
    "CREATE TABLE jobs3(run INTEGER PRIMARY KEY, name TEXT NOT NULL,"
    " reporters INTEGER, barrier_ms INTEGER, state TEXT, pass INTEGER,"
    " last_step INTEGER, alpha REAL, beta REAL, window INTEGER,"
    " max_active INTEGER, lock_steps INTEGER, warmup_steps INTEGER,"
    " early_alpha REAL, early_beta REAL, early_steps INTEGER,"
    " created_at INTEGER, updated_at INTEGER, owner TEXT);"
    "INSERT INTO jobs3(name, reporters, barrier_ms, state, pass, last_step,"
    " alpha, beta, window, max_active, lock_steps, warmup_steps,"
    " early_alpha, early_beta, early_steps, created_at, updated_at, owner)"
    " SELECT name, reporters, barrier_ms, state, pass, last_step, alpha,"
    " beta, window, max_active, lock_steps, warmup_steps, early_alpha,"
    " early_beta, early_steps, created_at, updated_at, owner FROM jobs"
    " ORDER BY created_at, name;"
    "DROP TABLE jobs;"
    "ALTER TABLE jobs3 RENAME TO jobs;"
    "CREATE INDEX jobs_by_name ON jobs(name, run);"
    "ALTER TABLE params ADD COLUMN run INTEGER;"
    "UPDATE params SET run=(SELECT run FROM jobs WHERE jobs.name=params.job);"
    "ALTER TABLE events ADD COLUMN run INTEGER;"
    "UPDATE events SET run=(SELECT run FROM jobs WHERE jobs.name=events.job);"
    "CREATE INDEX events_by_run ON events(run, step);"
    "CREATE TABLE units3(job TEXT, run INTEGER, id INTEGER, name TEXT,"
    " PRIMARY KEY(run, id));"
    "INSERT INTO units3 SELECT u.job, j.run, u.id, u.name FROM units u"
    " JOIN jobs j ON j.name=u.job;"
    "DROP TABLE units;"
    "ALTER TABLE units3 RENAME TO units;"
    "CREATE TABLE rank_units3(job TEXT, run INTEGER, rank INTEGER,"
    " idx INTEGER, unit INTEGER, PRIMARY KEY(run, rank, idx));"
    "INSERT INTO rank_units3 SELECT r.job, j.run, r.rank, r.idx, r.unit"
    " FROM rank_units r JOIN jobs j ON j.name=r.job;"
    "DROP TABLE rank_units;"
    "ALTER TABLE rank_units3 RENAME TO rank_units;"
    "CREATE TABLE steps3(job TEXT, run INTEGER, pass INTEGER, step INTEGER,"
    " reports INTEGER, risky INTEGER, pool INTEGER, n_active INTEGER,"
    " active TEXT, missing INTEGER, by_deadline INTEGER, latency_us INTEGER,"
    " at INTEGER, PRIMARY KEY(run, pass, step));"
    "INSERT INTO steps3 SELECT s.job, j.run, s.pass, s.step, s.reports,"
    " s.risky, s.pool, s.n_active, s.active, s.missing, s.by_deadline,"
    " s.latency_us, s.at FROM steps s JOIN jobs j ON j.name=s.job;"
    "DROP TABLE steps;"
    "ALTER TABLE steps3 RENAME TO steps;"
    "CREATE TABLE snapshots3(job TEXT, run INTEGER, pass INTEGER,"
    " step INTEGER, state BLOB, PRIMARY KEY(run, pass, step));"
    "INSERT INTO snapshots3 SELECT s.job, j.run, s.pass, s.step, s.state"
    " FROM snapshots s JOIN jobs j ON j.name=s.job;"
    "DROP TABLE snapshots;"
    "ALTER TABLE snapshots3 RENAME TO snapshots;";

/* Schema version 4: a unit's events without reading the run's others
 * (gnmrctl history --unit); the index by job name, unused since runs,
 * goes (every index costs each insert). */
static const char *const schema_v4 =
    "CREATE INDEX IF NOT EXISTS events_by_unit ON events(run, unit, step);"
    "DROP INDEX IF EXISTS events_by_step;";

/* Schema version 5: a run's decisions by step (gnmrctl decisions, plot,
 * export), each step's latest pass found by (run, step) instead of by
 * scanning the run's rows once per step: 20000 steps took 17 s. */
static const char *const schema_v5 =
    "CREATE INDEX IF NOT EXISTS steps_by_step ON steps(run, step, pass);";

int64_t store__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* PostgreSQL's schema: born at version 4, the SQLite schema's shape
 * (runs, the two events indexes) with PostgreSQL's types (64-bit
 * integers, double precision, bytea) and a "rowid" column where the store
 * reads rows in insertion order (params, events), so that the statements
 * are the same. Later versions append migrations to pg_steps, as SQLite's
 * append to theirs. */
static const char *const pg_schema_v4 =
    "CREATE TABLE jobs(run BIGINT PRIMARY KEY, name TEXT NOT NULL,"
    " reporters BIGINT, barrier_ms BIGINT, state TEXT, pass BIGINT,"
    " last_step BIGINT" PARAM_PG_DEFS ", created_at BIGINT,"
    " updated_at BIGINT, owner TEXT);"
    "CREATE INDEX jobs_by_name ON jobs(name, run);"
    "CREATE TABLE params(rowid BIGSERIAL PRIMARY KEY, job TEXT, pass BIGINT,"
    " from_step BIGINT, at BIGINT" PARAM_PG_DEFS ", run BIGINT);"
    "CREATE INDEX params_by_run ON params(run, rowid);"
    "CREATE TABLE units(job TEXT, run BIGINT, id BIGINT, name TEXT,"
    " PRIMARY KEY(run, id));"
    "CREATE TABLE rank_units(job TEXT, run BIGINT, rank BIGINT, idx BIGINT,"
    " unit BIGINT, PRIMARY KEY(run, rank, idx));"
    "CREATE TABLE steps(job TEXT, run BIGINT, pass BIGINT, step BIGINT,"
    " reports BIGINT, risky BIGINT, pool BIGINT, n_active BIGINT,"
    " active TEXT, missing BIGINT, by_deadline BIGINT, latency_us BIGINT,"
    " at BIGINT, PRIMARY KEY(run, pass, step));"
    "CREATE TABLE events(rowid BIGSERIAL, job TEXT, pass BIGINT,"
    " step BIGINT, kind TEXT, unit BIGINT, outcome TEXT,"
    " norm DOUBLE PRECISION, g DOUBLE PRECISION, d DOUBLE PRECISION,"
    " s DOUBLE PRECISION, count BIGINT, detail TEXT, at BIGINT,"
    " run BIGINT);"
    "CREATE INDEX events_by_run ON events(run, step);"
    "CREATE INDEX events_by_unit ON events(run, unit, step);"
    "CREATE TABLE snapshots(job TEXT, run BIGINT, pass BIGINT, step BIGINT,"
    " state BYTEA, PRIMARY KEY(run, pass, step));";

/* Two gnmrd starting together on one PostgreSQL schema migrate one after
 * the other: this transaction-scoped advisory lock ("GNMI" and the
 * schema) is held by the one migrating. */
#define PG_MIGRATE_LOCK                                                      \
  "SELECT pg_advisory_xact_lock(1196313929, hashtext(current_schema()))"

int store__exec(db_conn *db, const char *sql, char *err, size_t errlen) {
  if (db_exec(db, sql) != GNMR_OK) {
    if (err)
      snprintf(err, errlen, "%s", db_errmsg(db));
    return GNMR_E_STORE;
  }
  return GNMR_OK;
}

int store__configure(db_conn *db) {
  if (db_kind(db) != DB_SQLITE)
    return GNMR_OK;
  return store__exec(db,
              "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
              "PRAGMA foreign_keys=OFF;",
              NULL, 0);
}

int store__integrity(db_conn *db, char *err, size_t errlen) {
  db_stmt *st;
  if (db_kind(db) != DB_SQLITE)
    return GNMR_OK; /* the server keeps its own files whole */
  if (db_prepare(db, "PRAGMA quick_check(1)", &st) != GNMR_OK) {
    snprintf(err, errlen, "%s", db_errmsg(db));
    return GNMR_E_STORE;
  }
  int rc = db_step(st);
  const char *res = rc == DB_ROW ? db_column_text(st, 0) : NULL;
  int ok = res != NULL && strcmp(res, "ok") == 0;
  if (!ok)
    snprintf(err, errlen, "the database is damaged (PRAGMA quick_check: %s);"
             " restore it from a backup, or move it away to start afresh",
             res ? res : db_errmsg(db));
  db_finalize(st);
  return ok ? GNMR_OK : GNMR_E_STORE;
}

static int schema_version(db_conn *db) {
  db_stmt *st;
  int version = 0;
  if (db_prepare(db, "SELECT value FROM meta WHERE key='schema'", &st) ==
      GNMR_OK) {
    if (db_step(st) == DB_ROW && db_column_text(st, 0) != NULL)
      version = atoi(db_column_text(st, 0));
    db_finalize(st);
  }
  return version;
}

/* Runs one migration to version in a transaction of its own. */
static int migrate_to(db_conn *db, int version, const char *sql, char *err,
                      size_t errlen) {
  char meta[160];
  snprintf(meta, sizeof meta,
           "INSERT INTO meta VALUES('schema','%d') ON CONFLICT(key) DO "
           "UPDATE SET value=excluded.value",
           version);
  if (store__exec(db, sql, err, errlen) ||
      store__exec(db, meta, err, errlen))
    return GNMR_E_STORE;
  return GNMR_OK;
}

int store__migrate(db_conn *db, char *err, size_t errlen) {
  int pg = db_kind(db) == DB_PG;
  if (store__exec(db,
           "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, "
           "value TEXT);",
           err, errlen))
    return GNMR_E_STORE;
  if (store__exec(db, pg ? "BEGIN" : "BEGIN IMMEDIATE", err, errlen))
    return GNMR_E_STORE;
  if (pg && store__exec(db, PG_MIGRATE_LOCK, err, errlen))
    goto fail;
  int version = schema_version(db);
  if (version > STORE_SCHEMA_VERSION) {
    snprintf(err, errlen,
             "database schema %d is newer than this gnmrd (%d): upgrade "
             "gnmrd, or give it another database",
             version, STORE_SCHEMA_VERSION);
    goto fail;
  }
  if (pg) {
    /* (version, SQL): PostgreSQL's own history, from its first version */
    static const struct {
      int version;
      const char *const *sql;
    } pg_steps[] = {{4, &pg_schema_v4}, {5, &schema_v5}};
    for (size_t i = 0; i < sizeof pg_steps / sizeof pg_steps[0]; i++)
      if (version < pg_steps[i].version &&
          migrate_to(db, pg_steps[i].version, *pg_steps[i].sql, err, errlen))
        goto fail;
  } else {
    static const struct {
      int version;
      const char *const *sql;
    } steps[] = {{1, &schema_v1}, {2, &schema_v2}, {3, &schema_v3},
                 {4, &schema_v4}, {5, &schema_v5}};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
      if (version < steps[i].version &&
          migrate_to(db, steps[i].version, *steps[i].sql, err, errlen))
        goto fail;
  }
  if (store__exec(db, "COMMIT", err, errlen))
    goto fail;
  return GNMR_OK;
fail:
  db_rollback(db);
  return GNMR_E_STORE;
}

static void bind_params(db_stmt *st, int at, const policy_params *p) {
  for (int i = 0; i < GNMR_NPARAMS; i++) {
    if (!policy_param_is_f64(i))
      db_bind_int64(st, at + i, (int64_t)policy_param_u64(p, i));
    else if (isnan(policy_param_f64(p, i)))
      db_bind_null(st, at + i);
    else
      db_bind_double(st, at + i, policy_param_f64(p, i));
  }
}

void store__read_params(db_stmt *st, int at, policy_params *p) {
  for (int i = 0; i < GNMR_NPARAMS; i++) {
    if (!policy_param_is_f64(i))
      policy_param_set_u64(p, i, (uint64_t)db_column_int64(st, at + i));
    else
      policy_param_set_f64(p, i, db_column_type(st, at + i) == DB_NULL
                                     ? NAN
                                     : db_column_double(st, at + i));
  }
}

/* Runs one statement with the binder's values; 0 or GNMR_E_STORE. */
static int run(db_conn *db, const char *sql,
               void (*bind)(db_stmt *, const void *), const void *arg) {
  db_stmt *st;
  if (db_prepare(db, sql, &st) != GNMR_OK)
    return GNMR_E_STORE;
  bind(st, arg);
  int rc = db_step(st);
  db_finalize(st);
  return rc == DB_DONE ? GNMR_OK : GNMR_E_STORE;
}

static void bind_job(db_stmt *st, const void *arg) {
  const store_rec *r = arg;
  int64_t t = store__now_ms();
  db_bind_int64(st, 8 + GNMR_NPARAMS, (int64_t)r->run);
  db_bind_text(st, 1, r->job);
  db_bind_int64(st, 2, r->reporters);
  db_bind_int64(st, 3, r->barrier_ms);
  db_bind_int64(st, 4, r->pass);
  bind_params(st, 5, &r->params);
  db_bind_int64(st, 5 + GNMR_NPARAMS, t);
  db_bind_int64(st, 6 + GNMR_NPARAMS, t);
  if (r->text != NULL) /* the owner */
    db_bind_text(st, 7 + GNMR_NPARAMS, r->text);
  else
    db_bind_null(st, 7 + GNMR_NPARAMS);
}

static void bind_params_row(db_stmt *st, const void *arg) {
  const store_rec *r = arg;
  db_bind_int64(st, 5 + GNMR_NPARAMS, (int64_t)r->run);
  db_bind_text(st, 1, r->job);
  db_bind_int64(st, 2, r->pass);
  db_bind_int64(st, 3, (int64_t)r->step);
  db_bind_int64(st, 4, store__now_ms());
  bind_params(st, 5, &r->params);
}

static void bind_op_event(db_stmt *st, const void *arg) {
  const store_rec *r = arg;
  db_bind_text(st, 1, r->job);
  db_bind_int64(st, 2, r->pass);
  db_bind_int64(st, 3, (int64_t)r->step);
  db_bind_text(st, 4, r->text);
  if (r->rank == UINT32_MAX)
    db_bind_null(st, 5);
  else
    db_bind_int64(st, 5, r->rank);
  db_bind_text(st, 6, r->detail ? r->detail : "");
  db_bind_int64(st, 7, store__now_ms());
  db_bind_int64(st, 8, (int64_t)r->run);
}

static void bind_state(db_stmt *st, const void *arg) {
  const store_rec *r = arg;
  db_bind_text(st, 1, r->text);
  db_bind_int64(st, 2, store__now_ms());
  db_bind_int64(st, 3, (int64_t)r->run);
}

/* SQLite, a snapshot of SNAP_STREAM_MIN bytes or more: the row goes in
 * with a zeroblob of the snapshot's length (which SQLite writes without
 * building the record in memory) and the bytes are written into it in
 * pieces through the incremental blob API. Bound whole, a blob makes
 * SQLite copy it into one record buffer as large as the snapshot (97 MB
 * at a million units), a fresh mapping each time on the writer's thread,
 * paid a page fault per page. */
#define SNAP_STREAM_MIN ((size_t)1 << 20)
#define SNAP_STREAM_PIECE ((size_t)1 << 20)

static int put_snapshot_lite(sqlite3 *h, const store_rec *r) {
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(h,
                         "INSERT INTO snapshots(job, pass, step, state, run)"
                         " VALUES(?,?,?,zeroblob(?4),?5) ON CONFLICT(run,"
                         " pass, step) DO UPDATE SET state=excluded.state"
                         " RETURNING rowid",
                         -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  sqlite3_bind_text(st, 1, r->job, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, r->pass);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)r->step);
  sqlite3_bind_int64(st, 4, (sqlite3_int64)r->snapshot_len);
  sqlite3_bind_int64(st, 5, (sqlite3_int64)r->run);
  sqlite3_int64 rowid = 0;
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW)
    rowid = sqlite3_column_int64(st, 0);
  int done = rc == SQLITE_ROW && sqlite3_step(st) == SQLITE_DONE;
  sqlite3_finalize(st);
  if (!done)
    return GNMR_E_STORE;
  sqlite3_blob *b;
  if (sqlite3_blob_open(h, "main", "snapshots", "state", rowid, 1, &b) !=
      SQLITE_OK)
    return GNMR_E_STORE;
  rc = SQLITE_OK;
  for (size_t at = 0; rc == SQLITE_OK && at < r->snapshot_len;) {
    size_t n = r->snapshot_len - at < SNAP_STREAM_PIECE ? r->snapshot_len - at
                                                         : SNAP_STREAM_PIECE;
    rc = sqlite3_blob_write(b, (const char *)r->snapshot + at, (int)n,
                            (int)at);
    at += n;
  }
  if (sqlite3_blob_close(b) != SQLITE_OK || rc != SQLITE_OK)
    return GNMR_E_STORE;
  return GNMR_OK;
}

/* Stores r's snapshot and keeps only the job's two newest. */
static int apply_snapshot(db_conn *db, const store_rec *r) {
  db_stmt *st;
  int rc;
  sqlite3 *h = db_sqlite_handle(db);
  if (h != NULL && r->snapshot_len >= SNAP_STREAM_MIN &&
      r->snapshot_len <= INT_MAX) {
    if (put_snapshot_lite(h, r) != GNMR_OK)
      return GNMR_E_STORE;
  } else if (db_prepare(db,
                 "INSERT INTO snapshots(job, pass, step, state, run)"
                 " VALUES(?,?,?,?,?) ON CONFLICT(run, pass, step) DO UPDATE"
                 " SET state=excluded.state",
                 &st) != GNMR_OK) {
    return GNMR_E_STORE;
  } else {
    db_bind_text(st, 1, r->job);
    db_bind_int64(st, 2, r->pass);
    db_bind_int64(st, 3, (int64_t)r->step);
    db_bind_blob(st, 4, r->snapshot, r->snapshot_len);
    db_bind_int64(st, 5, (int64_t)r->run);
    rc = db_step(st);
    db_finalize(st);
    if (rc != DB_DONE)
      return GNMR_E_STORE;
  }
  /* keep the two newest snapshots of the run */
  if (db_prepare(db,
                 "DELETE FROM snapshots WHERE run=?1 AND (pass, step) NOT IN"
                 " (SELECT pass, step FROM snapshots WHERE run=?1"
                 " ORDER BY pass DESC, step DESC LIMIT 2)",
                 &st) != GNMR_OK)
    return GNMR_E_STORE;
  db_bind_int64(st, 1, (int64_t)r->run);
  rc = db_step(st);
  db_finalize(st);
  if (rc != DB_DONE)
    return GNMR_E_STORE;
  return GNMR_OK;
}

/* A step's events go up to EVENT_ROWS to a statement: one round trip to
 * PostgreSQL, one parse in SQLite; a statement per row count, prepared
 * when first needed. */
#define EVENT_ROWS STORE_EVENT_ROWS
#define EVENT_COLS 13

/* INSERT INTO events ... VALUES(...) with rows rows. */
static const char *events_sql(int rows, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap,
                              "INSERT INTO events(job, pass, step, kind, "
                              "unit, outcome, norm, g, d, s, count, at, run)"
                              " VALUES");
  for (int r = 0; r < rows && n < cap; r++)
    n += (size_t)snprintf(buf + n, cap - n, "%s(?,?,?,?,?,?,?,?,?,?,?,?,?)",
                          r ? "," : "");
  return buf;
}

/* Binds event e as row `row` (0-based) of an events statement. */
static void bind_event(db_stmt *st, int row, const store_rec *r,
                       const store_event *e, int64_t t) {
  int c = row * EVENT_COLS;
  db_bind_text(st, c + 1, r->job);
  db_bind_int64(st, c + 2, r->pass);
  db_bind_int64(st, c + 3, (int64_t)r->step);
  db_bind_text(st, c + 4, policy_event_name(e->kind));
  if (e->unit == UINT32_MAX)
    db_bind_null(st, c + 5);
  else
    db_bind_int64(st, c + 5, e->unit);
  db_bind_text(st, c + 6, e->outcome ? policy_outcome_name(e->outcome) : NULL);
  db_bind_double(st, c + 7, e->norm); /* NaN: NULL; both keep +-Inf */
  db_bind_double(st, c + 8, e->g);
  db_bind_double(st, c + 9, e->d);
  db_bind_double(st, c + 10, e->s);
  db_bind_int64(st, c + 11, e->count);
  db_bind_int64(st, c + 12, t);
  db_bind_int64(st, c + 13, (int64_t)r->run);
}

/* Prepares the step path's statements once per connection. */
static int prepare_step(store *s) {
  if (s->st_step != NULL)
    return GNMR_OK;
  if (db_prepare(s->db,
                 "INSERT INTO steps(job, pass, step, reports, risky, pool,"
                 " n_active, active, missing, by_deadline, latency_us, at,"
                 " run) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)"
                 " ON CONFLICT(run, pass, step) DO UPDATE SET"
                 " reports=excluded.reports, risky=excluded.risky,"
                 " pool=excluded.pool, n_active=excluded.n_active,"
                 " active=excluded.active, missing=excluded.missing,"
                 " by_deadline=excluded.by_deadline,"
                 " latency_us=excluded.latency_us, at=excluded.at",
                 &s->st_step) != GNMR_OK ||

      db_prepare(s->db,
                 "UPDATE jobs SET last_step=?1, updated_at=?2 WHERE run=?3",
                 &s->st_last) != GNMR_OK)
    return GNMR_E_STORE;
  return GNMR_OK;
}

static int apply_step(store *s, const store_rec *r) {
  db_conn *db = s->db;
  db_stmt *st;
  int rc;
  int64_t t = store__now_ms();
  if (prepare_step(s) != GNMR_OK)
    return GNMR_E_STORE;
  /* a failed earlier batch may have left a statement mid-way */
  db_reset(s->st_step);
  for (int k = 0; k <= STORE_EVENT_ROWS; k++)
    if (s->st_events[k] != NULL)
      db_reset(s->st_events[k]);
  db_reset(s->st_last);
  st = s->st_step;
  db_bind_text(st, 1, r->job);
  db_bind_int64(st, 2, r->pass);
  db_bind_int64(st, 3, (int64_t)r->step);
  db_bind_int64(st, 4, r->reports);
  db_bind_int64(st, 5, r->risky);
  db_bind_int64(st, 6, r->pool);
  db_bind_int64(st, 7, r->n);
  db_bind_text(st, 8, r->active ? r->active : "");
  db_bind_int64(st, 9, r->missing);
  db_bind_int64(st, 10, r->by_deadline);
  db_bind_int64(st, 11, (int64_t)r->latency_us);
  db_bind_int64(st, 12, t);
  db_bind_int64(st, 13, (int64_t)r->run);
  rc = db_step(st);
  db_reset(st);
  if (rc != DB_DONE)
    return GNMR_E_STORE;
  for (uint32_t i = 0; i < r->n_events;) {
    int rows = r->n_events - i >= EVENT_ROWS ? EVENT_ROWS
                                             : (int)(r->n_events - i);
    if (s->st_events[rows] == NULL) { /* each size prepared once */
      char sql[EVENT_ROWS * 32 + 160];
      if (db_prepare(s->db, events_sql(rows, sql, sizeof sql),
                     &s->st_events[rows]) != GNMR_OK)
        return GNMR_E_STORE;
    }
    st = s->st_events[rows];
    for (int k = 0; k < rows; k++)
      bind_event(st, k, r, &r->events[i + (uint32_t)k], t);
    rc = db_step(st);
    db_reset(st);
    if (rc != DB_DONE)
      return GNMR_E_STORE;
    i += (uint32_t)rows;
  }
  if (r->snapshot != NULL && apply_snapshot(db, r) != GNMR_OK)
    return GNMR_E_STORE;
  st = s->st_last;
  db_bind_int64(st, 1, (int64_t)r->step);
  db_bind_int64(st, 2, t);
  db_bind_int64(st, 3, (int64_t)r->run);
  rc = db_step(st);
  db_reset(st);
  return rc == DB_DONE ? GNMR_OK : GNMR_E_STORE;
}

static int apply_ids(db_conn *db, const store_rec *r) {
  db_stmt *st;
  const char *sql = r->kind == REC_UNITS
                        ? "INSERT INTO units(job, id, name, run)"
                          " VALUES(?,?,?,?) ON CONFLICT(run, id) DO UPDATE"
                          " SET name=excluded.name"
                        : "INSERT INTO rank_units(job, rank, idx, unit, run)"
                          " VALUES(?,?,?,?,?) ON CONFLICT(run, rank, idx) DO"
                          " UPDATE SET unit=excluded.unit";
  if (db_prepare(db, sql, &st) != GNMR_OK)
    return GNMR_E_STORE;
  for (uint32_t i = 0; i < r->n; i++) {
    db_bind_text(st, 1, r->job);
    if (r->kind == REC_UNITS) {
      db_bind_int64(st, 2, r->ids[i]);
      db_bind_text(st, 3, r->names[i]);
      db_bind_int64(st, 4, (int64_t)r->run);
    } else {
      db_bind_int64(st, 2, r->rank);
      db_bind_int64(st, 3, i);
      db_bind_int64(st, 4, r->ids[i]);
      db_bind_int64(st, 5, (int64_t)r->run);
    }
    int rc = db_step(st);
    db_reset(st);
    if (rc != DB_DONE) {
      db_finalize(st);
      return GNMR_E_STORE;
    }
  }
  db_finalize(st);
  return GNMR_OK;
}

static const char params_insert_sql[] =
    "INSERT INTO params(job, pass, from_step, at" PARAM_COLS ", run) "
    "VALUES(?,?,?,?" PARAM_QS ",?)";

int store__apply(store *s, const store_rec *r) {
  switch (r->kind) {
  case REC_JOB: {
    int rv = run(s->db,
                 "INSERT INTO jobs(name, reporters, barrier_ms, state, pass, "
                 "last_step" PARAM_COLS ", created_at, updated_at, owner, "
                 "run) VALUES(?,?,?,'running',?,0" PARAM_QS ",?,?,?,?) "
                 "ON CONFLICT(run) DO UPDATE SET reporters=excluded.reporters,"
                 " barrier_ms=excluded.barrier_ms, state='running',"
                 " pass=excluded.pass" PARAM_SETS ","
                 " updated_at=excluded.updated_at, owner=excluded.owner",
                 bind_job, r);
    if (rv == GNMR_OK)
      rv = run(s->db, params_insert_sql, bind_params_row, r);
    return rv;
  }
  case REC_PARAMS:
    return run(s->db, params_insert_sql, bind_params_row, r);
  case REC_UNITS:
  case REC_RANK:
    return apply_ids(s->db, r);
  case REC_STEP:
    return apply_step(s, r);
  case REC_SNAPSHOT:
    return apply_snapshot(s->db, r);
  case REC_EVENT:
    return run(s->db,
               "INSERT INTO events(job, pass, step, kind, unit, detail, at, "
               "run) VALUES(?,?,?,?,?,?,?,?)",
               bind_op_event, r);
  case REC_STATE:
    return run(s->db, "UPDATE jobs SET state=?1, updated_at=?2 WHERE run=?3",
               bind_state, r);
  default:
    return GNMR_E_INVAL;
  }
}

/* Retention: drops a job's steps and events older than retain_steps
 * behind `step`. Runs in the writer thread, in the batch's transaction. */
int store__retain(store *s, uint64_t run, uint64_t step) {
  char sql[160];
  if (s->retain_steps == 0 || step <= s->retain_steps || step % 256 != 0)
    return GNMR_OK;
  for (int k = 0; k < 2; k++) {
    db_stmt *st;
    snprintf(sql, sizeof sql, "DELETE FROM %s WHERE run=? AND step < ?",
             k ? "events" : "steps");
    if (db_prepare(s->db, sql, &st) != GNMR_OK)
      return GNMR_E_STORE;
    db_bind_int64(st, 1, (int64_t)run);
    db_bind_int64(st, 2, (int64_t)(step - s->retain_steps));
    int rc = db_step(st);
    db_finalize(st);
    if (rc != DB_DONE)
      return GNMR_E_STORE;
  }
  return GNMR_OK;
}

