/* SPDX-License-Identifier: MIT */
/* store_apply.c — the store's schema (versioned migrations) and how each
 * record kind is written (store_rec, store.h). Writer thread only, inside
 * the batch's transaction. */
#include <math.h>
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

int64_t store__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int store__exec(sqlite3 *db, const char *sql, char *err, size_t errlen) {
  char *msg = NULL;
  if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
    if (err)
      snprintf(err, errlen, "%s", msg ? msg : sqlite3_errmsg(db));
    sqlite3_free(msg);
    return GNMR_E_STORE;
  }
  return GNMR_OK;
}

int store__configure(sqlite3 *db) {
  sqlite3_busy_timeout(db, 5000);
  return store__exec(db,
              "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
              "PRAGMA foreign_keys=OFF;",
              NULL, 0);
}

int store_open_reader(const char *path, sqlite3 **db) {
  if (sqlite3_open_v2(path, db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
    sqlite3_close(*db);
    *db = NULL;
    return GNMR_E_STORE;
  }
  sqlite3_busy_timeout(*db, 5000);
  return GNMR_OK;
}

int store__integrity(sqlite3 *db, char *err, size_t errlen) {
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db, "PRAGMA quick_check(1)", -1, &st, NULL) !=
      SQLITE_OK) {
    snprintf(err, errlen, "%s", sqlite3_errmsg(db));
    return GNMR_E_STORE;
  }
  int rc = sqlite3_step(st);
  const char *res = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(st, 0)
                                     : NULL;
  int ok = res != NULL && strcmp(res, "ok") == 0;
  if (!ok)
    snprintf(err, errlen, "the database is damaged (PRAGMA quick_check: %s);"
             " restore it from a backup, or move it away to start afresh",
             res ? res : sqlite3_errmsg(db));
  sqlite3_finalize(st);
  return ok ? GNMR_OK : GNMR_E_STORE;
}

int store__migrate(sqlite3 *db, char *err, size_t errlen) {
  sqlite3_stmt *st;
  int version = 0;
  if (store__exec(db,
           "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, "
           "value TEXT);",
           err, errlen))
    return GNMR_E_STORE;
  if (sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key='schema'", -1,
                         &st, NULL) == SQLITE_OK) {
    if (sqlite3_step(st) == SQLITE_ROW)
      version = atoi((const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
  }
  if (version > STORE_SCHEMA_VERSION) {
    snprintf(err, errlen, "database schema %d is newer than this gnmrd (%d)",
             version, STORE_SCHEMA_VERSION);
    return GNMR_E_STORE;
  }
  if (version < 1) {
    if (store__exec(db, "BEGIN", err, errlen) ||
        store__exec(db, schema_v1, err, errlen) ||
        store__exec(db, "INSERT OR REPLACE INTO meta VALUES('schema','1')",
                    err, errlen) ||
        store__exec(db, "COMMIT", err, errlen)) {
      store__exec(db, "ROLLBACK", NULL, 0);
      return GNMR_E_STORE;
    }
  }
  static const struct {
    int version;
    const char *const *sql;
  } steps[] = {{2, &schema_v2}, {3, &schema_v3}, {4, &schema_v4}};
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    char meta[80];
    if (version >= steps[i].version)
      continue;
    snprintf(meta, sizeof meta,
             "INSERT OR REPLACE INTO meta VALUES('schema','%d')",
             steps[i].version);
    if (store__exec(db, "BEGIN", err, errlen) ||
        store__exec(db, *steps[i].sql, err, errlen) ||
        store__exec(db, meta, err, errlen) ||
        store__exec(db, "COMMIT", err, errlen)) {
      store__exec(db, "ROLLBACK", NULL, 0);
      return GNMR_E_STORE;
    }
  }
  return GNMR_OK;
}

static void bind_params(sqlite3_stmt *st, int at, const policy_params *p) {
  for (int i = 0; i < GNMR_NPARAMS; i++) {
    if (!policy_param_is_f64(i))
      sqlite3_bind_int64(st, at + i, (sqlite3_int64)policy_param_u64(p, i));
    else if (isnan(policy_param_f64(p, i)))
      sqlite3_bind_null(st, at + i);
    else
      sqlite3_bind_double(st, at + i, policy_param_f64(p, i));
  }
}

void store__read_params(sqlite3_stmt *st, int at, policy_params *p) {
  for (int i = 0; i < GNMR_NPARAMS; i++) {
    if (!policy_param_is_f64(i))
      policy_param_set_u64(p, i, (uint64_t)sqlite3_column_int64(st, at + i));
    else
      policy_param_set_f64(p, i, sqlite3_column_type(st, at + i) == SQLITE_NULL
                                     ? NAN
                                     : sqlite3_column_double(st, at + i));
  }
}

/* Runs one statement with the binder's values; 0 or GNMR_E_STORE. */
static int run(sqlite3 *db, const char *sql,
               void (*bind)(sqlite3_stmt *, const void *), const void *arg) {
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  bind(st, arg);
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? GNMR_OK : GNMR_E_STORE;
}

static void bind_job(sqlite3_stmt *st, const void *arg) {
  const store_rec *r = arg;
  int64_t t = store__now_ms();
  sqlite3_bind_int64(st, 8 + GNMR_NPARAMS, (sqlite3_int64)r->run);
  sqlite3_bind_text(st, 1, r->job, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, r->reporters);
  sqlite3_bind_int64(st, 3, r->barrier_ms);
  sqlite3_bind_int64(st, 4, r->pass);
  bind_params(st, 5, &r->params);
  sqlite3_bind_int64(st, 5 + GNMR_NPARAMS, t);
  sqlite3_bind_int64(st, 6 + GNMR_NPARAMS, t);
  if (r->text != NULL) /* the owner */
    sqlite3_bind_text(st, 7 + GNMR_NPARAMS, r->text, -1, SQLITE_STATIC);
  else
    sqlite3_bind_null(st, 7 + GNMR_NPARAMS);
}

static void bind_params_row(sqlite3_stmt *st, const void *arg) {
  const store_rec *r = arg;
  sqlite3_bind_int64(st, 5 + GNMR_NPARAMS, (sqlite3_int64)r->run);
  sqlite3_bind_text(st, 1, r->job, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, r->pass);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)r->step);
  sqlite3_bind_int64(st, 4, store__now_ms());
  bind_params(st, 5, &r->params);
}

static void bind_op_event(sqlite3_stmt *st, const void *arg) {
  const store_rec *r = arg;
  sqlite3_bind_text(st, 1, r->job, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, r->pass);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)r->step);
  sqlite3_bind_text(st, 4, r->text, -1, SQLITE_STATIC);
  if (r->rank == UINT32_MAX)
    sqlite3_bind_null(st, 5);
  else
    sqlite3_bind_int64(st, 5, r->rank);
  sqlite3_bind_text(st, 6, r->detail ? r->detail : "", -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 7, store__now_ms());
  sqlite3_bind_int64(st, 8, (sqlite3_int64)r->run);
}

static void bind_state(sqlite3_stmt *st, const void *arg) {
  const store_rec *r = arg;
  sqlite3_bind_text(st, 1, r->text, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, store__now_ms());
  sqlite3_bind_int64(st, 3, (sqlite3_int64)r->run);
}

/* Stores r's snapshot and keeps only the job's two newest. */
static int apply_snapshot(sqlite3 *db, const store_rec *r) {
  sqlite3_stmt *st;
  int rc;
  if (sqlite3_prepare_v2(db,
                         "INSERT OR REPLACE INTO snapshots(job, pass, step,"
                         " state, run) VALUES(?,?,?,?,?)",
                         -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  sqlite3_bind_text(st, 1, r->job, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, r->pass);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)r->step);
  sqlite3_bind_blob(st, 4, r->snapshot, (int)r->snapshot_len, SQLITE_STATIC);
  sqlite3_bind_int64(st, 5, (sqlite3_int64)r->run);
  rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE)
    return GNMR_E_STORE;
  /* keep the two newest snapshots of the run */
  if (sqlite3_prepare_v2(db,
                         "DELETE FROM snapshots WHERE run=?1 AND rowid NOT "
                         "IN (SELECT rowid FROM snapshots WHERE run=?1 "
                         "ORDER BY pass DESC, step DESC LIMIT 2)",
                         -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  sqlite3_bind_int64(st, 1, (sqlite3_int64)r->run);
  rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE)
    return GNMR_E_STORE;
  return GNMR_OK;
}

/* Prepares the step path's statements once per connection. */
static int prepare_step(store *s) {
  if (s->st_step != NULL)
    return GNMR_OK;
  if (sqlite3_prepare_v2(s->db,
                         "INSERT OR REPLACE INTO steps(job, pass, step,"
                         " reports, risky, pool, n_active, active, missing,"
                         " by_deadline, latency_us, at, run)"
                         " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
                         -1, &s->st_step, NULL) != SQLITE_OK ||
      sqlite3_prepare_v2(s->db,
                         "INSERT INTO events(job, pass, step, kind, unit,"
                         " outcome, norm, g, d, s, count, detail, at, run)"
                         " VALUES(?,?,?,?,?,?,?,?,?,?,?,NULL,?,?)",
                         -1, &s->st_event, NULL) != SQLITE_OK ||
      sqlite3_prepare_v2(s->db,
                         "UPDATE jobs SET last_step=?1, updated_at=?2 WHERE "
                         "run=?3",
                         -1, &s->st_last, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  return GNMR_OK;
}

static int apply_step(store *s, const store_rec *r) {
  sqlite3 *db = s->db;
  sqlite3_stmt *st;
  int rc;
  int64_t t = store__now_ms();
  if (prepare_step(s) != GNMR_OK)
    return GNMR_E_STORE;
  /* a failed earlier batch may have left a statement mid-way */
  sqlite3_reset(s->st_step);
  sqlite3_reset(s->st_event);
  sqlite3_reset(s->st_last);
  st = s->st_step;
  sqlite3_bind_text(st, 1, r->job, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, r->pass);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)r->step);
  sqlite3_bind_int64(st, 4, r->reports);
  sqlite3_bind_int64(st, 5, r->risky);
  sqlite3_bind_int64(st, 6, r->pool);
  sqlite3_bind_int64(st, 7, r->n);
  sqlite3_bind_text(st, 8, r->active ? r->active : "", -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 9, r->missing);
  sqlite3_bind_int64(st, 10, r->by_deadline);
  sqlite3_bind_int64(st, 11, (sqlite3_int64)r->latency_us);
  sqlite3_bind_int64(st, 12, t);
  sqlite3_bind_int64(st, 13, (sqlite3_int64)r->run);
  rc = sqlite3_step(st);
  sqlite3_reset(st);
  if (rc != SQLITE_DONE)
    return GNMR_E_STORE;
  if (r->n_events > 0) {
    st = s->st_event;
    for (uint32_t i = 0; i < r->n_events; i++) {
      const store_event *e = &r->events[i];
      sqlite3_bind_text(st, 1, r->job, -1, SQLITE_STATIC);
      sqlite3_bind_int64(st, 2, r->pass);
      sqlite3_bind_int64(st, 3, (sqlite3_int64)r->step);
      sqlite3_bind_text(st, 4, policy_event_name(e->kind), -1, SQLITE_STATIC);
      if (e->unit == UINT32_MAX)
        sqlite3_bind_null(st, 5);
      else
        sqlite3_bind_int64(st, 5, e->unit);
      if (e->outcome)
        sqlite3_bind_text(st, 6, policy_outcome_name(e->outcome), -1,
                          SQLITE_STATIC);
      else
        sqlite3_bind_null(st, 6);
#define BIND_NUM(col, v)                                                       \
  do {                                                                         \
    if (isnan(v))                                                              \
      sqlite3_bind_null(st, col);                                              \
    else                                                                       \
      sqlite3_bind_double(st, col, v); /* SQLite keeps +-Inf */                \
  } while (0)
      BIND_NUM(7, e->norm);
      BIND_NUM(8, e->g);
      BIND_NUM(9, e->d);
      BIND_NUM(10, e->s);
#undef BIND_NUM
      sqlite3_bind_int64(st, 11, e->count);
      sqlite3_bind_int64(st, 12, t);
      sqlite3_bind_int64(st, 13, (sqlite3_int64)r->run);
      rc = sqlite3_step(st);
      sqlite3_reset(st);
      if (rc != SQLITE_DONE)
        return GNMR_E_STORE;
    }
  }
  if (r->snapshot != NULL && apply_snapshot(db, r) != GNMR_OK)
    return GNMR_E_STORE;
  st = s->st_last;
  sqlite3_bind_int64(st, 1, (sqlite3_int64)r->step);
  sqlite3_bind_int64(st, 2, t);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)r->run);
  rc = sqlite3_step(st);
  sqlite3_reset(st);
  return rc == SQLITE_DONE ? GNMR_OK : GNMR_E_STORE;
}

static int apply_ids(sqlite3 *db, const store_rec *r) {
  sqlite3_stmt *st;
  const char *sql = r->kind == REC_UNITS
                        ? "INSERT OR REPLACE INTO units(job, id, name, run)"
                          " VALUES(?,?,?,?)"
                        : "INSERT OR REPLACE INTO rank_units(job, rank, idx,"
                          " unit, run) VALUES(?,?,?,?,?)";
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  for (uint32_t i = 0; i < r->n; i++) {
    sqlite3_bind_text(st, 1, r->job, -1, SQLITE_STATIC);
    if (r->kind == REC_UNITS) {
      sqlite3_bind_int64(st, 2, r->ids[i]);
      sqlite3_bind_text(st, 3, r->names[i], -1, SQLITE_STATIC);
      sqlite3_bind_int64(st, 4, (sqlite3_int64)r->run);
    } else {
      sqlite3_bind_int64(st, 2, r->rank);
      sqlite3_bind_int64(st, 3, i);
      sqlite3_bind_int64(st, 4, r->ids[i]);
      sqlite3_bind_int64(st, 5, (sqlite3_int64)r->run);
    }
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
      sqlite3_finalize(st);
      return GNMR_E_STORE;
    }
  }
  sqlite3_finalize(st);
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
    sqlite3_stmt *st;
    snprintf(sql, sizeof sql, "DELETE FROM %s WHERE run=? AND step < ?",
             k ? "events" : "steps");
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
      return GNMR_E_STORE;
    sqlite3_bind_int64(st, 1, (sqlite3_int64)run);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)(step - s->retain_steps));
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
      return GNMR_E_STORE;
  }
  return GNMR_OK;
}

