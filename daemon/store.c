/* SPDX-License-Identifier: MIT */
/* store.c — the SQLite history (see store.h). WAL with synchronous=NORMAL
 * survives a crash of gnmrd; the writer thread takes the whole queue per
 * batch and commits it in one transaction. A failed batch (disk full, a
 * read-only file) is rolled back, logged, counted and retried with backoff;
 * records are only freed once committed. */
#include "store.h"
#include "store_sql.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gnmr/error.h"
#include "latency.h"
#include "log.h"

#define QUEUE_CAP 1000000 /* records; beyond it new records are dropped */
#define RETRY_MAX_MS 5000

struct store {
  char path[4096];
  uint32_t snapshot_every;
  uint64_t retain_steps;
  sqlite3 *db; /* the writer thread's connection */
  /* the step path's statements, prepared once (writer thread) */
  sqlite3_stmt *st_step, *st_event, *st_last;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  store_rec *head, *tail; /* queue, under mu */
  uint64_t queued;
  int stop;
  atomic_uint_fast64_t records, batches, errors, dropped;
  atomic_uint_fast64_t commit_buckets[LATENCY_N_BUCKETS], commit_ns; /* commit times */
  /* Test hook: GNMR_STORE_FAULT=full:T or readonly:T makes the database
   * full (max_page_count pinned to its size: SQLITE_FULL) or read-only
   * (query_only: SQLITE_READONLY) for T ms after open, so that commits
   * fail with SQLite's own errors and the retry path runs for real. */
  int64_t fault_until;
  int fault_readonly, fault_lifted;
};

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

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int exec(sqlite3 *db, const char *sql, char *err, size_t errlen) {
  char *msg = NULL;
  if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
    if (err)
      snprintf(err, errlen, "%s", msg ? msg : sqlite3_errmsg(db));
    sqlite3_free(msg);
    return GNMR_E_STORE;
  }
  return GNMR_OK;
}

/* Sets the pragmas every connection of ours uses. */
static int configure(sqlite3 *db) {
  sqlite3_busy_timeout(db, 5000);
  return exec(db,
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

static int migrate(sqlite3 *db, char *err, size_t errlen) {
  sqlite3_stmt *st;
  int version = 0;
  if (exec(db,
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
    if (exec(db, "BEGIN", err, errlen) || exec(db, schema_v1, err, errlen) ||
        exec(db, "INSERT OR REPLACE INTO meta VALUES('schema','1')", err,
             errlen) ||
        exec(db, "COMMIT", err, errlen)) {
      exec(db, "ROLLBACK", NULL, 0);
      return GNMR_E_STORE;
    }
  }
  return GNMR_OK;
}

/* ---- records ------------------------------------------------------------ */

store_rec *store_rec_new(int kind, const char *job) {
  store_rec *r = calloc(1, sizeof *r);
  if (r == NULL)
    return NULL;
  r->kind = kind;
  if ((r->job = strdup(job)) == NULL) {
    free(r);
    return NULL;
  }
  return r;
}

void store_rec_free(store_rec *r) {
  if (r == NULL)
    return;
  if (r->names)
    for (uint32_t i = 0; i < r->n; i++)
      free(r->names[i]);
  free(r->names);
  free(r->ids);
  free(r->job);
  free(r->active);
  free(r->events);
  free(r->snapshot);
  free(r->text);
  free(r->detail);
  free(r);
}

/* Binds the parameters at at..at+GNMR_NPARAMS-1; an unset threshold is
 * NULL. */
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

static void read_params(sqlite3_stmt *st, int at, policy_params *p) {
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
  int64_t t = now_ms();
  sqlite3_bind_text(st, 1, r->job, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, r->reporters);
  sqlite3_bind_int64(st, 3, r->barrier_ms);
  sqlite3_bind_int64(st, 4, r->pass);
  bind_params(st, 5, &r->params);
  sqlite3_bind_int64(st, 5 + GNMR_NPARAMS, t);
  sqlite3_bind_int64(st, 6 + GNMR_NPARAMS, t);
}

static void bind_params_row(sqlite3_stmt *st, const void *arg) {
  const store_rec *r = arg;
  sqlite3_bind_text(st, 1, r->job, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, r->pass);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)r->step);
  sqlite3_bind_int64(st, 4, now_ms());
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
  sqlite3_bind_int64(st, 7, now_ms());
}

static void bind_state(sqlite3_stmt *st, const void *arg) {
  const store_rec *r = arg;
  sqlite3_bind_text(st, 1, r->text, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, now_ms());
  sqlite3_bind_text(st, 3, r->job, -1, SQLITE_STATIC);
}

/* Stores r's snapshot and keeps only the job's two newest. */
static int apply_snapshot(sqlite3 *db, const store_rec *r) {
  sqlite3_stmt *st;
  int rc;
  if (sqlite3_prepare_v2(db,
                         "INSERT OR REPLACE INTO snapshots "
                         "VALUES(?,?,?,?)",
                         -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  sqlite3_bind_text(st, 1, r->job, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, r->pass);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)r->step);
  sqlite3_bind_blob(st, 4, r->snapshot, (int)r->snapshot_len, SQLITE_STATIC);
  rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE)
    return GNMR_E_STORE;
  /* keep the two newest snapshots of the job */
  if (sqlite3_prepare_v2(db,
                         "DELETE FROM snapshots WHERE job=?1 AND rowid NOT "
                         "IN (SELECT rowid FROM snapshots WHERE job=?1 "
                         "ORDER BY pass DESC, step DESC LIMIT 2)",
                         -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  sqlite3_bind_text(st, 1, r->job, -1, SQLITE_STATIC);
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
                         "INSERT OR REPLACE INTO steps VALUES(?,?,?,?,?,?,?,"
                         "?,?,?,?,?)",
                         -1, &s->st_step, NULL) != SQLITE_OK ||
      sqlite3_prepare_v2(s->db,
                         "INSERT INTO events VALUES(?,?,?,?,?,?,?,?,?,?,?,"
                         "NULL,?)",
                         -1, &s->st_event, NULL) != SQLITE_OK ||
      sqlite3_prepare_v2(s->db,
                         "UPDATE jobs SET last_step=?1, updated_at=?2 WHERE "
                         "name=?3",
                         -1, &s->st_last, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  return GNMR_OK;
}

static int apply_step(store *s, const store_rec *r) {
  sqlite3 *db = s->db;
  sqlite3_stmt *st;
  int rc;
  int64_t t = now_ms();
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
  sqlite3_bind_text(st, 3, r->job, -1, SQLITE_STATIC);
  rc = sqlite3_step(st);
  sqlite3_reset(st);
  return rc == SQLITE_DONE ? GNMR_OK : GNMR_E_STORE;
}

static int apply_ids(sqlite3 *db, const store_rec *r) {
  sqlite3_stmt *st;
  const char *sql = r->kind == REC_UNITS
                        ? "INSERT OR REPLACE INTO units VALUES(?,?,?)"
                        : "INSERT OR REPLACE INTO rank_units VALUES(?,?,?,?)";
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  for (uint32_t i = 0; i < r->n; i++) {
    sqlite3_bind_text(st, 1, r->job, -1, SQLITE_STATIC);
    if (r->kind == REC_UNITS) {
      sqlite3_bind_int64(st, 2, r->ids[i]);
      sqlite3_bind_text(st, 3, r->names[i], -1, SQLITE_STATIC);
    } else {
      sqlite3_bind_int64(st, 2, r->rank);
      sqlite3_bind_int64(st, 3, i);
      sqlite3_bind_int64(st, 4, r->ids[i]);
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
    "INSERT INTO params(job, pass, from_step, at" PARAM_COLS ") "
    "VALUES(?,?,?,?" PARAM_QS ")";

static int apply(store *s, const store_rec *r) {
  switch (r->kind) {
  case REC_JOB: {
    int rv = run(s->db,
                 "INSERT INTO jobs(name, reporters, barrier_ms, state, pass, "
                 "last_step" PARAM_COLS ", created_at, updated_at) "
                 "VALUES(?,?,?,'running',?,0" PARAM_QS ",?,?) "
                 "ON CONFLICT(name) DO UPDATE SET reporters=excluded.reporters,"
                 " barrier_ms=excluded.barrier_ms, state='running',"
                 " pass=excluded.pass" PARAM_SETS ","
                 " updated_at=excluded.updated_at",
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
               "INSERT INTO events(job, pass, step, kind, unit, detail, at) "
               "VALUES(?,?,?,?,?,?,?)",
               bind_op_event, r);
  case REC_STATE:
    return run(s->db, "UPDATE jobs SET state=?1, updated_at=?2 WHERE name=?3",
               bind_state, r);
  default:
    return GNMR_E_INVAL;
  }
}

/* Retention: drops a job's steps and events older than retain_steps
 * behind `step`. Runs in the writer thread, in the batch's transaction. */
static int retain(store *s, const char *job, uint64_t step) {
  char sql[160];
  if (s->retain_steps == 0 || step <= s->retain_steps || step % 256 != 0)
    return GNMR_OK;
  for (int k = 0; k < 2; k++) {
    sqlite3_stmt *st;
    snprintf(sql, sizeof sql, "DELETE FROM %s WHERE job=? AND step < ?",
             k ? "events" : "steps");
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
      return GNMR_E_STORE;
    sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)(step - s->retain_steps));
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
      return GNMR_E_STORE;
  }
  return GNMR_OK;
}

static void *writer_main(void *arg) {
  store *s = arg;
  uint32_t backoff_ms = 0;
  uint64_t since_checkpoint = 0;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (s->head == NULL && !s->stop)
      pthread_cond_wait(&s->cv, &s->mu);
    store_rec *batch = s->head;
    s->head = s->tail = NULL;
    uint64_t n = s->queued;
    s->queued = 0;
    int stop = s->stop;
    pthread_mutex_unlock(&s->mu);
    if (batch == NULL && stop)
      break;

    if (s->fault_until != 0 && !s->fault_lifted) {
      char pragma[96];
      int on = now_ms() < s->fault_until;
      if (s->fault_readonly) {
        snprintf(pragma, sizeof pragma, "PRAGMA query_only=%d", on);
      } else if (on) {
        sqlite3_stmt *pc;
        long long pages = 1;
        if (sqlite3_prepare_v2(s->db, "PRAGMA page_count", -1, &pc, NULL) ==
            SQLITE_OK) {
          if (sqlite3_step(pc) == SQLITE_ROW)
            pages = sqlite3_column_int64(pc, 0);
          sqlite3_finalize(pc);
        }
        snprintf(pragma, sizeof pragma, "PRAGMA max_page_count=%lld", pages);
      } else {
        snprintf(pragma, sizeof pragma, "PRAGMA max_page_count=4294967294");
      }
      s->fault_lifted = !on;
      exec(s->db, pragma, NULL, 0);
    }
    char err[256] = "";
    struct timespec c0, c1;
    clock_gettime(CLOCK_MONOTONIC, &c0);
    int rv = exec(s->db, "BEGIN IMMEDIATE", err, sizeof err);
    for (store_rec *r = batch; rv == GNMR_OK && r; r = r->next) {
      rv = apply(s, r);
      if (rv == GNMR_OK && r->kind == REC_STEP)
        rv = retain(s, r->job, r->step);
      if (rv != GNMR_OK)
        snprintf(err, sizeof err, "%s", sqlite3_errmsg(s->db));
    }
    if (rv == GNMR_OK)
      rv = exec(s->db, "COMMIT", err, sizeof err);
    if (rv != GNMR_OK) {
      exec(s->db, "ROLLBACK", NULL, 0);
      atomic_fetch_add(&s->errors, 1);
      LOG(ERROR, "STORE-COMMIT", "%s: %s (%llu records kept, retrying)",
          s->path, err, (unsigned long long)n);
      /* put the batch back in front of anything queued since */
      pthread_mutex_lock(&s->mu);
      store_rec *last = batch;
      while (last && last->next)
        last = last->next;
      if (last) {
        last->next = s->head;
        if (s->tail == NULL)
          s->tail = last;
        s->head = batch;
        s->queued += n;
      }
      pthread_mutex_unlock(&s->mu);
      backoff_ms = backoff_ms ? backoff_ms * 2 : 100;
      if (backoff_ms > RETRY_MAX_MS)
        backoff_ms = RETRY_MAX_MS;
      if (stop && backoff_ms >= RETRY_MAX_MS) {
        LOG(ERROR, "STORE-LOST",
            "giving up at shutdown: %llu records not "
            "committed",
            (unsigned long long)n);
        break;
      }
      usleep(backoff_ms * 1000);
      continue;
    }
    backoff_ms = 0;
    clock_gettime(CLOCK_MONOTONIC, &c1);
    {
      uint64_t ns = (uint64_t)(c1.tv_sec - c0.tv_sec) * 1000000000u +
                    (uint64_t)(c1.tv_nsec - c0.tv_nsec);
      int b = latency_bucket((double)ns * 1e-9);
      if (b < LATENCY_N_BUCKETS)
        atomic_fetch_add(&s->commit_buckets[b], 1);
      atomic_fetch_add(&s->commit_ns, ns);
    }
    atomic_fetch_add(&s->batches, 1);
    atomic_fetch_add(&s->records, n);
    while (batch) {
      store_rec *next = batch->next;
      store_rec_free(batch);
      batch = next;
    }
    if ((since_checkpoint += n) > 50000) {
      sqlite3_wal_checkpoint_v2(s->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL,
                                NULL);
      since_checkpoint = 0;
    }
  }
  /* anything left after a failed shutdown */
  while (s->head) {
    store_rec *next = s->head->next;
    store_rec_free(s->head);
    s->head = next;
  }
  return NULL;
}

int store_open(const char *dir, uint32_t snapshot_every, uint64_t retain_steps,
               store **out, char *err, size_t errlen) {
  store *s = calloc(1, sizeof *s);
  *out = NULL;
  if (s == NULL)
    return GNMR_E_NOMEM;
  snprintf(s->path, sizeof s->path, "%s/gnmr.db", dir);
  s->snapshot_every = snapshot_every ? snapshot_every : 1;
  s->retain_steps = retain_steps;
  if (sqlite3_open_v2(s->path, &s->db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                          SQLITE_OPEN_NOMUTEX,
                      NULL) != SQLITE_OK) {
    snprintf(err, errlen, "%s: %s", s->path, sqlite3_errmsg(s->db));
    goto fail;
  }
  if (configure(s->db) != GNMR_OK) {
    snprintf(err, errlen, "%s: %s", s->path, sqlite3_errmsg(s->db));
    goto fail;
  }
  if (migrate(s->db, err, errlen) != GNMR_OK)
    goto fail;
  const char *fault = getenv("GNMR_STORE_FAULT");
  if (fault != NULL) {
    const char *colon = strchr(fault, ':');
    long long ms = colon ? atoll(colon + 1) : 0;
    s->fault_readonly = strncmp(fault, "readonly:", 9) == 0;
    if (ms > 0 && (s->fault_readonly || strncmp(fault, "full:", 5) == 0)) {
      s->fault_until = now_ms() + ms;
      LOG(WARN, "STORE-FAULT", "test hook: the database is %s for %lld ms",
          s->fault_readonly ? "read-only" : "full", ms);
    }
  }
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  if (pthread_create(&s->thread, NULL, writer_main, s) != 0) {
    snprintf(err, errlen, "cannot start the store thread");
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    goto fail;
  }
  *out = s;
  return GNMR_OK;
fail:
  sqlite3_close(s->db);
  free(s);
  return GNMR_E_STORE;
}

void store_close(store **ps) {
  if (ps == NULL || *ps == NULL)
    return;
  store *s = *ps;
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  sqlite3_finalize(s->st_step);
  sqlite3_finalize(s->st_event);
  sqlite3_finalize(s->st_last);
  sqlite3_wal_checkpoint_v2(s->db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL,
                            NULL);
  sqlite3_close(s->db);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
  *ps = NULL;
}

void store_put(store *s, store_rec *r) {
  if (r == NULL)
    return;
  r->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->queued >= QUEUE_CAP) {
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add(&s->dropped, 1);
    LOG(ERROR, "STORE-DROP",
        "store queue full (%u records): a %d record of "
        "job %s is lost",
        QUEUE_CAP, r->kind, r->job);
    store_rec_free(r);
    return;
  }
  if (s->tail)
    s->tail->next = r;
  else
    s->head = r;
  s->tail = r;
  s->queued++;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

void store_commit_histogram(store *s, uint64_t *buckets, uint64_t *count,
                            double *sum) {
  for (int i = 0; i < 15; i++)
    buckets[i] = atomic_load(&s->commit_buckets[i]);
  *count = atomic_load(&s->batches);
  *sum = (double)atomic_load(&s->commit_ns) * 1e-9;
}

uint32_t store_snapshot_every(const store *s) { return s->snapshot_every; }
const char *store_path(const store *s) { return s->path; }

void store_get_stats(store *s, store_stats *st) {
  st->records = atomic_load(&s->records);
  st->batches = atomic_load(&s->batches);
  st->errors = atomic_load(&s->errors);
  st->dropped = atomic_load(&s->dropped);
  pthread_mutex_lock(&s->mu);
  st->queued = s->queued;
  pthread_mutex_unlock(&s->mu);
}

/* ---- restore
 * ------------------------------------------------------------------ */

static void store_job_free(store_job *j) {
  if (j->unit_names)
    for (uint32_t u = 0; u < j->n_units; u++)
      free(j->unit_names[u]);
  free(j->unit_names);
  if (j->rank_ids)
    for (uint32_t r = 0; r < j->n_ranks; r++)
      free(j->rank_ids[r]);
  free(j->rank_ids);
  free(j->rank_n);
  free(j->snapshot);
  free(j->name);
}

/* Loads units, ranks, parameters and the newest snapshot of job j. */
static int load_job(sqlite3 *db, store_job *j) {
  sqlite3_stmt *st;
  int rc;
  /* units */
  if (sqlite3_prepare_v2(db,
                         "SELECT COALESCE(MAX(id)+1,0) FROM units WHERE "
                         "job=?",
                         -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  sqlite3_bind_text(st, 1, j->name, -1, SQLITE_STATIC);
  j->n_units = sqlite3_step(st) == SQLITE_ROW
                   ? (uint32_t)sqlite3_column_int64(st, 0)
                   : 0;
  sqlite3_finalize(st);
  if (j->n_units > POLICY_MAX_UNITS)
    return GNMR_E_STORE;
  j->unit_names = calloc(j->n_units ? j->n_units : 1, sizeof *j->unit_names);
  j->rank_n = calloc(j->n_ranks, sizeof *j->rank_n);
  j->rank_ids = calloc(j->n_ranks, sizeof *j->rank_ids);
  if (!j->unit_names || !j->rank_n || !j->rank_ids)
    return GNMR_E_NOMEM;
  if (sqlite3_prepare_v2(db, "SELECT id, name FROM units WHERE job=?", -1, &st,
                         NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  sqlite3_bind_text(st, 1, j->name, -1, SQLITE_STATIC);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    int64_t id = sqlite3_column_int64(st, 0);
    if (id >= 0 && id < j->n_units && j->unit_names[id] == NULL)
      j->unit_names[id] = strdup((const char *)sqlite3_column_text(st, 1));
  }
  sqlite3_finalize(st);
  /* ranks */
  if (sqlite3_prepare_v2(db,
                         "SELECT rank, idx, unit FROM rank_units WHERE job=? "
                         "ORDER BY rank, idx",
                         -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  sqlite3_bind_text(st, 1, j->name, -1, SQLITE_STATIC);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    int64_t r = sqlite3_column_int64(st, 0), unit = sqlite3_column_int64(st, 2);
    if (r < 0 || r >= j->n_ranks || unit < 0 || unit >= j->n_units)
      continue;
    uint32_t *ids = realloc(j->rank_ids[r], (j->rank_n[r] + 1) * sizeof *ids);
    if (ids == NULL) {
      sqlite3_finalize(st);
      return GNMR_E_NOMEM;
    }
    ids[j->rank_n[r]++] = (uint32_t)unit;
    j->rank_ids[r] = ids;
  }
  sqlite3_finalize(st);
  /* parameters in force: the last row of the params table */
  if (sqlite3_prepare_v2(db,
                         "SELECT 0" PARAM_COLS " FROM params WHERE job=? "
                         "ORDER BY rowid DESC LIMIT 1",
                         -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  sqlite3_bind_text(st, 1, j->name, -1, SQLITE_STATIC);
  j->params = j->hello_params;
  if (sqlite3_step(st) == SQLITE_ROW)
    read_params(st, 1, &j->params);
  sqlite3_finalize(st);
  /* newest snapshot */
  if (sqlite3_prepare_v2(db,
                         "SELECT state FROM snapshots WHERE job=? ORDER BY "
                         "pass DESC, step DESC LIMIT 1",
                         -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  sqlite3_bind_text(st, 1, j->name, -1, SQLITE_STATIC);
  if (sqlite3_step(st) == SQLITE_ROW) {
    int len = sqlite3_column_bytes(st, 0);
    const void *b = sqlite3_column_blob(st, 0);
    if (len > 0 && (j->snapshot = malloc((size_t)len)) != NULL) {
      memcpy(j->snapshot, b, (size_t)len);
      j->snapshot_len = (size_t)len;
    }
  }
  sqlite3_finalize(st);
  return GNMR_OK;
}

int store_restore(const char *dir, void (*fn)(const store_job *, void *),
                  void *ctx, char *err, size_t errlen) {
  char path[4200];
  sqlite3 *db;
  sqlite3_stmt *st;
  int rv = GNMR_OK;
  snprintf(path, sizeof path, "%s/gnmr.db", dir);
  if (access(path, F_OK) != 0)
    return GNMR_OK; /* nothing to restore */
  if (store_open_reader(path, &db) != GNMR_OK) {
    snprintf(err, errlen, "%s: cannot open", path);
    return GNMR_E_STORE;
  }
  if (sqlite3_prepare_v2(db,
                         "SELECT name, reporters, barrier_ms, pass"
                         PARAM_COLS " FROM jobs WHERE state='running'",
                         -1, &st, NULL) != SQLITE_OK) {
    snprintf(err, errlen, "%s: %s", path, sqlite3_errmsg(db));
    sqlite3_close(db);
    return GNMR_E_STORE;
  }
  while (sqlite3_step(st) == SQLITE_ROW) {
    store_job j = {0};
    j.name = strdup((const char *)sqlite3_column_text(st, 0));
    j.reporters = (uint32_t)sqlite3_column_int64(st, 1);
    j.barrier_ms = (uint32_t)sqlite3_column_int64(st, 2);
    j.pass = (uint32_t)sqlite3_column_int64(st, 3);
    read_params(st, 4, &j.hello_params);
    j.n_ranks = j.reporters;
    if (j.name == NULL || j.reporters == 0 || j.reporters > 4096 ||
        load_job(db, &j) != GNMR_OK) {
      LOG(ERROR, "STORE-RESTORE", "job %s: cannot be restored, skipped",
          j.name ? j.name : "?");
      store_job_free(&j);
      continue;
    }
    fn(&j, ctx);
    store_job_free(&j);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return rv;
}
