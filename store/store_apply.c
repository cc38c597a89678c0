/* SPDX-License-Identifier: MIT */
/* store_apply.c — how each record kind is written (store_rec.h).
 * Writer thread only, inside the batch's transaction. The schema and its
 * migrations are store_migrate.c's. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gnmr/error.h"
#include "store_apply.h"
#include "store_schema.h"

int64_t store__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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

static int put_snapshot_lite(db_conn *db, const store_rec *r) {
  db_stmt *st;
  if (db_prepare(db,
                 "INSERT INTO snapshots(job, pass, step, state, run)"
                 " VALUES(?,?,?,zeroblob(?4),?5) ON CONFLICT(run,"
                 " pass, step) DO UPDATE SET state=excluded.state"
                 " RETURNING rowid",
                 &st) != GNMR_OK)
    return GNMR_E_STORE;
  db_bind_text(st, 1, r->job);
  db_bind_int64(st, 2, r->pass);
  db_bind_int64(st, 3, (int64_t)r->step);
  db_bind_int64(st, 4, (int64_t)r->snapshot_len);
  db_bind_int64(st, 5, (int64_t)r->run);
  int64_t rowid = 0;
  int rc = db_step(st);
  if (rc == DB_ROW)
    rowid = db_column_int64(st, 0);
  int done = rc == DB_ROW && db_step(st) == DB_DONE;
  db_finalize(st);
  if (!done)
    return GNMR_E_STORE;
  return db_blob_write(db, "snapshots", "state", rowid, r->snapshot,
                       r->snapshot_len, SNAP_STREAM_PIECE) == GNMR_OK
             ? GNMR_OK
             : GNMR_E_STORE;
}

/* Stores r's snapshot and keeps only the job's two newest. */
static int apply_snapshot(db_conn *db, const store_rec *r) {
  db_stmt *st;
  int rc;
  if (db_streams_blobs(db) && r->snapshot_len >= SNAP_STREAM_MIN &&
      r->snapshot_len <= INT_MAX) {
    if (put_snapshot_lite(db, r) != GNMR_OK)
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
#define EVENT_COLS 14

/* INSERT INTO events ... VALUES(...) with rows rows. */
static const char *events_sql(int rows, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap,
                              "INSERT INTO events(job, pass, step, kind, "
                              "unit, outcome, norm, g, d, s, count, at, run,"
                              " detail)"
                              " VALUES");
  for (int r = 0; r < rows && n < cap; r++)
    n += (size_t)snprintf(buf + n, cap - n, "%s(?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
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
  /* which signal made an exceed risky, when the measure had a part
   * (docs/policy.md, "Measured signal"); none for the norm's alone */
  if (e->kind == POLICY_EV_EXCEED && (e->signal & POLICY_SIGNAL_MEASURE)) {
    char why[160];
    snprintf(why, sizeof why, "signal=%s measure=%.9g gm=%.9g dm=%.9g",
             policy_signal_name(e->signal), e->x, e->gm, e->dm);
    db_bind_text(st, c + 14, why);
  } else {
    db_bind_null(st, c + 14);
  }
}

/* PostgreSQL: a step's events as rows of one COPY per batch (text
 * format), where multi-row INSERTs bound 14 values a row: the server
 * parses no statement and binds nothing, and a batch's events go in one
 * round trip (issue 64: the store at 42-45% of a raw COPY). Sent when
 * more than COPY_FLUSH bytes wait, before a retention's DELETE and before
 * the commit; the same values as bind_event's (doubles as %.17g, +-Inf
 * as Infinity, NaN as NULL). */
#define COPY_FLUSH ((size_t)4 << 20)
#define COPY_SQL                                                               \
  "COPY events(job, pass, step, kind, unit, outcome, norm, g, d, s, count, " \
  "at, run, detail) FROM STDIN"

static int copy_room(store_stmts *s, size_t more) {
  if (s->copy_len + more <= s->copy_cap)
    return 1;
  size_t cap = s->copy_cap ? s->copy_cap : 65536;
  while (cap < s->copy_len + more)
    cap *= 2;
  char *b = realloc(s->copy, cap);
  if (b == NULL)
    return 0;
  s->copy = b;
  s->copy_cap = cap;
  return 1;
}

/* v as a field of COPY's text format: backslash, tab, newline and
 * carriage return escaped; NULL as \N. Then sep. */
static void copy_text(store_stmts *s, const char *v, char sep) {
  char *o = s->copy + s->copy_len;
  if (v == NULL) {
    *o++ = '\\';
    *o++ = 'N';
  } else {
    for (; *v; v++) {
      char c = *v, e = c == '\\' ? '\\' : c == '\t' ? 't'
                     : c == '\n' ? 'n' : c == '\r' ? 'r' : 0;
      if (e) {
        *o++ = '\\';
        *o++ = e;
      } else {
        *o++ = c;
      }
    }
  }
  *o++ = sep;
  s->copy_len = (size_t)(o - s->copy);
}

static void copy_int(store_stmts *s, int64_t v, char sep) {
  s->copy_len += (size_t)sprintf(s->copy + s->copy_len, "%lld%c",
                                 (long long)v, sep);
}

static void copy_double(store_stmts *s, double v) {
  if (v != v)
    copy_text(s, NULL, '\t');
  else if (isinf(v))
    copy_text(s, v > 0 ? "Infinity" : "-Infinity", '\t');
  else
    s->copy_len += (size_t)sprintf(s->copy + s->copy_len, "%.17g\t", v);
}

/* Event e of r as a COPY row (bind_event's values); 0 when out of
 * memory. */
static int copy_event(store_stmts *s, const store_rec *r, const store_event *e,
                      int64_t t) {
  /* each number at most 26 bytes, text at most twice its length */
  size_t most = 2 * strlen(r->job) + 2 * 160 + 14 * 28 + 64;
  if (!copy_room(s, most))
    return 0;
  copy_text(s, r->job, '\t');
  copy_int(s, r->pass, '\t');
  copy_int(s, (int64_t)r->step, '\t');
  copy_text(s, policy_event_name(e->kind), '\t');
  if (e->unit == UINT32_MAX)
    copy_text(s, NULL, '\t');
  else
    copy_int(s, e->unit, '\t');
  copy_text(s, e->outcome ? policy_outcome_name(e->outcome) : NULL, '\t');
  copy_double(s, e->norm);
  copy_double(s, e->g);
  copy_double(s, e->d);
  copy_double(s, e->s);
  copy_int(s, e->count, '\t');
  copy_int(s, t, '\t');
  copy_int(s, (int64_t)r->run, '\t');
  if (e->kind == POLICY_EV_EXCEED && (e->signal & POLICY_SIGNAL_MEASURE)) {
    char why[160];
    snprintf(why, sizeof why, "signal=%s measure=%.9g gm=%.9g dm=%.9g",
             policy_signal_name(e->signal), e->x, e->gm, e->dm);
    copy_text(s, why, '\n');
  } else {
    copy_text(s, NULL, '\n');
  }
  return 1;
}

int store__flush(store_stmts *s) {
  if (s->copy_len == 0)
    return GNMR_OK;
  int rv = db_copy_in(s->db, COPY_SQL, s->copy, s->copy_len);
  s->copy_len = 0;
  return rv == GNMR_OK ? GNMR_OK : GNMR_E_STORE;
}

void store__discard(store_stmts *s) { s->copy_len = 0; }

/* A step's events: COPY rows (PostgreSQL), or INSERTs of up to
 * EVENT_ROWS rows each. */
static int apply_events(store_stmts *s, const store_rec *r, int64_t t) {
  if (db_copies(s->db)) {
    for (uint32_t i = 0; i < r->n_events; i++)
      if (!copy_event(s, r, &r->events[i], t))
        return GNMR_E_STORE;
    return s->copy_len > COPY_FLUSH ? store__flush(s) : GNMR_OK;
  }
  for (uint32_t i = 0; i < r->n_events;) {
    int rows = r->n_events - i >= EVENT_ROWS ? EVENT_ROWS
                                             : (int)(r->n_events - i);
    if (s->st_events[rows] == NULL) { /* each size prepared once */
      char sql[EVENT_ROWS * 34 + 160];
      if (db_prepare(s->db, events_sql(rows, sql, sizeof sql),
                     &s->st_events[rows]) != GNMR_OK)
        return GNMR_E_STORE;
    }
    db_stmt *st = s->st_events[rows];
    for (int k = 0; k < rows; k++)
      bind_event(st, k, r, &r->events[i + (uint32_t)k], t);
    int rc = db_step(st);
    db_reset(st);
    if (rc != DB_DONE)
      return GNMR_E_STORE;
    i += (uint32_t)rows;
  }
  return GNMR_OK;
}

/* Prepares the step path's statements once per connection. */
static int prepare_step(store_stmts *s) {
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
      /* a decision restored from an agent: the history's own row of that
       * step, if it has one, stays (it has the norms and events) */
      db_prepare(s->db,
                 "INSERT INTO steps(job, pass, step, reports, risky, pool,"
                 " n_active, active, missing, by_deadline, latency_us, at,"
                 " run) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)"
                 " ON CONFLICT(run, pass, step) DO NOTHING",
                 &s->st_restored) != GNMR_OK ||

      db_prepare(s->db,
                 "UPDATE jobs SET last_step=CASE WHEN last_step < ?1 THEN ?1"
                 " ELSE last_step END, updated_at=?2 WHERE run=?3",
                 &s->st_last) != GNMR_OK)
    return GNMR_E_STORE;
  return GNMR_OK;
}

static int apply_step(store_stmts *s, const store_rec *r) {
  db_conn *db = s->db;
  db_stmt *st;
  int rc;
  int64_t t = store__now_ms();
  if (prepare_step(s) != GNMR_OK)
    return GNMR_E_STORE;
  /* a failed earlier batch may have left a statement mid-way */
  db_reset(s->st_step);
  db_reset(s->st_restored);
  for (int k = 0; k <= STORE_EVENT_ROWS; k++)
    if (s->st_events[k] != NULL)
      db_reset(s->st_events[k]);
  db_reset(s->st_last);
  st = r->restored ? s->st_restored : s->st_step;
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
  if (apply_events(s, r, t) != GNMR_OK)
    return GNMR_E_STORE;
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

int store__apply(store_stmts *s, const store_rec *r) {
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
int store__retain(store_stmts *s, uint64_t run, uint64_t step) {
  char sql[160];
  if (s->retain_steps == 0 || step <= s->retain_steps || step % 256 != 0)
    return GNMR_OK;
  if (store__flush(s) != GNMR_OK) /* the rows it may delete */
    return GNMR_E_STORE;
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


void store__stmts_finalize(store_stmts *s) {
  db_finalize(s->st_step);
  db_finalize(s->st_restored);
  for (int k = 0; k <= STORE_EVENT_ROWS; k++)
    db_finalize(s->st_events[k]);
  db_finalize(s->st_last);
  s->st_step = s->st_restored = s->st_last = NULL;
  for (int k = 0; k <= STORE_EVENT_ROWS; k++)
    s->st_events[k] = NULL;
  free(s->copy);
  s->copy = NULL;
  s->copy_len = s->copy_cap = 0;
}
