/* SPDX-License-Identifier: MIT */
/* jobs.c — the live jobs above the decision core (core.h): creating and
 * freeing them, connections bound to (job, rank), a job's barrier timer,
 * deciding its ready steps (large ones on a worker), and publishing each
 * step that the core decides: its history handed to history.c (record
 * and snapshot, queued before any send), its Decision encoded by
 * decision.c and sent, the same bytes, to every rank and observer, and
 * counted. The layers above call it:
 * dispatch.c (each message), hello.c (joining), lifecycle.c (endings,
 * restarts); it calls none of them. Loop thread only. */
#include <assert.h>
#include <malloc.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decision.h"
#include "gnmr/error.h"
#include "history.h"
#include "jobs_priv.h"
#include "latency.h"
#include "leader.h"
#include "log.h"
#include "seal.h"
#include "text.h"
#include "validate.h"
#include "wire.h"

/* ---- replies ------------------------------------------------------------- */

void jobs__reply(gnmrd *d, const void *id, size_t id_len, uint8_t *buf,
                 size_t len) {
  if (server_send(d->agents, id, id_len, buf, len) != GNMR_OK)
    d->c.send_failures++;
  free(buf);
}

void jobs__reply_error(gnmrd *d, const void *id, size_t id_len, int code,
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
    jobs__reply(d, id, id_len, buf, len);
}

/* ---- connections ------------------------------------------------------------ */

void jobs__drop_connection(gnmrd *d, core_rank *rr, int observer) {
  uint64_t v;
  if (rr->conn != NULL && hmap_get(&d->peers, rr->conn, rr->conn_len, &v)) {
    free((peer *)(uintptr_t)v);
    hmap_del(&d->peers, rr->conn, rr->conn_len);
  }
  core_disconnect(rr, observer);
}

/* Binds connection id to rr as (j, rank): a new peer entry. */
int jobs__bind_connection(gnmrd *d, job *j, core_rank *rr, uint32_t rank,
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
void jobs__connection_gone(job *j, core_rank *rr, int observer) {
  LOG(INFO, "PEER-GONE", "job %s: %s connection gone; no more decisions "
      "sent to it", j->core->name, observer ? "an observer's" : "a rank's");
  jobs__drop_connection(j->d, rr, observer);
}

/* ---- job lifetime ----------------------------------------------------------- */

static void decide_run(workers_task *t);
static void decide_done(workers_task *t);

static void release_held(void *owner) {
  held *h = owner;
  assert(h->d->held_bytes >= h->len);
  h->d->held_bytes -= h->len;
  gnmr__wire_free(&h->env);
  free(h);
}

/* A job of at least this many units gives its memory back when it ends. */
#define JOBS_TRIM_UNITS (1u << 16)

static void job_timer_closed(uv_handle_t *h) { free(h->data); }

/* Frees a job: its peers' memberships, its core state, then (via the loop)
 * the struct itself. */
void jobs__free(job **jp) {
  job *j = *jp;
  *jp = NULL;
  gnmrd *d = j->d;
  core_job *c = j->core;
  /* a large job's tables (a million units: hundreds of MB) go back to the
   * system when it ends, not only to malloc (issue 62) */
  int large = c->n_units >= JOBS_TRIM_UNITS;
  jobs__quiesce(j);
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
  history_forget(j);
  store_mark_free(&j->mark);
  free(j->hist);
  free(j->undur);
  core_job_free(&d->jobs, &j->core);
  uv_timer_stop(&j->timer);
  uv_close((uv_handle_t *)&j->timer, job_timer_closed);
  if (large)
    malloc_trim(0);
}

job *jobs__create(gnmrd *d, const char *name, const policy_params *prm,
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
  if ((j->mark = store_mark_new(0, 0)) == NULL ||
      (j->undur = malloc(GNMR_MAX_HELD * sizeof *j->undur)) == NULL) {
    store_mark_free(&j->mark);
    core_job_free(&d->jobs, &j->core);
    free(j);
    return NULL;
  }
  if (d->cfg != NULL)
    j->core->max_units = (uint32_t)d->cfg->max_units;
  j->d = d;
  j->task.run = decide_run;
  j->task.done = decide_done;
  j->last_report_ms = uv_now(d->loop);
  uv_timer_init(d->loop, &j->timer);
  j->timer.data = j;
  return j;
}

/* ---- deciding ------------------------------------------------------------------ */

/* Sends an encoded Decision to every joined rank and observer. */
static void send_all(job *j, const uint8_t *buf, size_t len) {
  gnmrd *d = j->d;
  core_job *c = j->core;
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
        jobs__connection_gone(j, rr, obs);
    }
  }
}

/* ---- decisions held by agents across a restart ----------------------------
 * A decision goes to the agents before the store commits it (decisions
 * never wait on the store), so a gnmrd killed in between took decisions
 * that agents acted on. Each agent keeps what it received past the
 * Decision's durable mark and sends it in its next Hello; the restarted
 * gnmrd stores each one not yet known (under its own pass, without the
 * norms and events that died with the old gnmrd), never decides those
 * steps again, and sends the newest to every rank: a rank that missed it
 * gets the one the others acted on. */
int jobs__held_sealed(const gnmrd *d, const char *name,
                      const Gnmr__Decision *h) {
  return d->st != NULL &&
         seal_check(store_seal_key(d->st), name, h->run, h->pass, h->step,
                    h->active, h->n_active, h->tag.data, h->tag.len);
}

/* Held decisions refused, logged at most once per HELD_LOG_MS (a refused
 * peer can say Hello again and again): the first reason, and how many
 * more since the last line. */
#define HELD_LOG_MS 10000
void jobs__held_refused(gnmrd *d, const char *name, size_t n,
                        const char *from, const char *why) {
  static uint64_t last_ms, quiet;
  char jb[300], fb[200];
  d->c.held_refused += n;
  uint64_t now = d->loop != NULL ? uv_now(d->loop) : 0;
  if (last_ms != 0 && now - last_ms < HELD_LOG_MS) {
    quiet += n;
    return;
  }
  LOG(WARN, "HELD-REFUSED", "job %s: %zu held decision%s from %s refused: "
      "%s (%llu more refused since the last such line)",
      gnmr__escape(name, jb, sizeof jb), n, n == 1 ? "" : "s",
      gnmr__escape(from, fb, sizeof fb), why, (unsigned long long)quiet);
  last_ms = now ? now : 1;
  quiet = 0;
}

/* Why a held decision h is not taken for job j: NULL when it is; *defer
 * set (and NULL returned) when it names units a rank that has not yet
 * joined will bring (a new run's first rank, after a restart): that rank
 * hands the same decision back. */
static const char *held_refusal(job *j, const Gnmr__Decision *h,
                                int *defer) {
  core_job *c = j->core;
  *defer = 0;
  if (!jobs__held_sealed(j->d, c->name, h))
    return "not sealed by a gnmrd of this store (a forged or altered "
           "decision, or one from another database)";
  for (size_t k = 0; k < h->n_active; k++)
    if (core_slot(c, h->active[k]) == UINT32_MAX) {
      for (uint32_t r = 0; r < c->reporters; r++)
        if (!c->ranks[r].ever) {
          *defer = 1;
          return NULL;
        }
      return "it names a unit id the job does not have";
    }
  return NULL;
}

/* Whether the history held step (pass, step) of j's run at the restart:
 * among its newest steps then, or older than all of a full window of them
 * (agents hold fewer decisions than the window: such a one was committed,
 * or is a peer's repeat). */
static int in_history(const job *j, uint32_t pass, uint64_t step) {
  uint32_t lo = 0, hi = j->n_hist;
  if (hi == 0)
    return 0;
  if (hi >= STORE_KEPT_MAX &&
      (pass < j->hist[0].pass ||
       (pass == j->hist[0].pass && step < j->hist[0].step)))
    return 1;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    const store_kept *k = &j->hist[mid];
    if (k->pass < pass || (k->pass == pass && k->step < step))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < j->n_hist && j->hist[lo].pass == pass &&
         j->hist[lo].step == step;
}

/* ---- durability: no more sent and uncommitted than agents hold ---------- */

/* Forgets the sent decisions the store has committed (at or before its
 * mark: store_mark_get says how far every one is, in order). */
static void undurable_trim(job *j) {
  uint32_t mp;
  uint64_t ms;
  store_mark_get(j->mark, &mp, &ms);
  while (j->undur_n > 0) {
    const struct undurable *u = &j->undur[j->undur_head];
    if (u->pass > mp || (u->pass == mp && u->step > ms))
      break;
    j->undur_head = (j->undur_head + 1) % GNMR_MAX_HELD;
    j->undur_n--;
  }
}

/* Whether j may decide a step now: with a store, while fewer than
 * GNMR_MAX_HELD of its decisions are sent and not committed. An agent
 * holds that many (the newest) past the mark its Decisions carry and
 * hands them to a restarted gnmrd, so nothing it acted on is lost;
 * beyond, the step waits for the store (its ranks take their fallback
 * route, as for a late decision) rather than being acted on where a
 * SIGKILL could lose it (docs/reliability.md). */
static int durable_room(job *j) {
  if (j->d->st == NULL)
    return 1;
  if (j->undur_n >= GNMR_MAX_HELD)
    undurable_trim(j);
  return j->undur_n < GNMR_MAX_HELD;
}

static void undurable_push(job *j, uint32_t pass, uint64_t step) {
  if (j->d->st == NULL)
    return;
  if (j->undur_n == GNMR_MAX_HELD) /* decided before any trim: trim now */
    undurable_trim(j);
  if (j->undur_n == GNMR_MAX_HELD) { /* never: durable_room came first */
    j->undur_head = (j->undur_head + 1) % GNMR_MAX_HELD;
    j->undur_n--;
  }
  uint32_t at = (j->undur_head + j->undur_n) % GNMR_MAX_HELD;
  j->undur[at].pass = pass;
  j->undur[at].step = step;
  j->undur_n++;
}

void jobs__adopt_held(job *j, Gnmr__Decision *const *hd, size_t n,
                      const char *from) {
  gnmrd *d = j->d;
  core_job *c = j->core;
  const Gnmr__Decision *newest = NULL;
  uint64_t first = 0, last = 0;
  uint32_t pass = 0;
  size_t adopted = 0, refused = 0, bad = 0;
  const char *bad_why = NULL;
  if (j->first_pass == 0 || n == 0)
    return; /* a job of this gnmrd: it made (and stores) every decision */
  jobs__quiesce(j);
  for (size_t i = 0; i < n; i++) {
    const Gnmr__Decision *h = hd[i];
    if (h->run != c->run)
      continue; /* another run's: never this job's */
    if (h->pass < j->known_pass ||
        (h->pass == j->known_pass && h->step <= j->known_step) ||
        in_history(j, h->pass, h->step))
      continue; /* adopted from another agent, or in the history */
    int defer;
    const char *why = held_refusal(j, h, &defer);
    if (why != NULL) {
      if (bad++ == 0)
        bad_why = why;
      continue;
    }
    if (defer)
      break; /* and every later one: adopting one past it would move
                known_step beyond it, and the rank that brings its
                units would then have it skipped */
    if (h->pass >= j->first_pass) {
      /* a pass the history never saw begin (its job row was not
       * committed): this job moves past it, unless it decided already */
      if (c->pub_pass == c->pass) {
        refused++;
        continue;
      }
      c->pass = h->pass + 1; /* sealed: below UINT32_MAX (validate) */
      j->first_pass = c->pass;
      history_job(d->st, c);
    }
    history_restored_step(d->st, c, h->pass, h->step, h->active, h->n_active,
                          j->mark);
    undurable_push(j, h->pass, h->step); /* held again until committed */
    j->known_pass = h->pass;
    j->known_step = h->step;
    if (adopted++ == 0 || h->pass != pass)
      first = h->step;
    pass = h->pass;
    last = h->step;
    if (core_restart_adopt_decided(c, h->step))
      newest = h;
    else if (c->pub_pass == c->pass && h->step <= c->pub_step)
      refused++; /* decided again here before this agent came back */
  }
  if (bad > 0)
    jobs__held_refused(d, c->name, bad, from, bad_why);
  if (refused > 0) {
    d->c.held_conflicts += refused;
    LOG(WARN, "HELD-CONFLICT", "job %s: %zu decisions held by %s were for "
        "steps this gnmrd had decided again (a rank came back after the "
        "barrier deadline); the history keeps both", c->name, refused, from);
  }
  if (adopted == 0)
    return;
  d->c.decisions_restored += adopted;
  char detail[160];
  snprintf(detail, sizeof detail, "pass %u steps %llu-%llu: %zu decisions "
           "restored from %s (acted on, not committed before gnmrd "
           "stopped)", pass, (unsigned long long)first,
           (unsigned long long)last, adopted, from);
  history_event(d->st, c, STORE_EV_DECISIONS_RESTORED, UINT32_MAX, detail);
  LOG(INFO, "HELD-RESTORE", "job %s: %s", c->name, detail);
  if (newest == NULL)
    return;
  /* the ranks still waiting for that step get what the others acted on */
  uint8_t *buf;
  size_t len;
  if (decision_encode_held(j, newest, &buf, &len) == GNMR_OK) {
    send_all(j, buf, len);
    free(buf);
  }
}

/* Whether a decided step is one to publish; counts and logs the others. */
static int publishable(job *j, const core_outcome *o) {
  gnmrd *d = j->d;
  core_job *c = j->core;
  d->c.missing_units += o->missing;
  if (o->republish) { /* nothing decided, published or stored */
    d->c.republish_refused++;
    LOG(ERROR, "JOB-REPUBLISH", "job %s: step %llu was already published in "
        "pass %u (up to step %llu); not deciding it again", c->name,
        (unsigned long long)o->step, c->pass,
        (unsigned long long)c->pub_step);
    return 0;
  }
  if (o->rv != GNMR_OK) {
    LOG(ERROR, "JOB-DECIDE", "job %s step %llu: %s", c->name,
        (unsigned long long)o->step, gnmr_strerror(o->rv));
    return 0;
  }
  return 1;
}

/* Stores, sends and counts one decided step. */
static void publish(job *j, const core_outcome *o) {
  gnmrd *d = j->d;
  if (!publishable(j, o))
    return;
  if (!leader_may_decide(d->lead, 1)) {
    /* begun within the lease, finished after it: a standby may serve
     * soon, so this decision is neither sent nor stored (its ranks'
     * reports go to whoever serves next) */
    d->c.lease_unsent++;
    LOG(WARN, "LEASE-UNSENT", "job %s step %llu: decided after this "
        "gnmrd's leadership lease ran out; not sent", j->core->name,
        (unsigned long long)o->step);
    return;
  }
  /* the record is queued before any rank can act on the decision: a crash
   * after a send never leaves an acted-on decision out of the history */
  history_step(j, o, (uv_now(d->loop) - o->first_ms) * 1000);
  uint8_t *buf;
  size_t len;
  if (decision_encode(j, o, &buf, &len) == GNMR_OK) {
    send_all(j, buf, len);
    free(buf);
  }
  undurable_push(j, j->core->pass, o->step);
  d->c.steps_decided++;
  if (o->by_deadline)
    d->c.deadline_decisions++;
  latency_observe(&d->decision_latency,
                  (double)(uv_hrtime() - o->first_ns) * 1e-9);
}

static void deadline_cb(uv_timer_t *t);
#define DURABLE_RETRY_MS 2

/* On a worker: the step's arithmetic. */
static void decide_run(workers_task *t) {
  job *j = (job *)((char *)t - offsetof(job, task));
  core_decide_run(j->core, &j->dd, &j->out);
}

/* Back on the loop: publish, then go on with the next ready step. */
static void decide_done(workers_task *t) {
  job *j = (job *)((char *)t - offsetof(job, task));
  core_decide_end(j->core, &j->dd, &j->out);
  publish(j, &j->out);
  j->d->c.worker_steps++;
  jobs__decide_ready(j);
}

void jobs__quiesce(job *j) {
  j->hold++;
  while (workers_busy(&j->task))
    workers_wait(j->d->workers, &j->task);
  j->hold--;
}

void jobs_quiesce_all(gnmrd *d) {
  size_t pos = 0;
  core_job *c;
  if (d->workers == NULL)
    return;
  while ((c = core_next_job(&d->jobs, &pos)) != NULL)
    jobs__quiesce(job_of(c));
}

/* Decides every ready step, then arms the timer for the next deadline. A
 * step of at least worker_min unit-shards goes to a worker, unless the
 * loop is waiting for the job (hold): the loop reads other messages
 * meanwhile, and the job's next step waits for it. */
/* The lease ran out (leader.h): every job's steps wait; retried every
 * LEASE_RETRY_MS until it is renewed (or gnmrd stops, deposed). */
#define LEASE_RETRY_MS 20
static void lease_cb(uv_timer_t *t) {
  gnmrd *d = t->data;
  size_t pos = 0;
  core_job *c;
  if (!leader_may_decide(d->lead, 0)) {
    uv_timer_start(&d->lease_wait, lease_cb, LEASE_RETRY_MS, 0);
    return;
  }
  LOG(INFO, "LEASE-RENEWED", "the store's leadership lease is renewed: "
      "deciding again");
  while ((c = core_next_job(&d->jobs, &pos)) != NULL)
    jobs__decide_ready(job_of(c));
}

void jobs__decide_ready(job *j) {
  core_outcome o;
  gnmrd *d = j->d;
  if (workers_busy(&j->task))
    return; /* decide_done() comes back here */
  if (!leader_may_decide(d->lead, 0)) {
    if (!uv_is_active((uv_handle_t *)&d->lease_wait)) {
      d->c.lease_pauses++;
      LOG(WARN, "LEASE-OUT", "the store's leadership lease ran out (its "
          "session not confirmed for %d ms): no step is decided until it "
          "is renewed", LEADER_LEASE_MS);
      uv_timer_start(&d->lease_wait, lease_cb, LEASE_RETRY_MS, 0);
    }
    return;
  }
  int room;
  while ((room = durable_room(j)) &&
         core_decide_begin(j->core, uv_now(d->loop), &j->dd)) {
    if (j->core->far_dropped > 0) {
      d->c.future_reports += j->core->far_dropped;
      LOG(WARN, "FAR-DROPPED", "job %s: %llu reports taken before the first "
          "decision were for steps more than %u past it (step %llu) and are "
          "dropped", j->core->name,
          (unsigned long long)j->core->far_dropped, CORE_MAX_AHEAD,
          (unsigned long long)j->core->last_decided);
      j->core->far_dropped = 0;
    }
    if (d->workers != NULL && !j->hold && j->dd.work >= d->worker_min) {
      workers_submit(d->workers, &j->task);
      server_kick(d->agents);
      return;
    }
    core_decide_run(j->core, &j->dd, &o);
    core_decide_end(j->core, &j->dd, &o);
    publish(j, &o);
  }
  server_kick(d->agents);
  uv_timer_stop(&j->timer);
  if (!room && j->core->n_pend > 0) {
    /* the store is behind: look again soon (the mark moves as the
     * writer commits) */
    if (!j->durable_waiting) {
      j->durable_waiting = 1;
      d->c.durable_waits++;
      LOG(WARN, "DURABLE-WAIT", "job %s: %u of its decisions are sent and "
          "not yet committed, as many as its agents hold: step %llu waits "
          "for the store (its ranks take their fallback route meanwhile)",
          j->core->name, GNMR_MAX_HELD,
          (unsigned long long)j->core->pend[0].step);
    }
    uv_timer_start(&j->timer, deadline_cb, DURABLE_RETRY_MS, 0);
    return;
  }
  if (room && j->durable_waiting) {
    j->durable_waiting = 0;
    LOG(INFO, "DURABLE-GO", "job %s: the store caught up; deciding again",
        j->core->name);
  }
  uint64_t first = core_next_deadline(j->core), now = uv_now(j->d->loop);
  if (first != UINT64_MAX)
    uv_timer_start(&j->timer, deadline_cb, first > now ? first - now : 0, 0);
}

static void deadline_cb(uv_timer_t *t) { jobs__decide_ready(t->data); }
