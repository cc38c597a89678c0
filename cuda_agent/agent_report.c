/* SPDX-License-Identifier: MIT */
/* agent_report.c — reports: reduce (CPU backend), encode and queue a step's
 * per-unit sums for the I/O thread through an inproc PUSH/PULL pair, never
 * blocking. Any thread (the training thread, the CUDA completion thread).
 * The steady state allocates nothing: values and packed bytes go through
 * the agent's scratch buffers (sized at open, the pack buffer grown to the
 * largest report once), under the lock that also orders the pipe. */
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "agent_internal.h"
#include "agent_priv.h"
#include "reduce_cpu.h"

int gnmr__agent_scratch_init(gnmr_agent *a) {
  size_t n = a->n_units ? a->n_units : 1;
  report_scratch *e = &a->enc, *c = &a->cpu;
  e->sumsq = malloc(n * sizeof *e->sumsq);
  e->nonfinite = malloc(n * sizeof *e->nonfinite);
  e->not_reported = malloc(n * sizeof *e->not_reported);
  c->sumsq = malloc(n * sizeof *c->sumsq);
  c->nonfinite = malloc(n * sizeof *c->nonfinite);
  c->seen = malloc(n);
  if (!e->sumsq || !e->nonfinite || !e->not_reported || !c->sumsq ||
      !c->nonfinite || !c->seen)
    return GNMR_E_NOMEM;
  return GNMR_OK;
}

static void scratch_free(report_scratch *s) {
  free(s->sumsq);
  free(s->nonfinite);
  free(s->not_reported);
  free(s->seen);
  free(s->pack);
  memset(s, 0, sizeof *s);
}

void gnmr__agent_scratch_free(gnmr_agent *a) {
  scratch_free(&a->enc);
  scratch_free(&a->cpu);
}

/* last_reported only grows: CUDA results arrive after later steps began. */
void gnmr__agent_mark_reported(gnmr_agent *a, uint64_t step) {
  uint_fast64_t cur = atomic_load(&a->last_reported);
  while (cur < step &&
         !atomic_compare_exchange_weak(&a->last_reported, &cur, step))
    ;
}

/* Queues one step's per-unit values. Unit i is not reported when
 * not_reported[i] != 0 or seen[i] == 0 (either array may be NULL). Packs
 * into a->enc and sends under push_mu: the pipe sees reports whole and in
 * the order they were packed. */
static int queue_values(gnmr_agent *a, uint64_t step, const double *sumsq,
                        const uint64_t *nonfinite,
                        const uint8_t *not_reported, const uint8_t *seen) {
  if (a->observer) { /* another replica reports this shard */
    gnmr__agent_mark_reported(a, step);
    return GNMR_OK;
  }
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Report r = GNMR__REPORT__INIT;
  report_scratch *e = &a->enc;
  int any_nf = 0, any_nr = 0, rv = GNMR_OK;
  pthread_mutex_lock(&a->push_mu);
  for (uint32_t i = 0; i < a->n_units; i++) {
    int skip = (not_reported && not_reported[i]) || (seen && !seen[i]);
    e->sumsq[i] = skip ? 0 : sumsq[i];
    e->nonfinite[i] = skip || !nonfinite ? 0 : nonfinite[i];
    e->not_reported[i] = skip;
    any_nf |= e->nonfinite[i] != 0;
    any_nr |= skip;
  }
  r.job = a->job;
  r.rank = a->rank;
  r.step = step;
  r.n_sumsq = a->n_units;
  r.sumsq = e->sumsq;
  r.n_nonfinite = any_nf ? a->n_units : 0;
  r.nonfinite = e->nonfinite;
  r.n_not_reported = any_nr ? a->n_units : 0;
  r.not_reported = e->not_reported;
  env.body_case = GNMR__ENVELOPE__BODY_REPORT;
  env.report = &r;
  size_t len = gnmr__wire_packed_size(&env);
  if (len > e->pack_cap) { /* the first report, or a larger one: room for
                              longer varints (steps, counts) to come */
    size_t cap = len + len / 8 + 64;
    uint8_t *b = realloc(e->pack, cap);
    if (b == NULL) {
      rv = GNMR_E_NOMEM;
      goto out;
    }
    e->pack = b;
    e->pack_cap = cap;
  }
  len = gnmr__wire_pack(&env, e->pack);
  gnmr__agent_mark_reported(a, step);
  int sent = zmq_send(a->push, e->pack, len, ZMQ_DONTWAIT) >= 0;
  atomic_fetch_add(sent ? &a->reports_sent : &a->reports_dropped, 1);
out:
  pthread_mutex_unlock(&a->push_mu);
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
    gnmr__agent_mark_reported(a, step);
    return GNMR_OK;
  }
  report_scratch *c = &a->cpu;
  pthread_mutex_lock(&a->cpu_mu);
  memset(c->sumsq, 0, a->n_units * sizeof *c->sumsq);
  memset(c->nonfinite, 0, a->n_units * sizeof *c->nonfinite);
  memset(c->seen, 0, a->n_units);
  int rv = gnmr_reduce_cpu(t, n, a->n_units, c->sumsq, c->nonfinite, c->seen);
  if (rv == GNMR_OK)
    rv = queue_values(a, step, c->sumsq, c->nonfinite, NULL, c->seen);
  pthread_mutex_unlock(&a->cpu_mu);
  return rv;
}

/* --- for the CUDA backend (cuda_backend.h) ---------------------------------- */

uint32_t gnmr__agent_n_units(const gnmr_agent *a) { return a->n_units; }

int gnmr__agent_begin_step(gnmr_agent *a, uint64_t step) {
  if (step == 0 || step <= atomic_load(&a->last_reported))
    return GNMR_E_INVAL;
  gnmr__agent_mark_reported(a, step);
  return a->observer ? 1 : GNMR_OK;
}

int gnmr__agent_queue_seen(gnmr_agent *a, uint64_t step, const double *sumsq,
                           const uint64_t *nonfinite, const uint8_t *seen) {
  return queue_values(a, step, sumsq, nonfinite, NULL, seen);
}
