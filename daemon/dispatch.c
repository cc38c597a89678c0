/* SPDX-License-Identifier: MIT */
/* dispatch.c — the agent endpoint's entry: each message decoded (a Report
 * from a connection that never joined is refused first, undecoded) and
 * handed down: a Hello to hello.c, a Report to the job's core (jobs.c
 * decides what is ready), a Bye to the job, and its ending to
 * lifecycle.c. The top of the agent protocol's layers: dispatch ->
 * hello, lifecycle -> jobs -> core. Loop thread only. */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fair.h"
#include "gnmr/error.h"
#include "history.h"
#include "jobs_priv.h"
#include "log.h"
#include "validate.h"
#include "wire.h"

/* ---- messages ------------------------------------------------------------------ */

/* The most bytes one unit takes in a Report, in any encoding protobuf
 * allows: two unpacked doubles (sumsq and measure, 9 each), a uint64 (11:
 * a ten-byte varint) and three bools (not_reported, shadowed, missing: 2
 * each). test_hostile sends it. */
#define REPORT_BYTES_PER_UNIT 35u
/* The rest: the job's name (at most 255 bytes), rank, step, the packed
 * fields' keys and lengths, with room for fields a newer agent adds. */
#define REPORT_BYTES_SLACK 65536u

/* Handles a Report; returns 1 when the job kept env (held until its step
 * is decided), 0 when the caller still owns it. */
static int on_report(gnmrd *d, const void *id, size_t id_len,
                     Gnmr__Envelope *env, size_t len) {
  const Gnmr__Report *r = env->report;
  uint64_t v;
#define REFUSE(code, ref, ...)                                   \
  do {                                                           \
    d->c.reports_refused++;                                      \
    jobs__reply_error(d, id, id_len, code, ref, r->step, __VA_ARGS__); \
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
  /* a report at or below the last decided step may start a new pass,
   * which changes the pass the step on a worker is recorded in */
  if (r->step <= c->last_decided)
    jobs__quiesce(j);
  held *hd = malloc(sizeof *hd);
  if (hd == NULL)
    REFUSE(GNMR_E_NOMEM, "step", "out of memory");
  *hd = (held){env, len, d};
  core_report rep = {hd, r->sumsq, r->n_nonfinite ? r->nonfinite : NULL,
                     r->n_not_reported ? (const int *)r->not_reported : NULL,
                     r->n_shadowed ? (const int *)r->shadowed : NULL,
                     r->n_measure ? r->measure : NULL,
                     r->n_missing ? (const int *)r->missing : NULL};
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
    history_job(d->st, c);
    history_event(d->st, c, STORE_EV_JOB_RESUMED, UINT32_MAX, detail);
    LOG(INFO, "JOB-RESUME", "job %s: %s", c->name, detail);
  }
  switch (rc) {
  case CORE_ACCEPTED:
    d->c.reports++;
    jobs__decide_ready(j);
    return 1;
  case CORE_LATE:
    d->c.late_reports++; /* dropped and counted: no reply */
    return 0;
  case CORE_TOO_FAR:
    d->c.future_reports++;
    if (c->last_decided == 0)
      REFUSE(GNMR_E_RANGE, "step", "step %llu is more than %u steps past "
             "every other rank's step before the job's first decision",
             (unsigned long long)r->step, CORE_MAX_AHEAD);
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
    jobs__drop_connection(d, &c->observers[rank], 1);
    return;
  }
  core_rank *rr = &c->ranks[rank];
  int was_joined = rr->joined;
  jobs__drop_connection(d, rr, 0);
  if (was_joined) {
    char detail[32];
    snprintf(detail, sizeof detail, "rank %u", rank);
    history_event(d->st, c, STORE_EV_AGENT_LEFT, rank, detail);
  }
  if (core_bye(c, rank)) {
    lifecycle__finish(j, FINISH_BYES);
    return;
  }
  jobs__decide_ready(j); /* fewer reporters may complete a pending step */
}

/* A Hello longer than HELLO_AWAY_BYTES (a job of tens of thousands of
 * units: 2^20 unit names are about 45 MB) is decoded and checked on
 * libuv's thread pool, and only its joining (the job's tables) runs on the
 * loop: decoding and checking such a Hello on the loop held every other
 * job's step for a second (tests/test_hostile.c,
 * a_million_unit_hello_does_not_stall_another_job). At most
 * HELLO_AWAY_MAX are away at once, of HELLO_AWAY_TOTAL bytes together
 * (each holds a copy of its bytes and their decoding: no more than one
 * Hello of the largest message gnmrd takes decoded on the loop held);
 * past that a large Hello is answered BUSY, and the agent sends it again
 * (it repeats an unanswered Hello). The agent sends
 * nothing else before its Welcome (it holds its reports until joined),
 * so nothing of its overtakes the Hello. A connection has one Hello away
 * at a time and, under tenancy, an agent key HELLO_AWAY_PER_KEY (issue
 * 62: one peer's Hellos held every place); another large Hello of theirs
 * meanwhile is answered BUSY as well. Without tenancy, a peer's address
 * group holds at most HELLO_AWAY_PER_KEY while another group waits
 * (fair.h: 32 connections of one host held every place). */
#define HELLO_AWAY_BYTES (1u << 20)
#define HELLO_AWAY_MAX 4
#define HELLO_AWAY_PER_KEY 2
#define HELLO_AWAY_TOTAL ((size_t)256 << 20)

typedef struct hello_away {
  uv_work_t req;
  gnmrd *d;
  void *data, *id;
  size_t len, id_len;
  char *user;
  char *group; /* its peer's address group (fair.h), or NULL */
  /* the settings as the Hello arrived */
  policy_params defaults;
  int has_defaults;
  uint32_t default_barrier;
  /* the pool's results */
  Gnmr__Envelope *env;
  int rv;      /* decoding's, then checking's */
  int refused; /* rv is checking's */
  const char *ref;
  char why[256];
  policy_params prm;
  uint32_t barrier;
  core_prepared *prep; /* a rank's unit table, for a new job */
} hello_away;

static unsigned hellos_away; /* loop thread */
static size_t hello_away_bytes;
static hello_away *away[HELLO_AWAY_MAX]; /* those on the pool */
static fair_wait away_wait; /* who waited for a place lately (fair.h) */

static void away_forget(const hello_away *a) {
  for (int k = 0; k < HELLO_AWAY_MAX; k++)
    if (away[k] == a)
      away[k] = NULL;
}

/* Why this connection, key or address group may send no more away, or
 * NULL; *of_group: what group holds away. Under tenancy a key holds at
 * most HELLO_AWAY_PER_KEY; without, an address group as many while
 * nobody else waits (fair.h), HELLO_AWAY_PER_KEY while another does. */
static const char *away_full(gnmrd *d, const void *id, size_t id_len,
                             const char *user, const char *group,
                             unsigned *of_group) {
  int tenancy = d->allow != NULL && user != NULL;
  unsigned of_key = 0;
  *of_group = 0;
  for (int k = 0; k < HELLO_AWAY_MAX; k++) {
    const hello_away *a = away[k];
    if (a == NULL)
      continue;
    if (a->id_len == id_len && memcmp(a->id, id, id_len) == 0)
      return "this connection's last one is being taken in";
    if (tenancy && a->user != NULL && strcmp(a->user, user) == 0 &&
        ++of_key >= HELLO_AWAY_PER_KEY)
      return "this key's are being taken in";
    if (group != NULL && a->group != NULL && strcmp(a->group, group) == 0)
      ++*of_group;
  }
  if (!tenancy && *of_group >= HELLO_AWAY_PER_KEY &&
      fair_contested(&away_wait, group, uv_now(d->loop)))
    return "this address's are being taken in while another's wait";
  return NULL;
}

/* What a's fields hold; a itself is the caller's. */
static void hello_away_clear(hello_away *a) {
  if (a->env != NULL)
    gnmr__wire_free(&a->env);
  core_prepared_free(&a->prep);
  free(a->data);
  free(a->id);
  free(a->user);
  free(a->group);
  a->data = a->id = NULL;
  a->user = a->group = NULL;
}

static void hello_away_free(hello_away *a) {
  hello_away_clear(a);
  free(a);
}

/* What is left of a large Hello (its decoding, a table not taken over:
 * a million small blocks) is freed on the pool too; the request itself
 * on the loop, after the pool is done with it. */
static void hello_free_work(uv_work_t *req) {
  hello_away_clear(req->data);
  /* a pool thread's arena keeps what it freed: a refused 100 MB Hello
   * left gnmrd +272 MB (issue 62); the pages go back to the system */
  malloc_trim(0);
}

static void hello_free_done(uv_work_t *req, int status) {
  (void)status;
  free(req->data);
}

static void hello_away_work(uv_work_t *req) {
  hello_away *a = req->data;
  /* a name listed twice refuses it before it is decoded (no allocation
   * a name) */
  a->ref = "";
  a->rv = gnmr__hello_bytes_dup(a->data, a->len, &a->ref, a->why,
                                sizeof a->why);
  if (a->rv != GNMR_OK) {
    a->refused = 1;
    free(a->data);
    a->data = NULL;
    return;
  }
  a->rv = gnmr__wire_decode(a->data, a->len, &a->env, a->why, sizeof a->why);
  free(a->data);
  a->data = NULL;
  if (a->rv != GNMR_OK)
    return;
  if (a->env->body_case != GNMR__ENVELOPE__BODY_HELLO) {
    a->rv = GNMR_E_PROTO; /* peek said Hello: cannot happen */
    snprintf(a->why, sizeof a->why, "not a Hello");
    return;
  }
  a->ref = "";
  a->rv = gnmr__validate_hello(a->env->hello,
                               a->has_defaults ? &a->defaults : NULL,
                               a->default_barrier, &a->prm, &a->barrier,
                               &a->ref, a->why, sizeof a->why);
  a->refused = a->rv != GNMR_OK;
  const Gnmr__Hello *h = a->env->hello;
  if (!a->refused && !h->observer && h->n_unit_ids == 0 &&
      core_prepare_units((const char *const *)h->units, h->n_units,
                         &a->prep) != GNMR_OK)
    a->prep = NULL; /* registered on the loop, as any Hello */
}

static void hello_away_done(uv_work_t *req, int status) {
  hello_away *a = req->data;
  gnmrd *d = a->d;
  hellos_away--;
  hello_away_bytes -= a->len;
  away_forget(a);
  if (status != 0 || d->stopping) {
    hello_away_free(a);
    return;
  }
  if (a->refused) { /* checked and refused, as on the loop */
    d->c.hellos_refused++;
    jobs__reply_error(d, a->id, a->id_len, a->rv, a->ref, 0, "%s", a->why);
  } else if (a->rv != GNMR_OK) {
    if (a->rv == GNMR_E_VERSION)
      d->c.version_errors++;
    else if (a->rv == GNMR_E_UNSUPPORTED)
      d->c.unsupported++;
    else
      d->c.decode_errors++;
    jobs__reply_error(d, a->id, a->id_len, a->rv, "envelope", 0, "%s",
                      a->why);
  } else {
    d->hello_group = a->group;
    hello__on_hello_checked(d, a->id, a->id_len, a->env->hello, a->user,
                            &a->prm, a->barrier, &a->prep);
    d->hello_group = NULL;
  }
  if (uv_queue_work(d->loop, &a->req, hello_free_work, hello_free_done) != 0)
    hello_away_free(a);
}

/* Sends a large Hello away; 1 when it went (or was answered BUSY). */
static int hello_send_away(gnmrd *d, const void *id, size_t id_len,
                           const void *data, size_t len, const char *user,
                           const char *group) {
  d->c.hellos++;
  unsigned of_group;
  const char *full = away_full(d, id, id_len, user, group, &of_group);
  if (full != NULL || hellos_away >= HELLO_AWAY_MAX ||
      (hellos_away > 0 && hello_away_bytes + len > HELLO_AWAY_TOTAL)) {
    if (full == NULL)
      fair_refused(&away_wait, group, of_group, HELLO_AWAY_PER_KEY,
                   uv_now(d->loop));
    d->c.hellos_refused++;
    d->c.hellos_away_busy++;
    jobs__reply_error(d, id, id_len, GNMR_E_BUSY, "hello", 0,
                      "gnmrd is taking in %u other large Hellos%s%s; this "
                      "one is sent again", hellos_away, full ? ": " : "",
                      full ? full : "");
    return 1;
  }
  hello_away *a = calloc(1, sizeof *a);
  if (a == NULL || (a->data = malloc(len)) == NULL ||
      (a->id = malloc(id_len ? id_len : 1)) == NULL ||
      (user != NULL && (a->user = strdup(user)) == NULL) ||
      (group != NULL && (a->group = strdup(group)) == NULL)) {
    if (a != NULL)
      hello_away_free(a);
    d->c.hellos_refused++;
    jobs__reply_error(d, id, id_len, GNMR_E_NOMEM, "hello", 0,
                      "out of memory");
    return 1;
  }
  memcpy(a->data, data, len);
  memcpy(a->id, id, id_len);
  a->len = len;
  a->id_len = id_len;
  a->d = d;
  if (d->cfg != NULL) {
    a->defaults = d->cfg->policy;
    a->has_defaults = 1;
    a->default_barrier = (uint32_t)d->cfg->barrier_ms;
  }
  a->req.data = a;
  if (uv_queue_work(d->loop, &a->req, hello_away_work, hello_away_done) !=
      0) {
    hello_away_free(a);
    return 0; /* decoded here, as any other */
  }
  hellos_away++;
  hello_away_bytes += len;
  d->c.hellos_away++;
  for (int k = 0; k < HELLO_AWAY_MAX; k++)
    if (away[k] == NULL) {
      away[k] = a;
      break;
    }
  return 1;
}

void dispatch_on_message(server *s, const void *id, size_t id_len,
                         const void *data, size_t len, const char *user,
                         void *ctx) {
  gnmrd *d = ctx;
  Gnmr__Envelope *env;
  char err[128];
  (void)s;
  d->c.messages_in++;
  /* A Report from a connection that has not joined is refused before it
   * is decoded: a peer that never said Hello cannot make the loop decode
   * megabytes of sums for every other job to wait on. */
  uint64_t known, step;
  uint32_t version;
  if (gnmr__wire_peek(data, len, &version, &step) ==
          GNMR__ENVELOPE__BODY_REPORT &&
      !hmap_get(&d->peers, id, id_len, &known)) {
    /* answered as a decode would: a version this side does not speak
     * first (docs/protocol.md), and the Report's step in the Error */
    if (version != GNMR_PROTOCOL_VERSION) {
      d->c.version_errors++;
      jobs__reply_error(d, id, id_len, GNMR_E_VERSION, "envelope", step,
                        "protocol version %u, this side speaks %u", version,
                        GNMR_PROTOCOL_VERSION);
      return;
    }
    d->c.unknown_agent++;
    d->c.reports_refused++;
    jobs__reply_error(d, id, id_len, GNMR_E_NOJOB, "hello", step,
                      "unknown agent: send Hello first");
    return;
  }
  /* A joined peer's Report is bounded by its rank's units before it is
   * decoded: every encoding protobuf allows of one (packed or not) takes
   * at most REPORT_BYTES_PER_UNIT a unit beside REPORT_BYTES_SLACK for the
   * job's name and the scalars; anything longer (a field repeated a
   * million times, sums for units the rank does not have) would only make
   * the loop, and every other job's step, wait on decoding it. An
   * observer never reports: refused undecoded as well. */
  if (version == GNMR_PROTOCOL_VERSION &&
      gnmr__wire_peek(data, len, NULL, NULL) == GNMR__ENVELOPE__BODY_REPORT &&
      hmap_get(&d->peers, id, id_len, &known)) {
    const peer *pr = (const peer *)(uintptr_t)known;
    if (pr->observer) {
      d->c.reports_refused++;
      jobs__reply_error(d, id, id_len, GNMR_E_PROTO, "observer", step,
                        "an observer does not report");
      return;
    }
    uint64_t units = pr->j->core->ranks[pr->rank].n_units;
    uint64_t bound = units * REPORT_BYTES_PER_UNIT + REPORT_BYTES_SLACK;
    if ((uint64_t)len > bound) {
      d->c.reports_refused++;
      d->c.reports_oversized++;
      jobs__reply_error(d, id, id_len, GNMR_E_RANGE, "report", step,
                        "a Report of %zu bytes: rank %u's %llu units need "
                        "at most %llu", len, pr->rank,
                        (unsigned long long)units, (unsigned long long)bound);
      return;
    }
  }
  if (len > HELLO_AWAY_BYTES && version == GNMR_PROTOCOL_VERSION &&
      gnmr__wire_peek(data, len, NULL, NULL) == GNMR__ENVELOPE__BODY_HELLO &&
      hello_send_away(d, id, id_len, data, len, user, server_msg_group(s)))
    return;
  int rv = gnmr__wire_decode(data, len, &env, err, sizeof err);
  if (rv != GNMR_OK) {
    if (rv == GNMR_E_VERSION)
      d->c.version_errors++;
    else if (rv == GNMR_E_UNSUPPORTED)
      d->c.unsupported++;
    else
      d->c.decode_errors++;
    jobs__reply_error(d, id, id_len, rv, "envelope", 0, "%s", err);
    return;
  }
  int kept = 0;
  switch (env->body_case) {
  case GNMR__ENVELOPE__BODY_HELLO:
    d->hello_group = server_msg_group(s);
    hello__on_hello(d, id, id_len, env->hello, user);
    d->hello_group = NULL;
    break;
  case GNMR__ENVELOPE__BODY_REPORT:
    kept = on_report(d, id, id_len, env, len);
    break;
  case GNMR__ENVELOPE__BODY_BYE:
    on_bye(d, id, id_len, env->bye);
    break;
  default:
    d->c.unsupported++;
    jobs__reply_error(d, id, id_len, GNMR_E_UNSUPPORTED, "envelope", 0,
                "message type %d is not served on the agent endpoint",
                (int)env->body_case);
    break;
  }
  if (!kept)
    gnmr__wire_free(&env);
}

void dispatch_on_bad_frames(server *s, void *ctx) {
  gnmrd *d = ctx;
  (void)s;
  d->c.messages_in++;
  d->c.bad_frames++;
}
