/* SPDX-License-Identifier: MIT */
/* jobs.c — gnmrd's agent protocol above the decision core (core.h): it
 * decodes Hello, Report and Bye, binds connections to (job, rank), arms a
 * job's barrier timer, and sends, stores (records.h) and counts each step
 * that the core decides: the same encoded Decision to every rank and
 * observer. Loop thread only. */
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "gnmrd.h"
#include "latency.h"
#include "log.h"
#include "records.h"
#include "text.h"
#include "validate.h"
#include "wire.h"

/* The loop's half of a job: its timer. core->data points back here. */
typedef struct job {
  core_job *core;
  gnmrd *d;
  uv_timer_t timer;
  uint64_t last_report_ms; /* loop time of the last accepted report, or of
                              its creation: idle jobs are retired */
} job;

/* A report held for an undecided step: the decoded envelope and the bytes
 * it came in, counted against [limits] max_held_mb. */
typedef struct held {
  Gnmr__Envelope *env;
  size_t len;
  gnmrd *d;
} held;

/* A connection identity's membership. */
typedef struct peer {
  job *j;
  uint32_t rank;  /* for an observer: its index in the job's observers */
  int observer;
} peer;

static job *job_of(core_job *c) { return c ? (job *)c->data : NULL; }

/* ---- replies ------------------------------------------------------------- */

static void reply(gnmrd *d, const void *id, size_t id_len, uint8_t *buf,
                  size_t len) {
  if (server_send(d->agents, id, id_len, buf, len) != GNMR_OK)
    d->c.send_failures++;
  free(buf);
}

static void reply_error(gnmrd *d, const void *id, size_t id_len, int code,
                        const char *ref, uint64_t step, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

static void reply_error(gnmrd *d, const void *id, size_t id_len, int code,
                        const char *ref, uint64_t step, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  uint8_t *buf;
  size_t len;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  LOG(DEBUG, "AGENT-ERROR", "%s (%s)", msg, gnmr_errname(code));
  if (gnmr__wire_error(code, msg, ref, step, &buf, &len) == GNMR_OK)
    reply(d, id, id_len, buf, len);
}

/* ---- connections ------------------------------------------------------------ */

/* Forgets a registration's connection: its peer entry and identity. */
static void drop_connection(gnmrd *d, core_rank *rr, int observer) {
  uint64_t v;
  if (rr->conn != NULL && hmap_get(&d->peers, rr->conn, rr->conn_len, &v)) {
    free((peer *)(uintptr_t)v);
    hmap_del(&d->peers, rr->conn, rr->conn_len);
  }
  core_disconnect(rr, observer);
}

/* Binds connection id to rr as (j, rank): a new peer entry. */
static int bind_connection(gnmrd *d, job *j, core_rank *rr, uint32_t rank,
                           int observer, const void *id, size_t id_len) {
  char *conn = malloc(id_len ? id_len : 1);
  peer *pr = malloc(sizeof *pr);
  if (conn == NULL || pr == NULL ||
      hmap_put(&d->peers, id, id_len, (uintptr_t)pr) != GNMR_OK) {
    free(conn);
    free(pr);
    return GNMR_E_NOMEM;
  }
  *pr = (peer){j, rank, observer};
  memcpy(conn, id, id_len);
  free(rr->conn);
  rr->conn = conn;
  rr->conn_len = id_len;
  return GNMR_OK;
}

/* A Decision could not reach a connection that ZeroMQ no longer has (it
 * closed, or missed its heartbeats): nothing more is sent to it. An
 * observer's slot is free again; a rank stays in the job (its shards count
 * as missing) until it joins again. */
static void connection_gone(job *j, core_rank *rr, int observer) {
  LOG(INFO, "PEER-GONE", "job %s: %s connection gone; no more decisions "
      "sent to it", j->core->name, observer ? "an observer's" : "a rank's");
  drop_connection(j->d, rr, observer);
}

/* ---- job lifetime ----------------------------------------------------------- */

static void release_held(void *owner) {
  held *h = owner;
  assert(h->d->held_bytes >= h->len);
  h->d->held_bytes -= h->len;
  gnmr__wire_free(&h->env);
  free(h);
}

static void job_timer_closed(uv_handle_t *h) { free(h->data); }

/* Frees a job: its peers' memberships, its core state, then (via the loop)
 * the struct itself. */
static void job_free(job *j) {
  gnmrd *d = j->d;
  core_job *c = j->core;
  for (uint32_t r = 0; r < c->reporters + c->n_observers; r++) {
    core_rank *rr = r < c->reporters ? &c->ranks[r]
                                     : &c->observers[r - c->reporters];
    uint64_t v;
    if (rr->conn && hmap_get(&d->peers, rr->conn, rr->conn_len, &v) &&
        ((peer *)(uintptr_t)v)->j == j) {
      free((peer *)(uintptr_t)v);
      hmap_del(&d->peers, rr->conn, rr->conn_len);
    }
  }
  core_job_free(&d->jobs, c);
  j->core = NULL;
  uv_timer_stop(&j->timer);
  uv_close((uv_handle_t *)&j->timer, job_timer_closed);
}

static job *job_create(gnmrd *d, const char *name, const policy_params *prm,
                       uint32_t reporters, uint32_t barrier_ms) {
  job *j = calloc(1, sizeof *j);
  if (j == NULL)
    return NULL;
  j->core = core_job_new(&d->jobs, name, prm, reporters, barrier_ms,
                         release_held);
  if (j->core == NULL) {
    free(j);
    return NULL;
  }
  j->core->data = j;
  if (d->cfg != NULL)
    j->core->max_units = (uint32_t)d->cfg->max_units;
  j->d = d;
  j->last_report_ms = uv_now(d->loop);
  uv_timer_init(d->loop, &j->timer);
  j->timer.data = j;
  return j;
}

/* ---- deciding ------------------------------------------------------------------ */

/* Sends, stores and counts one decided step. */
static void publish(job *j, const core_outcome *o) {
  gnmrd *d = j->d;
  core_job *c = j->core;
  d->c.missing_units += o->missing;
  if (o->republish) { /* nothing decided, published or stored */
    d->c.republish_refused++;
    LOG(ERROR, "JOB-REPUBLISH", "job %s: step %llu was already published in "
        "pass %u (up to step %llu); not deciding it again", c->name,
        (unsigned long long)o->step, c->pass,
        (unsigned long long)c->pub_step);
    return;
  }
  if (o->rv != GNMR_OK) {
    LOG(ERROR, "JOB-DECIDE", "job %s step %llu: %s", c->name,
        (unsigned long long)o->step, gnmr_strerror(o->rv));
    return;
  }
  /* the record is queued before any rank can act on the decision: a crash
   * after a send never leaves an acted-on decision out of the history */
  records_step(d->st, c, o, (uv_now(d->loop) - o->first_ms) * 1000);
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Decision dec = GNMR__DECISION__INIT;
  uint8_t *buf;
  size_t len;
  dec.job = c->name;
  dec.step = o->step;
  dec.n_active = o->res.n_active;
  dec.active = (uint32_t *)o->res.active;
  env.body_case = GNMR__ENVELOPE__BODY_DECISION;
  env.decision = &dec;
  if (gnmr__wire_encode(&env, &buf, &len) == GNMR_OK) {
    for (uint32_t r = 0; r < c->reporters + c->n_observers; r++) {
      int obs = r >= c->reporters;
      core_rank *rr = obs ? &c->observers[r - c->reporters] : &c->ranks[r];
      if (!rr->joined || rr->conn == NULL)
        continue;
      int srv = server_send(d->agents, rr->conn, rr->conn_len, buf, len);
      if (srv == GNMR_OK) {
        d->c.decisions_sent++;
      } else {
        d->c.send_failures++;
        if (srv == GNMR_E_CLOSED)
          connection_gone(j, rr, obs);
      }
    }
    free(buf);
  }
  d->c.steps_decided++;
  if (o->by_deadline)
    d->c.deadline_decisions++;
  latency_observe(&d->decision_latency,
                  (double)(uv_hrtime() - o->first_ns) * 1e-9);
}

static void deadline_cb(uv_timer_t *t);

/* Decides every ready step, then arms the timer for the next deadline. */
static void decide_ready(job *j) {
  core_outcome o;
  while (core_decide_next(j->core, uv_now(j->d->loop), &o))
    publish(j, &o);
  server_kick(j->d->agents);
  uv_timer_stop(&j->timer);
  uint64_t first = core_next_deadline(j->core), now = uv_now(j->d->loop);
  if (first != UINT64_MAX)
    uv_timer_start(&j->timer, deadline_cb, first > now ? first - now : 0, 0);
}

static void deadline_cb(uv_timer_t *t) { decide_ready(t->data); }

/* ---- messages ------------------------------------------------------------------ */

static void welcome(gnmrd *d, const void *id, size_t id_len, core_job *c,
                    const core_rank *rr, uint32_t rank) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Welcome w = GNMR__WELCOME__INIT;
  Gnmr__Params wp;
  uint8_t *buf;
  size_t len;
  gnmr__params_to_wire(&c->params, &wp);
  w.job = c->name;
  w.rank = rank;
  w.n_unit_ids = rr->n_units;
  w.unit_ids = rr->ids;
  w.params = &wp;
  w.last_step = c->last_decided;
  env.body_case = GNMR__ENVELOPE__BODY_WELCOME;
  env.welcome = &w;
  if (gnmr__wire_encode(&env, &buf, &len) == GNMR_OK)
    reply(d, id, id_len, buf, len);
}

/* A job's first Hello was accepted: the job exists from now on. */
static void job_accepted(job *j) {
  gnmrd *d = j->d;
  d->c.jobs_created++;
  LOG(INFO, "JOB-CREATE", "job %s: %u reporters, barrier %u ms",
      j->core->name, j->core->reporters, j->core->barrier_ms);
  records_job(d->st, j->core);
  records_event(d->st, j->core, STORE_EV_JOB_STARTED, UINT32_MAX, NULL);
}

/* The Hello's requested ids as uint32_t (NULL: none), narrowed in place,
 * once: they travel as uint64 so that validate_hello refuses an id above
 * the limit instead of a silent cut; below it they fit. */
static const uint32_t *narrow_ids(Gnmr__Hello *h) {
  if (h->n_unit_ids == 0)
    return NULL;
  unsigned char *b = (unsigned char *)h->unit_ids;
  for (size_t i = 0; i < h->n_unit_ids; i++) { /* writes trail reads */
    uint64_t v;
    memcpy(&v, b + 8 * i, sizeof v);
    assert(v < POLICY_MAX_UNITS);
    uint32_t v32 = (uint32_t)v;
    memcpy(b + 4 * i, &v32, sizeof v32);
  }
  return (const uint32_t *)(void *)h->unit_ids;
}

/* An observer joins (a Hello with observer set): its units map decisions to
 * its own units but add no shard; it gets every Decision and never
 * reports. A free slot is reused. */
static int observer_join(gnmrd *d, const void *id, size_t id_len, job *j,
                         const Gnmr__Hello *h, const uint32_t *ids, peer *pr,
                         const char *user) {
  core_job *c = j->core;
  char why[160];
  uint32_t slot;
  int full, rv;
  if (pr != NULL) { /* the same connection again: welcome it again */
    welcome(d, id, id_len, c, &c->observers[pr->rank], 0);
    return 1;
  }
  core_rank *rr = core_observer_slot(c, &slot, &full);
  if (rr == NULL) {
    d->c.hellos_refused++;
    if (full)
      reply_error(d, id, id_len, GNMR_E_BUSY, "observer", 0,
                  "job %.64s has %u observers already", c->name,
                  CORE_MAX_OBSERVERS);
    else
      reply_error(d, id, id_len, GNMR_E_NOMEM, "observer", 0,
                  "out of memory");
    return 0;
  }
  if ((rv = core_register_units(c, rr, (const char *const *)h->units,
                                h->n_units, ids, 0, why, sizeof why)) !=
      GNMR_OK) {
    d->c.hellos_refused++;
    if (rv == GNMR_E_RANGE)
      d->c.refused_max_units++;
    reply_error(d, id, id_len, rv, "units", 0, "%s", why);
    return 0;
  }
  if (bind_connection(d, j, rr, slot, 1, id, id_len) != GNMR_OK) {
    d->c.hellos_refused++;
    reply_error(d, id, id_len, GNMR_E_NOMEM, "observer", 0, "out of memory");
    return 0;
  }
  rr->joined = 1;
  rr->user = user ? strdup(user) : NULL;
  LOG(INFO, "OBSERVER-JOIN", "job %s: an observer joined with %zu units",
      c->name, h->n_units);
  welcome(d, id, id_len, c, rr, 0);
  return 1;
}

/* Whether a rank's connection still reaches a live peer: its Welcome is
 * sent again. A connection ZeroMQ no longer has is forgotten. */
static int probe_live(gnmrd *d, job *j, core_rank *rr, uint32_t rank) {
  core_job *c = j->core;
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Welcome w = GNMR__WELCOME__INIT;
  Gnmr__Params wp;
  uint8_t *buf;
  size_t len;
  gnmr__params_to_wire(&c->params, &wp);
  w.job = c->name;
  w.rank = rank;
  w.n_unit_ids = rr->n_units;
  w.unit_ids = rr->ids;
  w.params = &wp;
  w.last_step = c->last_decided;
  env.body_case = GNMR__ENVELOPE__BODY_WELCOME;
  env.welcome = &w;
  if (gnmr__wire_encode(&env, &buf, &len) != GNMR_OK)
    return 0;
  int rv = server_send(d->agents, rr->conn, rr->conn_len, buf, len);
  free(buf);
  if (rv == GNMR_E_CLOSED) {
    connection_gone(j, rr, 0);
    return 0;
  }
  return rv == GNMR_OK;
}

/* Refuses a Hello: counted, answered; a job this Hello created goes (a
 * job exists only once a Hello was accepted). */
#define REFUSE(code, ref, ...)                                   \
  do {                                                           \
    d->c.hellos_refused++;                                       \
    reply_error(d, id, id_len, code, ref, 0, __VA_ARGS__);       \
    if (created)                                                 \
      job_free(j);                                               \
    return;                                                      \
  } while (0)

static void on_hello(gnmrd *d, const void *id, size_t id_len, Gnmr__Hello *h,
                     const char *user) {
  policy_params prm;
  uint32_t barrier = 0;
  job *j = NULL;
  int created = 0;
  d->c.hellos++;
  {
    const char *ref = "";
    char why[256];
    int vrv = gnmr__validate_hello(h, d->cfg ? &d->cfg->policy : NULL,
                                   d->cfg ? (uint32_t)d->cfg->barrier_ms : 0,
                                   &prm, &barrier, &ref, why, sizeof why);
    if (vrv != GNMR_OK)
      REFUSE(vrv, ref, "%s", why);
  }
  const uint32_t *ids = narrow_ids(h);
  uint64_t v;
  peer *pr = NULL;
  if (hmap_get(&d->peers, id, id_len, &v)) {
    pr = (peer *)(uintptr_t)v;
    if (strcmp(pr->j->core->name, h->job) != 0 ||
        pr->observer != h->observer || (!pr->observer && pr->rank != h->rank))
      REFUSE(GNMR_E_MISMATCH, "rank",
             "this connection already joined job %.64s as %s %u",
             pr->j->core->name, pr->observer ? "observer" : "rank",
             pr->rank);
  }
  j = job_of(core_find(&d->jobs, h->job));
  if (j != NULL) {
    core_job *c = j->core;
    if (c->reporters != h->reporters)
      REFUSE(GNMR_E_MISMATCH, "reporters",
             "job %.64s has %u reporters, this agent says %u", c->name,
             c->reporters, h->reporters);
    if (!policy_params_equal(&c->hello_params, &prm))
      REFUSE(GNMR_E_MISMATCH, "params",
             "job %.64s runs with other policy parameters", c->name);
    if (c->barrier_ms != barrier)
      REFUSE(GNMR_E_MISMATCH, "barrier_ms",
             "job %.64s has a %u ms barrier, this agent says %u", c->name,
             c->barrier_ms, barrier);
  } else if (d->cfg != NULL && core_count(&d->jobs) >= d->cfg->max_jobs) {
    d->c.refused_max_jobs++;
    REFUSE(GNMR_E_BUSY, "job", "gnmrd serves %zu jobs already ([limits] "
           "max_jobs)", core_count(&d->jobs));
  } else if ((j = job_create(d, h->job, &prm, h->reporters, barrier)) ==
             NULL) {
    REFUSE(GNMR_E_NOMEM, "job", "out of memory");
  } else {
    created = 1;
  }
  if (h->observer) {
    if (!observer_join(d, id, id_len, j, h, ids, pr, user)) {
      if (created)
        job_free(j);
      return;
    }
    if (created)
      job_accepted(j);
    return;
  }
  core_job *c = j->core;
  core_rank *rr = &c->ranks[h->rank];
  int returning = rr->ever && !rr->joined; /* said Bye before */
  const char *const *names = (const char *const *)h->units;
  /* under CURVE a rank belongs to the key it first joined with */
  if (user != NULL && rr->user != NULL && strcmp(user, rr->user) != 0)
    REFUSE(GNMR_E_MISMATCH, "rank",
           "rank %u of job %.64s joined with another key", h->rank, c->name);
  if (rr->ever && !core_same_units(c, rr, names, h->n_units, ids))
    REFUSE(GNMR_E_MISMATCH, "units",
           "rank %u of job %.64s joined before with other units", h->rank,
           c->name);
  int registered = 0;
  if (!rr->ever) {
    char why[160];
    int urv = core_register_units(c, rr, names, h->n_units, ids, 1,
                                  why, sizeof why);
    if (urv == GNMR_E_RANGE)
      d->c.refused_max_units++;
    if (urv != GNMR_OK)
      REFUSE(urv, "unit_ids", "%s", why);
    registered = 1;
  }
  /* A rank is one agent: another live agent asking for a joined rank is
   * refused, naming both (the same job name run twice, or two processes
   * without RANK). The old connection is probed with its own Welcome: a
   * gone peer fails at once (ROUTER_MANDATORY), a live one gets a harmless
   * repeat. The same agent reconnecting replaces its connection. */
  if (pr == NULL && rr->joined && rr->conn != NULL &&
      rr->instance != NULL && h->instance[0] != '\0' &&
      strcmp(rr->instance, h->instance) != 0 && probe_live(d, j, rr, h->rank))
    REFUSE(GNMR_E_MISMATCH, "rank",
           "rank %u of job %.64s is held by a live agent (%.80s); this "
           "agent (%.80s) is refused: the same job name run twice, or two "
           "processes with one rank (RANK unset?)", h->rank, c->name,
           rr->instance, h->instance);
  /* Bind this connection to (job, rank), replacing an older connection. */
  if (pr == NULL) {
    if (rr->conn != NULL && hmap_get(&d->peers, rr->conn, rr->conn_len, &v)) {
      free((peer *)(uintptr_t)v);
      hmap_del(&d->peers, rr->conn, rr->conn_len);
    }
    if (bind_connection(d, j, rr, h->rank, 0, id, id_len) != GNMR_OK)
      REFUSE(GNMR_E_NOMEM, "rank", "out of memory");
  }
  if (created)
    job_accepted(j);
  if (registered)
    records_rank(d->st, c, h->rank);
  if (user != NULL && rr->user == NULL)
    rr->user = strdup(user);
  if (h->instance[0] != '\0') {
    free(rr->instance);
    rr->instance = strdup(h->instance);
  }
  if (!rr->joined) {
    char detail[32];
    snprintf(detail, sizeof detail, "rank %u", h->rank);
    records_event(d->st, c, STORE_EV_AGENT_JOINED, h->rank, detail);
  }
  core_join(c, h->rank, returning);
  LOG(INFO, "AGENT-JOIN", "job %s rank %u/%u joined with %zu units", c->name,
      h->rank, c->reporters, h->n_units);
  welcome(d, id, id_len, c, rr, h->rank);
}
#undef REFUSE

/* Handles a Report; returns 1 when the job kept env (held until its step
 * is decided), 0 when the caller still owns it. */
static int on_report(gnmrd *d, const void *id, size_t id_len,
                     Gnmr__Envelope *env, size_t len) {
  const Gnmr__Report *r = env->report;
  uint64_t v;
#define REFUSE(code, ref, ...)                                   \
  do {                                                           \
    d->c.reports_refused++;                                      \
    reply_error(d, id, id_len, code, ref, r->step, __VA_ARGS__); \
    return 0;                                                    \
  } while (0)
  if (!hmap_get(&d->peers, id, id_len, &v)) {
    d->c.unknown_agent++;
    REFUSE(GNMR_E_NOJOB, "hello", "unknown agent: send Hello first");
  }
  peer *pr = (peer *)(uintptr_t)v;
  job *j = pr->j;
  core_job *c = j->core;
  if (pr->observer)
    REFUSE(GNMR_E_PROTO, "observer", "an observer does not report");
  if (strcmp(r->job, c->name) != 0 || r->rank != pr->rank)
    REFUSE(GNMR_E_MISMATCH, "rank",
           "report for job %.64s rank %u on the connection of job %.64s "
           "rank %u", r->job, r->rank, c->name, pr->rank);
  {
    const char *ref = "";
    char why[256];
    int vrv = gnmr__validate_report(r, c->ranks[pr->rank].n_units, &ref, why,
                                    sizeof why);
    if (vrv != GNMR_OK)
      REFUSE(vrv, ref, "%s", why);
  }
  /* Over the cap, a report that would open a new undecided step is
   * refused; one for a step already waiting is taken: it completes the
   * step, which frees what is held. */
  size_t max_held = d->cfg ? (size_t)d->cfg->max_held_mb << 20 : SIZE_MAX;
  if (d->held_bytes + len > max_held && !core_is_pending(c, r->step)) {
    d->c.refused_max_held++;
    REFUSE(GNMR_E_BUSY, "step", "gnmrd holds %zu MB of reports for "
           "undecided steps ([limits] max_held_mb)", d->held_bytes >> 20);
  }
  held *hd = malloc(sizeof *hd);
  if (hd == NULL)
    REFUSE(GNMR_E_NOMEM, "step", "out of memory");
  *hd = (held){env, len, d};
  core_report rep = {hd, r->sumsq, r->n_nonfinite ? r->nonfinite : NULL,
                     r->n_not_reported ? (const int *)r->not_reported : NULL};
  core_clock now = {uv_now(d->loop), uv_hrtime()};
  char detail[128];
  int resumed;
  int rc = core_report_step(c, pr->rank, r->step, &rep, now, &resumed, detail,
                            sizeof detail);
  if (rc == CORE_ACCEPTED) {
    d->held_bytes += len;
    j->last_report_ms = now.ms;
  } else {
    free(hd); /* the caller frees env */
  }
  if (resumed) {
    records_job(d->st, c);
    records_event(d->st, c, STORE_EV_JOB_RESUMED, UINT32_MAX, detail);
    LOG(INFO, "JOB-RESUME", "job %s: %s", c->name, detail);
  }
  switch (rc) {
  case CORE_ACCEPTED:
    d->c.reports++;
    decide_ready(j);
    return 1;
  case CORE_LATE:
    d->c.late_reports++; /* dropped and counted: no reply */
    return 0;
  case CORE_TOO_FAR:
    d->c.future_reports++;
    REFUSE(GNMR_E_RANGE, "step", "step %llu is more than %u steps past the "
                                 "last decided step %llu",
           (unsigned long long)r->step, CORE_MAX_AHEAD,
           (unsigned long long)c->last_decided);
  case CORE_FULL:
    d->c.future_reports++;
    REFUSE(GNMR_E_BUSY, "step", "%u steps are already waiting for reports",
           CORE_MAX_PENDING);
  case CORE_DUPLICATE:
    d->c.duplicate_reports++;
    REFUSE(GNMR_E_DUP, "step", "duplicate report for step %llu",
           (unsigned long long)r->step);
  default:
    REFUSE(GNMR_E_NOMEM, "step", "out of memory");
  }
#undef REFUSE
}

/* How a job ends: every rank said Bye; no report came for [limits]
 * job_idle_s (retired: its processes died or hang); `gnmrctl finish`. */
enum { FINISH_BYES, FINISH_IDLE, FINISH_OPERATOR };

/* Ends a job. Its history and final state stay in the store. */
static void finish(job *j, int how) {
  gnmrd *d = j->d;
  core_job *c = j->core;
  int retired = how == FINISH_IDLE;
  LOG(INFO, retired ? "JOB-RETIRE" : "JOB-FINISH", "job %s %s at step %llu",
      c->name, retired                 ? "retired, no report for [limits] "
                                         "job_idle_s,"
               : how == FINISH_OPERATOR ? "finished by gnmrctl finish"
                                        : "finished",
      (unsigned long long)c->last_decided);
  records_event(d->st, c, retired ? STORE_EV_JOB_RETIRED
                                  : STORE_EV_JOB_FINISHED, UINT32_MAX,
                how == FINISH_OPERATOR ? "gnmrctl finish" : NULL);
  records_snapshot(d->st, c);
  records_state(d->st, c, retired ? "retired" : "finished");
  if (retired)
    d->c.jobs_retired++;
  else
    d->c.jobs_finished++;
  job_free(j);
}

void jobs_finish(gnmrd *d, core_job *c) {
  assert(job_of(c)->d == d);
  finish(job_of(c), FINISH_OPERATOR);
}

static void sweep_cb(uv_timer_t *t) {
  gnmrd *d = t->data;
  uint64_t idle_ms = d->cfg->job_idle_s * 1000, now = uv_now(d->loop);
  size_t pos = 0, n = 0;
  core_job *c;
  job **old = malloc((core_count(&d->jobs) + 1) * sizeof *old);
  while (old != NULL && (c = core_next_job(&d->jobs, &pos)) != NULL)
    if (now - job_of(c)->last_report_ms >= idle_ms)
      old[n++] = job_of(c);
  for (size_t i = 0; i < n; i++) /* finish() edits d->jobs */
    finish(old[i], FINISH_IDLE);
  free(old);
}

void jobs_start(gnmrd *d) {
  uv_timer_init(d->loop, &d->sweep);
  d->sweep.data = d;
  if (d->cfg == NULL || d->cfg->job_idle_s == 0)
    return;
  uint64_t every = d->cfg->job_idle_s * 1000 / 4;
  every = every < 100 ? 100 : every > 10000 ? 10000 : every;
  uv_timer_start(&d->sweep, sweep_cb, every, every);
  uv_unref((uv_handle_t *)&d->sweep);
}

static void on_bye(gnmrd *d, const void *id, size_t id_len,
                   const Gnmr__Bye *b) {
  uint64_t v;
  (void)b;
  d->c.byes++;
  if (!hmap_get(&d->peers, id, id_len, &v))
    return;
  peer *pr = (peer *)(uintptr_t)v;
  job *j = pr->j;
  core_job *c = j->core;
  uint32_t rank = pr->rank;
  if (pr->observer) { /* its slot is free again */
    drop_connection(d, &c->observers[rank], 1);
    return;
  }
  core_rank *rr = &c->ranks[rank];
  int was_joined = rr->joined;
  drop_connection(d, rr, 0);
  if (was_joined) {
    char detail[32];
    snprintf(detail, sizeof detail, "rank %u", rank);
    records_event(d->st, c, STORE_EV_AGENT_LEFT, rank, detail);
  }
  if (core_bye(c, rank)) {
    finish(j, FINISH_BYES);
    return;
  }
  decide_ready(j); /* fewer reporters may complete a pending step */
}

void jobs_on_message(server *s, const void *id, size_t id_len,
                     const void *data, size_t len, const char *user,
                     void *ctx) {
  gnmrd *d = ctx;
  Gnmr__Envelope *env;
  char err[128];
  (void)s;
  d->c.messages_in++;
  int rv = gnmr__wire_decode(data, len, &env, err, sizeof err);
  if (rv != GNMR_OK) {
    if (rv == GNMR_E_VERSION)
      d->c.version_errors++;
    else if (rv == GNMR_E_UNSUPPORTED)
      d->c.unsupported++;
    else
      d->c.decode_errors++;
    reply_error(d, id, id_len, rv, "envelope", 0, "%s", err);
    return;
  }
  int kept = 0;
  switch (env->body_case) {
  case GNMR__ENVELOPE__BODY_HELLO:
    on_hello(d, id, id_len, env->hello, user);
    break;
  case GNMR__ENVELOPE__BODY_REPORT:
    kept = on_report(d, id, id_len, env, len);
    break;
  case GNMR__ENVELOPE__BODY_BYE:
    on_bye(d, id, id_len, env->bye);
    break;
  default:
    d->c.unsupported++;
    reply_error(d, id, id_len, GNMR_E_UNSUPPORTED, "envelope", 0,
                "message type %d is not served on the agent endpoint",
                (int)env->body_case);
    break;
  }
  if (!kept)
    gnmr__wire_free(&env);
}

void jobs_on_bad_frames(server *s, void *ctx) {
  gnmrd *d = ctx;
  (void)s;
  d->c.messages_in++;
  d->c.bad_frames++;
}

void jobs_shutdown(gnmrd *d) {
  size_t pos = 0;
  core_job *c;
  job **all = malloc((core_count(&d->jobs) + 1) * sizeof *all);
  size_t n = 0;
  while (all != NULL && (c = core_next_job(&d->jobs, &pos)) != NULL)
    all[n++] = job_of(c);
  for (size_t i = 0; i < n; i++) /* job_free() edits d->jobs */
    job_free(all[i]);
  free(all);
  core_registry_free(&d->jobs);
  uint64_t v;
  pos = 0;
  while (hmap_next(&d->peers, &pos, NULL, NULL, &v))
    free((peer *)(uintptr_t)v);
  hmap_free(&d->peers);
}

/* ---- restore, snapshots, retuning -------------------------------------------- */

void jobs_restore(const store_job *sj, void *ctx) {
  gnmrd *d = ctx;
  char why[96], esc[600];
  /* names are checked where they enter; an older gnmrd did not check */
  int ok = gnmr__name_check(sj->name, GNMR_MAX_JOB_NAME, why, sizeof why);
  for (uint32_t u = 0; ok && u < sj->n_units; u++)
    ok = sj->unit_names[u] == NULL ||
         gnmr__name_check(sj->unit_names[u], GNMR_MAX_UNIT_NAME, why,
                          sizeof why);
  if (!ok) {
    LOG(ERROR, "JOB-RESTORE", "job %s: not restored, a name is invalid (%s);"
        " its history stays queryable", gnmr__escape(sj->name, esc,
                                                     sizeof esc), why);
    return;
  }
  job *j = job_create(d, sj->name, &sj->hello_params, sj->reporters,
                      sj->barrier_ms);
  if (j == NULL) {
    LOG(ERROR, "JOB-RESTORE", "job %s: out of memory", sj->name);
    return;
  }
  core_job *c = j->core;
  c->pass = sj->pass + 1;
  policy *pol = NULL;
  if (sj->snapshot != NULL &&
      policy_import(sj->snapshot, sj->snapshot_len, &pol) != GNMR_OK) {
    LOG(ERROR, "JOB-RESTORE", "job %s: snapshot unreadable, statistics "
                              "start afresh", sj->name);
    pol = NULL;
  }
  if (pol == NULL && policy_set_params(c->pol, &sj->params) == GNMR_OK)
    c->params = sj->params;
  if (core_restore(c, pol, sj->n_units, sj->unit_names, sj->n_ranks,
                   sj->rank_n, sj->rank_ids) != GNMR_OK) {
    LOG(ERROR, "JOB-RESTORE", "job %s: out of memory", sj->name);
    job_free(j);
    return;
  }
  records_job(d->st, c);
  char detail[96];
  snprintf(detail, sizeof detail, "pass %u: gnmrd restarted; state from the "
           "snapshot at step %llu", c->pass,
           (unsigned long long)c->last_decided);
  records_event(d->st, c, STORE_EV_JOB_RESUMED, UINT32_MAX, detail);
  LOG(INFO, "JOB-RESTORE", "job %s: %s", c->name, detail);
}

void jobs_snapshot_all(gnmrd *d) {
  size_t pos = 0;
  core_job *c;
  while ((c = core_next_job(&d->jobs, &pos)) != NULL)
    if (policy_last_step(c->pol) > 0)
      records_snapshot(d->st, c);
}

int jobs_set_params(gnmrd *d, core_job *c, char **settings, size_t n,
                    char *err, size_t errlen) {
  policy_params p = c->params;
  if (gnmr__policy_settings_apply(&p, settings, n, err, errlen) != 0)
    return GNMR_E_INVAL;
  int rv = policy_set_params(c->pol, &p);
  if (rv != GNMR_OK) {
    snprintf(err, errlen, "%s", gnmr_strerror(rv));
    return rv;
  }
  c->params = p;
  records_params(d->st, c);
  char detail[512];
  size_t off = 0;
  for (size_t i = 0; i < n && off < sizeof detail - 1; i++)
    off += (size_t)snprintf(detail + off, sizeof detail - off, "%s%s",
                            i ? " " : "", settings[i]);
  records_event(d->st, c, STORE_EV_PARAMS_CHANGED, UINT32_MAX, detail);
  LOG(INFO, "JOB-RETUNE", "job %s: %s (from step %llu)", c->name, detail,
      (unsigned long long)c->last_decided + 1);
  return GNMR_OK;
}
