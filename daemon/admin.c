/* SPDX-License-Identifier: MIT */
/* admin.c — gnmrd's admin endpoint. StatsRequest: the daemon's counters.
 * AdminRequest: live views answered on the loop thread from memory (status,
 * units, top, set) and history queries (jobs, history, decisions, export)
 * run on libuv's worker pool, each with its own short-lived read connection
 * to the store, so the loop never waits on SQLite. Results are JSON
 * (jansson); errors are Error envelopes with codes from the error table. */
#include <assert.h>
#include <jansson.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "gnmrd.h"
#include "log.h"
#include "wire.h"

#define MAX_LISTED_JOBS 1024
#define DEFAULT_LIMIT 1000
#define MAX_LIMIT 1000000

static void send_env(gnmrd *d, const void *id, size_t id_len,
                     Gnmr__Envelope *env) {
  uint8_t *buf;
  size_t len;
  if (gnmr__wire_encode(env, &buf, &len) == GNMR_OK) {
    server_send(d->admin, id, id_len, buf, len);
    free(buf);
  }
}

static void send_error(gnmrd *d, const void *id, size_t id_len, int code,
                       const char *msg) {
  uint8_t *buf;
  size_t len;
  if (gnmr__wire_error(code, msg, "admin", 0, &buf, &len) == GNMR_OK) {
    server_send(d->admin, id, id_len, buf, len);
    free(buf);
  }
}

/* Sends v (taken) as an AdminReply. */
static void send_json(gnmrd *d, const void *id, size_t id_len, json_t *v) {
  char *text = json_dumps(v, JSON_COMPACT | JSON_ENSURE_ASCII);
  json_decref(v);
  if (text == NULL) {
    send_error(d, id, id_len, GNMR_E_NOMEM, "out of memory");
    return;
  }
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__AdminReply rep = GNMR__ADMIN_REPLY__INIT;
  rep.json = text;
  env.body_case = GNMR__ENVELOPE__BODY_ADMIN_REPLY;
  env.admin_reply = &rep;
  send_env(d, id, id_len, &env);
  free(text);
}

static void send_stats(gnmrd *d, const void *id, size_t id_len) {
  static const char *const names[] = {
#define GNMRD__COUNTER_NAME(name) #name,
      GNMRD_COUNTERS(GNMRD__COUNTER_NAME)
#undef GNMRD__COUNTER_NAME
      "store_records", "store_batches", "store_errors", "store_dropped",
      "store_queued",
  };
  store_stats ss = {0};
  if (d->st)
    store_get_stats(d->st, &ss);
  const uint64_t values[] = {
#define GNMRD__COUNTER_VALUE(name) d->c.name,
      GNMRD_COUNTERS(GNMRD__COUNTER_VALUE)
#undef GNMRD__COUNTER_VALUE
      ss.records, ss.batches, ss.errors, ss.dropped, ss.queued,
  };
  enum { N = sizeof names / sizeof names[0] };
  Gnmr__Counter cs[N], *cp[N];
  const char *jobs[MAX_LISTED_JOBS];
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Stats st = GNMR__STATS__INIT;
  for (size_t i = 0; i < N; i++) {
    gnmr__counter__init(&cs[i]);
    cs[i].name = (char *)names[i];
    cs[i].value = values[i];
    cp[i] = &cs[i];
  }
  st.n_counters = N;
  st.counters = cp;
  st.n_jobs = jobs_names(d, jobs, MAX_LISTED_JOBS);
  st.jobs = (char **)jobs;
  env.body_case = GNMR__ENVELOPE__BODY_STATS;
  env.stats = &st;
  send_env(d, id, id_len, &env);
}

/* ---- history queries on the worker pool -------------------------------- */

typedef struct query {
  uv_work_t req;
  gnmrd *d;
  char *id;
  size_t id_len;
  char path[4200];
  char *command, *job, *unit, *kind;
  uint64_t from, to;
  uint32_t limit;
  json_t *result; /* set by the worker on success */
  int code;
  char err[256];
} query;

static void qfail(query *q, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void qfail(query *q, int code, const char *fmt, ...) {
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
  case SQLITE_TEXT:
    return json_string((const char *)sqlite3_column_text(st, c));
  default:
    return json_null();
  }
}

/* Runs sql with text/int binds described by fmt ('t' text, 'i' int64) and
 * returns the rows as an array of objects. NULL on error (q->err set). */
static json_t *rows(query *q, sqlite3 *db, const char *sql, const char *fmt,
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

static const char *const event_kinds[] = {
    "exceed",        "promote",      "demote",         "nonfinite",
    "budget_saturated", "missing",   "job_started",    "job_resumed",
    "job_finished",  "agent_joined", "agent_left",     "params_changed",
};

static int job_exists(query *q, sqlite3 *db) {
  json_t *r = rows(q, db, "SELECT name FROM jobs WHERE name=?", "t", q->job);
  int ok = r != NULL && json_array_size(r) > 0;
  json_decref(r);
  if (r != NULL && !ok)
    qfail(q, GNMR_E_NOJOB, "unknown job '%.128s'", q->job);
  return ok;
}

static int unit_exists(query *q, sqlite3 *db) {
  json_t *r = rows(q, db, "SELECT 1 FROM units WHERE job=? AND name=?", "tt",
                   q->job, q->unit);
  int ok = r != NULL && json_array_size(r) > 0;
  json_decref(r);
  return ok;
}

static const char decisions_sql[] =
    "SELECT step, active, pass FROM steps s WHERE job=?1 AND step BETWEEN ?2"
    " AND ?3 AND pass=(SELECT MAX(pass) FROM steps WHERE job=?1 AND "
    "step=s.step) ORDER BY step";

static const char events_sql_head[] =
    "SELECT e.pass, e.step, e.kind, e.unit, u.name AS unit_name, e.outcome,"
    " e.norm, e.g, e.d, e.s, e.count, e.detail, e.at FROM events e LEFT JOIN"
    " units u ON u.job=e.job AND u.id=e.unit WHERE e.job=?1 AND e.step "
    "BETWEEN ?2 AND ?3";

static void query_work(uv_work_t *req) {
  query *q = req->data;
  sqlite3 *db = NULL;
  sqlite3_int64 from = (sqlite3_int64)q->from,
                to = q->to ? (sqlite3_int64)q->to : INT64_MAX;
  if (store_open_reader(q->path, &db) != GNMR_OK) {
    qfail(q, GNMR_E_STORE, "cannot open %s", q->path);
    return;
  }
  if (strcmp(q->command, "jobs") == 0) {
    q->result = rows(q, db,
                     "SELECT name, state, pass, last_step, reporters, "
                     "barrier_ms, created_at, updated_at FROM jobs ORDER BY "
                     "name",
                     "");
  } else if (!job_exists(q, db)) {
    /* q->err set */
  } else if (strcmp(q->command, "decisions") == 0) {
    json_t *r = rows(q, db, decisions_sql, "tii", q->job, from, to);
    if (r)
      q->result = json_pack("{s:s,s:o}", "job", q->job, "decisions", r);
  } else if (strcmp(q->command, "history") == 0) {
    char sql[1024];
    int known = q->kind[0] == '\0';
    for (size_t i = 0; i < sizeof event_kinds / sizeof *event_kinds; i++)
      known |= strcmp(q->kind, event_kinds[i]) == 0;
    if (!known) {
      qfail(q, GNMR_E_INVAL,
            "unknown event kind '%.64s' (exceed, promote, demote, nonfinite,"
            " budget_saturated, missing, job_started, job_resumed, "
            "job_finished, agent_joined, agent_left, params_changed)",
            q->kind);
    } else if (q->unit[0] != '\0' && !unit_exists(q, db)) {
      qfail(q, GNMR_E_NOUNIT, "job %.128s has no unit '%.128s'", q->job,
            q->unit);
    } else {
      snprintf(sql, sizeof sql, "%s AND (?4 = '' OR u.name = ?4) AND "
                                "(?5 = '' OR e.kind = ?5) ORDER BY e.rowid "
                                "LIMIT ?6",
               events_sql_head);
      json_t *r = rows(q, db, sql, "tiitti", q->job, from, to, q->unit,
                       q->kind, (sqlite3_int64)q->limit);
      if (r)
        q->result = json_pack("{s:s,s:o}", "job", q->job, "events", r);
    }
  } else if (strcmp(q->command, "export") == 0) {
    json_t *jrow = rows(q, db, "SELECT * FROM jobs WHERE name=?", "t", q->job);
    json_t *params = rows(q, db, "SELECT * FROM params WHERE job=? ORDER BY"
                                 " rowid", "t", q->job);
    json_t *units = rows(q, db, "SELECT id, name FROM units WHERE job=? "
                                "ORDER BY id", "t", q->job);
    json_t *steps = rows(q, db, "SELECT pass, step, reports, risky, pool, "
                                "n_active, active, missing, by_deadline, "
                                "latency_us, at FROM steps WHERE job=? ORDER"
                                " BY pass, step", "t", q->job);
    char sql[512];
    snprintf(sql, sizeof sql, "%s ORDER BY e.rowid", events_sql_head);
    json_t *events = rows(q, db, sql, "tii", q->job, (sqlite3_int64)0,
                          (sqlite3_int64)INT64_MAX);
    if (jrow && params && units && steps && events)
      q->result = json_pack("{s:o,s:o,s:o,s:o,s:o}", "job",
                            json_incref(json_array_get(jrow, 0)), "params",
                            params, "units", units, "steps", steps, "events",
                            events);
    else {
      json_decref(params);
      json_decref(units);
      json_decref(steps);
      json_decref(events);
    }
    json_decref(jrow);
  }
  sqlite3_close(db);
}

static void query_free(query *q) {
  json_decref(q->result);
  free(q->id);
  free(q->command);
  free(q->job);
  free(q->unit);
  free(q->kind);
  free(q);
}

static void query_done(uv_work_t *req, int status) {
  query *q = req->data;
  gnmrd *d = q->d;
  if (status != 0 || d->stopping) {
    query_free(q);
    return;
  }
  if (q->result != NULL) {
    if (strcmp(q->command, "jobs") == 0) {
      /* mark live jobs; add live ones the store has not committed yet */
      const char *live[MAX_LISTED_JOBS];
      size_t n = jobs_names(d, live, MAX_LISTED_JOBS);
      size_t i;
      json_t *o;
      json_array_foreach(q->result, i, o) {
        const char *nm = json_string_value(json_object_get(o, "name"));
        json_object_set_new(o, "live",
                            json_boolean(nm && jobs_find(d, nm) != NULL));
      }
      for (size_t k = 0; k < n; k++) {
        int seen = 0;
        json_array_foreach(q->result, i, o) seen |=
            strcmp(json_string_value(json_object_get(o, "name")), live[k]) ==
            0;
        if (!seen)
          json_array_append_new(
              q->result, json_pack("{s:s,s:s,s:b}", "name", live[k], "state",
                                   "running", "live", 1));
      }
    }
    send_json(d, q->id, q->id_len, q->result);
    q->result = NULL;
  } else {
    send_error(d, q->id, q->id_len, q->code ? q->code : GNMR_E_INTERNAL,
               q->err[0] ? q->err : "query failed");
  }
  server_kick(d->admin);
  query_free(q);
}

static void start_query(gnmrd *d, const void *id, size_t id_len,
                        const Gnmr__AdminRequest *r) {
  query *q = calloc(1, sizeof *q);
  if (q == NULL || d->st == NULL) {
    free(q);
    send_error(d, id, id_len, GNMR_E_UNSUPPORTED,
               "this gnmrd keeps no history");
    return;
  }
  q->d = d;
  q->id = malloc(id_len ? id_len : 1);
  q->command = strdup(r->command);
  q->job = strdup(r->job);
  q->unit = strdup(r->unit);
  q->kind = strdup(r->kind);
  if (!q->id || !q->command || !q->job || !q->unit || !q->kind) {
    query_free(q);
    send_error(d, id, id_len, GNMR_E_NOMEM, "out of memory");
    return;
  }
  memcpy(q->id, id, id_len);
  q->id_len = id_len;
  snprintf(q->path, sizeof q->path, "%s", store_path(d->st));
  q->from = r->from_step;
  q->to = r->to_step;
  q->limit = r->limit ? (r->limit > MAX_LIMIT ? MAX_LIMIT : r->limit)
                      : DEFAULT_LIMIT;
  q->req.data = q;
  if (uv_queue_work(d->loop, &q->req, query_work, query_done) != 0) {
    send_error(d, id, id_len, GNMR_E_INTERNAL, "cannot queue the query");
    query_free(q);
  }
}

static void on_admin_request(gnmrd *d, const void *id, size_t id_len,
                             const Gnmr__AdminRequest *r) {
  const char *cmd = r->command;
  if (r->to_step != 0 && r->to_step < r->from_step) {
    send_error(d, id, id_len, GNMR_E_INVAL, "--to is below --from");
    return;
  }
  if (strcmp(cmd, "jobs") == 0 || strcmp(cmd, "history") == 0 ||
      strcmp(cmd, "decisions") == 0 || strcmp(cmd, "export") == 0) {
    if (strcmp(cmd, "jobs") != 0 && r->job[0] == '\0') {
      send_error(d, id, id_len, GNMR_E_INVAL, "a job name is needed");
      return;
    }
    start_query(d, id, id_len, r);
    return;
  }
  if (strcmp(cmd, "status") != 0 && strcmp(cmd, "units") != 0 &&
      strcmp(cmd, "top") != 0 && strcmp(cmd, "set") != 0) {
    char msg[160];
    snprintf(msg, sizeof msg, "unknown admin command '%.64s'", cmd);
    send_error(d, id, id_len, GNMR_E_UNSUPPORTED, msg);
    return;
  }
  job *j = jobs_find(d, r->job);
  if (j == NULL) {
    char msg[200];
    snprintf(msg, sizeof msg, "no running job '%.128s'", r->job);
    send_error(d, id, id_len, GNMR_E_NOJOB, msg);
    return;
  }
  if (strcmp(cmd, "status") == 0) {
    send_json(d, id, id_len, jobs_status_json(j));
  } else if (strcmp(cmd, "units") == 0) {
    send_json(d, id, id_len, jobs_units_json(j, 0));
  } else if (strcmp(cmd, "top") == 0) {
    send_json(d, id, id_len, jobs_units_json(j, r->limit ? r->limit : 10));
  } else {
    char err[256];
    int rv = jobs_set_params(j, r->settings, r->n_settings, err, sizeof err);
    if (rv != GNMR_OK)
      send_error(d, id, id_len, rv, err);
    else
      send_json(d, id, id_len, jobs_status_json(j));
  }
}

void admin_on_message(server *s, const void *id, size_t id_len,
                      const void *data, size_t len, const char *user,
                      void *ctx) {
  gnmrd *d = ctx;
  (void)user; /* any allowed key may query */
  Gnmr__Envelope *env;
  char err[128];
  (void)s;
  d->c.admin_requests++;
  int rv = gnmr__wire_decode(data, len, &env, err, sizeof err);
  if (rv == GNMR_OK && env->body_case == GNMR__ENVELOPE__BODY_STATS_REQUEST) {
    send_stats(d, id, id_len);
  } else if (rv == GNMR_OK &&
             env->body_case == GNMR__ENVELOPE__BODY_ADMIN_REQUEST) {
    on_admin_request(d, id, id_len, env->admin_request);
  } else {
    if (rv == GNMR_OK) {
      rv = GNMR_E_UNSUPPORTED;
      strcpy(err, "not an admin request");
    }
    send_error(d, id, id_len, rv, err);
  }
  gnmr__wire_free(&env);
}

void admin_on_bad_frames(server *s, void *ctx) {
  (void)s;
  ((gnmrd *)ctx)->c.admin_requests++;
}

/* Counts a refused connection by kind and logs it, at most one line per
 * kind every REFUSAL_LOG_MS, saying how many were not logged since. */
#define REFUSAL_LOG_MS 10000
void gnmrd_on_handshake_failed(server *s, server_refusal why, void *ctx) {
  static const struct {
    const char *what;
    size_t counter; /* offset in gnmrd_counters */
  } kinds[] = {
      [SERVER_REFUSED_PLAINTEXT] = {"a peer without CURVE (plaintext)",
                                    offsetof(gnmrd_counters,
                                             refused_plaintext)},
      [SERVER_REFUSED_SERVER_KEY] = {"a CURVE peer with the wrong server key",
                                     offsetof(gnmrd_counters,
                                              refused_server_key)},
      [SERVER_REFUSED_CLIENT_KEY] = {"a CURVE key not in the allow list",
                                     offsetof(gnmrd_counters,
                                              refused_client_key)},
      [SERVER_REFUSED_JUNK] = {"a connection that spoke no ZMTP",
                               offsetof(gnmrd_counters, refused_junk)},
  };
  static uint64_t last_ms[4], quiet[4];
  gnmrd *d = ctx;
  (void)s;
  assert((unsigned)why < sizeof kinds / sizeof kinds[0]);
  d->c.handshake_failures++;
  (*(uint64_t *)((char *)&d->c + kinds[why].counter))++;
  uint64_t now = uv_now(d->loop);
  if (last_ms[why] != 0 && now - last_ms[why] < REFUSAL_LOG_MS) {
    quiet[why]++;
    return;
  }
  char more[64] = "";
  if (quiet[why] > 0)
    snprintf(more, sizeof more, " (and %llu more not logged since)",
             (unsigned long long)quiet[why]);
  LOG(WARN, "PEER-REFUSED", "refused %s%s%s", kinds[why].what,
      why == SERVER_REFUSED_PLAINTEXT ? ": it must use CURVE and the server "
                                        "key" : "",
      more);
  last_ms[why] = now ? now : 1;
  quiet[why] = 0;
}
