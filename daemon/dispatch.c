/* SPDX-License-Identifier: MIT */
/* dispatch.c — the agent endpoint's entry: each message decoded (a Report
 * from a connection that never joined is refused first, undecoded) and
 * handed down: a Hello to hello.c, a Report to the job's core (jobs.c
 * decides what is ready), a Bye to the job, and its ending to
 * lifecycle.c. The top of the agent protocol's layers: dispatch ->
 * hello, lifecycle -> jobs -> core. Loop thread only. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "jobs_priv.h"
#include "log.h"
#include "records.h"
#include "validate.h"
#include "wire.h"

/* ---- messages ------------------------------------------------------------------ */

/* The most bytes one unit takes in a Report, in any encoding protobuf
 * allows: an unpacked double (9), uint64 (11) and two bools (2 each). */
#define REPORT_BYTES_PER_UNIT 24u
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
                     r->n_shadowed ? (const int *)r->shadowed : NULL};
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
    records_event(d->st, c, STORE_EV_AGENT_LEFT, rank, detail);
  }
  if (core_bye(c, rank)) {
    jobs__finish(j, FINISH_BYES);
    return;
  }
  jobs__decide_ready(j); /* fewer reporters may complete a pending step */
}

void jobs_on_message(server *s, const void *id, size_t id_len,
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
    jobs__on_hello(d, id, id_len, env->hello, user);
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

void jobs_on_bad_frames(server *s, void *ctx) {
  gnmrd *d = ctx;
  (void)s;
  d->c.messages_in++;
  d->c.bad_frames++;
}

