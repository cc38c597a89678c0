/* SPDX-License-Identifier: MIT */
/* store_query.c — the history queries (gnmrctl jobs, history, decisions,
 * export): the store owns its schema, so every SELECT is here. Each query
 * opens its own short-lived read connection; any thread (gnmrd runs them
 * on libuv's worker pool). Rows come back as JSON arrays of objects whose
 * keys are the column names listed here, never SELECT *. */
#include <fnmatch.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <sqlite3.h>

#include "commands.h"
#include "gnmr/error.h"
#include "store.h"
#include "store_query.h"
#include "store_sql.h"
#include "views.h"
#include "text.h"

static void qfail(store_query *q, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void qfail(store_query *q, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(q->err, sizeof q->err, fmt, ap);
  va_end(ap);
  q->code = code;
}

static json_t *col_json(sqlite3_stmt *st, int c) {
  switch (sqlite3_column_type(st, c)) {
  case SQLITE_INTEGER:
    return json_integer(sqlite3_column_int64(st, c));
  case SQLITE_FLOAT: {
    double v = sqlite3_column_double(st, c);
    if (v != v)
      return json_null();
    if (v > 1.7e308 || v < -1.7e308)
      return json_string(v > 0 ? "inf" : "-inf");
    return json_real(v);
  }
  case SQLITE_TEXT: {
    /* names were checked on entry; an older database may hold anything */
    const char *t = (const char *)sqlite3_column_text(st, c);
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
static json_t *rows(store_query *q, sqlite3 *db, const char *sql, const char *fmt,
                    ...) {
  sqlite3_stmt *st;
  va_list ap;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
    qfail(q, GNMR_E_STORE, "%s", sqlite3_errmsg(db));
    return NULL;
  }
  va_start(ap, fmt);
  for (int i = 0; fmt[i]; i++) {
    if (fmt[i] == 't')
      sqlite3_bind_text(st, i + 1, va_arg(ap, const char *), -1,
                        SQLITE_TRANSIENT);
    else
      sqlite3_bind_int64(st, i + 1, va_arg(ap, sqlite3_int64));
  }
  va_end(ap);
  json_t *arr = json_array();
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    json_t *o = json_object();
    for (int c = 0; c < sqlite3_column_count(st); c++)
      json_object_set_new(o, sqlite3_column_name(st, c), col_json(st, c));
    json_array_append_new(arr, o);
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) {
    qfail(q, GNMR_E_STORE, "%s", sqlite3_errmsg(db));
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
static int job_exists(store_query *q, sqlite3 *db) {
  json_t *r = rows(q, db, "SELECT run, owner FROM jobs WHERE name=?1 AND "
                   "(?2 = 0 OR run = ?2) ORDER BY run DESC LIMIT 1", "ti",
                   q->job, (sqlite3_int64)q->run);
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
static int64_t unit_id(store_query *q, sqlite3 *db) {
  json_t *r = rows(q, db, "SELECT id FROM units WHERE run=? AND name=?", "it",
                   (sqlite3_int64)q->resolved, q->unit);
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

static const char events_sql_head[] =
    "SELECT e.pass, e.step, e.kind, e.unit, u.name AS unit_name, e.outcome,"
    " e.norm, e.g, e.d, e.s, e.count, e.detail, e.at FROM events e LEFT JOIN"
    " units u ON u.run=e.run AND u.id=e.unit WHERE e.run=?1 AND e.step "
    "BETWEEN ?2 AND ?3";

/* status, units and top of a job that is not running (finished, retired,
 * or gnmrd restarted without it): its row, units and ranks, and its
 * newest snapshot rebuilt into an engine, seen through the live views. */
static json_t *job_view(store_query *q, sqlite3 *db) {
  sqlite3_stmt *st;
  store_job sj = {0};
  char state[32] = "";
  json_t *out = NULL;
  if (!job_exists(q, db))
    return NULL; /* q->err set */
  if (sqlite3_prepare_v2(db, "SELECT reporters, barrier_ms, pass, state"
                         PARAM_COLS " FROM jobs WHERE run=?", -1, &st,
                         NULL) != SQLITE_OK) {
    qfail(q, GNMR_E_STORE, "%s", sqlite3_errmsg(db));
    return NULL;
  }
  sqlite3_bind_int64(st, 1, (sqlite3_int64)q->resolved);
  if (sqlite3_step(st) != SQLITE_ROW) {
    sqlite3_finalize(st);
    qfail(q, GNMR_E_NOJOB, "unknown job '%.128s'", q->job);
    return NULL;
  }
  sj.reporters = (uint32_t)sqlite3_column_int64(st, 0);
  sj.barrier_ms = (uint32_t)sqlite3_column_int64(st, 1);
  sj.pass = (uint32_t)sqlite3_column_int64(st, 2);
  snprintf(state, sizeof state, "%s",
           sqlite3_column_text(st, 3) ? (const char *)sqlite3_column_text(
                                            st, 3)
                                      : "");
  store__read_params(st, 4, &sj.hello_params);
  sqlite3_finalize(st);
  sj.name = strdup(q->job);
  sj.run = q->resolved;
  sj.n_ranks = sj.reporters;
  core_job c = {0};
  policy *pol = NULL;
  if (sj.name == NULL || sj.reporters == 0 || sj.reporters > 4096 ||
      store__load_job(db, &sj) != GNMR_OK) {
    qfail(q, GNMR_E_STORE, "job %.128s cannot be read back", q->job);
    goto out;
  }
  if (sj.snapshot == NULL ||
      policy_import(sj.snapshot, sj.snapshot_len, &pol) != GNMR_OK)
    policy_create(&sj.params, 0, &pol); /* no statistics were kept */
  c.name = sj.name;
  c.run = sj.run;
  c.pass = sj.pass;
  c.reporters = sj.reporters;
  c.barrier_ms = sj.barrier_ms;
  c.params = pol ? *policy_get_params(pol) : sj.params;
  c.pol = pol;
  c.last_decided = pol ? policy_last_step(pol) : 0;
  c.n_units = sj.n_units;
  c.unit_names = sj.unit_names;
  c.ranks = calloc(sj.reporters, sizeof *c.ranks);
  c.shards = calloc(sj.n_units ? sj.n_units : 1, sizeof *c.shards);
  if (pol == NULL || c.ranks == NULL || c.shards == NULL) {
    qfail(q, GNMR_E_NOMEM, "out of memory");
    goto out;
  }
  for (uint32_t r = 0; r < sj.n_ranks; r++)
    for (uint32_t i = 0; i < sj.rank_n[r]; i++)
      if (sj.rank_ids[r][i] < sj.n_units)
        c.shards[sj.rank_ids[r][i]]++;
  if (q->command == GNMR_CMD_STATUS) {
    out = views_status(&c);
    json_object_set_new(out, "state", json_string(state));
  } else {
    out = views_units(&c, q->command == GNMR_CMD_TOP ? (q->limit ? q->limit
                                                                  : 10)
                                                      : 0);
  }
out:
  free(c.ranks);
  free(c.shards);
  policy_destroy(&pol);
  store__job_free(&sj);
  return out;
}

const char *store_query_history_sql(int by_unit, int by_kind, char *buf,
                                    size_t cap) {
  snprintf(buf, cap, "%s%s%s ORDER BY e.step, e.rowid LIMIT ?6",
           events_sql_head, by_unit ? " AND e.unit = ?4" : "",
           by_kind ? " AND e.kind = ?5" : "");
  return buf;
}

static void export_next(const char *path, store_query *q);

void store_query_run(const char *path, store_query *q) {
  sqlite3 *db = NULL;
  sqlite3_int64 from = (sqlite3_int64)q->from,
                to = q->to ? (sqlite3_int64)q->to : INT64_MAX;
  q->result = NULL;
  q->code = GNMR_OK;
  q->chunk = NULL;
  q->chunk_len = 0;
  if (q->command == GNMR_CMD_EXPORT) {
    export_next(path, q);
    return;
  }
  if (store_open_reader(path, &db) != GNMR_OK) {
    qfail(q, GNMR_E_STORE, "cannot open %s", path);
    return;
  }
  if (q->command == GNMR_CMD_STATUS || q->command == GNMR_CMD_UNITS ||
      q->command == GNMR_CMD_TOP) {
    q->result = job_view(q, db);
  } else if (q->command == GNMR_CMD_JOBS) {
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
  } else if (q->command == GNMR_CMD_RUNS) {
    json_t *r = rows(q, db, "SELECT run, state, pass, last_step, reporters, "
                     "barrier_ms, created_at, updated_at, owner FROM jobs "
                     "WHERE name=? ORDER BY run", "t", q->job);
    for (size_t i = r ? json_array_size(r) : 0; i-- > 0;)
      if (!visible(q, q->job, json_string_value(json_object_get(
                                  json_array_get(r, i), "owner"))))
        json_array_remove(r, i);
    if (r != NULL && json_array_size(r) == 0) {
      json_decref(r);
      qfail(q, GNMR_E_NOJOB, "unknown job '%.128s'", q->job);
    } else if (r != NULL) {
      q->result = json_pack("{s:s,s:o}", "job", q->job, "runs", r);
    }
  } else if (!job_exists(q, db)) {
    /* q->err set */
  } else if (q->command == GNMR_CMD_DECISIONS) {
    json_t *r = rows(q, db, decisions_sql, "iii", (sqlite3_int64)q->resolved,
                     from, to);
    if (r)
      q->result = json_pack("{s:s,s:I,s:o}", "job", q->job, "run",
                            (json_int_t)q->resolved, "decisions", r);
  } else if (q->command == GNMR_CMD_HISTORY) {
    char sql[1024];
    int64_t uid = -1;
    if (q->kind[0] != '\0' && !store_event_kind_known(q->kind)) {
      qfail(q, GNMR_E_INVAL, "unknown event kind '%.64s' (%s)", q->kind,
            store_event_kinds());
    } else if (q->unit[0] != '\0' && (uid = unit_id(q, db)) < 0) {
      qfail(q, GNMR_E_NOUNIT, "job %.128s has no unit '%.128s'", q->job,
            q->unit);
    } else {
      /* In step order, as the indexes (run, step) and (run, unit, step)
       * read: SQLite walks one of them and stops at the limit, instead of
       * sorting every event of the run first. A filter left out is left
       * out of the SQL, so that the planner sees only what applies. */
      store_query_history_sql(uid >= 0, q->kind[0] != '\0', sql,
                              sizeof sql);
      json_t *r = rows(q, db, sql, "iiiiti", (sqlite3_int64)q->resolved,
                       from, to, (sqlite3_int64)uid, q->kind,
                       (sqlite3_int64)q->limit);
      if (r)
        q->result = json_pack("{s:s,s:I,s:o}", "job", q->job, "run",
                              (json_int_t)q->resolved, "events", r);
    }
  }
  sqlite3_close(db);
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
static void put_row(text *t, sqlite3_stmt *st) {
  json_t *o = json_object();
  for (int c = 0; c < sqlite3_column_count(st); c++)
    json_object_set_new(o, sqlite3_column_name(st, c), col_json(st, c));
  char *s = json_dumps(o, JSON_ENSURE_ASCII);
  json_decref(o);
  if (s == NULL) {
    t->oom = 1;
    return;
  }
  puts_t(t, s);
  free(s);
}

void store_query_close(store_query *q) {
  if (q->cursor != NULL)
    sqlite3_finalize(q->cursor);
  if (q->db != NULL)
    sqlite3_close(q->db);
  q->cursor = NULL;
  q->db = NULL;
}

/* The sections of an export, each a key and the SQL of its rows. */
static const struct {
  const char *key, *sql;
} export_sections[] = {
    {"params", "SELECT job, pass, from_step, at" PARAM_COLS " FROM params "
               "WHERE run=? ORDER BY rowid"},
    {"units", "SELECT id, name FROM units WHERE run=? ORDER BY id"},
    {"steps", "SELECT pass, step, reports, risky, pool, n_active, active, "
              "missing, by_deadline, latency_us, at FROM steps WHERE run=? "
              "ORDER BY pass, step"},
    {"events", NULL}, /* events_sql_head, in (step, rowid) order */
};
enum { N_EXPORT_SECTIONS = 4 };

/* The next chunk of an export: the job's row first, then each section's
 * rows, at most about STORE_EXPORT_CHUNK bytes at a time. */
static void export_next(const char *path, store_query *q) {
  text t = {0};
  q->more = 0;
  if (q->db == NULL) { /* the first chunk */
    sqlite3_stmt *st;
    if (store_open_reader(path, &q->db) != GNMR_OK) {
      qfail(q, GNMR_E_STORE, "cannot open %s", path);
      return;
    }
    if (!job_exists(q, q->db)) {
      store_query_close(q);
      return;
    }
    if (sqlite3_prepare_v2(q->db, "SELECT name, run, reporters, barrier_ms, "
                           "state, pass, last_step" PARAM_COLS ", created_at,"
                           " updated_at FROM jobs WHERE run=?", -1, &st,
                           NULL) != SQLITE_OK) {
      qfail(q, GNMR_E_STORE, "%s", sqlite3_errmsg(q->db));
      store_query_close(q);
      return;
    }
    sqlite3_bind_int64(st, 1, (sqlite3_int64)q->resolved);
    puts_t(&t, "{\n  \"job\": ");
    if (sqlite3_step(st) == SQLITE_ROW)
      put_row(&t, st);
    else
      puts_t(&t, "null");
    sqlite3_finalize(st);
    q->section = 0;
  }
  while (q->section < N_EXPORT_SECTIONS && t.len < STORE_EXPORT_CHUNK &&
         !t.oom) {
    if (q->cursor == NULL) { /* a section starts */
      char sql[600];
      if (export_sections[q->section].sql != NULL)
        snprintf(sql, sizeof sql, "%s", export_sections[q->section].sql);
      else
        snprintf(sql, sizeof sql, "%s ORDER BY e.step, e.rowid",
                 events_sql_head);
      if (sqlite3_prepare_v2(q->db, sql, -1, &q->cursor, NULL) !=
          SQLITE_OK) {
        qfail(q, GNMR_E_STORE, "%s", sqlite3_errmsg(q->db));
        free(t.p);
        store_query_close(q);
        return;
      }
      sqlite3_bind_int64(q->cursor, 1, (sqlite3_int64)q->resolved);
      if (export_sections[q->section].sql == NULL) {
        sqlite3_bind_int64(q->cursor, 2, 0);
        sqlite3_bind_int64(q->cursor, 3, INT64_MAX);
      }
      puts_t(&t, ",\n  \"");
      puts_t(&t, export_sections[q->section].key);
      puts_t(&t, "\": [");
      q->section_rows = 0;
    }
    int rc;
    while (t.len < STORE_EXPORT_CHUNK && !t.oom &&
           (rc = sqlite3_step(q->cursor)) == SQLITE_ROW) {
      puts_t(&t, q->section_rows++ ? ",\n    " : "\n    ");
      put_row(&t, q->cursor);
    }
    if (t.len >= STORE_EXPORT_CHUNK || t.oom)
      break; /* this section goes on in the next chunk */
    if (rc != SQLITE_DONE) {
      qfail(q, GNMR_E_STORE, "%s", sqlite3_errmsg(q->db));
      free(t.p);
      store_query_close(q);
      return;
    }
    sqlite3_finalize(q->cursor);
    q->cursor = NULL;
    puts_t(&t, q->section_rows ? "\n  ]" : "]");
    q->section++;
  }
  if (t.oom) {
    free(t.p);
    qfail(q, GNMR_E_NOMEM, "out of memory");
    store_query_close(q);
    return;
  }
  if (q->section == N_EXPORT_SECTIONS) {
    puts_t(&t, "\n}\n");
    store_query_close(q);
  } else {
    q->more = 1;
  }
  q->chunk = t.p;
  q->chunk_len = t.len;
}



/* ---- the event kinds of the history ------------------------------------------ */

const char *store_op_event_name(int kind) {
  static const char *const names[STORE_EV_COUNT] = {
#define STORE__EV_NAME(id, name) [STORE_EV_##id] = name,
      STORE_OP_EVENTS(STORE__EV_NAME)
#undef STORE__EV_NAME
  };
  return kind >= 0 && kind < STORE_EV_COUNT ? names[kind] : "unknown";
}

int store_event_kind_known(const char *kind) {
  static const char *const all[] = {
#define STORE__POLICY_EV(id, v, name) name,
#define STORE__OP_EV(id, name) name,
      POLICY_EVENTS(STORE__POLICY_EV) STORE_OP_EVENTS(STORE__OP_EV)
#undef STORE__POLICY_EV
#undef STORE__OP_EV
  };
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (strcmp(kind, all[i]) == 0)
      return 1;
  return 0;
}

const char *store_event_kinds(void) {
  static const char kinds[] =
#define STORE__POLICY_EV(id, v, name) ", " name
#define STORE__OP_EV(id, name) ", " name
      POLICY_EVENTS(STORE__POLICY_EV) STORE_OP_EVENTS(STORE__OP_EV)
#undef STORE__POLICY_EV
#undef STORE__OP_EV
      ;
  return kinds + 2;
}
