/* SPDX-License-Identifier: MIT */
/* admin.c — gnmrd's admin endpoint. StatsRequest: the daemon's counters.
 * AdminRequest: live views answered on the loop thread from memory (status,
 * units, top, set) and history queries (jobs, history, decisions, export)
 * run on libuv's worker pool by the store (store_query.h), each with its
 * own short-lived read connection, so the loop never waits on SQLite. Results are JSON
 * (jansson); errors are Error envelopes with codes from the error table. */
#include <assert.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "admin.h"
#include "agents.h"
#include "commands.h"
#include "gnmr/error.h"
#include "gnmrd.h"
#include "keys.h"
#include "log.h"
#include "store_query.h"
#include "store_view.h"
#include "text.h"
#include "validate.h"
#include "views.h"
#include "wire.h"

#define MAX_LISTED_JOBS 1024
#define DEFAULT_LIMIT 1000
#define MAX_LIMIT 1000000

/* ---- unread replies, in bytes --------------------------------------------------- */
/* ZeroMQ holds a reply until its client reads it; a client that asks and
 * never reads (pipelining `units` of a large job on many connections)
 * would make gnmrd hold without end. So gnmrd counts what ZeroMQ still
 * holds, in bytes, per connection (its routing id) and in all: each
 * reply's bytes are handed to ZeroMQ (server_send_owned), whose I/O
 * thread calls reply_freed() when it has written or dropped them. A
 * connection with UNREAD_CONN bytes unread, or a reply that would pass
 * UNREAD_ALL in all (operator keys excepted: with tenancy they are
 * bound per connection only), gets BUSY instead, before the answer is
 * built where its size can be told (units, top). Small replies (up to
 * UNREAD_SMALL: jobs, stats, status) pass UNREAD_ALL by UNREAD_ROOM
 * more: an operator's `gnmrctl jobs` is answered beside a flood of
 * unread large ones. ADMIN_QUEUED_REPLIES (main.c) still bounds their
 * number per connection. */
#define UNREAD_CONN ((uint64_t)16 << 20)
#define UNREAD_ALL ((uint64_t)64 << 20)
#define UNREAD_SMALL ((uint64_t)64 << 10)
#define UNREAD_ROOM ((uint64_t)16 << 20)
#define UNREAD_CONNS_KEPT 4096 /* entries with nothing unread pruned past it */
/* bytes a unit takes in a `units` answer with names of 30-40 bytes (225
 * measured): the estimate made before building one; the bound itself is
 * on the built reply's size */
#define UNITS_REPLY_PER_UNIT 224

typedef struct rconn {
  _Atomic uint64_t bytes; /* unread */
  _Atomic uint32_t refs;  /* the map's, and one a reply ZeroMQ holds */
  int operator;           /* of its last request */
} rconn;

typedef struct rticket {
  rconn *c;
  size_t len;
} rticket;

static _Atomic uint64_t unread_all;
static hmap unread_conns; /* routing id -> rconn *, the loop's */

static void rconn_unref(rconn *c) {
  if (atomic_fetch_sub(&c->refs, 1) == 1)
    free(c);
}

/* ZeroMQ's I/O thread (or the loop, when a send failed). */
static void reply_freed(void *data, void *hint) {
  rticket *t = hint;
  atomic_fetch_sub(&unread_all, t->len);
  atomic_fetch_sub(&t->c->bytes, t->len);
  rconn_unref(t->c);
  free(t);
  free(data);
}

/* Forgets the connections with nothing unread (they come back as new). */
static void unread_prune(void) {
  size_t pos = 0, n = 0, len;
  const void *key;
  uint64_t v;
  struct idk {
    char id[256];
    size_t len;
  } *gone = malloc(unread_conns.live * sizeof *gone);
  if (gone == NULL)
    return;
  while (hmap_next(&unread_conns, &pos, &key, &len, &v))
    if (atomic_load(&((rconn *)(uintptr_t)v)->bytes) == 0 &&
        len <= sizeof gone[0].id) {
      memcpy(gone[n].id, key, len);
      gone[n++].len = len;
    }
  for (size_t i = 0; i < n; i++)
    if (hmap_get(&unread_conns, gone[i].id, gone[i].len, &v)) {
      hmap_del(&unread_conns, gone[i].id, gone[i].len);
      rconn_unref((rconn *)(uintptr_t)v);
    }
  free(gone);
}

static rconn *rconn_of(const void *id, size_t id_len) {
  uint64_t v;
  if (hmap_get(&unread_conns, id, id_len, &v))
    return (rconn *)(uintptr_t)v;
  if (unread_conns.live >= UNREAD_CONNS_KEPT)
    unread_prune();
  rconn *c = calloc(1, sizeof *c);
  if (c == NULL)
    return NULL;
  atomic_init(&c->refs, 1);
  if (hmap_put(&unread_conns, id, id_len, (uintptr_t)c) != GNMR_OK) {
    free(c);
    return NULL;
  }
  return c;
}

/* Why a reply of len bytes (0: not known yet) may not be queued for c,
 * or NULL. */
static const char *unread_refusal(const rconn *c, uint64_t len) {
  uint64_t mine = atomic_load(&c->bytes), all = atomic_load(&unread_all);
  if (mine >= UNREAD_CONN || (mine > 0 && mine + len > UNREAD_CONN))
    return "this connection";
  if (c->operator)
    return NULL;
  /* one reply larger than the bound passes when nothing else waits */
  if (all > 0 && (len > UNREAD_SMALL ? all + len > UNREAD_ALL
                                     : all + len > UNREAD_ALL + UNREAD_ROOM))
    return "all connections";
  return NULL;
}

static void send_busy_unread(gnmrd *d, const void *id, size_t id_len,
                             rconn *c, const char *whose);

/* Queues buf (copied) for the client, counted as unread until ZeroMQ has
 * written it; past the bounds above, BUSY instead. Past
 * ADMIN_QUEUED_REPLIES unread replies it is dropped and counted. */
static void reply_as(gnmrd *d, const void *id, size_t id_len,
                     const void *buf, size_t len, int checked) {
  rconn *c = rconn_of(id, id_len);
  if (c == NULL) {
    d->c.admin_replies_dropped++;
    return;
  }
  const char *whose = checked ? NULL : unread_refusal(c, len);
  if (whose != NULL) {
    send_busy_unread(d, id, id_len, c, whose);
    return;
  }
  void *copy = malloc(len ? len : 1);
  rticket *t = malloc(sizeof *t);
  if (copy == NULL || t == NULL) {
    free(copy);
    free(t);
    d->c.admin_replies_dropped++;
    return;
  }
  memcpy(copy, buf, len);
  t->c = c;
  t->len = len;
  atomic_fetch_add(&c->refs, 1);
  atomic_fetch_add(&c->bytes, len);
  atomic_fetch_add(&unread_all, len);
  if (server_send_owned(d->admin, id, id_len, copy, len, reply_freed, t) ==
      GNMR_E_BUSY)
    d->c.admin_replies_dropped++;
}

static void reply(gnmrd *d, const void *id, size_t id_len, const void *buf,
                  size_t len) {
  reply_as(d, id, id_len, buf, len, 0);
}

/* BUSY for a client over the bounds: a small Error, itself bound only by
 * ADMIN_QUEUED_REPLIES (it must say why nothing else comes). */
static void send_busy_unread(gnmrd *d, const void *id, size_t id_len,
                             rconn *c, const char *whose) {
  char msg[200];
  uint8_t *buf;
  size_t len;
  d->c.admin_unread_refused++;
  snprintf(msg, sizeof msg, "gnmrd holds %llu kB of admin replies unread "
           "on %s (bounds: %llu MB a connection, %llu MB in all): read "
           "them, then ask again",
           (unsigned long long)((!strcmp(whose, "this connection")
                                     ? atomic_load(&c->bytes)
                                     : atomic_load(&unread_all)) >> 10),
           whose, (unsigned long long)(UNREAD_CONN >> 20),
           (unsigned long long)(UNREAD_ALL >> 20));
  if (gnmr__wire_error(GNMR_E_BUSY, msg, "unread", 0, &buf, &len) ==
      GNMR_OK) {
    reply_as(d, id, id_len, buf, len, 1);
    free(buf);
  }
}

/* Before an answer is built: 1 (and BUSY sent) when its client, or every
 * client, has too much unread for it; est: its size where known, else 0.
 * Records whether the request's key is an operator's. */
static int unread_refuses(gnmrd *d, const void *id, size_t id_len,
                          const char *user, uint64_t est) {
  rconn *c = rconn_of(id, id_len);
  if (c == NULL)
    return 0; /* out of memory: the reply finds out */
  c->operator = d->allow != NULL && gnmr__allow_operator(d->allow, user);
  const char *whose = unread_refusal(c, est);
  if (whose == NULL)
    return 0;
  send_busy_unread(d, id, id_len, c, whose);
  return 1;
}

static void send_env(gnmrd *d, const void *id, size_t id_len,
                     Gnmr__Envelope *env) {
  uint8_t *buf;
  size_t len;
  if (gnmr__wire_encode(env, &buf, &len) == GNMR_OK) {
    reply(d, id, id_len, buf, len);
    free(buf);
  }
}

static void send_error(gnmrd *d, const void *id, size_t id_len, int code,
                       const char *msg) {
  uint8_t *buf;
  size_t len;
  if (gnmr__wire_error(code, msg, "admin", 0, &buf, &len) == GNMR_OK) {
    reply(d, id, id_len, buf, len);
    free(buf);
  }
}

/* Sends a chunk of an answer's text (export streams). */
static void send_chunk(gnmrd *d, const void *id, size_t id_len,
                       const char *text, int more, uint64_t stream,
                       uint64_t chunk) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__AdminReply rep = GNMR__ADMIN_REPLY__INIT;
  rep.json = (char *)text;
  rep.more = more;
  rep.stream = stream;
  rep.chunk = chunk;
  env.body_case = GNMR__ENVELOPE__BODY_ADMIN_REPLY;
  env.admin_reply = &rep;
  send_env(d, id, id_len, &env);
}

/* Sends v (taken) as an AdminReply. */
/* An answer's JSON text (taken over; NULL: out of memory). */
static void send_text(gnmrd *d, const void *id, size_t id_len, char *text) {
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

static void send_json(gnmrd *d, const void *id, size_t id_len, json_t *v) {
  char *text = json_dumps(v, JSON_COMPACT | JSON_ENSURE_ASCII);
  json_decref(v);
  send_text(d, id, id_len, text);
}

static void send_stats(gnmrd *d, const void *id, size_t id_len,
                       const char *user) {
  static const char *const names[] = {
#define GNMRD__COUNTER_NAME(name, metric, labels, help) #name,
      GNMRD_COUNTERS(GNMRD__COUNTER_NAME)
#undef GNMRD__COUNTER_NAME
#define STORE__STAT_NAME(field, name, metric, type, help) name,
      STORE_STATS(STORE__STAT_NAME)
#undef STORE__STAT_NAME
  };
  store_stats ss = {0};
  if (d->st)
    store_get_stats(d->st, &ss);
  const uint64_t values[] = {
#define GNMRD__COUNTER_VALUE(name, metric, labels, help) d->c.name,
      GNMRD_COUNTERS(GNMRD__COUNTER_VALUE)
#undef GNMRD__COUNTER_VALUE
#define STORE__STAT_VALUE(field, name, metric, type, help) ss.field,
      STORE_STATS(STORE__STAT_VALUE)
#undef STORE__STAT_VALUE
  };
  enum { N = sizeof names / sizeof names[0] };
  Gnmr__Counter cs[N], *cp[N];
  const char *jobs[MAX_LISTED_JOBS];
  const core_job *c;
  size_t pos = 0;
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Stats st = GNMR__STATS__INIT;
  for (size_t i = 0; i < N; i++) {
    gnmr__counter__init(&cs[i]);
    cs[i].name = (char *)names[i];
    cs[i].value = values[i];
    cp[i] = &cs[i];
  }
  /* the counters are the whole daemon's (every tenant's reports, Hellos,
   * refusals): with an allow list only operator keys see them; an agent
   * key's stats list its own jobs */
  int all = d->allow == NULL || gnmr__allow_operator(d->allow, user);
  st.n_counters = all ? N : 0;
  st.counters = cp;
  while (st.n_jobs < MAX_LISTED_JOBS &&
         (c = core_next_job(&d->jobs, &pos)) != NULL)
    if (d->allow == NULL || gnmr__allow_may(d->allow, user, c->owner,
                                            c->name))
      jobs[st.n_jobs++] = c->name;
  st.jobs = (char **)jobs;
  st.version = (char *)GNMR_VERSION;
  st.uptime_s = (uv_now(d->loop) - d->started_ms) / 1000;
  if (all) {
    st.agents = (char *)(d->bound_agents ? d->bound_agents : "");
    st.admin = (char *)(d->bound_admin ? d->bound_admin : "");
    st.data_dir = (char *)(d->cfg ? d->cfg->data_dir : "");
    st.term = d->term;
  }
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
  char *job, *unit, *kind; /* owned: sq points at them */
  char who[64], *who_jobs;  /* the requester's key and grant (tenancy) */
  store_query sq;
  uint64_t stream;          /* an export stream's id, 0 otherwise */
  uint64_t chunk;           /* the number of the chunk it sends next */
  char opener[64];          /* the key that opened it ("" without CURVE) */
  uint64_t idle_since;      /* loop time its last chunk went out */
  /* while queued or running: the requester's connection, and the flag
   * that stops the query when that connection goes (admin_on_gone) */
  int fd;
  atomic_int cancel;
  struct query *prev, *next;
  char *text;               /* the answer written out on the pool */
  int text_oom;             /* ... or that it could not be */
} query;

/* The queries queued or running on the pool (loop thread). */
static query *running;

static void run_unlink(query *q) {
  if (q->prev)
    q->prev->next = q->next;
  else if (running == q)
    running = q->next;
  if (q->next)
    q->next->prev = q->prev;
  q->prev = q->next = NULL;
}

/* Export streams between chunks: id -> query. A stream idle longer than
 * STREAM_IDLE_MS is closed; at most MAX_STREAMS are open. A stream's id is
 * 64 random bits and only the key that opened it may go on with it: a
 * counter would let anyone who can send a request read the next chunk of
 * another key's export (and leave a hole in it). */
#define STREAM_IDLE_MS 60000
#define MAX_STREAMS 16
static hmap streams;

static uint64_t new_stream_id(void) {
  uint64_t v = 0;
  while (v == 0 || hmap_get(&streams, &v, sizeof v, NULL))
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
      v = 0;
  return v;
}

static void query_work(uv_work_t *req) {
  query *q = req->data;
  store_query_run(q->path, &q->sq);
  /* the answer is written out here, not on the loop, where hundreds of
   * thousands of rows would hold every job's steps back; only the jobs
   * list, which the loop marks live first, goes as it is */
  if (q->sq.result != NULL && q->sq.command != GNMR_CMD_JOBS &&
      !atomic_load(&q->cancel)) {
    q->text = json_dumps(q->sq.result, JSON_COMPACT | JSON_ENSURE_ASCII);
    q->text_oom = q->text == NULL;
    json_decref(q->sq.result);
    q->sq.result = NULL;
  }
}

static void query_free(query *q) {
  store_query_clear(&q->sq);
  free(q->sq.chunk);
  json_decref(q->sq.result);
  free(q->text);
  free(q->id);
  free(q->job);
  free(q->unit);
  free(q->kind);
  free(q->who_jobs);
  free(q);
}

/* Marks live jobs in a jobs answer, and adds live ones the store has not
 * committed yet. */
static void mark_live(gnmrd *d, json_t *jobs, const query *q) {
  size_t i, pos = 0;
  json_t *o;
  const core_job *c;
  json_array_foreach(jobs, i, o) {
    const char *nm = json_string_value(json_object_get(o, "name"));
    const core_job *live = nm ? core_find(&d->jobs, nm) : NULL;
    json_int_t run = json_integer_value(json_object_get(o, "run"));
    json_object_set_new(o, "live",
                        json_boolean(live && (json_int_t)live->run == run));
  }
  while ((c = core_next_job(&d->jobs, &pos)) != NULL) {
    int seen = 0;
    if (q->sq.who != NULL && !gnmr__allow_may(d->allow, q->sq.who, c->owner,
                                              c->name))
      continue;
    json_array_foreach(jobs, i, o) {
      const char *nm = json_string_value(json_object_get(o, "name"));
      seen |= nm != NULL && strcmp(nm, c->name) == 0;
    }
    if (!seen)
      json_array_append_new(jobs, json_pack("{s:s,s:I,s:s,s:b}", "name",
                                            c->name, "run",
                                            (json_int_t)c->run, "state",
                                            "running", "live", 1));
  }
}

static void query_done(uv_work_t *req, int status) {
  query *q = req->data;
  gnmrd *d = q->d;
  run_unlink(q);
  if (atomic_load(&q->cancel)) {
    d->c.queries_abandoned++;
    query_free(q);
    return;
  }
  if (status != 0 || d->stopping) {
    query_free(q);
    return;
  }
  if (q->sq.chunk != NULL) { /* a chunk of an export */
    send_chunk(d, q->id, q->id_len, q->sq.chunk, q->sq.more, q->stream,
               q->chunk++);
    free(q->sq.chunk);
    q->sq.chunk = NULL;
    if (q->sq.more &&
        hmap_put(&streams, &q->stream, sizeof q->stream, (uintptr_t)q) ==
            GNMR_OK) {
      q->idle_since = uv_now(d->loop);
      return; /* kept for the next request */
    }
    query_free(q);
    return;
  }
  if (q->text != NULL || q->text_oom) {
    send_text(d, q->id, q->id_len, q->text);
    q->text = NULL;
  } else if (q->sq.result != NULL) {
    if (q->sq.command == GNMR_CMD_JOBS)
      mark_live(d, q->sq.result, q);
    send_json(d, q->id, q->id_len, q->sq.result);
    q->sq.result = NULL;
  } else {
    send_error(d, q->id, q->id_len, q->sq.code ? q->sq.code : GNMR_E_INTERNAL,
               q->sq.err[0] ? q->sq.err : "query failed");
  }
  query_free(q);
}

static void sweep_streams(gnmrd *d);

/* Queues q on the pool for the request just read; 0 on success. */
static int queue_query(gnmrd *d, query *q) {
  q->fd = server_msg_fd(d->admin);
  /* a client gone before its request was read: nobody waits for it */
  atomic_store(&q->cancel, !server_fd_live(d->admin, q->fd));
  q->sq.cancel = &q->cancel;
  q->req.data = q;
  q->next = running;
  q->prev = NULL;
  if (running)
    running->prev = q;
  running = q;
  if (uv_queue_work(d->loop, &q->req, query_work, query_done) != 0) {
    run_unlink(q);
    return -1;
  }
  return 0;
}

void admin_on_gone(server *s, int fd, void *ctx) {
  (void)s;
  (void)ctx;
  for (query *q = running; q != NULL && fd >= 0; q = q->next)
    if (q->fd == fd) { /* nobody waits for it: stopped, or never run */
      atomic_store(&q->cancel, 1);
      uv_cancel((uv_req_t *)&q->req);
    }
}

/* A connection's history queries queued or running on the pool: at most
 * ADMIN_QUERIES_PER_CONN; past it BUSY at once, before anything is built
 * (issue 62: 100,000 pipelined `history` requests on one connection took
 * gnmrd to 484 MB and kept the operator's `jobs` waiting 5 s). */
#define ADMIN_QUERIES_PER_CONN 8

static int queries_of(const void *id, size_t id_len) {
  int n = 0;
  for (const query *q = running; q != NULL; q = q->next)
    n += q->id_len == id_len && memcmp(q->id, id, id_len) == 0;
  return n;
}

static void start_query(gnmrd *d, const void *id, size_t id_len, int command,
                        const Gnmr__AdminRequest *r, const char *user) {
  if (queries_of(id, id_len) >= ADMIN_QUERIES_PER_CONN) {
    d->c.admin_queries_refused++;
    send_error(d, id, id_len, GNMR_E_BUSY, "this connection has 8 queries "
               "in progress: read their answers, then ask again");
    return;
  }
  if (gnmr_admin_commands[command].stream) {
    sweep_streams(d);
    if (streams.live >= MAX_STREAMS) {
      send_error(d, id, id_len, GNMR_E_BUSY, "too many exports in progress;"
                 " try again");
      return;
    }
  }
  query *q = calloc(1, sizeof *q);
  if (q == NULL || d->st == NULL) {
    free(q);
    send_error(d, id, id_len, GNMR_E_UNSUPPORTED,
               "this gnmrd keeps no history");
    return;
  }
  q->d = d;
  q->id = malloc(id_len ? id_len : 1);
  q->job = strdup(r->job);
  q->unit = strdup(r->unit);
  q->kind = strdup(r->kind);
  if (!q->id || !q->job || !q->unit || !q->kind) {
    query_free(q);
    send_error(d, id, id_len, GNMR_E_NOMEM, "out of memory");
    return;
  }
  memcpy(q->id, id, id_len);
  q->id_len = id_len;
  snprintf(q->path, sizeof q->path, "%s", store_path(d->st));
  q->sq.command = command;
  q->sq.view = store_view_job;
  q->sq.job = q->job;
  q->sq.unit = q->unit;
  q->sq.kind = q->kind;
  q->sq.from = r->from_step;
  q->sq.to = r->to_step;
  q->sq.limit = r->limit ? r->limit
                         : command == GNMR_CMD_TOP ? 10 : DEFAULT_LIMIT;
  q->sq.run = r->run;
  if (gnmr_admin_commands[command].stream) {
    q->stream = new_stream_id();
    snprintf(q->opener, sizeof q->opener, "%s", user ? user : "");
  }
  if (d->allow != NULL && !gnmr__allow_operator(d->allow, user)) {
    /* tenancy: the store shows this key its own jobs and its grant's */
    const gnmr_grant *g = gnmr__allow_find(d->allow, user);
    snprintf(q->who, sizeof q->who, "%s", user ? user : "");
    q->sq.who = q->who;
    if (g != NULL && g->jobs != NULL &&
        (q->who_jobs = strdup(g->jobs)) == NULL) {
      query_free(q);
      send_error(d, id, id_len, GNMR_E_NOMEM, "out of memory");
      return;
    }
    q->sq.who_jobs = q->who_jobs;
  }
  if (queue_query(d, q) != 0) {
    send_error(d, id, id_len, GNMR_E_INTERNAL, "cannot queue the query");
    query_free(q);
  }
}

/* Closes the streams idle too long. */
static void sweep_streams(gnmrd *d) {
  size_t pos = 0;
  uint64_t v, now = uv_now(d->loop);
  const void *key;
  size_t n = 0;
  uint64_t old[MAX_STREAMS + 1];
  while (n <= MAX_STREAMS && hmap_next(&streams, &pos, &key, NULL, &v))
    if (now - ((query *)(uintptr_t)v)->idle_since > STREAM_IDLE_MS)
      memcpy(&old[n++], key, sizeof old[0]);
  for (size_t i = 0; i < n; i++) {
    hmap_get(&streams, &old[i], sizeof old[i], &v);
    hmap_del(&streams, &old[i], sizeof old[i]);
    query_free((query *)(uintptr_t)v);
  }
}

/* The next chunk of an export stream, for the key that opened it (and
 * knows its id), when it asks for the chunk that comes next: a stream is
 * never read past a chunk its reader did not get. */
static void go_on(gnmrd *d, const void *id, size_t id_len,
                  const Gnmr__AdminRequest *r, const char *user) {
  uint64_t v;
  sweep_streams(d);
  if (!hmap_get(&streams, &r->stream, sizeof r->stream, &v)) {
    send_error(d, id, id_len, GNMR_E_NOJOB, "no such export stream (it "
               "finished, or was idle for a minute)");
    return;
  }
  query *q = (query *)(uintptr_t)v;
  if (strcmp(q->job, r->job) != 0 ||
      strcmp(q->opener, user ? user : "") != 0) {
    send_error(d, id, id_len, GNMR_E_DENIED, "this export stream is "
               "another request's");
    return;
  }
  if (r->chunk != q->chunk) {
    char msg[160];
    snprintf(msg, sizeof msg, "this export stream sends chunk %llu next, "
             "not %llu", (unsigned long long)q->chunk,
             (unsigned long long)r->chunk);
    send_error(d, id, id_len, GNMR_E_MISMATCH, msg);
    return;
  }
  hmap_del(&streams, &r->stream, sizeof r->stream);
  char *nid = malloc(id_len ? id_len : 1);
  if (nid == NULL) {
    query_free(q);
    send_error(d, id, id_len, GNMR_E_NOMEM, "out of memory");
    return;
  }
  memcpy(nid, id, id_len);
  free(q->id);
  q->id = nid;
  q->id_len = id_len;
  if (queue_query(d, q) != 0) {
    send_error(d, id, id_len, GNMR_E_INTERNAL, "cannot queue the query");
    query_free(q);
  }
}

static void deferred_close(void);

void admin_shutdown(gnmrd *d) {
  size_t pos = 0;
  uint64_t v;
  (void)d;
  /* nobody will read the answers: the running queries stop at their next
   * check (every 1024 rows), the queued ones never start, so a stop does
   * not wait them out (issue 62: 85 s, past systemd's TimeoutStopSec) */
  for (query *q = running; q != NULL; q = q->next) {
    atomic_store(&q->cancel, 1);
    uv_cancel((uv_req_t *)&q->req);
  }
  while (hmap_next(&streams, &pos, NULL, NULL, &v))
    query_free((query *)(uintptr_t)v);
  hmap_clear(&streams);
  deferred_close();
  pos = 0; /* what ZeroMQ still holds keeps its connection's count */
  while (hmap_next(&unread_conns, &pos, NULL, NULL, &v))
    rconn_unref((rconn *)(uintptr_t)v);
  hmap_clear(&unread_conns);
}

/* ---- the live commands' handlers (their rows in proto/commands.h) ----------
 */

typedef void live_fn(gnmrd *d, const void *id, size_t id_len,
                     const Gnmr__AdminRequest *r, const char *user,
                     core_job *c);

static void live_status(gnmrd *d, const void *id, size_t id_len,
                        const Gnmr__AdminRequest *r, const char *user,
                        core_job *c) {
  (void)r, (void)user;
  send_json(d, id, id_len, views_status(c));
}

/* units and top: refused before they are built while too much is unread
 * (their size, roughly) */
static void live_units_of(gnmrd *d, const void *id, size_t id_len,
                          const char *user, core_job *c, uint32_t top) {
  uint64_t n = c->n_units;
  if (top != 0 && n > top)
    n = top;
  if (unread_refuses(d, id, id_len, user, n * UNITS_REPLY_PER_UNIT))
    return;
  send_json(d, id, id_len, views_units(c, top, 0));
}

static void live_units(gnmrd *d, const void *id, size_t id_len,
                       const Gnmr__AdminRequest *r, const char *user,
                       core_job *c) {
  (void)r;
  live_units_of(d, id, id_len, user, c, 0);
}

static void live_top(gnmrd *d, const void *id, size_t id_len,
                     const Gnmr__AdminRequest *r, const char *user,
                     core_job *c) {
  live_units_of(d, id, id_len, user, c, r->limit ? r->limit : 10);
}

static void live_set(gnmrd *d, const void *id, size_t id_len,
                     const Gnmr__AdminRequest *r, const char *user,
                     core_job *c) {
  char err[256];
  (void)user;
  int rv =
      lifecycle_set_params(d, c, r->settings, r->n_settings, err, sizeof err);
  if (rv != GNMR_OK)
    send_error(d, id, id_len, rv, err);
  else
    send_json(d, id, id_len, views_status(c));
}

static void live_finish(gnmrd *d, const void *id, size_t id_len,
                        const Gnmr__AdminRequest *r, const char *user,
                        core_job *c) {
  (void)r, (void)user;
  json_t *v = views_status(c);
  json_object_set_new(v, "state", json_string("finished"));
  lifecycle_finish(d, c);
  send_json(d, id, id_len, v);
}

#define LIVE_OF(id, name, where, job, csv, op, changes, large, stream, opts,   \
                synopsis, summary, help, live, query, render)                  \
  [GNMR_CMD_##id] = live,
static live_fn *const live_handlers[GNMR_CMD_COUNT] = {
    GNMR_ADMIN_COMMANDS(LIVE_OF)};
#undef LIVE_OF
/* each command's store query by name ("0": none), for the live commands
 * the store also answers when their job is not running */
#define QUERY_NAME(id, name, where, job, csv, op, changes, large, stream,      \
                   opts, synopsis, summary, help, live, query, render)         \
  [GNMR_CMD_##id] = #query,
static const char *const query_names[GNMR_CMD_COUNT] = {
    GNMR_ADMIN_COMMANDS(QUERY_NAME)};
#undef QUERY_NAME

static void on_admin_request(gnmrd *d, const void *id, size_t id_len,
                             const Gnmr__AdminRequest *r, const char *user) {
  int k = gnmr__admin_command_find(r->command);
  if (r->from_step > GNMR_MAX_STEP || r->to_step > GNMR_MAX_STEP ||
      r->limit > MAX_LIMIT || r->run > INT64_MAX) {
    char m[160];
    snprintf(m, sizeof m, "%s",
             r->limit > MAX_LIMIT ? "limit is above 1000000"
             : r->run > INT64_MAX ? "run is above 2^63 - 1"
                                  : "a step filter is above the largest "
                                    "step (2^63 - 1025)");
    send_error(d, id, id_len, GNMR_E_RANGE, m);
    return;
  }
  if (r->to_step != 0 && r->to_step < r->from_step) {
    send_error(d, id, id_len, GNMR_E_INVAL, "--to is below --from");
    return;
  }
  if (k < 0) {
    char msg[200], esc[80];
    snprintf(msg, sizeof msg, "unknown admin command '%s'",
             gnmr__escape(r->command, esc, sizeof esc));
    send_error(d, id, id_len, GNMR_E_UNSUPPORTED, msg);
    return;
  }
  char why[96], msg[200];
  if (r->job[0] != '\0' &&
      !gnmr__name_check(r->job, GNMR_MAX_JOB_NAME, why, sizeof why)) {
    snprintf(msg, sizeof msg, "job name: %s", why);
    send_error(d, id, id_len, GNMR_E_INVAL, msg);
    return;
  }
  if (r->unit[0] != '\0' &&
      !gnmr__name_check(r->unit, GNMR_MAX_UNIT_NAME, why, sizeof why)) {
    snprintf(msg, sizeof msg, "unit name: %s", why);
    send_error(d, id, id_len, GNMR_E_INVAL, msg);
    return;
  }
  if (gnmr_admin_commands[k].operator && d->allow != NULL &&
      !gnmr__allow_operator(d->allow, user)) {
    snprintf(msg, sizeof msg, "'%s' is for operator keys (role=operator in "
             "the allow list)", gnmr_admin_commands[k].name);
    send_error(d, id, id_len, GNMR_E_DENIED, msg);
    return;
  }
  /* the answers that can be large: refused before they are built while
   * the client, or every client, leaves too much unread */
  const gnmr_admin_command *cmd = &gnmr_admin_commands[k];
  if (unread_refuses(d, id, id_len, user, cmd->large ? UNREAD_SMALL + 1 : 0))
    return;
  if (cmd->stream && r->stream != 0) {
    go_on(d, id, id_len, r, user);
    return;
  }
  if (cmd->needs_job && r->job[0] == '\0' && cmd->where == GNMR_AT_HISTORY) {
    send_error(d, id, id_len, GNMR_E_INVAL, "a job name is needed");
    return;
  }
  if (cmd->where == GNMR_AT_HISTORY) {
    start_query(d, id, id_len, k, r, user);
    return;
  }
  core_job *c = core_find(&d->jobs, r->job);
  if (c != NULL && d->allow != NULL &&
      !gnmr__allow_may(d->allow, user, c->owner, c->name))
    c = NULL; /* another tenant's job: as if it did not exist */
  if (c != NULL && r->run != 0 && r->run != c->run)
    c = NULL; /* an earlier run of the name: from the store */
  if (c == NULL && d->st != NULL && strcmp(query_names[k], "0") != 0) {
    start_query(d, id, id_len, k, r, user); /* not running: the store */
    return;
  }
  if (c == NULL) {
    snprintf(msg, sizeof msg, "no running job '%.128s'", r->job);
    send_error(d, id, id_len, GNMR_E_NOJOB, msg);
    return;
  }
  live_handlers[k](d, id, id_len, r, user, c);
}

/* ---- large answers, one a loop turn ------------------------------------------- */
/* `units` and `top` are built on the loop from a job's memory: tens of
 * milliseconds for 10^5 units. Answered as they come, a burst of them
 * (48 clients pipelining 8 each) held the loop, and every other request
 * and job behind it, for seconds. So they wait in a queue, of at most
 * ADMIN_DEFERRED_MAX (past it: BUSY), and are answered one a loop turn
 * (an idle handle: the loop polls every socket between two), after the
 * bounds on unread replies are checked again; every other request is
 * answered at once, ahead of them: an operator's `jobs`, `status` or
 * `stats`, and every job's steps, wait at most one such answer. */
#define ADMIN_DEFERRED_MAX 256

typedef struct deferred {
  struct deferred *next;
  gnmrd *d;
  void *id;
  size_t id_len;
  char *user; /* NULL: none */
  Gnmr__Envelope *env;
} deferred;

static deferred *defer_head, *defer_tail;
static size_t n_deferred;
static uv_idle_t *defer_idle;

static void deferred_free(deferred *q) {
  gnmr__wire_free(&q->env);
  free(q->id);
  free(q->user);
  free(q);
}

static void on_deferred(uv_idle_t *h) {
  deferred *q = defer_head;
  if (q == NULL) {
    uv_idle_stop(h);
    return;
  }
  defer_head = q->next;
  if (defer_head == NULL)
    defer_tail = NULL;
  n_deferred--;
  jobs_quiesce_all(q->d);
  on_admin_request(q->d, q->id, q->id_len, q->env->admin_request, q->user);
  server_kick(q->d->admin); /* a send outside a drain: look again */
  if (defer_head == NULL)
    uv_idle_stop(h);
  deferred_free(q);
}

static void idle_freed(uv_handle_t *h) { free(h); }

/* The requests still waiting when gnmrd stops: not answered. */
static void deferred_close(void) {
  while (defer_head != NULL) {
    deferred *q = defer_head;
    defer_head = q->next;
    deferred_free(q);
  }
  defer_tail = NULL;
  n_deferred = 0;
  if (defer_idle != NULL) {
    uv_close((uv_handle_t *)defer_idle, idle_freed);
    defer_idle = NULL;
  }
}

/* 1 when the request was queued (env taken), 0 when the caller answers
 * it now; BUSY (and 1, env kept by the caller) past the queue's bound. */
static int defer(gnmrd *d, const void *id, size_t id_len, const char *user,
                 Gnmr__Envelope *env) {
  int k = gnmr__admin_command_find(env->admin_request->command);
  if (k < 0 || !gnmr_admin_commands[k].large ||
      gnmr_admin_commands[k].where != GNMR_AT_LIVE) /* built on the loop */
    return 0;
  if (defer_idle == NULL) {
    if ((defer_idle = malloc(sizeof *defer_idle)) == NULL)
      return 0;
    uv_idle_init(d->loop, defer_idle);
  }
  if (n_deferred >= ADMIN_DEFERRED_MAX) {
    d->c.admin_deferred_refused++;
    send_error(d, id, id_len, GNMR_E_BUSY, "gnmrd has 256 `units` and "
               "`top` requests waiting: ask again later");
    return -1;
  }
  deferred *q = calloc(1, sizeof *q);
  if (q == NULL || (q->id = malloc(id_len ? id_len : 1)) == NULL ||
      (user != NULL && (q->user = strdup(user)) == NULL)) {
    if (q != NULL) {
      free(q->id);
      free(q);
    }
    return 0; /* answered now */
  }
  memcpy(q->id, id, id_len);
  q->id_len = id_len;
  q->d = d;
  q->env = env;
  if (defer_tail != NULL)
    defer_tail->next = q;
  else
    defer_head = q;
  defer_tail = q;
  if (n_deferred++ == 0)
    uv_idle_start(defer_idle, on_deferred);
  return 1;
}

void admin_on_message(server *s, const void *id, size_t id_len,
                      const void *data, size_t len, const char *user,
                      void *ctx) {
  gnmrd *d = ctx;
  Gnmr__Envelope *env;
  char err[160];
  (void)s;
  d->c.admin_requests++;
  int rv = gnmr__wire_decode(data, len, &env, err, sizeof err);
  if (rv == GNMR_OK && env->body_case == GNMR__ENVELOPE__BODY_STATS_REQUEST) {
    send_stats(d, id, id_len, user);
  } else if (rv == GNMR_OK &&
             env->body_case == GNMR__ENVELOPE__BODY_ADMIN_REQUEST) {
    int later = defer(d, id, id_len, user, env);
    if (later == 1)
      return; /* env is the queue's */
    if (later == 0) {
      jobs_quiesce_all(d); /* commands and views read engines */
      on_admin_request(d, id, id_len, env->admin_request, user);
    }
  } else {
    if (rv == GNMR_OK &&
        (env->body_case == GNMR__ENVELOPE__BODY_HELLO ||
         env->body_case == GNMR__ENVELOPE__BODY_REPORT ||
         env->body_case == GNMR__ENVELOPE__BODY_BYE)) {
      rv = GNMR_E_UNSUPPORTED;
      snprintf(err, sizeof err,
               "not an admin request: this is gnmrd's admin endpoint; "
               "agents connect to its agents endpoint (gnmrd --agents)");
    } else if (rv == GNMR_OK) {
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
