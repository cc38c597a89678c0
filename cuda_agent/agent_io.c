/* SPDX-License-Identifier: MIT */
/* agent_io.c — the agent's I/O thread: it owns the DEALER socket to gnmrd,
 * joins the job (Hello/Welcome, again after a daemon restart or a
 * reconnection), holds reports while not joined, forwards reports from the
 * inproc pipe, and publishes each Decision as a route bitmap under a
 * seqlock that readers never wait on. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "agent_priv.h"
#include "gnmr/error.h"
#include "ipc.h"
#include "text.h"
#include "validate.h"

/* How long a closing agent lets its Bye out (gnmr_agent_close). */
#define BYE_LINGER_MS 500

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
  uint32_t hello_retry;  /* ms until the next unanswered Hello; 0: none */
  int welcomed;        /* a Welcome came before: the next one is a re-join */
  uint32_t *ids;       /* job-wide id of each local unit (Welcome) */
  uint32_t *by_id;     /* local indices sorted by job-wide id */
  int have_ids;
  /* The last report forwarded, until its decision comes: a gnmrd that
   * dies with it (killed, or its standby taking over) took it along, and
   * on the disconnection it goes back to the hold for the next one. A
   * reference to the same buffer (zmq_msg_copy), not a copy. */
  zmq_msg_t inflight;
  int have_inflight;
  uint64_t inflight_step;
  /* the socket directory failed the peer check (another user's, say):
   * no Hello goes and nothing that comes is read, until it passes */
  int untrusted;
  /* The decisions received past gnmrd's durable mark, oldest first (their
   * envelopes, as decoded): sent back in every Hello, so that a gnmrd
   * killed before committing them stores them after its restart. */
  Gnmr__Envelope *hdec[GNMR_MAX_HELD];
  int n_hdec;
  /* the newest leadership term seen in a Welcome or a Decision: a
   * decision of an older term comes from a gnmrd that has been replaced
   * (docs/reliability.md, "One leader at a time") */
  uint64_t term;
} io_state;

static int before(uint32_t pa, uint64_t sa, uint32_t pb, uint64_t sb) {
  return pa < pb || (pa == pb && sa < sb);
}

/* Forgets the held decisions that gnmrd committed (at or before d's
 * durable mark) or that are of another run, then holds d's envelope when
 * it comes after the newest held. Returns whether env was kept. */
static int hold_decision(io_state *io, Gnmr__Envelope *env) {
  const Gnmr__Decision *d = env->decision;
  if (d->run == 0 || d->pass == 0)
    return 0; /* a gnmrd that predates held decisions */
  int n = 0;
  for (int i = 0; i < io->n_hdec; i++) {
    const Gnmr__Decision *h = io->hdec[i]->decision;
    if (h->run != d->run ||
        !before(d->durable_pass, d->durable_step, h->pass, h->step)) {
      gnmr__wire_free(&io->hdec[i]);
      continue;
    }
    io->hdec[n++] = io->hdec[i];
  }
  io->n_hdec = n;
  if (n > 0 && !before(io->hdec[n - 1]->decision->pass,
                       io->hdec[n - 1]->decision->step, d->pass, d->step))
    return 0;
  if (io->n_hdec == (int)GNMR_MAX_HELD) { /* the oldest goes */
    gnmr__wire_free(&io->hdec[0]);
    memmove(&io->hdec[0], &io->hdec[1], (GNMR_MAX_HELD - 1) *
                                            sizeof io->hdec[0]);
    io->n_hdec--;
  }
  /* gnmrd needs the step's active set, not why: the scores stay here */
  env->decision->n_risky = env->decision->n_g = env->decision->n_d =
      env->decision->n_s = env->decision->n_bound = 0;
  io->hdec[io->n_hdec++] = env;
  return 1;
}

/* Whether the endpoints' socket directories are still safe to talk
 * through: another local user who made a directory where gnmrd's would be
 * could serve there as gnmrd, get this rank's Hello and send it decisions.
 * Checked before every Hello, so that a directory made after the agent
 * opened is refused too; the reason is the agent's last error (DENIED). */
static int endpoints_trusted(gnmr_agent *a, io_state *io) {
  char why[700];
  if (gnmr__ipc_dir_check_peer(a->endpoint, why, sizeof why) !=
      GNMR_E_INVAL) {
    io->untrusted = 0;
    return 1;
  }
  if (!io->untrusted) {
    atomic_fetch_add(&a->errors, 1);
    atomic_store(&a->last_error, GNMR_E_DENIED);
    pthread_mutex_lock(&a->err_mu);
    snprintf(a->last_error_text, sizeof a->last_error_text, "%.*s",
             (int)sizeof a->last_error_text - 1, why);
    pthread_mutex_unlock(&a->err_mu);
  }
  io->untrusted = 1;
  io->next_hello = gnmr__now_ms() + HELLO_REFUSED_MS;
  return 0;
}

static void send_hello(gnmr_agent *a, io_state *io) {
  if (!endpoints_trusted(a, io))
    return;
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Hello h = GNMR__HELLO__INIT;
  Gnmr__Params wp;
  policy_params pp;
  uint8_t *buf;
  size_t len;
  policy_params_from_public(&a->params, &pp);
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
  h.instance = a->instance;
  /* the training side's word is for its first join: a re-join (a gnmrd
   * restarted under the run) continues what it joined */
  h.start = io->welcomed ? GNMR_START_ANY : a->start;
  h.node_ranks = a->node_ranks;
  /* the newest held decisions whose active sets fit GNMR_MAX_HELD_IDS
   * (gnmrd refuses a Hello with more); an observer's are never history,
   * and gnmrd refuses them */
  int from = io->n_hdec;
  uint64_t ids = 0;
  while (from > 0 && !a->observer &&
         ids + io->hdec[from - 1]->decision->n_active <= GNMR_MAX_HELD_IDS)
    ids += io->hdec[--from]->decision->n_active;
  h.n_held = (size_t)(io->n_hdec - from);
  Gnmr__Decision *held[GNMR_MAX_HELD];
  for (int i = from; i < io->n_hdec; i++)
    held[i - from] = io->hdec[i]->decision;
  h.held = held;
  env.body_case = GNMR__ENVELOPE__BODY_HELLO;
  env.hello = &h;
  io->next_hello = gnmr__now_ms() + HELLO_CONNECT_MS;
  if (gnmr__wire_encode(&env, &buf, &len) != GNMR_OK)
    return;
  if (zmq_send(io->dealer, buf, len, ZMQ_DONTWAIT) >= 0) {
    atomic_fetch_add(&a->hellos, 1);
    /* unanswered: again later, and later each time (a job of a million
     * units takes gnmrd most of a second to register, and every Hello
     * is answered with a Welcome that size) */
    /* the first wait grows with the job: registering a unit takes gnmrd
     * about a microsecond (a million units, most of a second) */
    io->hello_retry = io->hello_retry ? io->hello_retry * 2
                                      : HELLO_RETRY_MS + a->n_units / 1000;
    if (io->hello_retry > HELLO_RETRY_MAX_MS)
      io->hello_retry = HELLO_RETRY_MAX_MS;
    io->next_hello = gnmr__now_ms() + io->hello_retry;
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

/* The step of a held report (0 when it does not parse). */
static uint64_t held_step(const held_msg *h) {
  return gnmr__wire_report_step(h->buf, h->len);
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

/* Sends what was held; the newest becomes the report in flight, kept
 * until its step is decided (requeue_inflight: sent again after a
 * re-join, were this connection's reports refused or lost). */
static void flush_held(gnmr_agent *a, io_state *io) {
  for (int i = 0; i < io->n_held; i++) {
    send_report(a, io, io->held[i].buf, io->held[i].len);
    if (i == io->n_held - 1) {
      if (io->have_inflight)
        zmq_msg_close(&io->inflight);
      io->have_inflight =
          zmq_msg_init_size(&io->inflight, io->held[i].len) == 0;
      if (io->have_inflight) {
        memcpy(zmq_msg_data(&io->inflight), io->held[i].buf,
               io->held[i].len);
        io->inflight_step = held_step(&io->held[i]);
      }
    }
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
  io->hello_retry = 0;
  if (w->n_unit_ids != a->n_units)
    return; /* not ours: ignore */
  if (w->term < io->term)
    return; /* from a gnmrd an older term's: replaced */
  io->term = w->term;
  for (uint32_t i = 0; i < a->n_units; i++) {
    io->ids[i] = w->unit_ids[i];
    io->by_id[i] = i;
  }
  qsort_r(io->by_id, a->n_units, sizeof *io->by_id, by_id_cmp, io->ids);
  io->have_ids = 1;
  if (io->welcomed) {
    drop_stale(a, io, w->last_step);
  } else { /* what the training side is told it joined (gnmr_agent_run) */
    atomic_store(&a->welcome_run, w->run);
    atomic_store(&a->welcome_last, w->last_step);
  }
  io->welcomed = 1;
  atomic_store(&a->joined, 1);
  flush_held(a, io);
}

/* Marks local units whose job-wide id is active; publishes under seqlock. */
/* Returns whether the decision was applied (a new step). */
static int on_decision(gnmr_agent *a, io_state *io, const Gnmr__Decision *d) {
  if (d->term < io->term) {
    atomic_fetch_add(&a->decisions_fenced, 1);
    return 0; /* made by a leader that has been replaced: never acted on */
  }
  io->term = d->term;
  if (io->have_inflight && d->step >= io->inflight_step) {
    zmq_msg_close(&io->inflight); /* decided: the buffer goes back */
    io->have_inflight = 0;
  }
  if (!io->have_ids || d->step <= atomic_load(&a->decided_step))
    return 0;
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
  /* the risky units this agent holds, local indices ascending */
  pthread_mutex_lock(&a->risky_mu);
  uint32_t nr = 0, nu = a->n_units;
  size_t n_in = d->n_risky;
  if (d->n_g < n_in || d->n_d < n_in || d->n_s < n_in)
    n_in = 0; /* a malformed decision: no scores */
  for (size_t k = 0; k < n_in; k++) {
    uint32_t id = d->risky[k], lo = 0, hi = nu;
    while (lo < hi) {
      uint32_t mid = lo + (hi - lo) / 2;
      if (io->ids[io->by_id[mid]] < id)
        lo = mid + 1;
      else
        hi = mid;
    }
    for (; lo < nu && io->ids[io->by_id[lo]] == id && nr < nu; lo++) {
      uint32_t u = io->by_id[lo], at = nr++;
      while (at > 0 && a->risky_units[at - 1] > u) { /* keep ascending */
        a->risky_units[at] = a->risky_units[at - 1];
        for (int q = 0; q < 3; q++)
          a->risky_gds[(size_t)q * nu + at] =
              a->risky_gds[(size_t)q * nu + at - 1];
        at--;
      }
      a->risky_units[at] = u;
      a->risky_gds[at] = d->g[k];
      a->risky_gds[nu + at] = d->d[k];
      a->risky_gds[2 * (size_t)nu + at] = d->s[k];
    }
  }
  a->n_risky = nr;
  a->risky_step = d->step;
  /* the same-step mode's bounds, by id (none: +inf, no spare) */
  for (uint32_t u = 0; u < nu; u++)
    a->bounds[u] = io->ids[u] < d->n_bound && d->bound[io->ids[u]] >= 0
                       ? d->bound[io->ids[u]]
                       : INFINITY;
  a->spare = d->n_bound == 0 ? 0 : d->spare < nu ? d->spare : nu;
  pthread_mutex_unlock(&a->risky_mu);
  /* a seqlock has one writer: readers (any thread) retry, writers would
   * interleave */
  GNMR_OWNED(&a->io_owner, "publishing a decision");
  atomic_fetch_add_explicit(&a->seq, 1, memory_order_acq_rel); /* odd */
  for (size_t i = 0; i < a->n_words; i++)
    atomic_store_explicit(&a->routes[i], words[i], memory_order_relaxed);
  atomic_store_explicit(&a->decided_step, d->step, memory_order_relaxed);
  atomic_fetch_add_explicit(&a->seq, 1, memory_order_release); /* even */
  atomic_fetch_add(&a->decisions, 1);
  pthread_mutex_lock(&a->mu);
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
  return 1;
}

static void requeue_inflight(gnmr_agent *a, io_state *io);

static void on_message(gnmr_agent *a, io_state *io, const void *buf,
                       size_t len) {
  Gnmr__Envelope *env;
  if (io->untrusted ||
      gnmr__wire_decode(buf, len, &env, NULL, 0) != GNMR_OK)
    return;
  switch (env->body_case) {
  case GNMR__ENVELOPE__BODY_WELCOME:
    on_welcome(a, io, env->welcome);
    break;
  case GNMR__ENVELOPE__BODY_DECISION:
    if (on_decision(a, io, env->decision) && hold_decision(io, env))
      return; /* held: freed once gnmrd says it is committed */
    break;
  case GNMR__ENVELOPE__BODY_ERROR:
    atomic_fetch_add(&a->errors, 1);
    atomic_store(&a->last_error, env->error->code);
    pthread_mutex_lock(&a->err_mu);
    /* a peer's words: escaped before anyone prints or warns them (an
     * escape sequence from a hostile gnmrd never reaches a terminal) */
    gnmr__escape(env->error->message ? env->error->message : "",
                 a->last_error_text, sizeof a->last_error_text);
    pthread_mutex_unlock(&a->err_mu);
    if (env->error->code == GNMR_E_NOJOB) {
      /* the daemon does not know us (restarted, or this connection is a
       * new one it has not seen a Hello on): join again now, and send
       * the report it refused again after the Welcome. Lost, a job's
       * first step would wait for this rank for good (docs/protocol.md:
       * no deadline decides before every rank has reported once). */
      atomic_store(&a->joined, 0);
      io->next_hello = 0;
      requeue_inflight(a, io);
    } else if (!atomic_load(&a->joined)) {
      /* our Hello was refused (mismatch, bad config): retry slowly; an
       * observer early for its job's ranks, or a resume while gnmrd
       * reads the ended run back from its history: soon */
      int early = env->error->code == GNMR_E_BUSY && env->error->ref &&
                  (strcmp(env->error->ref, "layout") == 0 ||
                   strcmp(env->error->ref, "run") == 0);
      io->next_hello = gnmr__now_ms() + (early ? HELLO_LAYOUT_MS
                                               : HELLO_REFUSED_MS);
    }
    break;
  default:
    break;
  }
  gnmr__wire_free(&env);
}

/* A report sent but not decided when the connection went: back to the
 * front of the hold (it is older than any held), sent again on re-join
 * unless the job decided that step meanwhile (drop_stale). A daemon that
 * did get it counts the second one as a duplicate. */
static void requeue_inflight(gnmr_agent *a, io_state *io) {
  if (!io->have_inflight)
    return;
  size_t n = zmq_msg_size(&io->inflight);
  void *copy = io->inflight_step > atomic_load(&a->decided_step)
                   ? malloc(n ? n : 1)
                   : NULL;
  if (copy != NULL) {
    memcpy(copy, zmq_msg_data(&io->inflight), n);
    if (io->n_held == HELD_MAX) { /* the hold keeps the newest */
      free(copy);
      atomic_fetch_add(&a->reports_dropped, 1);
    } else {
      memmove(&io->held[1], &io->held[0], (size_t)io->n_held *
                                              sizeof io->held[0]);
      io->held[0] = (held_msg){copy, n};
      io->n_held++;
    }
  }
  zmq_msg_close(&io->inflight);
  io->have_inflight = 0;
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
      io->hello_retry = 0;
      requeue_inflight(a, io);
    } else if ((ev == ZMQ_EVENT_CONNECTED ||
                ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) &&
               !atomic_load(&a->joined)) {
      /* the handshake (CURVE included) is what a send waits for under
       * ZMQ_IMMEDIATE: Hello goes now, not at the next poll timeout */
      io->next_hello = 0;
    }
  }
  zmq_msg_close(&m);
}

void *gnmr__agent_io_main(void *arg) {
  gnmr_agent *a = arg;
  io_state io = {0};
  /* named, so that top -H and /proc/PID/task show what it costs */
  pthread_setname_np(pthread_self(), "gnmr-agent-io");
  gnmr_owner_claim(&a->io_owner);
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
    if (!atomic_load(&a->joined) && gnmr__now_ms() >= io.next_hello)
      send_hello(a, &io);
    zmq_pollitem_t items[3] = {{io.dealer, 0, ZMQ_POLLIN, 0},
                               {io.pull, 0, ZMQ_POLLIN, 0},
                               {io.monitor, 0, ZMQ_POLLIN, 0}};
    long timeout = IO_POLL_MS;
    if (!atomic_load(&a->joined)) { /* wake for the next Hello */
      uint64_t now = gnmr__now_ms();
      timeout = io.next_hello <= now ? 0
                : io.next_hello - now < IO_POLL_MS ? (long)(io.next_hello -
                                                            now)
                                                   : IO_POLL_MS;
    }
    if (zmq_poll(items, 3, timeout) < 0 && zmq_errno() != EINTR)
      break;
    if (items[2].revents & ZMQ_POLLIN)
      on_monitor(a, &io);
    while (zmq_msg_recv(&msg, io.pull, ZMQ_DONTWAIT) >= 0) {
      size_t n = zmq_msg_size(&msg);
      void *copy;
      if (atomic_load(&a->joined)) { /* forwarded as it is: no copy */
        if (io.have_inflight)
          zmq_msg_close(&io.inflight);
        zmq_msg_init(&io.inflight);
        io.have_inflight = zmq_msg_copy(&io.inflight, &msg) == 0;
        io.inflight_step = gnmr__wire_report_step(zmq_msg_data(&msg), n);
        if (zmq_msg_send(&msg, io.dealer, ZMQ_DONTWAIT) < 0)
          atomic_fetch_add(&a->reports_dropped, 1);
      } else if ((copy = malloc(n ? n : 1)) != NULL) {
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
      /* the Bye is let out before the socket closes (it lingered 0 ms
       * and, under load, went with the socket: gnmrd kept the run
       * 'running'); at most BYE_LINGER_MS, only where gnmrd is connected
       * (ZMQ_IMMEDIATE queues nothing to a connection that is not) */
      int linger = BYE_LINGER_MS;
      if (zmq_send(io.dealer, buf, len, ZMQ_DONTWAIT) >= 0)
        zmq_setsockopt(io.dealer, ZMQ_LINGER, &linger, sizeof linger);
      free(buf);
    }
  }
out:
  if (io.have_inflight)
    zmq_msg_close(&io.inflight);
  for (int i = 0; i < io.n_held; i++)
    free(io.held[i].buf);
  for (int i = 0; i < io.n_hdec; i++)
    gnmr__wire_free(&io.hdec[i]);
  zmq_close(io.monitor);
  zmq_close(io.dealer);
  zmq_close(io.pull);
  free(io.ids);
  free(io.by_id);
  return NULL;
}

/* Creates the DEALER (to gnmrd) and the PULL end of the report pipe. */
int gnmr__agent_open_io_sockets(gnmr_agent *a) {
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
  /* the pipe's name is unique in the process (address and a counter): an
   * agent opened where a closed one was must not meet its monitor
   * endpoint, which ZeroMQ unbinds later, on its own thread */
  char mon[sizeof a->pipe_addr + 16];
  snprintf(mon, sizeof mon, "%s-monitor", a->pipe_addr);
  if (zmq_socket_monitor(a->dealer, mon,
                         ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED |
                             ZMQ_EVENT_HANDSHAKE_SUCCEEDED) != 0 ||
      (a->monitor = zmq_socket(a->zctx, ZMQ_PAIR)) == NULL)
    goto err;
  zmq_setsockopt(a->monitor, ZMQ_LINGER, &zero, sizeof zero);
  if (zmq_connect(a->monitor, mon) != 0 ||
      zmq_connect(a->pull, a->pipe_addr) != 0)
    goto err;
  /* "a,b": an active gnmrd and its standbys. Only the active one binds,
   * and under ZMQ_IMMEDIATE messages go to completed connections only, so
   * every message reaches the one serving; when it goes, the standby that
   * takes over binds and the agent joins it as it re-joins a restart. */
  {
    char *list = strdup(a->endpoint), *save = NULL;
    int n = 0;
    if (list == NULL)
      goto err;
    for (char *ep = strtok_r(list, ",", &save); ep != NULL;
         ep = strtok_r(NULL, ",", &save)) {
      if (zmq_connect(a->dealer, ep) != 0) {
        free(list);
        goto err;
      }
      n++;
    }
    free(list);
    if (n == 0)
      goto err;
  }
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

