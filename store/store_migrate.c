/* SPDX-License-Identifier: MIT */
/* store_migrate.c — the history's schema, per backend, as versioned
 * migrations (never edit one: append the next), and the connection's
 * set-up and integrity check. gnmrd's writer runs them when it opens the
 * store; readers never do. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "db.h"
#include "gnmr/error.h"
#include "store_migrate.h"
#include "store_schema.h"

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

/* Schema version 6: the optional rules' parameters (docs/policy.md),
 * mean_horizon and job_relative, columns of jobs and params; rows before
 * it read as 0 (the rules off). */
static const char *const schema_v6 =
    "ALTER TABLE jobs ADD COLUMN mean_horizon INTEGER;"
    "ALTER TABLE params ADD COLUMN mean_horizon INTEGER;"
    "ALTER TABLE jobs ADD COLUMN job_relative INTEGER;"
    "ALTER TABLE params ADD COLUMN job_relative INTEGER;";
static const char *const pg_schema_v6 =
    "ALTER TABLE jobs ADD COLUMN mean_horizon BIGINT;"
    "ALTER TABLE params ADD COLUMN mean_horizon BIGINT;"
    "ALTER TABLE jobs ADD COLUMN job_relative BIGINT;"
    "ALTER TABLE params ADD COLUMN job_relative BIGINT;";

/* Schema version 7: the optional rule confirm_steps (docs/policy.md), a
 * column of jobs and params; rows before it read as 0 (the rule off). */
static const char *const schema_v7 =
    "ALTER TABLE jobs ADD COLUMN confirm_steps INTEGER;"
    "ALTER TABLE params ADD COLUMN confirm_steps INTEGER;";
static const char *const pg_schema_v7 =
    "ALTER TABLE jobs ADD COLUMN confirm_steps BIGINT;"
    "ALTER TABLE params ADD COLUMN confirm_steps BIGINT;";

/* Schema version 8: the measured signal's thresholds measure_alpha and
 * measure_beta and the same-step mode's flag same_step (docs/policy.md),
 * columns of jobs and params; rows before it read as 0 (off). */
static const char *const schema_v8 =
    "ALTER TABLE jobs ADD COLUMN measure_alpha REAL;"
    "ALTER TABLE params ADD COLUMN measure_alpha REAL;"
    "ALTER TABLE jobs ADD COLUMN measure_beta REAL;"
    "ALTER TABLE params ADD COLUMN measure_beta REAL;"
    "ALTER TABLE jobs ADD COLUMN same_step INTEGER;"
    "ALTER TABLE params ADD COLUMN same_step INTEGER;";
static const char *const pg_schema_v8 =
    "ALTER TABLE jobs ADD COLUMN measure_alpha DOUBLE PRECISION;"
    "ALTER TABLE params ADD COLUMN measure_alpha DOUBLE PRECISION;"
    "ALTER TABLE jobs ADD COLUMN measure_beta DOUBLE PRECISION;"
    "ALTER TABLE params ADD COLUMN measure_beta DOUBLE PRECISION;"
    "ALTER TABLE jobs ADD COLUMN same_step BIGINT;"
    "ALTER TABLE params ADD COLUMN same_step BIGINT;";

/* The parameter columns as of PostgreSQL's version 4 (frozen: a parameter
 * added later comes with a migration of its own). */
#define PG_PARAM_DEFS_V4                                                      \
  ", \"alpha\" DOUBLE PRECISION, \"beta\" DOUBLE PRECISION, \"window\" BIGINT," \
  " \"max_active\" BIGINT, \"lock_steps\" BIGINT, \"warmup_steps\" BIGINT,"   \
  " \"early_alpha\" DOUBLE PRECISION, \"early_beta\" DOUBLE PRECISION,"       \
  " \"early_steps\" BIGINT"

/* PostgreSQL's schema: born at version 4, the SQLite schema's shape
 * (runs, the two events indexes) with PostgreSQL's types (64-bit
 * integers, double precision, bytea) and a "rowid" column where the store
 * reads rows in insertion order (params, events), so that the statements
 * are the same. Later versions append migrations to pg_steps, as SQLite's
 * append to theirs. */
static const char *const pg_schema_v4 =
    "CREATE TABLE jobs(run BIGINT PRIMARY KEY, name TEXT NOT NULL,"
    " reporters BIGINT, barrier_ms BIGINT, state TEXT, pass BIGINT,"
    " last_step BIGINT" PG_PARAM_DEFS_V4 ", created_at BIGINT,"
    " updated_at BIGINT, owner TEXT);"
    "CREATE INDEX jobs_by_name ON jobs(name, run);"
    "CREATE TABLE params(rowid BIGSERIAL PRIMARY KEY, job TEXT, pass BIGINT,"
    " from_step BIGINT, at BIGINT" PG_PARAM_DEFS_V4 ", run BIGINT);"
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
    } pg_steps[] = {{4, &pg_schema_v4}, {5, &schema_v5}, {6, &pg_schema_v6},
                    {7, &pg_schema_v7}, {8, &pg_schema_v8}};
    for (size_t i = 0; i < sizeof pg_steps / sizeof pg_steps[0]; i++)
      if (version < pg_steps[i].version &&
          migrate_to(db, pg_steps[i].version, *pg_steps[i].sql, err, errlen))
        goto fail;
  } else {
    static const struct {
      int version;
      const char *const *sql;
    } steps[] = {{1, &schema_v1}, {2, &schema_v2}, {3, &schema_v3},
                 {4, &schema_v4}, {5, &schema_v5}, {6, &schema_v6},
                 {7, &schema_v7}, {8, &schema_v8}};
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

/* The seal key as stored: 64 hex digits. */
static int key_from_hex(const char *hex, uint8_t key[STORE_SEAL_KEY_BYTES]) {
  if (hex == NULL || strlen(hex) != 2 * STORE_SEAL_KEY_BYTES)
    return 0;
  for (size_t i = 0; i < STORE_SEAL_KEY_BYTES; i++) {
    unsigned v = 0;
    for (int k = 0; k < 2; k++) {
      char c = hex[2 * i + (size_t)k];
      unsigned x = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                   : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                                          : 16u;
      if (x == 16u)
        return 0;
      v = v * 16 + x;
    }
    key[i] = (uint8_t)v;
  }
  return 1;
}

int store__seal_key(db_conn *db, uint8_t key[STORE_SEAL_KEY_BYTES], char *err,
                    size_t errlen) {
  uint8_t fresh[STORE_SEAL_KEY_BYTES];
  char hex[2 * STORE_SEAL_KEY_BYTES + 1], sql[200];
  size_t got = 0;
  while (got < sizeof fresh) {
    ssize_t n = getrandom(fresh + got, sizeof fresh - got, 0);
    if (n <= 0) {
      snprintf(err, errlen, "no random bytes for the seal key (getrandom)");
      return GNMR_E_IO;
    }
    got += (size_t)n;
  }
  for (size_t i = 0; i < sizeof fresh; i++)
    snprintf(hex + 2 * i, 3, "%02x", fresh[i]);
  memset(fresh, 0, sizeof fresh);
  /* the first gnmrd of a database makes it; every later one (a restart, a
   * standby) reads that one: two starting at once agree on the first */
  snprintf(sql, sizeof sql, "INSERT INTO meta VALUES('seal_key','%s') ON "
           "CONFLICT(key) DO NOTHING", hex);
  memset(hex, 0, sizeof hex);
  int rv = store__exec(db, sql, err, errlen);
  memset(sql, 0, sizeof sql);
  if (rv != GNMR_OK)
    return GNMR_E_STORE;
  db_stmt *st;
  if (db_prepare(db, "SELECT value FROM meta WHERE key='seal_key'", &st) !=
      GNMR_OK) {
    snprintf(err, errlen, "%s", db_errmsg(db));
    return GNMR_E_STORE;
  }
  int ok = db_step(st) == DB_ROW && key_from_hex(db_column_text(st, 0), key);
  db_finalize(st);
  if (!ok) {
    snprintf(err, errlen, "the seal key (meta 'seal_key') is not 64 hex "
             "digits: delete that row and every gnmrd of this database "
             "makes a new one (decisions agents hold then are refused)");
    return GNMR_E_STORE;
  }
  return GNMR_OK;
}

int store__term_next(db_conn *db, uint64_t *term, char *err, size_t errlen) {
  /* the next term: one more than the store's, and at least the wall
   * clock in ms, so that a store made afresh (a data directory lost, a
   * backup restored) under agents that saw an older store's terms still
   * starts above them. One statement: two gnmrds starting at once get two
   * terms. */
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  unsigned long long now = (unsigned long long)ts.tv_sec * 1000ull +
                           (unsigned long long)ts.tv_nsec / 1000000ull;
  char sql[300];
  snprintf(sql, sizeof sql,
           "INSERT INTO meta VALUES('term','%llu') ON CONFLICT(key) DO "
           "UPDATE SET value=CAST(%s(CAST(meta.value AS BIGINT)+1, %llu) "
           "AS TEXT)",
           now, db_kind(db) == DB_PG ? "GREATEST" : "MAX", now);
  if (store__exec(db, sql, err, errlen) != GNMR_OK)
    return GNMR_E_STORE;
  db_stmt *st;
  if (db_prepare(db, "SELECT value FROM meta WHERE key='term'", &st) !=
      GNMR_OK) {
    snprintf(err, errlen, "%s", db_errmsg(db));
    return GNMR_E_STORE;
  }
  const char *v = db_step(st) == DB_ROW ? db_column_text(st, 0) : NULL;
  char *end = NULL;
  unsigned long long t = v != NULL ? strtoull(v, &end, 10) : 0;
  int ok = v != NULL && end != v && *end == '\0' && t > 0 &&
           t < (1ull << 62);
  db_finalize(st);
  if (!ok) {
    snprintf(err, errlen, "the leadership term (meta 'term') is not a "
             "number: delete that row (the next term is then the clock's)");
    return GNMR_E_STORE;
  }
  *term = t;
  return GNMR_OK;
}
