/* SPDX-License-Identifier: MIT */
/* relay.c — gnmrd --relay-to ENDPOINT: a node relay (docs/protocol.md,
 * "Node relays"). The ranks of one node say Hello and report to it; it
 * joins the job at the central gnmrd as one reporter, the node (rank
 * r / node_ranks of the job's node_ranks), whose units are every unit
 * its ranks hold, and sends one Report a step: each unit's shards summed
 * in rank order from 0, the counts, flags and largest measure of its
 * ranks, a unit whose shard did not come by its deadline (half the job's
 * barrier after the step's first report) marked missing. The central
 * gnmrd sums the nodes' sums in node order, which is the sum it makes of
 * the same ranks without relays when they say the same node_ranks: the
 * same bits. Decisions come back once a node and go to each of its ranks
 * unchanged (the same bytes); the decisions not yet durable are held and
 * handed back in the relay's Hello, with those its ranks held, when it
 * joins again. One upstream connection per job, as a rank's.
 *
 * What a relay does not serve (refused with UNSUPPORTED, saying so):
 * observers (they join gnmrd itself), and ranks of another node than the
 * one its first rank of the job named. A single thread, zmq_poll. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "gnmr/error.h"
#include "hmap.h"
#include "ipc.h"
#include "text.h"
#include "keys.h"
#include "log.h"
#include "params.h"
#include "relay.h"
#include "validate.h"
#include "wire.h"

#define RELAY_MAX_JOBS 64
#define RELAY_MAX_PENDING 16 /* steps of a job waiting for local reports */
#define RELAY_RETRY_MS 2000  /* an unanswered or refused upstream Hello */
#define RELAY_MAX_PROXIES 256 /* observers passed through, one connection each */
/* the largest message either side may send (gnmrd's default --max-msg):
 * a larger one closes its connection before anything is read */
#define RELAY_MAX_MSG ((int64_t)256 << 20)

typedef struct lrank { /* one rank of the node */
  char *conn;          /* its connection's identity; NULL: not joined */
  size_t conn_len;
  Gnmr__Envelope *hello; /* its latest Hello */
  uint32_t *slot;        /* its units' places in the node's union */
  int bye;
} lrank;

typedef struct lstep { /* one step's reports from the node's ranks */
  uint64_t step, deadline;
  uint32_t got;
  Gnmr__Envelope **rep; /* by local index */
} lstep;

typedef struct rjob {
  char *name;
  uint32_t reporters, node_ranks, barrier_ms, node, nodes, first, n_local;
  lrank *lr;
  hmap slots;           /* unit name -> place in the union */
  char **names;         /* the union, in order of first appearance */
  uint64_t *req_ids;    /* the ids the ranks asked for, or NULL */
  uint32_t *holders;    /* ranks of the node holding each */
  uint32_t n_units;
  uint32_t *ids;        /* the job-wide ids (upstream Welcome) */
  void *up;             /* DEALER to the central gnmrd */
  void *mon;            /* its failed handshakes (a refused key) */
  uint64_t said_refused; /* when that was last logged (ms) */
  int up_state;         /* 0 not asked, 1 Hello sent, 2 welcomed */
  uint64_t next_hello;
  Gnmr__Envelope *welcome;
  lstep pend[RELAY_MAX_PENDING];
  uint32_t n_pend;
  uint64_t last_sent;
  Gnmr__Envelope *held[GNMR_MAX_HELD]; /* decisions not yet durable */
  uint32_t n_held;
} rjob;

/* An observer passed through: every message of its connection goes to
 * gnmrd on a connection of its own, and back, unchanged (an observer
 * reports nothing a relay could sum, and its units need not be the
 * node's). */
typedef struct proxy {
  char *conn;
  size_t conn_len;
  void *up;
} proxy;

typedef struct relay {
  void *ctx, *local;
  proxy proxies[RELAY_MAX_PROXIES];
  uint32_t n_proxies;
  const char *upstream;
  int curve;                     /* CURVE toward gnmrd: the keys below */
  char server_key[41], pub[41], sec[41];
  char host[64];
  rjob *jobs[RELAY_MAX_JOBS];
  uint32_t n_jobs;
  uint64_t late, partial;
} relay;

static volatile sig_atomic_t stopping;
static void on_stop(int sig) {
  (void)sig;
  stopping = 1;
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- sending ------------------------------------------------------------------- */

static void send_to(relay *r, const char *conn, size_t conn_len,
                    const void *buf, size_t len) {
  if (zmq_send(r->local, conn, conn_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
    return;
  zmq_send(r->local, buf, len, ZMQ_DONTWAIT);
}

/* An envelope to gnmrd on sock. */
static void send_up(void *sock, Gnmr__Envelope *env) {
  uint8_t *buf;
  size_t len;
  if (gnmr__wire_encode(env, &buf, &len) != GNMR_OK)
    return;
  zmq_send(sock, buf, len, ZMQ_DONTWAIT);
  free(buf);
}

static void send_env_to(relay *r, const char *conn, size_t conn_len,
                        Gnmr__Envelope *env) {
  uint8_t *buf;
  size_t len;
  if (gnmr__wire_encode(env, &buf, &len) != GNMR_OK)
    return;
  send_to(r, conn, conn_len, buf, len);
  free(buf);
}

static void reply_error(relay *r, const char *conn, size_t conn_len,
                        int code, const char *ref, uint64_t step,
                        const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static void reply_error(relay *r, const char *conn, size_t conn_len,
                        int code, const char *ref, uint64_t step,
                        const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  uint8_t *buf;
  size_t len;
  if (gnmr__wire_error(code, msg, ref, step, &buf, &len) == GNMR_OK) {
    send_to(r, conn, conn_len, buf, len);
    free(buf);
  }
}

/* ---- jobs ---------------------------------------------------------------------- */

static void lstep_clear(rjob *j, lstep *s) {
  for (uint32_t i = 0; i < j->n_local; i++)
    gnmr__wire_free(&s->rep[i]);
  free(s->rep);
  s->rep = NULL;
}

static void union_clear(rjob *j) {
  for (uint32_t u = 0; u < j->n_units; u++)
    free(j->names[u]);
  free(j->names);
  free(j->req_ids);
  free(j->holders);
  free(j->ids);
  j->names = NULL;
  j->req_ids = NULL;
  j->holders = NULL;
  j->ids = NULL;
  j->n_units = 0;
  hmap_clear(&j->slots);
  j->slots.keyed = 1;
  for (uint32_t i = 0; i < j->n_local; i++) {
    free(j->lr[i].slot);
    j->lr[i].slot = NULL;
  }
}

static void job_free(rjob **jp) {
  rjob *j = *jp;
  if (j == NULL)
    return;
  for (uint32_t i = 0; i < j->n_pend; i++)
    lstep_clear(j, &j->pend[i]);
  union_clear(j);
  hmap_clear(&j->slots);
  for (uint32_t i = 0; i < j->n_local; i++) {
    free(j->lr[i].conn);
    gnmr__wire_free(&j->lr[i].hello);
  }
  for (uint32_t i = 0; i < j->n_held; i++)
    gnmr__wire_free(&j->held[i]);
  gnmr__wire_free(&j->welcome);
  if (j->up != NULL)
    zmq_close(j->up);
  if (j->mon != NULL)
    zmq_close(j->mon);
  free(j->lr);
  free(j->name);
  free(j);
  *jp = NULL;
}

static rjob *job_find(relay *r, const char *name) {
  for (uint32_t i = 0; i < r->n_jobs; i++)
    if (strcmp(r->jobs[i]->name, name) == 0)
      return r->jobs[i];
  return NULL;
}

/* The job and local index of a connection, or NULL. */
static rjob *conn_find(relay *r, const void *id, size_t id_len, uint32_t *li) {
  for (uint32_t k = 0; k < r->n_jobs; k++) {
    rjob *j = r->jobs[k];
    for (uint32_t i = 0; i < j->n_local; i++)
      if (j->lr[i].conn != NULL && j->lr[i].conn_len == id_len &&
          memcmp(j->lr[i].conn, id, id_len) == 0) {
        *li = i;
        return j;
      }
  }
  return NULL;
}

/* A connection to gnmrd, with the relay's CURVE keys when it has them;
 * with mon, a PAIR that hears of its failed handshakes too. */
static void *up_socket(relay *r, void **mon) {
  void *up = zmq_socket(r->ctx, ZMQ_DEALER);
  int zero = 0;
  static unsigned seq;
  char ep[64];
  snprintf(ep, sizeof ep, "inproc://relay-monitor-%u", seq++);
  if (mon != NULL && up != NULL &&
      (zmq_socket_monitor(up, ep, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                      ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                      ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) !=
           0 ||
       (*mon = zmq_socket(r->ctx, ZMQ_PAIR)) == NULL ||
       zmq_setsockopt(*mon, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
       zmq_connect(*mon, ep) != 0)) {
    zmq_close(up);
    return NULL;
  }
  int64_t max_msg = RELAY_MAX_MSG;
  if (up == NULL ||
      zmq_setsockopt(up, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
      zmq_setsockopt(up, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg) != 0 ||
      (r->curve &&
       (zmq_setsockopt(up, ZMQ_CURVE_SERVERKEY, r->server_key, 41) != 0 ||
        zmq_setsockopt(up, ZMQ_CURVE_PUBLICKEY, r->pub, 41) != 0 ||
        zmq_setsockopt(up, ZMQ_CURVE_SECRETKEY, r->sec, 41) != 0)) ||
      zmq_connect(up, r->upstream) != 0) {
    if (up != NULL)
      zmq_close(up);
    return NULL;
  }
  return up;
}

static rjob *job_new(relay *r, const Gnmr__Hello *h, uint32_t barrier) {
  uint32_t per = h->node_ranks > 1 ? h->node_ranks : 1;
  rjob *j = calloc(1, sizeof *j);
  if (j == NULL || (j->name = strdup(h->job)) == NULL) {
    free(j);
    return NULL;
  }
  j->reporters = h->reporters;
  j->node_ranks = per;
  j->barrier_ms = barrier;
  j->node = h->rank / per;
  j->nodes = (h->reporters + per - 1) / per;
  j->first = j->node * per;
  j->n_local = h->reporters - j->first < per ? h->reporters - j->first : per;
  j->slots.keyed = 1;
  j->lr = calloc(j->n_local, sizeof *j->lr);
  j->up = up_socket(r, &j->mon);
  if (j->lr == NULL || j->up == NULL) {
    job_free(&j);
    return NULL;
  }
  return j;
}

/* ---- the node's union of units --------------------------------------------------- */

/* Every rank's units in rank order, each name once, with the ranks
 * holding it; 0 or GNMR_E_NOMEM / GNMR_E_MISMATCH (one name, two ids). */
static int union_build(rjob *j, char *why, size_t why_len) {
  union_clear(j);
  uint32_t cap = 0, all_ids = 1;
  for (uint32_t i = 0; i < j->n_local; i++) {
    const Gnmr__Hello *h = j->lr[i].hello->hello;
    cap += (uint32_t)h->n_units;
    all_ids &= h->n_unit_ids == h->n_units;
  }
  j->names = calloc(cap ? cap : 1, sizeof *j->names);
  j->req_ids = all_ids ? calloc(cap ? cap : 1, sizeof *j->req_ids) : NULL;
  j->holders = calloc(cap ? cap : 1, sizeof *j->holders);
  if (j->names == NULL || j->holders == NULL || (all_ids && !j->req_ids))
    return GNMR_E_NOMEM;
  for (uint32_t i = 0; i < j->n_local; i++) {
    const Gnmr__Hello *h = j->lr[i].hello->hello;
    lrank *lr = &j->lr[i];
    if ((lr->slot = calloc(h->n_units ? h->n_units : 1, sizeof *lr->slot)) ==
        NULL)
      return GNMR_E_NOMEM;
    for (size_t k = 0; k < h->n_units; k++) {
      size_t len = strlen(h->units[k]);
      uint64_t v;
      if (!hmap_get(&j->slots, h->units[k], len, &v)) {
        v = j->n_units;
        if ((j->names[v] = strdup(h->units[k])) == NULL ||
            hmap_put(&j->slots, h->units[k], len, v) != GNMR_OK)
          return GNMR_E_NOMEM;
        if (j->req_ids != NULL)
          j->req_ids[v] = h->unit_ids[k];
        j->n_units++;
      } else if (j->req_ids != NULL && j->req_ids[v] != h->unit_ids[k]) {
        snprintf(why, why_len, "unit %.80s: id %llu on rank %u, %llu on "
                 "another rank of this node", h->units[k],
                 (unsigned long long)h->unit_ids[k], j->first + i,
                 (unsigned long long)j->req_ids[v]);
        return GNMR_E_MISMATCH;
      }
      lr->slot[k] = (uint32_t)v;
      j->holders[v]++;
    }
  }
  return GNMR_OK;
}

static int all_joined(const rjob *j) {
  for (uint32_t i = 0; i < j->n_local; i++)
    if (j->lr[i].hello == NULL)
      return 0;
  return 1;
}

/* ---- upstream: the relay as the node's one reporter ------------------------------- */

static int held_cmp(const Gnmr__Decision *a, const Gnmr__Decision *b) {
  if (a->pass != b->pass)
    return a->pass < b->pass ? -1 : 1;
  return a->step < b->step ? -1 : a->step > b->step;
}

/* The relay's held decisions and its ranks', each (pass, step) once, in
 * ascending order, the newest GNMR_MAX_HELD. */
static size_t held_gather(const rjob *j, Gnmr__Decision **out) {
  size_t n = 0;
  for (uint32_t i = 0; i < j->n_held; i++)
    out[n++] = j->held[i]->decision;
  for (uint32_t i = 0; i < j->n_local; i++) {
    const Gnmr__Hello *h = j->lr[i].hello->hello;
    for (size_t k = 0; k < h->n_held; k++) {
      size_t p = 0;
      while (p < n && held_cmp(out[p], h->held[k]) < 0)
        p++;
      if (p < n && held_cmp(out[p], h->held[k]) == 0)
        continue;
      if (n == GNMR_MAX_HELD) {
        if (p == 0)
          continue; /* older than every one kept */
        memmove(&out[0], &out[1], (p - 1) * sizeof *out);
        out[p - 1] = h->held[k];
        continue;
      }
      memmove(&out[p + 1], &out[p], (n - p) * sizeof *out);
      out[p] = h->held[k];
      n++;
    }
  }
  return n;
}

static void up_hello(relay *r, rjob *j) {
  const Gnmr__Hello *h0 = j->lr[0].hello->hello;
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Hello h = GNMR__HELLO__INIT;
  char instance[160];
  snprintf(instance, sizeof instance, "relay %s node %u", r->host, j->node);
  Gnmr__Decision **held = malloc(2 * GNMR_MAX_HELD * sizeof *held);
  if (held == NULL)
    return;
  h.protocol = GNMR_PROTOCOL_VERSION;
  h.job = j->name;
  h.rank = j->node;
  h.reporters = j->nodes;
  h.n_units = j->n_units;
  h.units = j->names;
  if (j->req_ids != NULL) {
    h.n_unit_ids = j->n_units;
    h.unit_ids = j->req_ids;
  }
  h.params = h0->params;
  h.barrier_ms = h0->barrier_ms;
  h.instance = instance;
  h.start = j->welcome == NULL ? h0->start : 0;
  h.n_held = held_gather(j, held);
  h.held = held;
  env.body_case = GNMR__ENVELOPE__BODY_HELLO;
  env.hello = &h;
  send_up(j->up, &env);
  free(held);
  j->up_state = 1;
  j->next_hello = now_ms() + RELAY_RETRY_MS;
  LOG(INFO, "RELAY-HELLO", "job %s: node %u of %u joins with %u units",
      j->name, j->node, j->nodes, j->n_units);
}

/* A local rank's Welcome, from the job's: its own units' ids. */
static void welcome_rank(relay *r, rjob *j, uint32_t li) {
  lrank *lr = &j->lr[li];
  const Gnmr__Welcome *w = j->welcome->welcome;
  const Gnmr__Hello *h = lr->hello->hello;
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Welcome mine = *w;
  uint32_t *ids = malloc((h->n_units ? h->n_units : 1) * sizeof *ids);
  if (ids == NULL)
    return;
  for (size_t k = 0; k < h->n_units; k++)
    ids[k] = j->ids[lr->slot[k]];
  mine.rank = j->first + li;
  mine.n_unit_ids = h->n_units;
  mine.unit_ids = ids;
  env.body_case = GNMR__ENVELOPE__BODY_WELCOME;
  env.welcome = &mine;
  send_env_to(r, lr->conn, lr->conn_len, &env);
  free(ids);
}

static void on_up_welcome(relay *r, rjob *j, Gnmr__Envelope *env) {
  const Gnmr__Welcome *w = env->welcome;
  if (w->n_unit_ids != j->n_units) {
    LOG(ERROR, "RELAY-WELCOME", "job %s: a Welcome of %zu ids for %u units",
        j->name, w->n_unit_ids, j->n_units);
    gnmr__wire_free(&env);
    return;
  }
  free(j->ids);
  j->ids = malloc((j->n_units ? j->n_units : 1) * sizeof *j->ids);
  if (j->ids == NULL) {
    gnmr__wire_free(&env);
    return;
  }
  memcpy(j->ids, w->unit_ids, j->n_units * sizeof *j->ids);
  gnmr__wire_free(&j->welcome);
  j->welcome = env;
  j->up_state = 2;
  for (uint32_t i = 0; i < j->n_local; i++)
    if (j->lr[i].conn != NULL && !j->lr[i].bye)
      welcome_rank(r, j, i);
  LOG(INFO, "RELAY-JOIN", "job %s: node %u joined (run %llu, last step %llu)",
      j->name, j->node, (unsigned long long)w->run,
      (unsigned long long)w->last_step);
}

/* Keeps a sealed decision until gnmrd says it is durable, and forgets
 * those it says are. */
static void hold_decision(rjob *j, Gnmr__Envelope *env) {
  const Gnmr__Decision *d = env->decision;
  uint32_t k = 0;
  for (uint32_t i = 0; i < j->n_held; i++) {
    const Gnmr__Decision *o = j->held[i]->decision;
    if (o->run != d->run || o->pass < d->durable_pass ||
        (o->pass == d->durable_pass && o->step <= d->durable_step))
      gnmr__wire_free(&j->held[i]);
    else
      j->held[k++] = j->held[i];
  }
  j->n_held = k;
  if (d->tag.len == 0 || (d->pass < d->durable_pass) ||
      (d->pass == d->durable_pass && d->step <= d->durable_step)) {
    gnmr__wire_free(&env);
    return;
  }
  if (j->n_held == GNMR_MAX_HELD) {
    gnmr__wire_free(&j->held[0]);
    memmove(&j->held[0], &j->held[1], (GNMR_MAX_HELD - 1) * sizeof *j->held);
    j->n_held--;
  }
  j->held[j->n_held++] = env;
}

/* A failed handshake with gnmrd: said at most every 10 s a job (gnmrd
 * counts and logs its side: auth_denied, handshake_failures). */
static void on_monitor(rjob *j, const char *upstream) {
  zmq_msg_t m;
  zmq_msg_init(&m);
  int events = 0;
  while (zmq_msg_recv(&m, j->mon, ZMQ_DONTWAIT) >= 0)
    events += !zmq_msg_more(&m); /* an event is two frames */
  zmq_msg_close(&m);
  uint64_t now = now_ms();
  if (events > 0 && now - j->said_refused >= 10000) {
    j->said_refused = now;
    LOG(ERROR, "RELAY-REFUSED", "job %s: gnmrd at %s refused this relay's "
        "connection (CURVE: its key not in gnmrd's allow list, the wrong "
        "server key, or CURVE on one side only); its ranks wait", j->name,
        upstream);
  }
}

static void on_upstream(relay *r, rjob *j) {
  zmq_msg_t m;
  zmq_msg_init(&m);
  while (zmq_msg_recv(&m, j->up, ZMQ_DONTWAIT) >= 0) {
    const void *buf = zmq_msg_data(&m);
    size_t len = zmq_msg_size(&m);
    Gnmr__Envelope *env = NULL;
    if (gnmr__wire_decode(buf, len, &env, NULL, 0) != GNMR_OK)
      continue;
    switch (env->body_case) {
    case GNMR__ENVELOPE__BODY_WELCOME:
      on_up_welcome(r, j, env);
      continue;
    case GNMR__ENVELOPE__BODY_DECISION:
      /* the same bytes to every rank of the node */
      for (uint32_t i = 0; i < j->n_local; i++)
        if (j->lr[i].conn != NULL && !j->lr[i].bye)
          send_to(r, j->lr[i].conn, j->lr[i].conn_len, buf, len);
      hold_decision(j, env);
      continue;
    case GNMR__ENVELOPE__BODY_ERROR:
    {
      char esc[400]; /* a peer's words: escaped before they are logged */
      LOG(WARN, "RELAY-REFUSED", "job %s node %u: gnmrd says %s (%d)",
          j->name, j->node,
          gnmr__escape(env->error->message ? env->error->message : "", esc,
                       sizeof esc),
          env->error->code);
    }
      if (env->error->code == GNMR_E_NOJOB || j->up_state != 2) {
        j->up_state = 0; /* joins again (a restarted gnmrd) */
        j->next_hello = now_ms() + (env->error->code == GNMR_E_NOJOB
                                        ? 0 : RELAY_RETRY_MS);
      }
      /* the ranks see what gnmrd said (a refused join, above all) */
      for (uint32_t i = 0; i < j->n_local; i++)
        if (j->lr[i].conn != NULL && env->error->code != GNMR_E_NOJOB)
          send_to(r, j->lr[i].conn, j->lr[i].conn_len, buf, len);
      break;
    default:
      break;
    }
    gnmr__wire_free(&env);
  }
  zmq_msg_close(&m);
}

/* ---- the node's reports ----------------------------------------------------------- */

/* Step s of the node, summed: each unit's shards in rank order from 0,
 * as the central gnmrd sums a node's (docs/protocol.md); a unit with a
 * shard that did not come, or said missing, or reported by some of its
 * ranks and not by others, is missing; by none, not reported. */
static void flush_step(relay *r, rjob *j, lstep *s) {
  uint32_t n = j->n_units;
  double *sum = calloc(n ? n : 1, sizeof *sum);
  double *meas = malloc((n ? n : 1) * sizeof *meas);
  uint64_t *nf = calloc(n ? n : 1, sizeof *nf);
  uint32_t *got = calloc(n ? n : 1, sizeof *got), *nrc = calloc(n ? n : 1, 4);
  protobuf_c_boolean *nr = calloc(n ? n : 1, sizeof *nr),
                     *shd = calloc(n ? n : 1, sizeof *shd),
                     *mis = calloc(n ? n : 1, sizeof *mis);
  if (!sum || !meas || !nf || !got || !nrc || !nr || !shd || !mis)
    goto out;
  int any_nf = 0, any_shd = 0, any_meas = 0, any_mis = 0, any_nr = 0;
  for (uint32_t u = 0; u < n; u++)
    meas[u] = NAN;
  for (uint32_t i = 0; i < j->n_local; i++) { /* rank order */
    const Gnmr__Report *p = s->rep[i] ? s->rep[i]->report : NULL;
    if (p == NULL)
      continue;
    const uint32_t *slot = j->lr[i].slot;
    for (size_t k = 0; k < p->n_sumsq; k++) {
      uint32_t u = slot[k];
      got[u]++;
      if (p->n_missing && p->missing[k])
        mis[u] = 1;
      if (p->n_not_reported && p->not_reported[k]) {
        nrc[u]++;
        continue;
      }
      sum[u] += p->sumsq[k];
      if (p->n_nonfinite)
        nf[u] += p->nonfinite[k];
      if (p->n_shadowed && p->shadowed[k])
        shd[u] = 1;
      if (p->n_measure && !isnan(p->measure[k]) && !(p->measure[k] <= meas[u]))
        meas[u] = p->measure[k];
    }
  }
  for (uint32_t u = 0; u < n; u++) {
    if (got[u] < j->holders[u] || (nrc[u] > 0 && nrc[u] < got[u]))
      mis[u] = 1;
    else if (got[u] > 0 && nrc[u] == got[u])
      nr[u] = 1;
    any_mis |= mis[u];
    any_nr |= nr[u];
    any_nf |= nf[u] != 0;
    any_shd |= shd[u];
    any_meas |= !isnan(meas[u]);
  }
  if (s->got < j->n_local)
    r->partial++;
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Report rep = GNMR__REPORT__INIT;
  rep.job = j->name;
  rep.rank = j->node;
  rep.step = s->step;
  rep.n_sumsq = n;
  rep.sumsq = sum;
  rep.n_nonfinite = any_nf ? n : 0;
  rep.nonfinite = nf;
  rep.n_not_reported = any_nr ? n : 0;
  rep.not_reported = nr;
  rep.n_shadowed = any_shd ? n : 0;
  rep.shadowed = shd;
  rep.n_measure = any_meas ? n : 0;
  rep.measure = meas;
  rep.n_missing = any_mis ? n : 0;
  rep.missing = mis;
  env.body_case = GNMR__ENVELOPE__BODY_REPORT;
  env.report = &rep;
  send_up(j->up, &env);
out:
  free(sum);
  free(meas);
  free(nf);
  free(got);
  free(nrc);
  free(nr);
  free(shd);
  free(mis);
}

/* Sends every pending step up to and including index k, in step order. */
static void flush_through(relay *r, rjob *j, uint32_t k) {
  for (uint32_t i = 0; i <= k; i++) {
    if (j->up_state == 2)
      flush_step(r, j, &j->pend[i]);
    j->last_sent = j->pend[i].step;
    lstep_clear(j, &j->pend[i]);
  }
  memmove(&j->pend[0], &j->pend[k + 1],
          (j->n_pend - k - 1) * sizeof j->pend[0]);
  j->n_pend -= k + 1;
}

static uint32_t expected(const rjob *j) {
  uint32_t e = 0;
  for (uint32_t i = 0; i < j->n_local; i++)
    e += !j->lr[i].bye;
  return e;
}

static void on_report(relay *r, const void *id, size_t id_len,
                      Gnmr__Envelope *env) {
  const Gnmr__Report *p = env->report;
  uint32_t li;
  rjob *j = conn_find(r, id, id_len, &li);
  if (j == NULL) {
    reply_error(r, id, id_len, GNMR_E_NOJOB, "hello", p->step,
                "unknown agent: send Hello first");
    gnmr__wire_free(&env);
    return;
  }
  const char *ref = "";
  char why[256];
  int rv = strcmp(p->job, j->name) != 0 || p->rank != j->first + li
               ? GNMR_E_MISMATCH
               : gnmr__validate_report(p, (uint32_t)j->lr[li].hello->hello
                                              ->n_units, &ref, why, sizeof why);
  if (rv == GNMR_E_MISMATCH && ref[0] == '\0') {
    ref = "rank";
    snprintf(why, sizeof why, "report for job %.64s rank %u on the "
             "connection of job %.64s rank %u", p->job, p->rank, j->name,
             j->first + li);
  }
  if (rv != GNMR_OK) {
    reply_error(r, id, id_len, rv, ref, p->step, "%s", why);
    gnmr__wire_free(&env);
    return;
  }
  if (p->step <= j->last_sent) { /* late: its step went without it */
    r->late++;
    gnmr__wire_free(&env);
    return;
  }
  uint32_t k = 0;
  while (k < j->n_pend && j->pend[k].step < p->step)
    k++;
  if (k == j->n_pend || j->pend[k].step != p->step) {
    lstep fresh = {p->step, now_ms() + j->barrier_ms / 2, 0,
                   calloc(j->n_local, sizeof(Gnmr__Envelope *))};
    if (j->n_pend == RELAY_MAX_PENDING || fresh.rep == NULL) {
      free(fresh.rep);
      reply_error(r, id, id_len, GNMR_E_BUSY, "step", p->step,
                  "%u steps are already waiting for this node's reports",
                  RELAY_MAX_PENDING);
      gnmr__wire_free(&env);
      return;
    }
    memmove(&j->pend[k + 1], &j->pend[k], (j->n_pend - k) * sizeof *j->pend);
    j->pend[k] = fresh;
    j->n_pend++;
  }
  lstep *s = &j->pend[k];
  if (s->rep[li] != NULL) {
    reply_error(r, id, id_len, GNMR_E_DUP, "step", p->step,
                "duplicate report for step %llu",
                (unsigned long long)p->step);
    gnmr__wire_free(&env);
    return;
  }
  s->rep[li] = env;
  if (++s->got >= expected(j))
    flush_through(r, j, k);
}

/* ---- observers, passed through --------------------------------------------------- */

static proxy *proxy_find(relay *r, const void *id, size_t id_len) {
  for (uint32_t i = 0; i < r->n_proxies; i++)
    if (r->proxies[i].conn_len == id_len &&
        memcmp(r->proxies[i].conn, id, id_len) == 0)
      return &r->proxies[i];
  return NULL;
}

static void proxy_drop(relay *r, uint32_t i) {
  zmq_close(r->proxies[i].up);
  free(r->proxies[i].conn);
  r->proxies[i] = r->proxies[--r->n_proxies];
}

/* An observer's Hello (as the relay joins it: the nodes for reporters):
 * its own connection to gnmrd. */
static void proxy_hello(relay *r, const void *id, size_t id_len,
                        const void *buf, size_t len) {
  proxy *px = proxy_find(r, id, id_len);
  if (px == NULL) {
    if (r->n_proxies == RELAY_MAX_PROXIES) {
      reply_error(r, id, id_len, GNMR_E_BUSY, "observer", 0,
                  "this relay passes %u observers already; connect to "
                  "gnmrd itself", RELAY_MAX_PROXIES);
      return;
    }
    px = &r->proxies[r->n_proxies];
    px->up = up_socket(r, NULL);
    px->conn = malloc(id_len ? id_len : 1);
    if (px->up == NULL || px->conn == NULL) {
      if (px->up != NULL)
        zmq_close(px->up);
      free(px->conn);
      reply_error(r, id, id_len, GNMR_E_NOMEM, "observer", 0,
                  "out of memory");
      return;
    }
    memcpy(px->conn, id, id_len);
    px->conn_len = id_len;
    r->n_proxies++;
  }
  zmq_send(px->up, buf, len, ZMQ_DONTWAIT);
}

/* gnmrd's messages to a passed-through observer; one whose connection
 * is gone (its agent restarted under a new identity) is dropped. */
static void on_proxy(relay *r, uint32_t i) {
  zmq_msg_t m;
  zmq_msg_init(&m);
  proxy *px = &r->proxies[i];
  int gone = 0;
  while (zmq_msg_recv(&m, px->up, ZMQ_DONTWAIT) >= 0)
    if (zmq_send(r->local, px->conn, px->conn_len,
                 ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(r->local, zmq_msg_data(&m), zmq_msg_size(&m),
                 ZMQ_DONTWAIT) < 0)
      gone |= errno == EHOSTUNREACH;
  zmq_msg_close(&m);
  if (gone)
    proxy_drop(r, i);
}

/* ---- the node's ranks joining -------------------------------------------------- */

/* A Hello's job as this relay serves it: found (its settings the
 * Hello's, its node the rank's) or made; NULL with an answer sent. */
static rjob *hello_job(relay *r, const void *id, size_t id_len,
                       const Gnmr__Hello *h, uint32_t barrier) {
  uint32_t per = h->node_ranks > 1 ? h->node_ranks : 1;
  rjob *j = job_find(r, h->job);
  if (j == NULL) {
    if (r->n_jobs == RELAY_MAX_JOBS) {
      reply_error(r, id, id_len, GNMR_E_BUSY, "job", 0,
                  "this relay serves %u jobs already", RELAY_MAX_JOBS);
      return NULL;
    }
    if ((j = job_new(r, h, barrier)) == NULL) {
      reply_error(r, id, id_len, GNMR_E_NOMEM, "job", 0, "out of memory");
      return NULL;
    }
    r->jobs[r->n_jobs++] = j;
    LOG(INFO, "RELAY-JOB", "job %s: node %u of %u, ranks %u..%u", j->name,
        j->node, j->nodes, j->first, j->first + j->n_local - 1);
    return j;
  }
  if (j->reporters != h->reporters || j->node_ranks != per ||
      j->barrier_ms != barrier) {
    reply_error(r, id, id_len, GNMR_E_MISMATCH, "reporters", 0,
                "job %.64s has %u reporters, %u ranks a node and a %u ms "
                "barrier at this relay; this agent says %u, %u, %u", j->name,
                j->reporters, j->node_ranks, j->barrier_ms, h->reporters, per,
                barrier);
    return NULL;
  }
  if (h->rank / per != j->node) {
    reply_error(r, id, id_len, GNMR_E_UNSUPPORTED, "rank", 0,
                "rank %u of job %.64s is on node %u; this relay serves its "
                "node %u (ranks %u..%u): connect to that node's relay",
                h->rank, j->name, h->rank / per, j->node, j->first,
                j->first + j->n_local - 1);
    return NULL;
  }
  return j;
}

static int same_units(const Gnmr__Hello *a, const Gnmr__Hello *b) {
  if (a->n_units != b->n_units || a->n_unit_ids != b->n_unit_ids)
    return 0;
  for (size_t k = 0; k < a->n_units; k++)
    if (strcmp(a->units[k], b->units[k]) != 0 ||
        (a->n_unit_ids && a->unit_ids[k] != b->unit_ids[k]))
      return 0;
  return 1;
}

static void on_hello(relay *r, const void *id, size_t id_len,
                     Gnmr__Envelope *env) {
  Gnmr__Hello *h = env->hello;
  policy_params defaults, prm;
  policy_params_default(&defaults);
  uint32_t barrier;
  const char *ref = "";
  char why[512];
  int rv = gnmr__validate_hello(h, &defaults, 0, &prm, &barrier, &ref, why,
                                sizeof why);
  if (rv == GNMR_OK && h->observer) {
    /* gnmrd's job has the nodes as its reporters, summed as they are */
    uint32_t per = h->node_ranks > 1 ? h->node_ranks : 1;
    h->reporters = (h->reporters + per - 1) / per;
    h->node_ranks = 0;
    uint8_t *buf;
    size_t len;
    if (gnmr__wire_encode(env, &buf, &len) == GNMR_OK) {
      proxy_hello(r, id, id_len, buf, len);
      free(buf);
    }
    gnmr__wire_free(&env);
    return;
  }
  rjob *j = rv == GNMR_OK ? hello_job(r, id, id_len, h, barrier) : NULL;
  if (rv != GNMR_OK)
    reply_error(r, id, id_len, rv, ref, 0, "%s", why);
  if (j == NULL) {
    gnmr__wire_free(&env);
    return;
  }
  uint32_t li = h->rank - j->first;
  lrank *lr = &j->lr[li];
  if (lr->hello != NULL && !same_units(lr->hello->hello, h)) {
    reply_error(r, id, id_len, GNMR_E_MISMATCH, "units", 0,
                "rank %u of job %.64s joined this relay before with other "
                "units", h->rank, j->name);
    gnmr__wire_free(&env);
    return;
  }
  int had = lr->hello != NULL;
  gnmr__wire_free(&lr->hello);
  lr->hello = env;
  lr->bye = 0;
  if (lr->conn == NULL || lr->conn_len != id_len ||
      memcmp(lr->conn, id, id_len) != 0) {
    char *c = malloc(id_len ? id_len : 1);
    if (c == NULL)
      return;
    memcpy(c, id, id_len);
    free(lr->conn);
    lr->conn = c;
    lr->conn_len = id_len;
  }
  if (!all_joined(j))
    return; /* its Welcome waits for the node's other ranks */
  if (!had || j->names == NULL) {
    int urv = union_build(j, why, sizeof why);
    if (urv != GNMR_OK) {
      reply_error(r, id, id_len, urv, "unit_ids", 0, "%s", why);
      return;
    }
    j->up_state = 0; /* the node joins (again) with every rank's units */
  }
  if (j->up_state == 2)
    welcome_rank(r, j, li); /* a rank back on a joined node */
  else if (j->up_state == 0)
    up_hello(r, j);
}

static void on_bye(relay *r, const void *id, size_t id_len,
                   const Gnmr__Envelope *env) {
  uint32_t li;
  rjob *j = conn_find(r, id, id_len, &li);
  (void)env;
  if (j == NULL)
    return;
  j->lr[li].bye = 1;
  if (expected(j) > 0) {
    /* a step waiting only for the rank that left goes now */
    for (uint32_t k = 0; k < j->n_pend; k++)
      if (j->pend[k].got >= expected(j)) {
        flush_through(r, j, k);
        break;
      }
    return;
  }
  Gnmr__Envelope out = GNMR__ENVELOPE__INIT;
  Gnmr__Bye b = GNMR__BYE__INIT;
  b.job = j->name;
  b.rank = j->node;
  out.body_case = GNMR__ENVELOPE__BODY_BYE;
  out.bye = &b;
  send_up(j->up, &out);
  LOG(INFO, "RELAY-BYE", "job %s: node %u's ranks all left", j->name,
      j->node);
  for (uint32_t i = 0; i < r->n_jobs; i++)
    if (r->jobs[i] == j) {
      job_free(&r->jobs[i]);
      r->jobs[i] = r->jobs[--r->n_jobs];
      break;
    }
}

static void on_local(relay *r) {
  zmq_msg_t idm, m;
  zmq_msg_init(&idm);
  zmq_msg_init(&m);
  while (zmq_msg_recv(&idm, r->local, ZMQ_DONTWAIT) >= 0) {
    if (!zmq_msg_more(&idm) || zmq_msg_recv(&m, r->local, 0) < 0)
      continue;
    if (zmq_msg_more(&m)) { /* not [identity][payload]: dropped whole */
      while (zmq_msg_more(&m) && zmq_msg_recv(&m, r->local, 0) >= 0)
        ;
      continue;
    }
    const void *id = zmq_msg_data(&idm);
    size_t id_len = zmq_msg_size(&idm);
    proxy *px = proxy_find(r, id, id_len);
    if (px != NULL && gnmr__wire_peek_body(zmq_msg_data(&m), zmq_msg_size(
                          &m)) != GNMR__ENVELOPE__BODY_HELLO) {
      /* a passed-through observer's: as it is (a Hello again is read
       * again: its reporters are the nodes at gnmrd) */
      zmq_send(px->up, zmq_msg_data(&m), zmq_msg_size(&m), ZMQ_DONTWAIT);
      continue;
    }
    Gnmr__Envelope *env = NULL;
    char err[256];
    int rv = gnmr__wire_decode(zmq_msg_data(&m), zmq_msg_size(&m), &env, err,
                               sizeof err);
    if (rv != GNMR_OK) {
      reply_error(r, id, id_len, rv, "", 0, "%s", err);
      continue;
    }
    switch (env->body_case) {
    case GNMR__ENVELOPE__BODY_HELLO:
      on_hello(r, id, id_len, env);
      break;
    case GNMR__ENVELOPE__BODY_REPORT:
      on_report(r, id, id_len, env);
      break;
    case GNMR__ENVELOPE__BODY_BYE:
      on_bye(r, id, id_len, env);
      gnmr__wire_free(&env);
      break;
    default:
      reply_error(r, id, id_len, GNMR_E_UNSUPPORTED, "", 0,
                  "a node relay takes Hello, Report and Bye from its node's "
                  "ranks; gnmrctl talks to gnmrd");
      gnmr__wire_free(&env);
    }
  }
  zmq_msg_close(&idm);
  zmq_msg_close(&m);
}

/* Deadlines (a step half the barrier after its first local report goes
 * with what came) and upstream Hellos due; returns the ms to the next. */
static long tick(relay *r) {
  uint64_t now = now_ms();
  long wait = 200;
  for (uint32_t k = 0; k < r->n_jobs; k++) {
    rjob *j = r->jobs[k];
    if (all_joined(j) && j->names != NULL && j->up_state != 2 &&
        now >= j->next_hello)
      up_hello(r, j);
    for (uint32_t i = j->n_pend; i-- > 0;)
      if (now >= j->pend[i].deadline) {
        flush_through(r, j, i);
        break;
      }
    if (j->n_pend > 0 && (long)(j->pend[0].deadline - now) < wait)
      wait = (long)(j->pend[0].deadline - now);
  }
  return wait < 0 ? 0 : wait;
}

static int relay_loop(relay *r) {
  static zmq_pollitem_t items[1 + 2 * RELAY_MAX_JOBS + RELAY_MAX_PROXIES];
  void *socks[2 * RELAY_MAX_JOBS + RELAY_MAX_PROXIES];
  while (!stopping) {
    long wait = tick(r);
    items[0] = (zmq_pollitem_t){r->local, 0, ZMQ_POLLIN, 0};
    uint32_t n = 0;
    for (uint32_t k = 0; k < r->n_jobs; k++) {
      socks[n++] = r->jobs[k]->up;
      socks[n++] = r->jobs[k]->mon;
    }
    for (uint32_t k = 0; k < r->n_proxies; k++)
      socks[n++] = r->proxies[k].up;
    for (uint32_t k = 0; k < n; k++)
      items[1 + k] = (zmq_pollitem_t){socks[k], 0, ZMQ_POLLIN, 0};
    if (zmq_poll(items, (int)(1 + n), wait) < 0) {
      if (errno == EINTR)
        continue;
      LOG(ERROR, "RELAY-POLL", "%s", zmq_strerror(errno));
      return 1;
    }
    /* by socket: a job or a proxy may have gone meanwhile */
    for (uint32_t k = 0; k < n; k++) {
      if (!(items[1 + k].revents & ZMQ_POLLIN))
        continue;
      for (uint32_t i = 0; i < r->n_jobs; i++) {
        if (r->jobs[i]->up == socks[k])
          on_upstream(r, r->jobs[i]);
        else if (r->jobs[i]->mon == socks[k])
          on_monitor(r->jobs[i], r->upstream);
      }
      for (uint32_t i = 0; i < r->n_proxies; i++)
        if (r->proxies[i].up == socks[k]) {
          on_proxy(r, i);
          break;
        }
    }
    if (items[0].revents & ZMQ_POLLIN)
      on_local(r);
  }
  return 0;
}

static const char relay_usage[] =
    "usage: gnmrd --relay-to ENDPOINT --agents ENDPOINT [--log-level LEVEL]\n"
    "             [--curve-server-key KEY|FILE --key-file FILE] [--insecure]\n"
    "  A node relay: the ranks of this node say Hello and report to\n"
    "  --agents (ipc:// or a loopback tcp:// endpoint); the relay joins\n"
    "  each job at the gnmrd of --relay-to as the node's one reporter\n"
    "  (the ranks' Hello.node_ranks says the nodes), sends one Report a\n"
    "  step with each unit's shards summed in rank order, and hands\n"
    "  gnmrd's decisions to every rank of the node (docs/protocol.md,\n"
    "  \"Node relays\"). --curve-server-key (gnmrd's public key) and\n"
    "  --key-file (the relay's key pair, gnmrctl keygen) connect to gnmrd\n"
    "  with CURVE; a non-loopback tcp:// gnmrd without CURVE needs\n"
    "  --insecure.\n";

typedef struct relay_opts {
  const char *up, *agents, *server_key, *key_file;
  int insecure;
} relay_opts;

static int relay_args(int argc, char **argv, relay_opts *o) {
  static const struct option longopts[] = {
      {"relay-to", required_argument, NULL, 'r'},
      {"agents", required_argument, NULL, 'a'},
      {"log-level", required_argument, NULL, 'l'},
      {"curve-server-key", required_argument, NULL, 'k'},
      {"key-file", required_argument, NULL, 'f'},
      {"insecure", no_argument, NULL, 'I'},
      {"help", no_argument, NULL, 'h'},
      {0},
  };
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'r':
      o->up = optarg;
      break;
    case 'a':
      o->agents = optarg;
      break;
    case 'k':
      o->server_key = optarg;
      break;
    case 'f':
      o->key_file = optarg;
      break;
    case 'I':
      o->insecure = 1;
      break;
    case 'l':
      if (gnmr__log_parse_level(optarg, &gnmr__log_level) != GNMR_OK) {
        fprintf(stderr, "gnmrd: --log-level %s: error, warn, info or debug\n",
                optarg);
        return 2;
      }
      break;
    case 'h':
      fputs(relay_usage, stdout);
      return 0;
    default:
      fputs(relay_usage, stderr);
      return 2;
    }
  }
  if (optind != argc || o->up == NULL || o->agents == NULL ||
      (o->server_key == NULL) != (o->key_file == NULL)) {
    if (optind == argc && o->up && o->agents)
      fprintf(stderr, "gnmrd: CURVE needs both --curve-server-key and "
                      "--key-file\n");
    fputs(relay_usage, stderr);
    return 2;
  }
  return -1;
}

static int loopback(const char *ep) {
  return strncmp(ep, "tcp://127.", 10) == 0 ||
         strncmp(ep, "tcp://localhost:", 16) == 0 ||
         strncmp(ep, "tcp://[::1]:", 12) == 0;
}

/* The keys toward gnmrd, and the rule gnmrd itself keeps: no plaintext
 * beyond loopback unless said. */
static int relay_keys(relay *r, const relay_opts *o) {
  char err[300];
  if (o->server_key != NULL) {
    if (gnmr__key_valid(o->server_key))
      memcpy(r->server_key, o->server_key, 41);
    else if (gnmr__key_file_read(o->server_key, r->server_key, NULL, err,
                                 sizeof err) != GNMR_OK) {
      LOG(ERROR, "RELAY-KEYS", "--curve-server-key: %s", err);
      return 1;
    }
    if (gnmr__key_file_read(o->key_file, r->pub, r->sec, err, sizeof err) !=
        GNMR_OK) {
      LOG(ERROR, "RELAY-KEYS", "--key-file: %s", err);
      return 1;
    }
    r->curve = 1;
    return 0;
  }
  for (const char *p = o->up; p != NULL; p = strchr(p, ',')) {
    p += *p == ',';
    if (strncmp(p, "tcp://", 6) == 0 && !loopback(p) && !o->insecure) {
      LOG(ERROR, "RELAY-ENDPOINT", "%s: gnmrd beyond loopback without CURVE "
          "(give --curve-server-key and --key-file, or --insecure)", o->up);
      return 1;
    }
  }
  return 0;
}

/* Binds the node's endpoint as gnmrd binds its own: a safe socket
 * directory, no other process's socket taken over, no plaintext TCP
 * beyond loopback (a relay has no CURVE of its own yet). */
static int relay_bind(relay *r, const char *agents) {
  char err[512];
  if (gnmr__endpoint_check(agents, 1, err, sizeof err) != GNMR_OK ||
      gnmr__endpoint_check(r->upstream, 0, err, sizeof err) != GNMR_OK ||
      gnmr__ipc_dir_check(agents, err, sizeof err) != GNMR_OK ||
      gnmr__ipc_free(agents, err, sizeof err) != GNMR_OK) {
    LOG(ERROR, "RELAY-ENDPOINT", "%s", err);
    return 1;
  }
  if (strncmp(agents, "tcp://", 6) == 0 && !loopback(agents)) {
    LOG(ERROR, "RELAY-ENDPOINT", "%s: a relay serves its node's ranks on "
        "ipc:// or loopback tcp:// only (no CURVE of its own)", agents);
    return 1;
  }
  int zero = 0, mand = 1;
  int64_t max_msg = RELAY_MAX_MSG;
  if ((r->local = zmq_socket(r->ctx, ZMQ_ROUTER)) == NULL ||
      zmq_setsockopt(r->local, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
      zmq_setsockopt(r->local, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg) !=
          0 ||
      zmq_setsockopt(r->local, ZMQ_ROUTER_MANDATORY, &mand, sizeof mand) !=
          0 ||
      zmq_bind(r->local, agents) != 0) {
    LOG(ERROR, "RELAY-ENDPOINT", "%s: %s", agents, zmq_strerror(errno));
    return 1;
  }
  return 0;
}

int relay_main(int argc, char **argv) {
  relay_opts o = {0};
  int code = relay_args(argc, argv, &o);
  if (code >= 0)
    return code;
  static relay r;
  r.upstream = o.up;
  if (relay_keys(&r, &o) != 0)
    return 1;
  if (gethostname(r.host, sizeof r.host) != 0)
    snprintf(r.host, sizeof r.host, "localhost");
  r.host[sizeof r.host - 1] = '\0';
  signal(SIGPIPE, SIG_IGN);
  signal(SIGTERM, on_stop);
  signal(SIGINT, on_stop);
  r.ctx = zmq_ctx_new();
  code = r.ctx == NULL || relay_bind(&r, o.agents) != 0;
  if (code == 0) {
    LOG(INFO, "RELAY-START", "relaying %s to %s%s", o.agents, o.up,
        r.curve ? " (CURVE)" : "");
    code = relay_loop(&r);
  }
  for (uint32_t i = 0; i < r.n_jobs; i++)
    job_free(&r.jobs[i]);
  while (r.n_proxies > 0)
    proxy_drop(&r, 0);
  if (r.local != NULL)
    zmq_close(r.local);
  if (r.ctx != NULL)
    zmq_ctx_term(r.ctx);
  if (code == 0)
    LOG(INFO, "STOP", "relay stopped (%llu partial steps, %llu late "
        "reports)", (unsigned long long)r.partial,
        (unsigned long long)r.late);
  return code;
}
