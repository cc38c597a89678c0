/* SPDX-License-Identifier: MIT */
/* jobs.c — gnmrd's agent protocol: jobs created by their first Hello, units
 * shared by name across reporters (shards), a per-step barrier that decides
 * a step when every expected reporter delivered it or its deadline passed,
 * one policy step per decided step, and the same encoded Decision sent to
 * every rank. Invariant: steps are decided in increasing order; partial
 * sums are added in rank order at decision time, never in arrival order, so
 * a decision does not depend on network timing. Loop thread only. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gnmr/error.h"
#include "gnmrd.h"
#include "metrics.h"
#include "policy_opts.h"
#include "validate.h"
#include "log.h"
#include "policy.h"
#include "wire.h"

#define MAX_PENDING 16u     /* undecided steps held per job */
#define MAX_AHEAD 1024u     /* a report may run this far past the last decision */

/* One rank's registration in a job. */
typedef struct rank_reg {
  int joined;         /* said Hello (and not Bye) */
  int rejoined;       /* said Hello after steps were decided: its next
                         report may restart training from a checkpoint */
  uint64_t last_step; /* highest step of its accepted reports in this pass;
                         UINT64_MAX after a restore (not known) */
  char *user;         /* the CURVE key it first joined with, or NULL */
  int ever;           /* has ever joined: its units exist */
  char *ident;        /* current connection identity */
  size_t ident_len;
  uint32_t n_units;
  uint32_t *ids;      /* job-wide id of each local unit */
} rank_reg;

/* One rank's report held until its step is decided: the decoded envelope
 * itself (no copy of its arrays), freed when the step is decided. */
typedef struct held_report {
  Gnmr__Envelope *env;             /* owned; NULL = not reported yet */
  const double *sumsq;             /* into env */
  const uint64_t *nonfinite;       /* NULL: all zero */
  const protobuf_c_boolean *nr;    /* NULL: all reported */
} held_report;

typedef struct pending {
  uint64_t step;
  uint64_t first_ms;         /* loop time of the first report */
  uint64_t first_ns;         /* uv_hrtime() of the first report */
  uint64_t deadline;         /* loop time (ms) */
  uint32_t got;
  held_report *by_rank;      /* reporters entries; sumsq NULL = not yet */
} pending;

struct job {
  gnmrd *d;
  char *name;
  uint32_t pass;             /* 1, +1 at each resume */
  uint32_t pub_pass;         /* pass of the last published decision */
  uint64_t pub_step;         /* its step: a pass publishes each step once */
  policy_params hello_params;/* what its agents send (fixed) */
  policy_params params;      /* in force (changed by gnmrctl set) */
  uint32_t reporters, barrier_ms, byes;
  policy *pol;
  hmap unit_ids;             /* name -> id */
  char **unit_names;         /* by id */
  uint32_t *shards;          /* by id: ranks holding the unit */
  uint32_t n_units, cap_units;
  rank_reg *ranks;
  rank_reg *observers;       /* data-parallel replicas: decisions only */
  uint32_t n_observers, cap_observers;
  pending pend[MAX_PENDING]; /* sorted by step */
  uint32_t n_pend;
  uint64_t last_decided;
  uv_timer_t timer;
  /* decision scratch, by unit id */
  double *norm, *acc;
  uint8_t *input;
  uint32_t *got, *nrc;
  uint64_t *nfc;
};

/* A connection identity's membership. */
typedef struct peer {
  job *j;
  uint32_t rank;  /* for an observer: its index in j->observers */
  int observer;
} peer;

/* ---- history --------------------------------------------------------------- */

static void put(job *j, store_rec *r) {
  if (r == NULL)
    return;
  if (j->d->st == NULL)
    store_rec_free(r);
  else
    store_put(j->d->st, r);
}

/* An operational event: kind with a free-form detail; rank or
 * UINT32_MAX. */
static void put_event(job *j, const char *kind, uint32_t rank,
                      const char *detail) {
  store_rec *r = store_rec_new(REC_EVENT, j->name);
  if (r == NULL)
    return;
  r->pass = j->pass;
  r->step = j->last_decided;
  r->rank = rank;
  r->text = strdup(kind);
  r->detail = detail ? strdup(detail) : NULL;
  put(j, r);
}

static void put_job(job *j) {
  store_rec *r = store_rec_new(REC_JOB, j->name);
  if (r == NULL)
    return;
  r->pass = j->pass;
  r->step = j->last_decided + 1;
  r->reporters = j->reporters;
  r->barrier_ms = j->barrier_ms;
  r->params = j->hello_params;
  put(j, r);
  if (!gnmr__params_equal(&j->params, &j->hello_params)) {
    store_rec *pr = store_rec_new(REC_PARAMS, j->name);
    if (pr) {
      pr->pass = j->pass;
      pr->step = j->last_decided + 1;
      pr->params = j->params;
      put(j, pr);
    }
  }
}

/* Records a rank's units: (id, name) pairs and its id list. */
static void put_rank(job *j, uint32_t rank) {
  rank_reg *rr = &j->ranks[rank];
  store_rec *u = store_rec_new(REC_UNITS, j->name);
  store_rec *r = store_rec_new(REC_RANK, j->name);
  if (u && r && (u->ids = malloc(rr->n_units * sizeof *u->ids)) &&
      (u->names = calloc(rr->n_units, sizeof *u->names)) &&
      (r->ids = malloc(rr->n_units * sizeof *r->ids))) {
    u->n = r->n = rr->n_units;
    r->rank = rank;
    for (uint32_t i = 0; i < rr->n_units; i++) {
      u->ids[i] = r->ids[i] = rr->ids[i];
      u->names[i] = strdup(j->unit_names[rr->ids[i]]);
      if (u->names[i] == NULL)
        u->names[i] = strdup("?");
    }
    put(j, u);
    put(j, r);
    return;
  }
  store_rec_free(u);
  store_rec_free(r);
}

static store_rec *snapshot_rec(job *j, int kind) {
  store_rec *r = store_rec_new(kind, j->name);
  if (r == NULL)
    return NULL;
  size_t len = policy_export_size(j->pol);
  if ((r->snapshot = malloc(len)) == NULL ||
      policy_export(j->pol, r->snapshot, len, &r->snapshot_len) != GNMR_OK) {
    store_rec_free(r);
    return NULL;
  }
  r->pass = j->pass;
  r->step = policy_last_step(j->pol);
  return r;
}

/* The step record: summary, decision, events (with norms and scores) and,
 * every snapshot_every steps, the policy state after the step. */
static void put_step(job *j, const pending *p, const policy_result *res,
                     uint32_t missing, int by_deadline) {
  store_rec *r = NULL;
  if (j->d->st == NULL)
    return;
  int snap = p->step % store_snapshot_every(j->d->st) == 0;
  r = snap ? snapshot_rec(j, REC_STEP) : store_rec_new(REC_STEP, j->name);
  if (r == NULL)
    return;
  r->kind = REC_STEP;
  r->pass = j->pass;
  r->step = p->step;
  r->reports = p->got;
  r->risky = res->n_risky;
  r->pool = res->n_pool;
  r->n = res->n_active;
  r->missing = missing;
  r->by_deadline = (uint32_t)by_deadline;
  r->latency_us = (uv_now(j->d->loop) - p->first_ms) * 1000;
  r->active = malloc((size_t)res->n_active * 11 + 1);
  if (r->active) {
    size_t off = 0;
    r->active[0] = '\0';
    for (uint32_t i = 0; i < res->n_active; i++)
      off += (size_t)sprintf(r->active + off, i ? " %u" : "%u",
                             res->active[i]);
  }
  if (res->n_events > 0 &&
      (r->events = malloc(res->n_events * sizeof *r->events)) != NULL) {
    r->n_events = res->n_events;
    for (uint32_t i = 0; i < res->n_events; i++) {
      const policy_event *e = &res->events[i];
      store_event *o = &r->events[i];
      int has_unit = e->unit != UINT32_MAX;
      o->unit = e->unit;
      o->kind = e->kind;
      o->outcome = e->outcome;
      o->count = e->count;
      o->norm = has_unit && j->input[e->unit] == POLICY_REPORTED
                    ? j->norm[e->unit]
                    : NAN;
      o->g = has_unit ? res->g[e->unit] : NAN;
      o->d = has_unit ? res->d[e->unit] : NAN;
      o->s = has_unit ? res->s[e->unit] : NAN;
    }
  }
  put(j, r);
}

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

/* ---- job lifetime ----------------------------------------------------------- */

static void pending_clear(job *j, pending *p) {
  for (uint32_t r = 0; r < j->reporters; r++)
    gnmr__wire_free(&p->by_rank[r].env);
  free(p->by_rank);
  memset(p, 0, sizeof *p);
}

static void job_timer_closed(uv_handle_t *h) {
  job *j = h->data;
  free(j);
}

/* Frees a job: its state, its peers' memberships, then (via the loop) the
 * struct itself. The caller removes it from d->jobs. */
static void job_free(job *j) {
  gnmrd *d = j->d;
  for (uint32_t r = 0; r < j->reporters; r++) {
    rank_reg *rr = &j->ranks[r];
    if (rr->ident) {
      uint64_t v;
      if (hmap_get(&d->peers, rr->ident, rr->ident_len, &v)) {
        peer *p = (peer *)(uintptr_t)v;
        if (p->j == j) {
          hmap_del(&d->peers, rr->ident, rr->ident_len);
          free(p);
        }
      }
      free(rr->ident);
    }
    free(rr->ids);
    free(rr->user);
  }
  for (uint32_t o = 0; o < j->n_observers; o++) {
    rank_reg *rr = &j->observers[o];
    uint64_t v;
    if (rr->ident && hmap_get(&d->peers, rr->ident, rr->ident_len, &v)) {
      peer *p = (peer *)(uintptr_t)v;
      if (p->j == j) {
        hmap_del(&d->peers, rr->ident, rr->ident_len);
        free(p);
      }
    }
    free(rr->ident);
    free(rr->ids);
    free(rr->user);
  }
  free(j->observers);
  for (uint32_t i = 0; i < j->n_pend; i++)
    pending_clear(j, &j->pend[i]);
  for (uint32_t u = 0; u < j->n_units; u++)
    free(j->unit_names[u]);
  free(j->unit_names);
  free(j->shards);
  free(j->ranks);
  free(j->norm);
  free(j->acc);
  free(j->input);
  free(j->got);
  free(j->nrc);
  free(j->nfc);
  hmap_free(&j->unit_ids);
  policy_destroy(&j->pol);
  free(j->name);
  uv_timer_stop(&j->timer);
  uv_close((uv_handle_t *)&j->timer, job_timer_closed);
}

static void deadline_cb(uv_timer_t *t);

static job *job_create(gnmrd *d, const char *name, const policy_params *prm,
                       uint32_t reporters, uint32_t barrier_ms) {
  job *j = calloc(1, sizeof *j);
  if (j == NULL)
    return NULL;
  j->d = d;
  j->pass = 1;
  j->hello_params = *prm;
  j->params = *prm;
  j->reporters = reporters;
  j->barrier_ms = barrier_ms;
  j->name = strdup(name);
  j->ranks = calloc(reporters, sizeof *j->ranks);
  if (j->name == NULL || j->ranks == NULL ||
      policy_create(prm, 0, &j->pol) != GNMR_OK ||
      hmap_put(&d->jobs, name, strlen(name), (uintptr_t)j) != GNMR_OK) {
    policy_destroy(&j->pol);
    free(j->name);
    free(j->ranks);
    free(j);
    return NULL;
  }
  uv_timer_init(d->loop, &j->timer);
  j->timer.data = j;
  d->c.jobs_created++;
  LOG(INFO, "JOB-CREATE", "job %s: %u reporters, barrier %u ms", name,
      reporters, barrier_ms);
  return j;
}

/* Grows the per-unit arrays to hold n units. */
static int job_reserve_units(job *j, uint32_t n) {
  if (n <= j->cap_units)
    return GNMR_OK;
  uint32_t cap = j->cap_units ? j->cap_units : 64;
  while (cap < n)
    cap *= 2;
#define GROW(field)                                                   \
  do {                                                                \
    void *p = realloc(j->field, (size_t)cap * sizeof *j->field);      \
    if (p == NULL)                                                    \
      return GNMR_E_NOMEM;                                            \
    j->field = p;                                                     \
  } while (0)
  GROW(unit_names);
  GROW(shards);
  GROW(norm);
  GROW(acc);
  GROW(input);
  GROW(got);
  GROW(nrc);
  GROW(nfc);
#undef GROW
  j->cap_units = cap;
  return GNMR_OK;
}

/* ---- deciding ------------------------------------------------------------------ */

/* Forgets a registration's connection: its peer entry and identity. */
static void drop_connection(gnmrd *d, rank_reg *rr) {
  uint64_t v;
  if (rr->ident != NULL && hmap_get(&d->peers, rr->ident, rr->ident_len, &v)) {
    free((peer *)(uintptr_t)v);
    hmap_del(&d->peers, rr->ident, rr->ident_len);
  }
  free(rr->ident);
  rr->ident = NULL;
  rr->ident_len = 0;
}

/* A Decision could not reach a connection that ZeroMQ no longer has (it
 * closed, or missed its heartbeats): nothing more is sent to it. An
 * observer's slot is free again; a rank stays in the job (its shards count
 * as missing) until it joins again. */
static void connection_gone(job *j, rank_reg *rr, int observer) {
  LOG(INFO, "PEER-GONE", "job %s: %s connection gone; no more decisions "
      "sent to it", j->name, observer ? "an observer's" : "a rank's");
  drop_connection(j->d, rr);
  if (observer)
    rr->joined = 0;
}

/* Decides pending step p (the oldest), sends the decision, frees p. */
static void decide(job *j, pending *p, int by_deadline) {
  gnmrd *d = j->d;
  uint32_t n = j->n_units;
  policy_result res;
  memset(j->acc, 0, n * sizeof *j->acc);
  memset(j->got, 0, n * sizeof *j->got);
  memset(j->nrc, 0, n * sizeof *j->nrc);
  memset(j->nfc, 0, n * sizeof *j->nfc);
  for (uint32_t r = 0; r < j->reporters; r++) { /* rank order */
    held_report *h = &p->by_rank[r];
    rank_reg *rr = &j->ranks[r];
    if (h->env == NULL)
      continue;
    for (uint32_t i = 0; i < rr->n_units; i++) {
      uint32_t id = rr->ids[i];
      j->got[id]++;
      if (h->nr && h->nr[i]) {
        j->nrc[id]++;
        continue;
      }
      j->acc[id] += h->sumsq[i];
      if (h->nonfinite)
        j->nfc[id] += h->nonfinite[i];
    }
  }
  /* The job's layout is known once every rank has said Hello: before
   * that, a unit may have shards on a rank not yet seen, and the sum of
   * the shards that came would pass for the whole unit's norm. Every unit
   * is then missing (its statistics wait), never a smaller norm. */
  int layout_known = 1;
  for (uint32_t r = 0; r < j->reporters && layout_known; r++)
    layout_known = j->ranks[r].ever;
  uint32_t missing = 0;
  for (uint32_t u = 0; u < n; u++) {
    j->norm[u] = 0;
    if (!layout_known || j->got[u] < j->shards[u] ||
        (j->nrc[u] > 0 && j->nrc[u] < j->got[u])) {
      j->input[u] = POLICY_MISSING;
      d->c.missing_units++;
      missing++;
    } else if (j->nrc[u] == j->got[u]) {
      j->input[u] = POLICY_NOT_REPORTED;
    } else {
      j->input[u] = POLICY_REPORTED;
      j->norm[u] = j->nfc[u] > 0 ? NAN : sqrt(j->acc[u]);
    }
  }
  /* the invariant every rank relies on: one decision per step per pass */
  int again = j->pub_pass == j->pass && p->step <= j->pub_step;
  int rv = again ? GNMR_OK
                 : policy_step(j->pol, p->step, j->norm, j->input, &res);
  if (again) { /* nothing decided, published or stored */
    d->c.republish_refused++;
    LOG(ERROR, "JOB-REPUBLISH", "job %s: step %llu was already published in "
        "pass %u (up to step %llu); not deciding it again", j->name,
        (unsigned long long)p->step, j->pass,
        (unsigned long long)j->pub_step);
  } else if (rv != GNMR_OK) {
    LOG(ERROR, "JOB-DECIDE", "job %s step %llu: %s", j->name,
        (unsigned long long)p->step, gnmr_strerror(rv));
  } else {
    Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
    Gnmr__Decision dec = GNMR__DECISION__INIT;
    uint8_t *buf;
    size_t len;
    dec.job = j->name;
    dec.step = p->step;
    dec.n_active = res.n_active;
    dec.active = (uint32_t *)res.active;
    env.body_case = GNMR__ENVELOPE__BODY_DECISION;
    env.decision = &dec;
    if (gnmr__wire_encode(&env, &buf, &len) == GNMR_OK) {
      for (uint32_t r = 0; r < j->reporters + j->n_observers; r++) {
        rank_reg *rr = r < j->reporters ? &j->ranks[r]
                                        : &j->observers[r - j->reporters];
        if (!rr->joined || rr->ident == NULL)
          continue;
        int srv = server_send(d->agents, rr->ident, rr->ident_len, buf, len);
        if (srv == GNMR_OK) {
          d->c.decisions_sent++;
        } else {
          d->c.send_failures++;
          if (srv == GNMR_E_CLOSED)
            connection_gone(j, rr, r >= j->reporters);
        }
      }
      free(buf);
    }
    j->pub_pass = j->pass;
    j->pub_step = p->step;
    d->c.steps_decided++;
    if (by_deadline)
      d->c.deadline_decisions++;
    put_step(j, p, &res, missing, by_deadline);
    metrics_observe_decision(d, (double)(uv_hrtime() - p->first_ns) * 1e-9);
  }
  j->last_decided = p->step;
  pending_clear(j, p);
  /* p is pend[0]: shift the rest down */
  memmove(&j->pend[0], &j->pend[1], (j->n_pend - 1) * sizeof j->pend[0]);
  j->n_pend--;
  memset(&j->pend[j->n_pend], 0, sizeof j->pend[0]);
}

/* Arms the job's timer for the earliest pending deadline. */
static void rearm(job *j) {
  uv_timer_stop(&j->timer);
  if (j->n_pend == 0)
    return;
  uint64_t now = uv_now(j->d->loop), first = j->pend[0].deadline;
  for (uint32_t i = 1; i < j->n_pend; i++)
    if (j->pend[i].deadline < first)
      first = j->pend[i].deadline;
  uv_timer_start(&j->timer, deadline_cb, first > now ? first - now : 0, 0);
}

static uint32_t expected(const job *j) {
  uint32_t e = j->reporters - j->byes;
  return e ? e : 1;
}

/* Decides, in step order, every pending step that is complete or whose
 * deadline passed, and every step below one of those. */
static void decide_ready(job *j) {
  uint64_t now = uv_now(j->d->loop);
  for (;;) {
    int32_t last = -1;
    for (uint32_t i = 0; i < j->n_pend; i++)
      if (j->pend[i].got >= expected(j) || j->pend[i].deadline <= now)
        last = (int32_t)i;
    if (last < 0)
      break;
    for (int32_t i = 0; i <= last; i++) {
      int complete = j->pend[0].got >= expected(j);
      decide(j, &j->pend[0], !complete);
    }
  }
  server_kick(j->d->agents);
  rearm(j);
}

static void deadline_cb(uv_timer_t *t) { decide_ready(t->data); }

/* ---- messages ------------------------------------------------------------------ */

static void welcome(gnmrd *d, const void *id, size_t id_len, job *j,
                    const rank_reg *rr, uint32_t rank) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Welcome w = GNMR__WELCOME__INIT;
  Gnmr__Params wp;
  uint8_t *buf;
  size_t len;
  gnmr__params_to_wire(&j->params, &wp);
  w.job = j->name;
  w.rank = rank;
  w.n_unit_ids = rr->n_units;
  w.unit_ids = rr->ids;
  w.params = &wp;
  w.last_step = j->last_decided;
  env.body_case = GNMR__ENVELOPE__BODY_WELCOME;
  env.welcome = &w;
  if (gnmr__wire_encode(&env, &buf, &len) == GNMR_OK)
    reply(d, id, id_len, buf, len);
}

/* Registers rank's units in j: existing names become shards, new names get
 * the ids the Hello asks for (Hello.unit_ids) or the next free ones. Ids
 * never reported by anyone (gaps) are units with no shard: never reported.
 * On failure nothing changes and why says what conflicts. */
static int register_units(job *j, rank_reg *rr, const Gnmr__Hello *h,
                          int shards, char *why, size_t whylen) {
  size_t n = h->n_units;
  int want = h->n_unit_ids > 0;
  uint32_t *ids = malloc(n * sizeof *ids);
  hmap asked = {0}; /* ids requested by new names in this Hello */
  uint32_t new_n = j->n_units, n_auto = 0;
  int rv = GNMR_E_NOMEM;
  if (ids == NULL)
    return GNMR_E_NOMEM;
  for (size_t i = 0; i < n; i++) { /* pass 1: decide, change nothing */
    uint64_t v;
    const char *nm = h->units[i];
    uint32_t req = want ? h->unit_ids[i] : 0;
    if (hmap_get(&j->unit_ids, nm, strlen(nm), &v)) {
      if (want && req != v) {
        snprintf(why, whylen, "unit '%.64s' has id %u in this job, not %u",
                 nm, (uint32_t)v, req);
        rv = GNMR_E_MISMATCH;
        goto out;
      }
      ids[i] = (uint32_t)v;
    } else if (want) {
      if ((req < j->n_units && j->unit_names[req] != NULL) ||
          hmap_get(&asked, &req, sizeof req, NULL)) {
        snprintf(why, whylen, "unit id %u is already taken (asked for "
                              "'%.64s')", req, nm);
        rv = GNMR_E_MISMATCH;
        goto out;
      }
      if (hmap_put(&asked, &req, sizeof req, i) != GNMR_OK)
        goto out;
      ids[i] = req;
      if (req + 1 > new_n)
        new_n = req + 1;
    } else {
      ids[i] = UINT32_MAX; /* numbered after every requested id */
      n_auto++;
    }
  }
  if ((uint64_t)new_n + n_auto > POLICY_MAX_UNITS) {
    snprintf(why, whylen, "a job has at most %u units", POLICY_MAX_UNITS);
    rv = GNMR_E_RANGE;
    goto out;
  }
  uint32_t old_n = j->n_units, total = new_n + n_auto;
  if (job_reserve_units(j, total) != GNMR_OK ||
      policy_resize(j->pol, total) != GNMR_OK)
    goto out; /* the arrays may have grown: harmless */
  for (uint32_t u = old_n; u < total; u++) {
    j->unit_names[u] = NULL;
    j->shards[u] = 0;
  }
  for (size_t i = 0, next = new_n; i < n; i++) { /* pass 2: apply */
    const char *nm = h->units[i];
    if (hmap_get(&j->unit_ids, nm, strlen(nm), NULL))
      continue;
    if (ids[i] == UINT32_MAX)
      ids[i] = (uint32_t)next++;
    char *copy = strdup(nm);
    if (copy == NULL ||
        hmap_put(&j->unit_ids, nm, strlen(nm), ids[i]) != GNMR_OK) {
      free(copy);
      for (uint32_t u = old_n; u < total; u++) /* roll the names back */
        if (j->unit_names[u] != NULL) {
          hmap_del(&j->unit_ids, j->unit_names[u], strlen(j->unit_names[u]));
          free(j->unit_names[u]);
          j->unit_names[u] = NULL;
        }
      for (size_t k = 0; k < i; k++) /* names below old_n: requested gaps */
        if (ids[k] < old_n && j->unit_names[ids[k]] != NULL &&
            j->shards[ids[k]] == 0) {
          hmap_del(&j->unit_ids, j->unit_names[ids[k]],
                   strlen(j->unit_names[ids[k]]));
          free(j->unit_names[ids[k]]);
          j->unit_names[ids[k]] = NULL;
        }
      goto out;
    }
    j->unit_names[ids[i]] = copy;
  }
  j->n_units = total;
  for (size_t i = 0; shards && i < n; i++)
    j->shards[ids[i]]++;
  rr->ids = ids;
  rr->n_units = (uint32_t)n;
  rr->ever = 1;
  ids = NULL;
  rv = GNMR_OK;
out:
  hmap_free(&asked);
  free(ids);
  return rv;
}

/* Whether Hello h lists exactly the units rank rr registered before. */
static int same_units(const job *j, const rank_reg *rr, const Gnmr__Hello *h) {
  if (h->n_units != rr->n_units)
    return 0;
  for (size_t i = 0; i < h->n_units; i++)
    if (strcmp(j->unit_names[rr->ids[i]], h->units[i]) != 0 ||
        (h->n_unit_ids > 0 && h->unit_ids[i] != rr->ids[i]))
      return 0;
  return 1;
}

/* An observer joins job j (a Hello with observer set): its units map
 * decisions to its own units but add no shard; it gets every Decision and
 * never reports. A free slot is reused; at most MAX_OBSERVERS per job. */
#define MAX_OBSERVERS 4096u
static void observer_join(gnmrd *d, const void *id, size_t id_len, job *j,
                          const Gnmr__Hello *h, peer *pr, const char *user) {
  rank_reg *rr;
  char why[160] = "out of memory";
  int rv;
  if (pr != NULL) { /* the same connection again: welcome it again */
    welcome(d, id, id_len, j, &j->observers[pr->rank], 0);
    return;
  }
  uint32_t slot = 0;
  while (slot < j->n_observers && j->observers[slot].joined)
    slot++;
  if (slot == j->n_observers) {
    if (j->n_observers == MAX_OBSERVERS) {
      d->c.hellos_refused++;
      reply_error(d, id, id_len, GNMR_E_BUSY, "observer", 0,
                  "job %.64s has %u observers already", j->name,
                  MAX_OBSERVERS);
      return;
    }
    if (j->n_observers == j->cap_observers) {
      uint32_t cap = j->cap_observers ? j->cap_observers * 2 : 8;
      rank_reg *o = realloc(j->observers, cap * sizeof *o);
      if (o == NULL)
        goto nomem;
      j->observers = o;
      j->cap_observers = cap;
    }
    memset(&j->observers[slot], 0, sizeof j->observers[slot]);
    j->n_observers++;
  }
  rr = &j->observers[slot];
  free(rr->ids);
  free(rr->ident);
  free(rr->user);
  memset(rr, 0, sizeof *rr);
  if ((rv = register_units(j, rr, h, 0, why, sizeof why)) != GNMR_OK) {
    d->c.hellos_refused++;
    reply_error(d, id, id_len, rv, "units", 0, "%s", why);
    return;
  }
  peer *np = malloc(sizeof *np);
  rr->ident = malloc(id_len ? id_len : 1);
  if (np == NULL || rr->ident == NULL ||
      hmap_put(&d->peers, id, id_len, (uintptr_t)np) != GNMR_OK) {
    free(np);
    goto nomem;
  }
  memcpy(rr->ident, id, id_len);
  rr->ident_len = id_len;
  rr->joined = 1;
  rr->user = user ? strdup(user) : NULL;
  *np = (peer){j, slot, 1};
  LOG(INFO, "OBSERVER-JOIN", "job %s: an observer joined with %zu units",
      j->name, h->n_units);
  welcome(d, id, id_len, j, rr, 0);
  return;
nomem:
  d->c.hellos_refused++;
  reply_error(d, id, id_len, GNMR_E_NOMEM, "observer", 0, "out of memory");
}

static void on_hello(gnmrd *d, const void *id, size_t id_len,
                     const Gnmr__Hello *h, const char *user) {
  policy_params prm;
  uint32_t barrier = 0;
  d->c.hellos++;
#define REFUSE(code, ref, ...)                                   \
  do {                                                           \
    d->c.hellos_refused++;                                       \
    reply_error(d, id, id_len, code, ref, 0, __VA_ARGS__);       \
    return;                                                      \
  } while (0)
  {
    const char *ref = "";
    char why[256];
    int vrv = gnmr__validate_hello(h, d->cfg ? &d->cfg->policy : NULL,
                                   d->cfg ? (uint32_t)d->cfg->barrier_ms : 0,
                                   &prm, &barrier, &ref, why, sizeof why);
    if (vrv != GNMR_OK)
      REFUSE(vrv, ref, "%s", why);
  }
  uint64_t v;
  peer *pr = NULL;
  if (hmap_get(&d->peers, id, id_len, &v)) {
    pr = (peer *)(uintptr_t)v;
    if (strcmp(pr->j->name, h->job) != 0 || pr->observer != h->observer ||
        (!pr->observer && pr->rank != h->rank))
      REFUSE(GNMR_E_MISMATCH, "rank",
             "this connection already joined job %.64s as %s %u",
             pr->j->name, pr->observer ? "observer" : "rank", pr->rank);
  }
  job *j = hmap_get(&d->jobs, h->job, strlen(h->job), &v)
               ? (job *)(uintptr_t)v
               : NULL;
  if (j != NULL) {
    if (j->reporters != h->reporters)
      REFUSE(GNMR_E_MISMATCH, "reporters",
             "job %.64s has %u reporters, this agent says %u", j->name,
             j->reporters, h->reporters);
    if (!gnmr__params_equal(&j->hello_params, &prm))
      REFUSE(GNMR_E_MISMATCH, "params",
             "job %.64s runs with other policy parameters", j->name);
    if (j->barrier_ms != barrier)
      REFUSE(GNMR_E_MISMATCH, "barrier_ms",
             "job %.64s has a %u ms barrier, this agent says %u", j->name,
             j->barrier_ms, barrier);
  } else if ((j = job_create(d, h->job, &prm, h->reporters, barrier)) ==
             NULL) {
    REFUSE(GNMR_E_NOMEM, "job", "out of memory");
  } else {
    put_job(j);
    put_event(j, "job_started", UINT32_MAX, NULL);
  }
  if (h->observer) {
    observer_join(d, id, id_len, j, h, pr, user);
    return;
  }
  rank_reg *rr = &j->ranks[h->rank];
  int returning = rr->ever && !rr->joined; /* said Bye before */
  /* under CURVE a rank belongs to the key it first joined with */
  if (user != NULL && rr->user != NULL && strcmp(user, rr->user) != 0)
    REFUSE(GNMR_E_MISMATCH, "rank",
           "rank %u of job %.64s joined with another key", h->rank, j->name);
  if (rr->ever && !same_units(j, rr, h))
    REFUSE(GNMR_E_MISMATCH, "units",
           "rank %u of job %.64s joined before with other units", h->rank,
           j->name);
  if (!rr->ever) {
    char why[160] = "out of memory";
    int urv = register_units(j, rr, h, 1, why, sizeof why);
    if (urv != GNMR_OK)
      REFUSE(urv, "unit_ids", "%s", why);
    put_rank(j, h->rank);
  }

  /* Bind this connection to (job, rank), replacing an older connection. */
  if (pr == NULL) {
    if (rr->ident != NULL && hmap_get(&d->peers, rr->ident, rr->ident_len,
                                      &v)) {
      free((peer *)(uintptr_t)v);
      hmap_del(&d->peers, rr->ident, rr->ident_len);
    }
    char *ident = malloc(id_len ? id_len : 1);
    pr = malloc(sizeof *pr);
    if (ident == NULL || pr == NULL ||
        hmap_put(&d->peers, id, id_len, (uintptr_t)pr) != GNMR_OK) {
      free(ident);
      free(pr);
      REFUSE(GNMR_E_NOMEM, "rank", "out of memory");
    }
    memcpy(ident, id, id_len);
    free(rr->ident);
    rr->ident = ident;
    rr->ident_len = id_len;
    pr->j = j;
    pr->rank = h->rank;
    pr->observer = 0;
  }
  if (returning && j->byes > 0)
    j->byes--; /* a rank that said Bye came back */
  if (j->last_decided > 0)
    rr->rejoined = 1;
  if (user != NULL && rr->user == NULL)
    rr->user = strdup(user);
  if (!rr->joined) {
    char detail[32];
    snprintf(detail, sizeof detail, "rank %u", h->rank);
    put_event(j, "agent_joined", h->rank, detail);
  }
  rr->joined = 1;
  LOG(INFO, "AGENT-JOIN", "job %s rank %u/%u joined with %zu units",
      j->name, h->rank, j->reporters, h->n_units);
  welcome(d, id, id_len, j, rr, h->rank);
#undef REFUSE
}

static pending *find_or_add_pending(job *j, uint64_t step) {
  uint32_t i = 0;
  while (i < j->n_pend && j->pend[i].step < step)
    i++;
  if (i < j->n_pend && j->pend[i].step == step)
    return &j->pend[i];
  if (j->n_pend == MAX_PENDING)
    return NULL;
  held_report *by_rank = calloc(j->reporters, sizeof *by_rank);
  if (by_rank == NULL)
    return NULL;
  memmove(&j->pend[i + 1], &j->pend[i], (j->n_pend - i) * sizeof j->pend[0]);
  j->n_pend++;
  pending *p = &j->pend[i];
  p->step = step;
  p->got = 0;
  p->by_rank = by_rank;
  p->first_ms = uv_now(j->d->loop);
  p->first_ns = uv_hrtime();
  p->deadline = p->first_ms + j->barrier_ms;
  return p;
}

/* Handles a Report; returns 1 when it kept env (held until its step is
 * decided), 0 when the caller still owns it. */
static int on_report(gnmrd *d, const void *id, size_t id_len,
                     Gnmr__Envelope *env) {
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
  if (pr->observer)
    REFUSE(GNMR_E_PROTO, "observer", "an observer does not report");
  rank_reg *rr = &j->ranks[pr->rank];
  if (strcmp(r->job, j->name) != 0 || r->rank != pr->rank)
    REFUSE(GNMR_E_MISMATCH, "rank",
           "report for job %.64s rank %u on the connection of job %.64s "
           "rank %u", r->job, r->rank, j->name, pr->rank);
  {
    const char *ref = "";
    char why[256];
    int vrv = gnmr__validate_report(r, rr->n_units, &ref, why, sizeof why);
    if (vrv != GNMR_OK)
      REFUSE(vrv, ref, "%s", why);
  }
  if (r->step <= j->last_decided && rr->rejoined &&
      r->step <= rr->last_step) {
    /* Training restarted from a checkpoint: the rank went back below its
     * own last accepted step. A new pass over these steps, with the
     * statistics kept; undecided steps of the old pass go. A report that
     * is only late (a rank back from a partition flushing what it held:
     * above its own last step, at or below the job's) is no restart. */
    char detail[96];
    snprintf(detail, sizeof detail, "pass %u: training restarted at step "
             "%llu after step %llu", j->pass + 1,
             (unsigned long long)r->step, (unsigned long long)j->last_decided);
    for (uint32_t i = 0; i < j->n_pend; i++)
      pending_clear(j, &j->pend[i]);
    j->n_pend = 0;
    j->pass++;
    j->last_decided = r->step - 1;
    for (uint32_t k = 0; k < j->reporters; k++)
      j->ranks[k].last_step = j->last_decided;
    put_job(j);
    put_event(j, "job_resumed", UINT32_MAX, detail);
    LOG(INFO, "JOB-RESUME", "job %s: %s", j->name, detail);
  }
  if (r->step <= j->last_decided) {
    d->c.late_reports++; /* dropped and counted: no reply */
    return 0;
  }
  rr->rejoined = 0;
  if (r->step > j->last_decided + MAX_AHEAD && j->last_decided > 0) {
    d->c.future_reports++;
    REFUSE(GNMR_E_RANGE, "step", "step %llu is more than %u steps past the "
                                 "last decided step %llu",
           (unsigned long long)r->step, MAX_AHEAD,
           (unsigned long long)j->last_decided);
  }
  pending *p = find_or_add_pending(j, r->step);
  if (p == NULL) {
    d->c.future_reports++;
    REFUSE(GNMR_E_BUSY, "step", "%u steps are already waiting for reports",
           MAX_PENDING);
  }
  held_report *h = &p->by_rank[pr->rank];
  if (h->env != NULL) {
    d->c.duplicate_reports++;
    REFUSE(GNMR_E_DUP, "step", "duplicate report for step %llu",
           (unsigned long long)r->step);
  }
  h->env = env; /* kept: its arrays are read when the step is decided */
  if (rr->last_step == UINT64_MAX || r->step > rr->last_step)
    rr->last_step = r->step;
  h->sumsq = r->sumsq;
  h->nonfinite = r->n_nonfinite ? r->nonfinite : NULL;
  h->nr = r->n_not_reported ? r->not_reported : NULL;
  p->got++;
  d->c.reports++;
  decide_ready(j);
  return 1;
#undef REFUSE
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
  uint32_t rank = pr->rank;
  if (pr->observer) { /* its slot is free again */
    drop_connection(d, &j->observers[rank]);
    j->observers[rank].joined = 0;
    return;
  }
  rank_reg *rr = &j->ranks[rank];
  drop_connection(d, rr);
  if (rr->joined) {
    char detail[32];
    snprintf(detail, sizeof detail, "rank %u", rank);
    put_event(j, "agent_left", rank, detail);
    rr->joined = 0;
    j->byes++;
  }
  if (j->byes >= j->reporters) {
    LOG(INFO, "JOB-FINISH", "job %s finished at step %llu", j->name,
        (unsigned long long)j->last_decided);
    put_event(j, "job_finished", UINT32_MAX, NULL);
    put(j, snapshot_rec(j, REC_SNAPSHOT));
    store_rec *st = store_rec_new(REC_STATE, j->name);
    if (st) {
      st->text = strdup("finished");
      put(j, st);
    }
    hmap_del(&d->jobs, j->name, strlen(j->name));
    d->c.jobs_finished++;
    job_free(j);
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
    kept = on_report(d, id, id_len, env);
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
  uint64_t v;
  /* job_free() edits d->peers, never d->jobs: iterating jobs is safe */
  while (hmap_next(&d->jobs, &pos, NULL, NULL, &v))
    job_free((job *)(uintptr_t)v);
  hmap_free(&d->jobs);
  pos = 0;
  while (hmap_next(&d->peers, &pos, NULL, NULL, &v))
    free((peer *)(uintptr_t)v);
  hmap_free(&d->peers);
}

size_t jobs_names(gnmrd *d, const char **names, size_t cap) {
  size_t n = 0, pos = 0;
  uint64_t v;
  while (n < cap && hmap_next(&d->jobs, &pos, NULL, NULL, &v))
    names[n++] = ((job *)(uintptr_t)v)->name;
  return n;
}

/* ---- restore, snapshots, retuning, views ------------------------------------ */

void jobs_restore(const store_job *sj, void *ctx) {
  gnmrd *d = ctx;
  job *j = job_create(d, sj->name, &sj->hello_params, sj->reporters,
                      sj->barrier_ms);
  if (j == NULL) {
    LOG(ERROR, "JOB-RESTORE", "job %s: out of memory", sj->name);
    return;
  }
  j->pass = sj->pass + 1;
  policy *pol = NULL;
  if (sj->snapshot != NULL &&
      policy_import(sj->snapshot, sj->snapshot_len, &pol) == GNMR_OK) {
    policy_destroy(&j->pol);
    j->pol = pol;
    j->params = *policy_get_params(pol);
  } else {
    if (sj->snapshot != NULL)
      LOG(ERROR, "JOB-RESTORE", "job %s: snapshot unreadable, statistics "
                                "start afresh", sj->name);
    if (policy_set_params(j->pol, &sj->params) == GNMR_OK)
      j->params = sj->params;
  }
  j->last_decided = policy_last_step(j->pol);
  uint32_t n = sj->n_units;
  if (policy_units(j->pol) > n)
    n = policy_units(j->pol);
  if (job_reserve_units(j, n) != GNMR_OK ||
      policy_resize(j->pol, n) != GNMR_OK) {
    LOG(ERROR, "JOB-RESTORE", "job %s: out of memory", sj->name);
    hmap_del(&d->jobs, j->name, strlen(j->name));
    job_free(j);
    return;
  }
  for (uint32_t u = 0; u < n; u++) {
    j->shards[u] = 0;
    j->unit_names[u] = NULL;
    if (u < sj->n_units && sj->unit_names[u] != NULL &&
        (j->unit_names[u] = strdup(sj->unit_names[u])) != NULL)
      hmap_put(&j->unit_ids, j->unit_names[u], strlen(j->unit_names[u]), u);
  }
  j->n_units = n;
  for (uint32_t r = 0; r < j->reporters; r++)
    j->ranks[r].last_step = UINT64_MAX; /* a rejoining rank's lower step
                                           restarts training */
  for (uint32_t r = 0; r < sj->n_ranks; r++) {
    rank_reg *rr = &j->ranks[r];
    if (sj->rank_n[r] == 0 ||
        (rr->ids = malloc(sj->rank_n[r] * sizeof *rr->ids)) == NULL)
      continue;
    memcpy(rr->ids, sj->rank_ids[r], sj->rank_n[r] * sizeof *rr->ids);
    rr->n_units = sj->rank_n[r];
    rr->ever = 1;
    for (uint32_t i = 0; i < rr->n_units; i++)
      j->shards[rr->ids[i]]++;
  }
  put_job(j);
  char detail[96];
  snprintf(detail, sizeof detail, "pass %u: gnmrd restarted; state from the "
           "snapshot at step %llu", j->pass,
           (unsigned long long)j->last_decided);
  put_event(j, "job_resumed", UINT32_MAX, detail);
  LOG(INFO, "JOB-RESTORE", "job %s: %s", j->name, detail);
}

void jobs_snapshot_all(gnmrd *d) {
  size_t pos = 0;
  uint64_t v;
  while (hmap_next(&d->jobs, &pos, NULL, NULL, &v)) {
    job *j = (job *)(uintptr_t)v;
    if (policy_last_step(j->pol) > 0)
      put(j, snapshot_rec(j, REC_SNAPSHOT));
  }
}

job *jobs_find(gnmrd *d, const char *name) {
  uint64_t v;
  return hmap_get(&d->jobs, name, strlen(name), &v) ? (job *)(uintptr_t)v
                                                    : NULL;
}

int jobs_set_params(job *j, char **settings, size_t n, char *err,
                    size_t errlen) {
  policy_params p = j->params;
  if (gnmr__policy_settings_apply(&p, settings, n, err, errlen) != 0)
    return GNMR_E_INVAL;
  int rv = policy_set_params(j->pol, &p);
  if (rv != GNMR_OK) {
    snprintf(err, errlen, "%s", gnmr_strerror(rv));
    return rv;
  }
  j->params = p;
  store_rec *r = store_rec_new(REC_PARAMS, j->name);
  if (r) {
    r->pass = j->pass;
    r->step = j->last_decided + 1;
    r->params = p;
    put(j, r);
  }
  char detail[512];
  size_t off = 0;
  for (size_t i = 0; i < n && off < sizeof detail - 1; i++)
    off += (size_t)snprintf(detail + off, sizeof detail - off, "%s%s",
                            i ? " " : "", settings[i]);
  put_event(j, "params_changed", UINT32_MAX, detail);
  LOG(INFO, "JOB-RETUNE", "job %s: %s (from step %llu)", j->name, detail,
      (unsigned long long)j->last_decided + 1);
  return GNMR_OK;
}

/* A JSON number; null for NaN, the string "inf"/"-inf" for infinities. */
static json_t *jnum(double v) {
  if (isnan(v))
    return json_null();
  if (isinf(v))
    return json_string(v > 0 ? "inf" : "-inf");
  return json_real(v);
}

static json_t *params_json(const policy_params *p) {
  return json_pack("{s:o,s:o,s:I,s:I,s:I,s:I,s:o,s:o,s:I}", "alpha",
                   jnum(p->alpha), "beta", jnum(p->beta), "window",
                   (json_int_t)p->window, "max_active",
                   (json_int_t)p->max_active, "lock_steps",
                   (json_int_t)p->lock_steps, "warmup_steps",
                   (json_int_t)p->warmup_steps, "early_alpha",
                   jnum(isnan(p->early_alpha) ? p->alpha : p->early_alpha),
                   "early_beta",
                   jnum(isnan(p->early_beta) ? p->beta : p->early_beta),
                   "early_steps", (json_int_t)p->early_steps);
}

json_t *jobs_status_json(job *j) {
  uint32_t joined = 0;
  for (uint32_t r = 0; r < j->reporters; r++)
    joined += j->ranks[r].joined != 0;
  json_t *active = json_array();
  for (uint32_t u = 0; u < j->n_units; u++) {
    policy_unit_info info;
    if (policy_unit(j->pol, u, &info) == GNMR_OK && info.active)
      json_array_append_new(
          active, json_pack("{s:I,s:s}", "id", (json_int_t)u, "name",
                            j->unit_names[u] ? j->unit_names[u] : ""));
  }
  return json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:o}", "job",
                   j->name, "state", "running", "pass", (json_int_t)j->pass,
                   "step", (json_int_t)j->last_decided, "reporters",
                   (json_int_t)j->reporters, "joined", (json_int_t)joined,
                   "units", (json_int_t)j->n_units, "pending_steps",
                   (json_int_t)j->n_pend, "barrier_ms",
                   (json_int_t)j->barrier_ms, "params",
                   params_json(&j->params), "active", active);
}

static const double *sort_s; /* loop thread only: qsort context */
static int by_score_desc(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  if (sort_s[x] != sort_s[y])
    return sort_s[x] > sort_s[y] ? -1 : 1;
  return x < y ? -1 : 1;
}

json_t *jobs_units_json(job *j, uint32_t top) {
  uint32_t n = j->n_units, *order = malloc((n ? n : 1) * sizeof *order);
  double *s = malloc((n ? n : 1) * sizeof *s);
  json_t *arr = json_array();
  if (order == NULL || s == NULL) {
    free(order);
    free(s);
    return arr;
  }
  for (uint32_t u = 0; u < n; u++) {
    policy_unit_info info;
    order[u] = u;
    s[u] = policy_unit(j->pol, u, &info) == GNMR_OK && !isnan(info.last_s)
               ? info.last_s
               : 0;
  }
  if (top > 0) {
    sort_s = s;
    qsort(order, n, sizeof *order, by_score_desc);
    if (top < n)
      n = top;
  }
  for (uint32_t k = 0; k < n; k++) {
    uint32_t u = order[k];
    policy_unit_info info;
    if (policy_unit(j->pol, u, &info) != GNMR_OK)
      continue;
    json_array_append_new(
        arr, json_pack("{s:I,s:s,s:I,s:I,s:o,s:o,s:o,s:o,s:I,s:b,s:I}", "id",
                       (json_int_t)u, "name",
                       j->unit_names[u] ? j->unit_names[u] : "", "shards",
                       (json_int_t)j->shards[u], "reports",
                       (json_int_t)info.cnt, "mean", jnum(info.mean), "g",
                       jnum(info.last_g), "d", jnum(info.last_d), "s",
                       jnum(info.last_s), "lock", (json_int_t)info.lock,
                       "active", info.active, "promotions",
                       (json_int_t)info.promotions));
  }
  free(order);
  free(s);
  return arr;
}

void jobs_get_metrics(gnmrd *d, const char *name, jobs_metrics *m) {
  job *j = jobs_find(d, name);
  memset(m, 0, sizeof *m);
  if (j == NULL)
    return;
  m->step = j->last_decided;
  m->units = j->n_units;
  for (uint32_t u = 0; u < j->n_units; u++) {
    policy_unit_info info;
    if (policy_unit(j->pol, u, &info) == GNMR_OK && info.active)
      m->active++;
  }
}
