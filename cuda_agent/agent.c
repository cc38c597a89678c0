/* SPDX-License-Identifier: MIT */
/* agent.c — libgnmr-agent: the training thread reduces and encodes a report
 * and hands the bytes to the I/O thread through an inproc PUSH/PULL pair
 * (never blocking); the I/O thread owns the DEALER socket to gnmrd, joins
 * the job (Hello/Welcome, again after a daemon restart), forwards reports,
 * and publishes each Decision as a route bitmap under a seqlock that
 * readers never wait on. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "gnmr/agent.h"
#include "agent_internal.h"
#include "keys.h"
#include "num.h"
#include "params.h"
#include "text.h"
#include "wire.h"

#define HELLO_RETRY_MS 500   /* Hello sent, no Welcome yet */
#define HELLO_CONNECT_MS 20  /* Hello could not be sent: not connected */
#define HELD_MAX 8           /* reports kept while not joined */
#define HELLO_REFUSED_MS 5000 /* back-off after a refused Hello */
#define IO_POLL_MS 50
#define MAX_MSG (256 << 20)

struct gnmr_agent {
  /* configuration, immutable after open */
  char *endpoint, *job;
  char curve_server[41], curve_public[41], curve_secret[41]; /* "" = off */
  uint32_t rank, reporters, n_units, barrier_ms, fallback_route,
      fallback_after;
  char **names;
  uint32_t *req_ids; /* requested job-wide ids, or NULL */
  int observer;      /* receives decisions, never reports */
  gnmr_params params;

  void *zctx;
  void *push; /* reporters' end of the report pipe (push_mu) */
  pthread_mutex_t push_mu; /* the training and CUDA completion threads */
  void *dealer, *pull, *monitor; /* made in open(), then owned by the I/O
                                    thread */
  char pipe_addr[64];
  pthread_t io;
  atomic_int stop;
  atomic_int joined;

  /* decision, published by the I/O thread under a seqlock */
  atomic_uint_fast64_t seq;
  atomic_uint_fast64_t decided_step;
  _Atomic uint64_t *routes; /* n_units bits */
  size_t n_words;
  pthread_mutex_t mu;       /* for gnmr_agent_wait() only */
  pthread_cond_t cv;

  atomic_uint_fast64_t last_reported; /* written by the training thread */

  /* counters */
  atomic_uint_fast64_t reports_sent, reports_dropped, decisions,
      late_decisions, fallback_routes, errors, hellos, reports_stale;
  atomic_int last_error;
};

void gnmr_params_default(gnmr_params *p) {
  policy_params d;
  policy_params_default(&d);
  policy_params_to_public(&d, p);
}

static void to_policy(const gnmr_params *g, policy_params *p) {
  policy_params_from_public(g, p);
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int check_config(const gnmr_agent_config *c) {
  policy_params p;
  if (c == NULL || c->endpoint == NULL || c->endpoint[0] == '\0' ||
      !gnmr__printable(c->job, 128) || c->reporters == 0 ||
      c->rank >= c->reporters || c->n_units == 0 || c->unit_names == NULL ||
      c->fallback_route > GNMR_ROUTE_HIGH || c->barrier_ms > 600000 ||
      c->observer > 1)
    return GNMR_E_INVAL;
  for (uint32_t i = 0; i < c->n_units; i++)
    if (!gnmr__printable(c->unit_names[i], 256))
      return GNMR_E_INVAL;
  int keys = (c->curve_server_key != NULL) + (c->curve_public_key != NULL) +
             (c->curve_secret_key != NULL);
  if (keys != 0 && (keys != 3 || !gnmr__key_valid(c->curve_server_key) ||
                    !gnmr__key_valid(c->curve_public_key) ||
                    !gnmr__key_valid(c->curve_secret_key)))
    return GNMR_E_INVAL;
  to_policy(&c->params, &p);
  return policy_params_validate(&p, NULL);
}

/* Frees the copied configuration and the route bitmap. */
static void free_config(gnmr_agent *a) {
  for (uint32_t i = 0; i < a->n_units; i++)
    free(a->names[i]);
  free(a->names);
  free(a->req_ids);
  free(a->routes);
  free(a->endpoint);
  free(a->job);
}

/* ---- I/O thread ----------------------------------------------------------- */

/* A report waiting for the daemon's Welcome. */
typedef struct held_msg {
  void *buf;
  size_t len;
} held_msg;

typedef struct io_state {
  void *dealer, *pull;
  void *monitor; /* PAIR receiving the DEALER's connect/disconnect events */
  held_msg held[HELD_MAX]; /* oldest first */
  int n_held;
  uint64_t next_hello;
  int welcomed;        /* a Welcome came before: the next one is a re-join */
  uint32_t *ids;       /* job-wide id of each local unit (Welcome) */
  uint32_t *by_id;     /* local indices sorted by job-wide id */
  int have_ids;
} io_state;

static void send_hello(gnmr_agent *a, io_state *io) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Hello h = GNMR__HELLO__INIT;
  Gnmr__Params wp;
  policy_params pp;
  uint8_t *buf;
  size_t len;
  to_policy(&a->params, &pp);
  gnmr__params_to_wire(&pp, &wp);
  h.protocol = GNMR_PROTOCOL_VERSION;
  h.job = a->job;
  h.rank = a->rank;
  h.reporters = a->reporters;
  h.n_units = a->n_units;
  h.units = a->names;
  if (a->req_ids != NULL) {
    h.n_unit_ids = a->n_units;
    h.unit_ids = a->req_ids;
  }
  h.params = &wp;
  h.barrier_ms = a->barrier_ms;
  h.observer = a->observer;
  env.body_case = GNMR__ENVELOPE__BODY_HELLO;
  env.hello = &h;
  io->next_hello = now_ms() + HELLO_CONNECT_MS;
  if (gnmr__wire_encode(&env, &buf, &len) != GNMR_OK)
    return;
  if (zmq_send(io->dealer, buf, len, ZMQ_DONTWAIT) >= 0) {
    atomic_fetch_add(&a->hellos, 1);
    io->next_hello = now_ms() + HELLO_RETRY_MS;
  }
  free(buf);
}

/* Keeps a report until the daemon welcomes us; the oldest goes first when
 * the hold is full (counted as dropped). Takes ownership of buf. */
static void hold(gnmr_agent *a, io_state *io, void *buf, size_t len) {
  if (io->n_held == HELD_MAX) {
    free(io->held[0].buf);
    memmove(&io->held[0], &io->held[1], (HELD_MAX - 1) * sizeof io->held[0]);
    io->n_held--;
    atomic_fetch_add(&a->reports_dropped, 1);
  }
  io->held[io->n_held++] = (held_msg){buf, len};
}

static void send_report(gnmr_agent *a, io_state *io, const void *buf,
                        size_t len) {
  if (zmq_send(io->dealer, buf, len, ZMQ_DONTWAIT) < 0)
    atomic_fetch_add(&a->reports_dropped, 1);
  (void)io;
}

/* The step of a held report (0 when it does not decode). */
static uint64_t held_step(const held_msg *h) {
  Gnmr__Envelope *env;
  uint64_t step = 0;
  if (gnmr__wire_decode(h->buf, h->len, &env, NULL, 0) != GNMR_OK)
    return 0;
  if (env->body_case == GNMR__ENVELOPE__BODY_REPORT)
    step = env->report->step;
  gnmr__wire_free(&env);
  return step;
}

/* On a re-join, drops the held reports that are stale: made while the link
 * was down, for steps the job has decided without this rank since (at or
 * below Welcome.last_step). Sent, they would only be late. An agent's
 * steps only grow, so none of them is a rewind: a restart from a
 * checkpoint is a new agent, whose first Welcome drops nothing. */
static void drop_stale(gnmr_agent *a, io_state *io, uint64_t last_step) {
  int n = 0;
  for (int i = 0; i < io->n_held; i++) {
    if (held_step(&io->held[i]) <= last_step) {
      free(io->held[i].buf);
      atomic_fetch_add(&a->reports_stale, 1);
      continue;
    }
    io->held[n++] = io->held[i];
  }
  io->n_held = n;
}

static void flush_held(gnmr_agent *a, io_state *io) {
  for (int i = 0; i < io->n_held; i++) {
    send_report(a, io, io->held[i].buf, io->held[i].len);
    free(io->held[i].buf);
  }
  io->n_held = 0;
}

/* Orders local indices by job-wide id; ctx is the ids array. Uses
 * qsort_r: several agents' I/O threads may sort at once in one process. */
static int by_id_cmp(const void *x, const void *y, void *ctx) {
  const uint32_t *ids = ctx;
  uint32_t a = ids[*(const uint32_t *)x], b = ids[*(const uint32_t *)y];
  return a < b ? -1 : a > b;
}

static void on_welcome(gnmr_agent *a, io_state *io, const Gnmr__Welcome *w) {
  if (w->n_unit_ids != a->n_units)
    return; /* not ours: ignore */
  for (uint32_t i = 0; i < a->n_units; i++) {
    io->ids[i] = w->unit_ids[i];
    io->by_id[i] = i;
  }
  qsort_r(io->by_id, a->n_units, sizeof *io->by_id, by_id_cmp, io->ids);
  io->have_ids = 1;
  if (io->welcomed)
    drop_stale(a, io, w->last_step);
  io->welcomed = 1;
  atomic_store(&a->joined, 1);
  flush_held(a, io);
}

/* Marks local units whose job-wide id is active; publishes under seqlock. */
static void on_decision(gnmr_agent *a, io_state *io, const Gnmr__Decision *d) {
  if (!io->have_ids || d->step <= atomic_load(&a->decided_step))
    return;
  uint64_t words[a->n_words];
  memset(words, 0, sizeof words);
  for (size_t k = 0; k < d->n_active; k++) {
    uint32_t id = d->active[k], lo = 0, hi = a->n_units;
    while (lo < hi) { /* binary search in by_id */
      uint32_t mid = lo + (hi - lo) / 2;
      if (io->ids[io->by_id[mid]] < id)
        lo = mid + 1;
      else
        hi = mid;
    }
    /* several local units can never share an id, but be exact anyway */
    for (; lo < a->n_units && io->ids[io->by_id[lo]] == id; lo++) {
      uint32_t u = io->by_id[lo];
      words[u / 64] |= UINT64_C(1) << (u % 64);
    }
  }
  atomic_fetch_add_explicit(&a->seq, 1, memory_order_acq_rel); /* odd */
  for (size_t i = 0; i < a->n_words; i++)
    atomic_store_explicit(&a->routes[i], words[i], memory_order_relaxed);
  atomic_store_explicit(&a->decided_step, d->step, memory_order_relaxed);
  atomic_fetch_add_explicit(&a->seq, 1, memory_order_release); /* even */
  atomic_fetch_add(&a->decisions, 1);
  pthread_mutex_lock(&a->mu);
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
}

static void on_message(gnmr_agent *a, io_state *io, const void *buf,
                       size_t len) {
  Gnmr__Envelope *env;
  if (gnmr__wire_decode(buf, len, &env, NULL, 0) != GNMR_OK)
    return;
  switch (env->body_case) {
  case GNMR__ENVELOPE__BODY_WELCOME:
    on_welcome(a, io, env->welcome);
    break;
  case GNMR__ENVELOPE__BODY_DECISION:
    on_decision(a, io, env->decision);
    break;
  case GNMR__ENVELOPE__BODY_ERROR:
    atomic_fetch_add(&a->errors, 1);
    atomic_store(&a->last_error, env->error->code);
    if (env->error->code == GNMR_E_NOJOB) {
      /* the daemon does not know us (restarted): join again now */
      atomic_store(&a->joined, 0);
      io->next_hello = 0;
    } else if (!atomic_load(&a->joined)) {
      /* our Hello was refused (mismatch, bad config): retry slowly */
      io->next_hello = now_ms() + HELLO_REFUSED_MS;
    }
    break;
  default:
    break;
  }
  gnmr__wire_free(&env);
}

/* Reads one monitor event (two frames): on a disconnect the daemon may be
 * gone, so reports are held and Hello is sent again on reconnection. */
static void on_monitor(gnmr_agent *a, io_state *io) {
  zmq_msg_t m;
  zmq_msg_init(&m);
  while (zmq_msg_recv(&m, io->monitor, ZMQ_DONTWAIT) >= 0) {
    uint16_t ev = 0;
    if (zmq_msg_size(&m) >= 2)
      memcpy(&ev, zmq_msg_data(&m), sizeof ev);
    if (zmq_msg_more(&m))
      zmq_msg_recv(&m, io->monitor, 0); /* the endpoint frame */
    if (ev == ZMQ_EVENT_DISCONNECTED) {
      atomic_store(&a->joined, 0);
      io->next_hello = 0;
    } else if (ev == ZMQ_EVENT_CONNECTED && !atomic_load(&a->joined)) {
      io->next_hello = 0;
    }
  }
  zmq_msg_close(&m);
}

static void *io_main(void *arg) {
  gnmr_agent *a = arg;
  io_state io = {0};
  io.dealer = a->dealer;
  io.pull = a->pull;
  io.monitor = a->monitor;
  io.ids = calloc(a->n_units, sizeof *io.ids);
  io.by_id = calloc(a->n_units, sizeof *io.by_id);
  if (!io.ids || !io.by_id)
    goto out;

  zmq_msg_t msg;
  zmq_msg_init(&msg);
  while (!atomic_load(&a->stop)) {
    if (!atomic_load(&a->joined) && now_ms() >= io.next_hello)
      send_hello(a, &io);
    zmq_pollitem_t items[3] = {{io.dealer, 0, ZMQ_POLLIN, 0},
                               {io.pull, 0, ZMQ_POLLIN, 0},
                               {io.monitor, 0, ZMQ_POLLIN, 0}};
    if (zmq_poll(items, 3, IO_POLL_MS) < 0 && zmq_errno() != EINTR)
      break;
    if (items[2].revents & ZMQ_POLLIN)
      on_monitor(a, &io);
    while (zmq_msg_recv(&msg, io.pull, ZMQ_DONTWAIT) >= 0) {
      size_t n = zmq_msg_size(&msg);
      void *copy;
      if (atomic_load(&a->joined))
        send_report(a, &io, zmq_msg_data(&msg), n);
      else if ((copy = malloc(n ? n : 1)) != NULL) {
        memcpy(copy, zmq_msg_data(&msg), n);
        hold(a, &io, copy, n);
      } else
        atomic_fetch_add(&a->reports_dropped, 1);
    }
    while (zmq_msg_recv(&msg, io.dealer, ZMQ_DONTWAIT) >= 0)
      on_message(a, &io, zmq_msg_data(&msg), zmq_msg_size(&msg));
  }
  zmq_msg_close(&msg);

  /* Bye, best effort */
  {
    Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
    Gnmr__Bye bye = GNMR__BYE__INIT;
    uint8_t *buf;
    size_t len;
    bye.job = a->job;
    bye.rank = a->rank;
    env.body_case = GNMR__ENVELOPE__BODY_BYE;
    env.bye = &bye;
    if (atomic_load(&a->joined) &&
        gnmr__wire_encode(&env, &buf, &len) == GNMR_OK) {
      zmq_send(io.dealer, buf, len, ZMQ_DONTWAIT);
      free(buf);
    }
  }
out:
  for (int i = 0; i < io.n_held; i++)
    free(io.held[i].buf);
  zmq_close(io.monitor);
  zmq_close(io.dealer);
  zmq_close(io.pull);
  free(io.ids);
  free(io.by_id);
  return NULL;
}

/* ---- public API ------------------------------------------------------------- */

int gnmr_agent_config_from_env(gnmr_agent_config *cfg, const char **bad_var) {
  static const struct {
    const char *var;
    size_t off;
    int kind; /* 0 string, 1 u32, 2 u64, 3 double, 4 route */
  } vars[] = {
      {"GNMR_ENDPOINT", offsetof(gnmr_agent_config, endpoint), 0},
      {"GNMR_JOB", offsetof(gnmr_agent_config, job), 0},
      {"GNMR_RANK", offsetof(gnmr_agent_config, rank), 1},
      {"GNMR_REPORTERS", offsetof(gnmr_agent_config, reporters), 1},
      {"GNMR_BARRIER_MS", offsetof(gnmr_agent_config, barrier_ms), 1},
      {"GNMR_FALLBACK_ROUTE", offsetof(gnmr_agent_config, fallback_route), 4},
      {"GNMR_FALLBACK_AFTER", offsetof(gnmr_agent_config, fallback_after), 1},
#define ENV_KIND_THRESHOLD 3
#define ENV_KIND_WINDOW 1
#define ENV_KIND_U32 1
#define ENV_KIND_U64 2
#define GNMR__PARAM_ENV(name, ctype, kind, opt, env, def, inh)               \
  {env, offsetof(gnmr_agent_config, params.name), ENV_KIND_##kind},
      GNMR_PARAMS_MAP(GNMR__PARAM_ENV)
#undef GNMR__PARAM_ENV
      {"GNMR_OBSERVER", offsetof(gnmr_agent_config, observer), 1},
      {"GNMR_CURVE_SERVER_KEY", offsetof(gnmr_agent_config, curve_server_key),
       0},
      {"GNMR_CURVE_PUBLIC_KEY", offsetof(gnmr_agent_config, curve_public_key),
       0},
      {"GNMR_CURVE_SECRET_KEY", offsetof(gnmr_agent_config, curve_secret_key),
       0},
  };
  gnmr_agent_config c;
  if (cfg == NULL)
    return GNMR_E_INVAL;
  c = *cfg;
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i].var);
    char *field = (char *)&c + vars[i].off;
    uint64_t u;
    double dv;
    int ok = 1;
    if (v == NULL)
      continue;
    switch (vars[i].kind) {
    case 0:
      memcpy(field, &v, sizeof v);
      break;
    case 1:
      ok = gnmr__parse_u64(v, UINT32_MAX, &u) == 0;
      if (ok) {
        uint32_t u32 = (uint32_t)u;
        memcpy(field, &u32, sizeof u32);
      }
      break;
    case 2:
      ok = gnmr__parse_u64(v, UINT64_MAX, &u) == 0;
      if (ok)
        memcpy(field, &u, sizeof u);
      break;
    case 3:
      ok = gnmr__parse_double(v, 0, &dv) == 0 && dv > 0;
      if (ok)
        memcpy(field, &dv, sizeof dv);
      break;
    default: {
      uint32_t route = strcmp(v, "high") == 0  ? GNMR_ROUTE_HIGH
                       : strcmp(v, "low") == 0 ? GNMR_ROUTE_LOW
                                               : UINT32_MAX;
      ok = route != UINT32_MAX;
      if (ok)
        memcpy(field, &route, sizeof route);
    }
    }
    if (!ok) {
      if (bad_var != NULL)
        *bad_var = vars[i].var;
      return GNMR_E_INVAL;
    }
  }
  *cfg = c;
  if (bad_var != NULL)
    *bad_var = NULL;
  return GNMR_OK;
}

/* One ZeroMQ context per process, shared by its agents (several ranks in
 * one process would otherwise start one ZeroMQ I/O thread each). */
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static void *shared_ctx;
static unsigned shared_refs;

static void *ctx_acquire(void) {
  pthread_mutex_lock(&ctx_mu);
  if (shared_ctx == NULL)
    shared_ctx = zmq_ctx_new();
  void *c = shared_ctx;
  if (c != NULL)
    shared_refs++;
  pthread_mutex_unlock(&ctx_mu);
  return c;
}

/* Terminates the context with its last agent (all sockets closed). */
static void ctx_release(void) {
  pthread_mutex_lock(&ctx_mu);
  if (--shared_refs == 0) {
    zmq_ctx_term(shared_ctx);
    shared_ctx = NULL;
  }
  pthread_mutex_unlock(&ctx_mu);
}

/* Creates the DEALER (to gnmrd) and the PULL end of the report pipe. */
static int open_io_sockets(gnmr_agent *a) {
  int zero = 0, one = 1, hb_ivl = 1000, hb_tmo = 5000, recon = 100;
  int64_t maxmsg = MAX_MSG;
  a->dealer = zmq_socket(a->zctx, ZMQ_DEALER);
  a->pull = zmq_socket(a->zctx, ZMQ_PULL);
  if (a->dealer == NULL || a->pull == NULL)
    goto err;
  zmq_setsockopt(a->dealer, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(a->dealer, ZMQ_IMMEDIATE, &one, sizeof one);
  zmq_setsockopt(a->dealer, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl);
  zmq_setsockopt(a->dealer, ZMQ_HEARTBEAT_TIMEOUT, &hb_tmo, sizeof hb_tmo);
  zmq_setsockopt(a->dealer, ZMQ_RECONNECT_IVL, &recon, sizeof recon);
  zmq_setsockopt(a->dealer, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
  if (a->curve_server[0] != '\0' &&
      (zmq_setsockopt(a->dealer, ZMQ_CURVE_SERVERKEY, a->curve_server, 41) ||
       zmq_setsockopt(a->dealer, ZMQ_CURVE_PUBLICKEY, a->curve_public, 41) ||
       zmq_setsockopt(a->dealer, ZMQ_CURVE_SECRETKEY, a->curve_secret, 41)))
    goto err;
  zmq_setsockopt(a->pull, ZMQ_LINGER, &zero, sizeof zero);
  char mon[80];
  snprintf(mon, sizeof mon, "inproc://gnmr-monitor-%p", (void *)a);
  if (zmq_socket_monitor(a->dealer, mon,
                         ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0 ||
      (a->monitor = zmq_socket(a->zctx, ZMQ_PAIR)) == NULL)
    goto err;
  zmq_setsockopt(a->monitor, ZMQ_LINGER, &zero, sizeof zero);
  if (zmq_connect(a->monitor, mon) != 0 ||
      zmq_connect(a->pull, a->pipe_addr) != 0 ||
      zmq_connect(a->dealer, a->endpoint) != 0)
    goto err;
  return GNMR_OK;
err:
  if (a->monitor)
    zmq_close(a->monitor);
  if (a->dealer)
    zmq_close(a->dealer);
  if (a->pull)
    zmq_close(a->pull);
  a->monitor = a->dealer = a->pull = NULL;
  return GNMR_E_IO;
}

int gnmr_agent_open(const gnmr_agent_config *cfg, gnmr_agent **out) {
  static atomic_uint pipe_counter;
  int rv = GNMR_E_NOMEM, zero = 0;
  gnmr_agent *a;
  if (out == NULL)
    return GNMR_E_INVAL;
  *out = NULL;
  if ((rv = check_config(cfg)) != GNMR_OK)
    return GNMR_E_INVAL;
  if ((a = calloc(1, sizeof *a)) == NULL)
    return GNMR_E_NOMEM;
  rv = GNMR_E_NOMEM;
  a->rank = cfg->rank;
  a->reporters = cfg->reporters;
  a->n_units = cfg->n_units;
  a->params = cfg->params;
  a->barrier_ms = cfg->barrier_ms ? cfg->barrier_ms : 1000;
  a->fallback_route = cfg->fallback_route;
  a->fallback_after = cfg->fallback_after ? cfg->fallback_after : 3;
  a->n_words = (cfg->n_units + 63) / 64;
  a->observer = cfg->observer != 0;
  if (cfg->curve_server_key != NULL) {
    memcpy(a->curve_server, cfg->curve_server_key, 41);
    memcpy(a->curve_public, cfg->curve_public_key, 41);
    memcpy(a->curve_secret, cfg->curve_secret_key, 41);
  }
  a->endpoint = strdup(cfg->endpoint);
  a->job = strdup(cfg->job);
  a->names = calloc(cfg->n_units, sizeof *a->names);
  a->routes = calloc(a->n_words, sizeof *a->routes);
  if (!a->endpoint || !a->job || !a->names || !a->routes)
    goto err_free;
  for (uint32_t i = 0; i < cfg->n_units; i++)
    if ((a->names[i] = strdup(cfg->unit_names[i])) == NULL)
      goto err_free;
  if (cfg->unit_ids != NULL) {
    if ((a->req_ids = malloc(cfg->n_units * sizeof *a->req_ids)) == NULL)
      goto err_free;
    memcpy(a->req_ids, cfg->unit_ids, cfg->n_units * sizeof *a->req_ids);
  }
  pthread_mutex_init(&a->mu, NULL);
  pthread_mutex_init(&a->push_mu, NULL);
  {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->cv, &ca);
    pthread_condattr_destroy(&ca);
  }
  rv = GNMR_E_IO;
  if ((a->zctx = ctx_acquire()) == NULL)
    goto err_sync;
  snprintf(a->pipe_addr, sizeof a->pipe_addr, "inproc://gnmr-agent-%p-%u",
           (void *)a, atomic_fetch_add(&pipe_counter, 1));
  if ((a->push = zmq_socket(a->zctx, ZMQ_PUSH)) == NULL)
    goto err_ctx;
  zmq_setsockopt(a->push, ZMQ_LINGER, &zero, sizeof zero);
  if (zmq_bind(a->push, a->pipe_addr) != 0)
    goto err_push;
  /* The I/O thread's sockets are made and connected here, so that a report
   * queued right after open() already has its pipe; pthread_create() is the
   * full barrier ZeroMQ asks for when a socket changes threads. */
  if (open_io_sockets(a) != GNMR_OK)
    goto err_push;
  if (pthread_create(&a->io, NULL, io_main, a) != 0)
    goto err_io;
  *out = a;
  return GNMR_OK;
err_io:
  zmq_close(a->monitor);
  zmq_close(a->dealer);
  zmq_close(a->pull);
err_push:
  zmq_close(a->push);
err_ctx:
  ctx_release();
err_sync:
  pthread_mutex_destroy(&a->mu);
  pthread_mutex_destroy(&a->push_mu);
  pthread_cond_destroy(&a->cv);
err_free:
  if (a->names)
    for (uint32_t i = 0; i < cfg->n_units; i++)
      free(a->names[i]);
  free(a->names);
  free(a->req_ids);
  free(a->routes);
  free(a->endpoint);
  free(a->job);
  free(a);
  return rv;
}

void gnmr_agent_close(gnmr_agent **pa) {
  if (pa == NULL || *pa == NULL)
    return;
  gnmr_agent *a = *pa;
  atomic_store(&a->stop, 1);
  pthread_join(a->io, NULL);
  zmq_close(a->push);
  ctx_release();
  pthread_mutex_destroy(&a->mu);
  pthread_mutex_destroy(&a->push_mu);
  pthread_cond_destroy(&a->cv);
  free_config(a);
  free(a);
  *pa = NULL;
}

/* last_reported only grows: CUDA results arrive after later steps began. */
static void mark_reported(gnmr_agent *a, uint64_t step) {
  uint_fast64_t cur = atomic_load(&a->last_reported);
  while (cur < step &&
         !atomic_compare_exchange_weak(&a->last_reported, &cur, step))
    ;
}

/* Encodes and queues a report; the arrays are n_units long. Any thread. */
static int queue_report(gnmr_agent *a, uint64_t step, double *sumsq,
                        uint64_t *nonfinite, protobuf_c_boolean *nr,
                        int any_nonfinite, int any_nr) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  if (a->observer) { /* another replica reports this shard */
    mark_reported(a, step);
    return GNMR_OK;
  }
  Gnmr__Report r = GNMR__REPORT__INIT;
  uint8_t *buf;
  size_t len;
  r.job = a->job;
  r.rank = a->rank;
  r.step = step;
  r.n_sumsq = a->n_units;
  r.sumsq = sumsq;
  r.n_nonfinite = any_nonfinite ? a->n_units : 0;
  r.nonfinite = nonfinite;
  r.n_not_reported = any_nr ? a->n_units : 0;
  r.not_reported = nr;
  env.body_case = GNMR__ENVELOPE__BODY_REPORT;
  env.report = &r;
  if (gnmr__wire_encode(&env, &buf, &len) != GNMR_OK)
    return GNMR_E_NOMEM;
  mark_reported(a, step);
  pthread_mutex_lock(&a->push_mu);
  int sent = zmq_send(a->push, buf, len, ZMQ_DONTWAIT) >= 0;
  pthread_mutex_unlock(&a->push_mu);
  atomic_fetch_add(sent ? &a->reports_sent : &a->reports_dropped, 1);
  free(buf);
  return GNMR_OK;
}

/* Queues one step's per-unit values. Unit i is not reported when
 * not_reported[i] != 0 or seen[i] == 0 (either array may be NULL). */
static int queue_values(gnmr_agent *a, uint64_t step, const double *sumsq,
                        const uint64_t *nonfinite,
                        const uint8_t *not_reported, const uint8_t *seen) {
  double *s = malloc(a->n_units * sizeof *s);
  uint64_t *nf = calloc(a->n_units, sizeof *nf);
  protobuf_c_boolean *nr = calloc(a->n_units, sizeof *nr);
  int any_nf = 0, any_nr = 0, rv = GNMR_E_NOMEM;
  if (s && nf && nr) {
    for (uint32_t i = 0; i < a->n_units; i++) {
      int skip = (not_reported && not_reported[i]) || (seen && !seen[i]);
      s[i] = skip ? 0 : sumsq[i];
      nf[i] = skip || !nonfinite ? 0 : nonfinite[i];
      nr[i] = skip;
      any_nf |= nf[i] != 0;
      any_nr |= skip;
    }
    rv = queue_report(a, step, s, nf, nr, any_nf, any_nr);
  }
  free(s);
  free(nf);
  free(nr);
  return rv;
}

int gnmr_agent_report_sums(gnmr_agent *a, uint64_t step, const double *sumsq,
                           const uint64_t *nonfinite,
                           const uint8_t *not_reported) {
  if (a == NULL || sumsq == NULL || step == 0 ||
      step <= atomic_load(&a->last_reported))
    return GNMR_E_INVAL;
  for (uint32_t i = 0; i < a->n_units; i++)
    if (!(sumsq[i] >= 0) && !(not_reported && not_reported[i]))
      return GNMR_E_INVAL; /* negative or NaN: use nonfinite counts */
  return queue_values(a, step, sumsq, nonfinite, not_reported, NULL);
}

int gnmr_agent_report(gnmr_agent *a, uint64_t step, const gnmr_tensor *t,
                      size_t n) {
  if (a == NULL || step == 0 || step <= atomic_load(&a->last_reported))
    return GNMR_E_INVAL;
  if (a->observer) { /* no reduction: another replica reports */
    mark_reported(a, step);
    return GNMR_OK;
  }
  double *s = calloc(a->n_units, sizeof *s);
  uint64_t *nf = calloc(a->n_units, sizeof *nf);
  uint8_t *seen = calloc(a->n_units, 1);
  int rv = GNMR_E_NOMEM;
  if (s && nf && seen) {
    rv = gnmr_reduce_cpu(t, n, a->n_units, s, nf, seen);
    if (rv == GNMR_OK)
      rv = queue_values(a, step, s, nf, NULL, seen);
  }
  free(s);
  free(nf);
  free(seen);
  return rv;
}

int gnmr_agent_wait(gnmr_agent *a, uint64_t step, int timeout_ms) {
  if (a == NULL)
    return GNMR_E_INVAL;
  if (atomic_load(&a->decided_step) >= step)
    return GNMR_OK;
  struct timespec dl;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  int64_t ns = dl.tv_nsec + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) *
                                1000000;
  dl.tv_sec += ns / 1000000000;
  dl.tv_nsec = ns % 1000000000;
  int rv = GNMR_OK;
  pthread_mutex_lock(&a->mu);
  while (atomic_load(&a->decided_step) < step) {
    if (pthread_cond_timedwait(&a->cv, &a->mu, &dl) == ETIMEDOUT) {
      if (atomic_load(&a->decided_step) < step)
        rv = GNMR_E_TIMEDOUT;
      break;
    }
  }
  pthread_mutex_unlock(&a->mu);
  if (rv == GNMR_E_TIMEDOUT)
    atomic_fetch_add(&a->late_decisions, 1);
  return rv;
}

int gnmr_agent_route(gnmr_agent *a, uint32_t unit) {
  if (a == NULL)
    return GNMR_ROUTE_LOW;
  for (;;) {
    uint64_t s0 = atomic_load_explicit(&a->seq, memory_order_acquire);
    if (s0 & 1)
      continue; /* a writer is publishing */
    uint64_t d = atomic_load_explicit(&a->decided_step, memory_order_relaxed);
    uint64_t w = unit < a->n_units
                     ? atomic_load_explicit(&a->routes[unit / 64],
                                            memory_order_relaxed)
                     : 0;
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&a->seq, memory_order_relaxed) != s0)
      continue;
    if (unit >= a->n_units || d == 0 ||
        atomic_load(&a->last_reported) > d + a->fallback_after) {
      atomic_fetch_add(&a->fallback_routes, 1);
      return (int)a->fallback_route;
    }
    return (w >> (unit % 64)) & 1 ? GNMR_ROUTE_HIGH : GNMR_ROUTE_LOW;
  }
}

uint64_t gnmr_agent_decided_step(const gnmr_agent *a) {
  return a ? atomic_load(&a->decided_step) : 0;
}

int gnmr_agent_joined(const gnmr_agent *a) {
  return a ? atomic_load(&a->joined) : 0;
}

int gnmr_agent_stats_get(const gnmr_agent *a, gnmr_agent_stats *o) {
  if (a == NULL || o == NULL)
    return GNMR_E_INVAL;
  o->reports_sent = atomic_load(&a->reports_sent);
  o->reports_dropped = atomic_load(&a->reports_dropped);
  o->decisions = atomic_load(&a->decisions);
  o->late_decisions = atomic_load(&a->late_decisions);
  o->fallback_routes = atomic_load(&a->fallback_routes);
  o->errors = atomic_load(&a->errors);
  o->hellos = atomic_load(&a->hellos);
  o->last_error = atomic_load(&a->last_error);
  o->reports_stale = atomic_load(&a->reports_stale);
  return GNMR_OK;
}

/* --- for the CUDA backend (cuda_backend.h) ---------------------------------- */

uint32_t gnmr__agent_n_units(const gnmr_agent *a) { return a->n_units; }

int gnmr__agent_begin_step(gnmr_agent *a, uint64_t step) {
  if (step == 0 || step <= atomic_load(&a->last_reported))
    return GNMR_E_INVAL;
  mark_reported(a, step);
  return a->observer ? 1 : GNMR_OK;
}

int gnmr__agent_queue_seen(gnmr_agent *a, uint64_t step, const double *sumsq,
                           const uint64_t *nonfinite, const uint8_t *seen) {
  return queue_values(a, step, sumsq, nonfinite, NULL, seen);
}
