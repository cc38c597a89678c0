/* SPDX-License-Identifier: MIT */
/* agent_report.c — reports: reduce (CPU backend), encode and queue a step's
 * per-unit sums for the I/O thread through an inproc PUSH/PULL pair, never
 * blocking. Any thread (the training thread, the CUDA completion thread).
 * A report is packed straight from the caller's arrays into one of a few
 * pool buffers that ZeroMQ takes without a copy (zmq_msg_init_data) and
 * the I/O thread forwards as it is; the steady state allocates nothing of
 * ours (libzmq allocates its small message header). Under the lock that
 * also orders the pipe. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
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
  e->shadowed = malloc(n * sizeof *e->shadowed);
  e->measure = malloc(n * sizeof *e->measure);
  c->sumsq = malloc(n * sizeof *c->sumsq);
  c->nonfinite = malloc(n * sizeof *c->nonfinite);
  c->seen = malloc(n);
  if (!e->sumsq || !e->nonfinite || !e->not_reported || !e->shadowed ||
      !e->measure || !c->sumsq ||
      !c->nonfinite || !c->seen)
    return GNMR_E_NOMEM;
  return GNMR_OK;
}

static void scratch_free(report_scratch *s) {
  free(s->sumsq);
  free(s->nonfinite);
  free(s->not_reported);
  free(s->shadowed);
  free(s->measure);
  free(s->seen);
  free(s->pack);
  memset(s, 0, sizeof *s);
}

void gnmr__agent_scratch_clear(gnmr_agent *a) {
  scratch_free(&a->enc);
  scratch_free(&a->cpu);
  /* ZeroMQ releases the buffers of dropped messages as it tears the
   * closed sockets down (at once when the context ends): wait for that,
   * briefly; a buffer still held then is left to ZeroMQ, never freed
   * under it. */
  for (int tries = 0; tries < 2000; tries++) {
    int busy = 0;
    for (int i = 0; i < REPORT_POOL; i++)
      busy |= atomic_load(&a->pool[i].busy);
    if (!busy)
      break;
    usleep(1000);
  }
  for (int i = 0; i < REPORT_POOL; i++)
    if (!atomic_load(&a->pool[i].busy))
      free(a->pool[i].p);
}

/* ZeroMQ is done with a pool buffer (any thread). */
static void pool_release(void *data, void *hint) {
  (void)data;
  atomic_store(&((pool_buf *)hint)->busy, 0);
}

/* last_reported only grows: CUDA results arrive after later steps began. */
void gnmr__agent_mark_reported(gnmr_agent *a, uint64_t step) {
  uint_fast64_t cur = atomic_load(&a->last_reported);
  while (cur < step &&
         !atomic_compare_exchange_weak(&a->last_reported, &cur, step))
    ;
}

/* ---- packing a Report ------------------------------------------------------ */

int gnmr__report_pack(gnmr__report_layout *pl, const uint8_t *skip, int check,
                      uint8_t *out) {
  /* proto/ writes the envelope around the sums, which are copied (and
   * checked) here in one pass */
  uint8_t *o = gnmr__report_pack_head(pl, out);
  int bad = gnmr__sums_copy_check(o, pl->sumsq, skip, pl->n, check);
  gnmr__report_pack_tail(pl, o + 8 * (size_t)pl->n);
  return bad;
}

/* Queues one step's per-unit values. Unit i is not reported when
 * not_reported[i] != 0 or seen[i] == 0 (either array may be NULL). Packs
 * into a->enc and sends under push_mu: the pipe sees reports whole and in
 * the order they were packed. */
/* The step's Report, straight from the caller's arrays; the flags a unit
 * without a value needs are built (in a->enc) only when some unit has
 * none. gnmrd ignores the sum and the count of a unit marked not
 * reported. Under push_mu. */
static void fill_report(gnmr_agent *a, Gnmr__Report *r, uint64_t step,
                        const double *sumsq, const uint64_t *nonfinite,
                        const uint8_t *not_reported, const uint8_t *seen,
                        const uint8_t *shadowed) {
  report_scratch *e = &a->enc;
  const uint32_t n = a->n_units;
  int any_nf = 0, any_nr = 0, any_sh = 0;
  uint8_t nr_any = 0;
  if (not_reported != NULL)
    for (uint32_t i = 0; i < n; i++)
      nr_any |= not_reported[i];
  if (seen != NULL)
    for (uint32_t i = 0; i < n; i++)
      nr_any |= !seen[i];
  if (nr_any) {
    for (uint32_t i = 0; i < n; i++)
      e->not_reported[i] = (not_reported && not_reported[i]) ||
                           (seen && !seen[i]);
    any_nr = 1;
  }
  if (nonfinite != NULL) {
    uint64_t acc = 0;
    for (uint32_t i = 0; i < n; i++)
      acc |= nonfinite[i];
    any_nf = acc != 0;
  }
  if (shadowed != NULL)
    for (uint32_t i = 0; i < n; i++)
      any_sh |= (e->shadowed[i] = shadowed[i] != 0);
  r->job = a->job;
  r->rank = a->rank;
  r->step = step;
  r->n_sumsq = n;
  r->sumsq = (double *)sumsq;
  r->n_nonfinite = any_nf ? n : 0;
  r->nonfinite = (uint64_t *)nonfinite;
  r->n_not_reported = any_nr ? n : 0;
  r->not_reported = e->not_reported;
  r->n_shadowed = any_sh ? n : 0;
  r->shadowed = e->shadowed;
  /* the measures given for this step (gnmr_agent_measure), whichever
   * path reports it */
  r->n_measure = e->measure_step == step ? n : 0;
  r->measure = e->measure;
}

/* A free pool buffer that holds len bytes, or NULL (all in flight, or no
 * memory: the copying path). The first report, or a larger one, grows
 * every free buffer (with room for longer varints), the copying path's
 * too, so that the steady state allocates nothing whichever buffer it
 * gets. Under push_mu. */
static pool_buf *pool_take(gnmr_agent *a, size_t len) {
  report_scratch *e = &a->enc;
  pool_buf *b = NULL;
  for (int i = 0; i < REPORT_POOL && b == NULL; i++)
    if (!atomic_load(&a->pool[i].busy))
      b = &a->pool[i];
  if (b == NULL || len <= b->cap)
    return b;
  size_t cap = len + len / 8 + 64;
  for (int i = 0; i < REPORT_POOL; i++) {
    pool_buf *o = &a->pool[i];
    uint8_t *p;
    if (o->cap < cap && !atomic_load(&o->busy) &&
        (p = realloc(o->p, cap)) != NULL) {
      o->p = p;
      o->cap = cap;
    }
  }
  uint8_t *p;
  if (cap > e->pack_cap && (p = realloc(e->pack, cap)) != NULL) {
    e->pack = p;
    e->pack_cap = cap;
  }
  return len > b->cap ? NULL : b;
}

/* Packs into b and hands it to ZeroMQ, which holds it until sent (zero
 * copy). *sent: the pipe took it. Under push_mu. */
static int send_pooled(gnmr_agent *a, pool_buf *b, gnmr__report_layout *pl,
                       const uint8_t *not_reported, int check, uint64_t step,
                       int *sent) {
  zmq_msg_t m;
  if (gnmr__report_pack(pl, not_reported, check, b->p))
    return GNMR_E_INVAL; /* the buffer stays free */
  atomic_store(&b->busy, 1);
  if (zmq_msg_init_data(&m, b->p, pl->len, pool_release, b) != 0) {
    atomic_store(&b->busy, 0);
    return GNMR_E_NOMEM;
  }
  gnmr__agent_mark_reported(a, step);
  *sent = zmq_msg_send(&m, a->push, ZMQ_DONTWAIT) >= 0;
  if (!*sent)
    zmq_msg_close(&m); /* releases b */
  return GNMR_OK;
}

/* Every pool buffer still in flight: packs into a->enc and ZeroMQ copies
 * it. Under push_mu. */
static int send_copied(gnmr_agent *a, gnmr__report_layout *pl,
                       const uint8_t *not_reported, int check, uint64_t step,
                       int *sent) {
  report_scratch *e = &a->enc;
  if (pl->len > e->pack_cap) {
    size_t cap = pl->len + pl->len / 8 + 64;
    uint8_t *p = realloc(e->pack, cap);
    if (p == NULL)
      return GNMR_E_NOMEM;
    e->pack = p;
    e->pack_cap = cap;
  }
  if (gnmr__report_pack(pl, not_reported, check, e->pack))
    return GNMR_E_INVAL;
  gnmr__agent_mark_reported(a, step);
  *sent = zmq_send(a->push, e->pack, pl->len, ZMQ_DONTWAIT) >= 0;
  return GNMR_OK;
}

static int queue_values(gnmr_agent *a, uint64_t step, const double *sumsq,
                        const uint64_t *nonfinite, const uint8_t *not_reported,
                        const uint8_t *seen, const uint8_t *shadowed,
                        int check) {
  if (atomic_load(&a->forked))
    return gnmr__agent_refuse_forked(a);
  if (a->observer) { /* another replica reports this shard */
    gnmr__agent_mark_reported(a, step);
    return GNMR_OK;
  }
  Gnmr__Report r = GNMR__REPORT__INIT; /* packed by gnmr__report_pack, as
                                          protobuf-c would pack it */
  int sent = 0, rv;
  pthread_mutex_lock(&a->push_mu);
  fill_report(a, &r, step, sumsq, nonfinite, not_reported, seen, shadowed);
  gnmr__report_layout pl;
  gnmr__report_plan(&pl, &r);
  pool_buf *b = pool_take(a, pl.len);
  rv = b != NULL ? send_pooled(a, b, &pl, not_reported, check, step, &sent)
                 : send_copied(a, &pl, not_reported, check, step, &sent);
  if (rv == GNMR_OK)
    atomic_fetch_add(sent ? &a->reports_sent : &a->reports_dropped, 1);
  pthread_mutex_unlock(&a->push_mu);
  return rv;
}

int gnmr_agent_measure(gnmr_agent *a, uint64_t step, const double *measure) {
  if (a == NULL || measure == NULL || step == 0 ||
      step <= atomic_load(&a->last_reported))
    return GNMR_E_INVAL;
  for (uint32_t i = 0; i < a->n_units; i++)
    if (measure[i] < 0) /* NaN: not measured; +inf: not finite */
      return GNMR_E_INVAL;
  pthread_mutex_lock(&a->push_mu);
  memcpy(a->enc.measure, measure, a->n_units * sizeof *measure);
  a->enc.measure_step = step;
  pthread_mutex_unlock(&a->push_mu);
  return GNMR_OK;
}

int gnmr_agent_report_sums(gnmr_agent *a, uint64_t step, const double *sumsq,
                           const uint64_t *nonfinite,
                           const uint8_t *not_reported) {
  return gnmr_agent_report_sums_shadowed(a, step, sumsq, nonfinite,
                                         not_reported, NULL);
}

int gnmr_agent_report_sums_shadowed(gnmr_agent *a, uint64_t step,
                                    const double *sumsq,
                                    const uint64_t *nonfinite,
                                    const uint8_t *not_reported,
                                    const uint8_t *shadowed) {
  if (a == NULL || sumsq == NULL || step == 0 ||
      step <= atomic_load(&a->last_reported))
    return GNMR_E_INVAL;
  if (atomic_load(&a->forked))
    return gnmr__agent_refuse_forked(a);
  /* negative or NaN: use nonfinite counts. Checked as the sums are
   * copied into the message (one pass); an observer sends nothing, so its
   * check is a pass of its own. */
  if (a->observer && gnmr__sums_invalid(sumsq, not_reported, a->n_units))
    return GNMR_E_INVAL;
  return queue_values(a, step, sumsq, nonfinite, not_reported, NULL,
                      shadowed, 1);
}

int gnmr_agent_report(gnmr_agent *a, uint64_t step, const gnmr_tensor *t,
                      size_t n) {
  if (a == NULL || step == 0 || step <= atomic_load(&a->last_reported))
    return GNMR_E_INVAL;
  if (atomic_load(&a->forked))
    return gnmr__agent_refuse_forked(a);
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
    rv = queue_values(a, step, c->sumsq, c->nonfinite, NULL, c->seen, NULL,
                      0);
  pthread_mutex_unlock(&a->cpu_mu);
  return rv;
}

/* --- for the CUDA backend (cuda_backend.h) ---------------------------------- */

uint32_t gnmr__agent_n_units(const gnmr_agent *a) { return a->n_units; }

int gnmr__agent_refuse_forked(gnmr_agent *a) {
  atomic_store(&a->last_error, GNMR_E_CLOSED);
  pthread_mutex_lock(&a->err_mu);
  snprintf(a->last_error_text, sizeof a->last_error_text,
           "this agent belongs to the process that opened it (%.120s); a "
           "forked child cannot use it: open another in the child",
           a->instance);
  pthread_mutex_unlock(&a->err_mu);
  return GNMR_E_CLOSED;
}

int gnmr__agent_forked(const gnmr_agent *a) {
  return atomic_load(&a->forked);
}

int gnmr__agent_begin_step(gnmr_agent *a, uint64_t step) {
  if (step == 0 || step <= atomic_load(&a->last_reported))
    return GNMR_E_INVAL;
  if (atomic_load(&a->forked))
    return gnmr__agent_refuse_forked(a);
  gnmr__agent_mark_reported(a, step);
  return a->observer ? 1 : GNMR_OK;
}

int gnmr__agent_queue_seen(gnmr_agent *a, uint64_t step, const double *sumsq,
                           const uint64_t *nonfinite, const uint8_t *seen) {
  return queue_values(a, step, sumsq, nonfinite, NULL, seen, NULL, 0);
}
