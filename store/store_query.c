/* SPDX-License-Identifier: MIT */
/* store_query.c — the history queries (gnmrctl jobs, history, decisions,
 * export): the store owns its schema, so every SELECT is here. Each query
 * opens its own short-lived read connection; any thread (gnmrd runs them
 * on libuv's worker pool). Rows come back as JSON arrays of objects whose
 * keys are the column names listed here, never SELECT *. */
#include <errno.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "gnmr/error.h"
#include "db.h"
#include "policy.h"
#include "store_query.h"
#include "store_schema.h"
#include "text.h"

#define qfail store_query_fail
void store_query_fail(store_query *q, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(q->err, sizeof q->err, fmt, ap);
  va_end(ap);
  q->code = code;
}

static json_t *col_json(db_stmt *st, int c) {
  switch (db_column_type(st, c)) {
  case DB_INT:
    return json_integer(db_column_int64(st, c));
  case DB_FLOAT: {
    double v = db_column_double(st, c);
    if (v != v)
      return json_null();
    if (v > 1.7e308 || v < -1.7e308)
      return json_string(v > 0 ? "inf" : "-inf");
    return json_real(v);
  }
  case DB_TEXT: {
    /* names were checked on entry; an older database may hold anything */
    const char *t = db_column_text(st, c);
    json_t *j = json_string(t);
    if (j == NULL) {
      char esc[2048];
      j = json_string(gnmr__escape(t, esc, sizeof esc));
    }
    return j;
  }
  default:
    return json_null();
  }
}

/* Runs sql with text/int binds described by fmt ('t' text, 'i' int64) and
 * returns the rows as an array of objects. NULL on error (q->err set). */
static json_t *rows(store_query *q, db_conn *db, const char *sql, const char *fmt,
                    ...) {
  db_stmt *st;
  va_list ap;
  if (db_prepare(db, sql, &st) != GNMR_OK) {
    qfail(q, GNMR_E_STORE, "%s", db_errmsg(db));
    return NULL;
  }
  va_start(ap, fmt);
  for (int i = 0; fmt[i]; i++) {
    if (fmt[i] == 't')
      db_bind_text(st, i + 1, va_arg(ap, const char *));
    else
      db_bind_int64(st, i + 1, va_arg(ap, int64_t));
  }
  va_end(ap);
  json_t *arr = json_array();
  int rc;
  uint64_t n = 0;
  while ((rc = db_step(st)) == DB_ROW) {
    if ((++n & 1023) == 0 && q->cancel != NULL && atomic_load(q->cancel)) {
      db_finalize(st);
      qfail(q, GNMR_E_CLOSED, "stopped: nobody waits for the answer");
      json_decref(arr);
      return NULL;
    }
    json_t *o = json_object();
    for (int c = 0; c < db_column_count(st); c++)
      json_object_set_new(o, db_column_name(st, c), col_json(st, c));
    json_array_append_new(arr, o);
  }
  db_finalize(st);
  if (rc != DB_DONE) {
    qfail(q, GNMR_E_STORE, "%s", db_errmsg(db));
    json_decref(arr);
    return NULL;
  }
  return arr;
}

/* Whether the requester may see a job of that owner (tenancy). */
static int visible(const store_query *q, const char *name, const char *owner) {
  return q->who == NULL || owner == NULL || strcmp(owner, q->who) == 0 ||
         (q->who_jobs != NULL && name != NULL &&
          fnmatch(q->who_jobs, name, 0) == 0);
}

/* Finds the run asked for (q->run, or the name's latest) into
 * q->resolved; 0 with q->err set when there is none (or it is another
 * tenant's). */
int store_query_resolve(store_query *q, db_conn *db) {
  json_t *r = rows(q, db, "SELECT run, owner FROM jobs WHERE name=?1 AND "
                   "(?2 = 0 OR run = ?2) ORDER BY run DESC LIMIT 1", "ti",
                   q->job, (int64_t)q->run);
  json_t *row = r ? json_array_get(r, 0) : NULL;
  int ok = row != NULL &&
           visible(q, q->job,
                   json_string_value(json_object_get(row, "owner")));
  if (ok)
    q->resolved = (uint64_t)json_integer_value(json_object_get(row, "run"));
  json_decref(r);
  if (r != NULL && !ok) {
    if (q->run != 0)
      qfail(q, GNMR_E_NOJOB, "job '%.128s' has no run %llu", q->job,
            (unsigned long long)q->run);
    else
      qfail(q, GNMR_E_NOJOB, "unknown job '%.128s'", q->job);
  }
  return ok;
}

/* The id of the unit named q->unit in the run, or -1. */
static int64_t unit_id(store_query *q, db_conn *db) {
  json_t *r = rows(q, db, "SELECT id FROM units WHERE run=? AND name=?", "it",
                   (int64_t)q->resolved, q->unit);
  int64_t id = r != NULL && json_array_size(r) > 0
                   ? json_integer_value(json_object_get(json_array_get(r, 0),
                                                        "id"))
                   : -1;
  json_decref(r);
  return id;
}

static const char decisions_sql[] =
    "SELECT step, active, pass FROM steps s WHERE run=?1 AND step BETWEEN ?2"
    " AND ?3 AND pass=(SELECT MAX(pass) FROM steps WHERE run=?1 AND "
    "step=s.step) ORDER BY step";

const char *store_query_decisions_sql(void) { return decisions_sql; }

/* An agent's events (agent_joined, agent_left) keep its rank in the
 * unit column: shown as rank, with no unit. */
#define AGENT_EVENT "e.kind IN ('agent_joined', 'agent_left')"
static const char events_sql_head[] =
    "SELECT e.pass, e.step, e.kind, CASE WHEN " AGENT_EVENT " THEN NULL ELSE"
    " e.unit END AS unit, CASE WHEN " AGENT_EVENT " THEN NULL ELSE u.name END"
    " AS unit_name, CASE WHEN " AGENT_EVENT " THEN e.unit END AS rank, "
    "e.outcome, e.norm, e.g, e.d, e.s, e.count, e.detail, e.at FROM events e"
    " LEFT JOIN units u ON u.run=e.run AND u.id=e.unit WHERE e.run=?1 AND "
    "e.step BETWEEN ?2 AND ?3";

/* status, units and top of a job that is not running (finished, retired,
 * or gnmrd restarted without it): its row, units and ranks, and its
 * newest snapshot rebuilt into an engine, seen through the live views. */

const char *store_query_history_sql(int by_unit, int by_kind, char *buf,
                                    size_t cap) {
  snprintf(buf, cap, "%s%s%s ORDER BY e.step, e.rowid LIMIT ?6",
           events_sql_head,
           by_unit ? " AND e.unit = ?4 AND NOT " AGENT_EVENT : "",
           by_kind ? " AND e.kind = ?5" : "");
  return buf;
}

static void export_next(const char *path, store_query *q);

/* Each decision's "active" (ids, ascending, space-separated: the policy's
 * decisions CSV) becomes an array of {id, name}, its ids kept as
 * "active_ids"; a unit's name is read once per query. */
static int name_active(store_query *q, db_conn *db, json_t *decisions) {
  db_stmt *st;
  if (db_prepare(db, "SELECT name FROM units WHERE run=?1 AND id=?2", &st) !=
      GNMR_OK) {
    qfail(q, GNMR_E_STORE, "%s", db_errmsg(db));
    return GNMR_E_STORE;
  }
  json_t *names = json_object(); /* "id" -> name */
  size_t i;
  json_t *row;
  int rv = GNMR_OK;
  json_array_foreach(decisions, i, row) {
    const char *ids = json_string_value(json_object_get(row, "active"));
    json_t *arr = json_array();
    for (const char *p = ids ? ids : ""; *p != '\0' && rv == GNMR_OK;) {
      char *end;
      errno = 0;
      unsigned long long id = strtoull(p, &end, 10);
      if (end == p || errno != 0 || id >= UINT32_MAX) {
        qfail(q, GNMR_E_STORE, "step %lld: active '%.64s' is not unit ids",
              (long long)json_integer_value(json_object_get(row, "step")),
              ids);
        rv = GNMR_E_STORE;
        break;
      }
      char key[24];
      snprintf(key, sizeof key, "%llu", id);
      json_t *nm = json_object_get(names, key);
      if (nm == NULL) {
        db_reset(st);
        db_bind_int64(st, 1, (int64_t)q->resolved);
        db_bind_int64(st, 2, (int64_t)id);
        const char *t = db_step(st) == DB_ROW ? db_column_text(st, 0) : NULL;
        nm = t != NULL ? json_string(t) : json_null();
        if (nm == NULL) /* not UTF-8: an old database's bytes */
          nm = json_string("?");
        json_object_set_new(names, key, nm);
      }
      json_array_append_new(arr, json_pack("{s:I,s:O}", "id", (json_int_t)id,
                                           "name", nm));
      p = end;
      while (*p == ' ')
        p++;
    }
    json_object_set_new(row, "active_ids", json_string(ids ? ids : ""));
    json_object_set_new(row, "active", arr);
  }
  json_decref(names);
  db_finalize(st);
  return rv;
}

/* ---- the history's commands (their rows in proto/commands.h) --------------
 */

/* status, units and top of a job that is not running: gnmrd's view of
 * its snapshot (q->view: daemon/store_view.c, which gnmrd and gnmrctl
 * --store both link) */
static void query_view(store_query *q, db_conn *db) {
  if (q->view != NULL)
    q->result = q->view(q, db);
  else
    qfail(q, GNMR_E_INVAL,
          "status, units and top of a job need a policy engine "
          "to read its snapshot (no view was given)");
}

static void query_jobs(store_query *q, db_conn *db) {
  q->result = rows(q, db,
                   "SELECT name, run, state, pass, last_step, reporters, "
                   "barrier_ms, created_at, updated_at, owner FROM jobs "
                   "WHERE run IN (SELECT MAX(run) FROM jobs GROUP BY name)"
                   " ORDER BY name",
                   "");
  if (q->result != NULL && q->who != NULL) { /* another tenant's: hidden */
    for (size_t i = json_array_size(q->result); i-- > 0;) {
      json_t *o = json_array_get(q->result, i);
      if (!visible(q, json_string_value(json_object_get(o, "name")),
                   json_string_value(json_object_get(o, "owner"))))
        json_array_remove(q->result, i);
    }
  }
}

static void query_runs(store_query *q, db_conn *db) {
  json_t *r = rows(q, db,
                   "SELECT run, state, pass, last_step, reporters, "
                   "barrier_ms, created_at, updated_at, owner FROM jobs "
                   "WHERE name=? ORDER BY run",
                   "t", q->job);
  /* run ids are the store's, shared by every job name: nth is this
   * name's own count (its 1st, 2nd... run), whoever asks */
  for (size_t i = r ? json_array_size(r) : 0; i-- > 0;)
    json_object_set_new(json_array_get(r, i), "nth",
                        json_integer((json_int_t)i + 1));
  for (size_t i = r ? json_array_size(r) : 0; i-- > 0;)
    if (!visible(
            q, q->job,
            json_string_value(json_object_get(json_array_get(r, i), "owner"))))
      json_array_remove(r, i);
  if (r != NULL && json_array_size(r) == 0) {
    json_decref(r);
    qfail(q, GNMR_E_NOJOB, "unknown job '%.128s'", q->job);
  } else if (r != NULL) {
    q->result = json_pack("{s:s,s:o}", "job", q->job, "runs", r);
  }
}

static void query_decisions(store_query *q, db_conn *db) {
  if (!store_query_resolve(q, db))
    return; /* q->err set */
  int64_t to = q->to ? (int64_t)q->to : INT64_MAX;
  json_t *r = rows(q, db, decisions_sql, "iii", (int64_t)q->resolved,
                   (int64_t)q->from, to);
  if (r && name_active(q, db, r) != GNMR_OK) {
    json_decref(r);
    r = NULL;
  }
  if (r)
    q->result = json_pack("{s:s,s:I,s:o}", "job", q->job, "run",
                          (json_int_t)q->resolved, "decisions", r);
}

static void query_history(store_query *q, db_conn *db) {
  char sql[1024];
  int64_t uid = -1;
  if (!store_query_resolve(q, db))
    return; /* q->err set */
  if (q->kind[0] != '\0' && !store_event_kind_known(q->kind)) {
    qfail(q, GNMR_E_INVAL, "unknown event kind '%.64s' (%s)", q->kind,
          store_event_kinds());
    return;
  }
  if (q->unit[0] != '\0' && (uid = unit_id(q, db)) < 0) {
    qfail(q, GNMR_E_NOUNIT, "job %.128s has no unit '%.128s'", q->job, q->unit);
    return;
  }
  /* In step order, as the indexes (run, step) and (run, unit, step)
   * read: SQLite walks one of them and stops at the limit, instead of
   * sorting every event of the run first. A filter left out is left
   * out of the SQL, so that the planner sees only what applies. */
  store_query_history_sql(uid >= 0, q->kind[0] != '\0', sql, sizeof sql);
  json_t *r = rows(q, db, sql, "iiiiti", (int64_t)q->resolved, (int64_t)q->from,
                   q->to ? (int64_t)q->to : INT64_MAX, (int64_t)uid, q->kind,
                   (int64_t)q->limit);
  if (r)
    q->result = json_pack("{s:s,s:I,s:o}", "job", q->job, "run",
                          (json_int_t)q->resolved, "events", r);
}

typedef void query_fn(store_query *q, db_conn *db);
static query_fn *const queries[GNMR_CMD_COUNT] = {
#define QUERY_OF(id, name, where, job, csv, op, changes, large, stream, opts,  \
                 synopsis, summary, help, live, query, render)                 \
  [GNMR_CMD_##id] = query,
    GNMR_ADMIN_COMMANDS(QUERY_OF)
#undef QUERY_OF
};

void store_query_run(const char *path, store_query *q) {
  db_conn *db = NULL;
  q->result = NULL;
  q->code = GNMR_OK;
  q->chunk = NULL;
  q->chunk_len = 0;
  if (q->command < 0 || q->command >= GNMR_CMD_COUNT ||
      (queries[q->command] == NULL &&
       !gnmr_admin_commands[q->command].stream)) {
    qfail(q, GNMR_E_INVAL, "not a command of the history");
    return;
  }
  if (gnmr_admin_commands[q->command].stream) {
    export_next(path, q); /* its own connection, kept between chunks */
    return;
  }
  if (store_open_reader(path, &db, q->err, sizeof q->err) != GNMR_OK) {
    q->code = GNMR_E_STORE;
    return;
  }
  queries[q->command](q, db);
  db_close(&db);
}

/* ---- export, streamed ------------------------------------------------------- */

typedef struct text {
  char *p;
  size_t len, cap;
  int oom;
} text;

static void put(text *t, const char *s, size_t n) {
  if (t->oom)
    return;
  if (t->len + n + 1 > t->cap) {
    size_t cap = t->cap ? t->cap : 4096;
    while (cap < t->len + n + 1)
      cap *= 2;
    char *p = realloc(t->p, cap);
    if (p == NULL) {
      t->oom = 1;
      return;
    }
    t->p = p;
    t->cap = cap;
  }
  memcpy(t->p + t->len, s, n);
  t->len += n;
  t->p[t->len] = '\0';
}

static void puts_t(text *t, const char *s) { put(t, s, strlen(s)); }

/* One row of the cursor as JSON ({"col": value, ...}). */
static void put_row(text *t, db_stmt *st) {
  json_t *o = json_object();
  for (int c = 0; c < db_column_count(st); c++)
    json_object_set_new(o, db_column_name(st, c), col_json(st, c));
  char *s = json_dumps(o, JSON_ENSURE_ASCII);
  json_decref(o);
  if (s == NULL) {
    t->oom = 1;
    return;
  }
  puts_t(t, s);
  free(s);
}

void store_query_clear(store_query *q) {
  json_decref(q->stats);
  q->stats = NULL;
  q->stats_at = 0;
  if (q->cursor != NULL)
    db_finalize(q->cursor);
  if (q->db != NULL)
    db_close(&q->db);
  q->cursor = NULL;
  q->db = NULL;
}

/* The sections of an export, each a key and the SQL of its rows. */
static const struct {
  const char *key, *sql;
} export_sections[] = {
    {"params", "SELECT job, pass, from_step, at" PARAM_COLS " FROM params "
               "WHERE run=? ORDER BY rowid"},
    /* each unit's promotions and exceedances, counted in the history
     * (exact, whatever its last snapshot holds); events_by_unit finds
     * them */
    {"units", "SELECT u.id, u.name, (SELECT count(*) FROM events e WHERE "
              "e.run=u.run AND e.unit=u.id AND e.kind='promote') AS "
              "promotions, (SELECT count(*) FROM events e WHERE e.run=u.run "
              "AND e.unit=u.id AND e.kind='exceed') AS exceeds FROM units u "
              "WHERE u.run=?1 ORDER BY u.id"},
    {"steps", "SELECT pass, step, reports, risky, pool, n_active, active, "
              "missing, by_deadline, latency_us, at FROM steps WHERE run=? "
              "ORDER BY pass, step"},
    {"events", NULL}, /* events_sql_head, in (step, rowid) order */
    {"unit_stats", NULL}, /* export_stats */
};
enum { N_EXPORT_SECTIONS = 5, STATS_SECTION = 4 };

/* How many units the run has; UINT64_MAX when that cannot be read. */
static uint64_t run_units(store_query *q) {
  db_stmt *st;
  uint64_t n = UINT64_MAX;
  if (db_prepare(q->db, "SELECT count(*) FROM units WHERE run=?", &st) !=
      GNMR_OK)
    return n;
  db_bind_int64(st, 1, (int64_t)q->resolved);
  if (db_step(st) == DB_ROW)
    n = (uint64_t)db_column_int64(st, 0);
  db_finalize(st);
  return n;
}

/* The last section: each unit's statistics in the run's last snapshot
 * (reports, the policy's mean over its horizon, lock, promotions as the
 * snapshot counted them), as `units` reads a job that is not running,
 * through q->view; null where there is no view, nothing to read back,
 * or more than STORE_EXPORT_STATS_MAX units (the view is built whole in
 * memory, ~1 kB a unit: `gnmrctl units JOB` reads a larger job's; its
 * "units" still count each unit's promotions and exceedances). Streamed
 * an element at a time; 1 when it is whole. */
static int export_stats(text *t, store_query *q) {
  if (q->section_rows == 0 && q->stats == NULL) { /* it starts */
    int command = q->command;
    q->command = GNMR_CMD_UNITS;
    if (q->view != NULL && run_units(q) <= STORE_EXPORT_STATS_MAX)
      q->stats = q->view(q, q->db);
    q->command = command;
    if (!json_is_array(q->stats)) {
      json_decref(q->stats);
      q->stats = NULL;
      q->code = GNMR_OK; /* the rest of the export stands */
      q->err[0] = '\0';
      puts_t(t, ",\n  \"unit_stats\": null");
      return 1;
    }
    puts_t(t, ",\n  \"unit_stats\": [");
    q->stats_at = 0;
  }
  size_t n = json_array_size(q->stats);
  while (q->stats_at < n && t->len < STORE_EXPORT_CHUNK && !t->oom) {
    char *e = json_dumps(json_array_get(q->stats, q->stats_at),
                         JSON_ENSURE_ASCII | JSON_ENCODE_ANY);
    if (e == NULL) {
      t->oom = 1;
      break;
    }
    puts_t(t, q->stats_at++ ? ",\n    " : "\n    ");
    puts_t(t, e);
    free(e);
    q->section_rows++;
  }
  if (q->stats_at < n || t->oom)
    return 0;
  puts_t(t, n ? "\n  ]" : "]");
  json_decref(q->stats);
  q->stats = NULL;
  return 1;
}

/* The next chunk of an export: the job's row first, then each section's
 * rows, at most about STORE_EXPORT_CHUNK bytes at a time. */
static void export_next(const char *path, store_query *q) {
  text t = {0};
  q->more = 0;
  if (q->db == NULL) { /* the first chunk */
    db_stmt *st;
    if (store_open_reader(path, &q->db, q->err, sizeof q->err) != GNMR_OK) {
      q->code = GNMR_E_STORE;
      return;
    }
    if (!store_query_resolve(q, q->db)) {
      store_query_clear(q);
      return;
    }
    if (db_prepare(q->db, "SELECT name, run, reporters, barrier_ms, "
                           "state, pass, last_step" PARAM_COLS ", created_at,"
                           " updated_at FROM jobs WHERE run=?", &st) != GNMR_OK) {
      qfail(q, GNMR_E_STORE, "%s", db_errmsg(q->db));
      store_query_clear(q);
      return;
    }
    db_bind_int64(st, 1, (int64_t)q->resolved);
    puts_t(&t, "{\n  \"job\": ");
    if (db_step(st) == DB_ROW)
      put_row(&t, st);
    else
      puts_t(&t, "null");
    db_finalize(st);
    q->section = 0;
  }
  while (q->section < N_EXPORT_SECTIONS && t.len < STORE_EXPORT_CHUNK &&
         !t.oom) {
    if (q->section == STATS_SECTION) {
      if (!export_stats(&t, q))
        break; /* it goes on in the next chunk */
      q->section++;
      q->section_rows = 0;
      continue;
    }
    if (q->cursor == NULL) { /* a section starts */
      char sql[600];
      if (export_sections[q->section].sql != NULL)
        snprintf(sql, sizeof sql, "%s", export_sections[q->section].sql);
      else
        snprintf(sql, sizeof sql, "%s ORDER BY e.step, e.rowid",
                 events_sql_head);
      if (db_prepare_stream(q->db, sql, &q->cursor) != GNMR_OK) {
        qfail(q, GNMR_E_STORE, "%s", db_errmsg(q->db));
        free(t.p);
        store_query_clear(q);
        return;
      }
      db_bind_int64(q->cursor, 1, (int64_t)q->resolved);
      if (export_sections[q->section].sql == NULL) {
        db_bind_int64(q->cursor, 2, 0);
        db_bind_int64(q->cursor, 3, INT64_MAX);
      }
      puts_t(&t, ",\n  \"");
      puts_t(&t, export_sections[q->section].key);
      puts_t(&t, "\": [");
      q->section_rows = 0;
    }
    int rc;
    while (t.len < STORE_EXPORT_CHUNK && !t.oom &&
           (rc = db_step(q->cursor)) == DB_ROW) {
      puts_t(&t, q->section_rows++ ? ",\n    " : "\n    ");
      put_row(&t, q->cursor);
    }
    if (t.len >= STORE_EXPORT_CHUNK || t.oom)
      break; /* this section goes on in the next chunk */
    if (rc != DB_DONE) {
      qfail(q, GNMR_E_STORE, "%s", db_errmsg(q->db));
      free(t.p);
      store_query_clear(q);
      return;
    }
    db_finalize(q->cursor);
    q->cursor = NULL;
    puts_t(&t, q->section_rows ? "\n  ]" : "]");
    q->section++;
    q->section_rows = 0;
  }
  if (t.oom) {
    free(t.p);
    qfail(q, GNMR_E_NOMEM, "out of memory");
    store_query_clear(q);
    return;
  }
  if (q->section == N_EXPORT_SECTIONS) {
    puts_t(&t, "\n}\n");
    store_query_clear(q);
  } else {
    q->more = 1;
  }
  q->chunk = t.p;
  q->chunk_len = t.len;
}
