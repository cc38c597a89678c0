/* SPDX-License-Identifier: MIT */
/* agent_async.c — gnmr_agent_report_begin/_end: a report of host tensors
 * reduced and queued on the agent's own report thread while the training
 * thread goes on (its optimizer step, say).
 *
 * Why a thread of the library's and not the caller's: a Python worker
 * thread must take the GIL before it can start the pass, and the training
 * thread holds it through most of an optimizer step, so the pass there
 * began late and its Python half competed with the optimizer for the GIL.
 * Here the caller hands over a copy of its tensor table and returns; the
 * thread (named gnmr-agent-rep, started at the first begin) reduces with
 * gnmr_reduce_cpu_threads, queues the report exactly as gnmr_agent_report
 * would, and _end waits for it and hands back the pass's own results.
 *
 * One report is in flight per agent. The state machine, under mu:
 * IDLE -(begin)-> QUEUED -(thread)-> RUNNING -> DONE -(end)-> IDLE. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "agent_internal.h"
#include "agent_priv.h"
#include "reduce_cpu.h"

enum { IDLE, QUEUED, RUNNING, DONE };

struct gnmr__report_job {
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  pthread_t th;
  int stop;
  int state;
  uint64_t step;
  gnmr_tensor *t; /* the caller's table, copied */
  size_t n, cap;
  unsigned threads;
  int any_mark;
  uint8_t *mark;     /* n_units: send as non-finite where seen */
  double *sumsq;     /* n_units each: the pass's results */
  uint64_t *nonfinite, *sent_nf;
  uint8_t *seen;
  int rv;
};

static void run_one(gnmr_agent *a, gnmr__report_job *j) {
  const uint32_t nu = a->n_units;
  memset(j->sumsq, 0, nu * sizeof *j->sumsq);
  memset(j->nonfinite, 0, nu * sizeof *j->nonfinite);
  memset(j->seen, 0, nu);
  int rv = gnmr_reduce_cpu_threads(j->t, j->n, nu, j->sumsq, j->nonfinite,
                                   j->seen, j->threads);
  if (rv == GNMR_OK) {
    const uint64_t *nf = j->nonfinite;
    if (j->any_mark) { /* what the low-cost path would have sent */
      for (uint32_t u = 0; u < nu; u++)
        j->sent_nf[u] = j->nonfinite[u] +
                        (j->mark[u] && j->seen[u] && !j->nonfinite[u]);
      nf = j->sent_nf;
    }
    rv = gnmr__agent_queue_seen(a, j->step, j->sumsq, nf, j->seen);
  }
  j->rv = rv;
}

static void *rep_main(void *arg) {
  gnmr_agent *a = arg;
  gnmr__report_job *j = a->rep;
  pthread_setname_np(pthread_self(), "gnmr-agent-rep");
  /* experiment (bench/report_async.py): no wake-up preemption */
  if (getenv("GNMR_REP_BATCH")) {
    struct sched_param sp = {0};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
  }
  pthread_mutex_lock(&j->mu);
  for (;;) {
    while (j->state != QUEUED && !j->stop)
      pthread_cond_wait(&j->go, &j->mu);
    if (j->state != QUEUED) /* stop, nothing in flight */
      break;
    j->state = RUNNING;
    pthread_mutex_unlock(&j->mu);
    run_one(a, j);
    pthread_mutex_lock(&j->mu);
    j->state = DONE;
    pthread_cond_broadcast(&j->done);
  }
  pthread_mutex_unlock(&j->mu);
  return NULL;
}

static void job_free(gnmr__report_job *j) {
  free(j->t);
  free(j->mark);
  free(j->sumsq);
  free(j->nonfinite);
  free(j->sent_nf);
  free(j->seen);
  free(j);
}

/* The job and its thread, made at the first begin. */
static int job_open(gnmr_agent *a) {
  const uint32_t nu = a->n_units;
  gnmr__report_job *j = calloc(1, sizeof *j);
  if (j == NULL)
    return GNMR_E_NOMEM;
  j->mark = calloc(nu ? nu : 1, 1);
  j->sumsq = calloc(nu ? nu : 1, sizeof *j->sumsq);
  j->nonfinite = calloc(nu ? nu : 1, sizeof *j->nonfinite);
  j->sent_nf = calloc(nu ? nu : 1, sizeof *j->sent_nf);
  j->seen = calloc(nu ? nu : 1, 1);
  if (!j->mark || !j->sumsq || !j->nonfinite || !j->sent_nf || !j->seen) {
    job_free(j);
    return GNMR_E_NOMEM;
  }
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->go, NULL);
  pthread_cond_init(&j->done, NULL);
  a->rep = j;
  if (pthread_create(&j->th, NULL, rep_main, a) != 0) {
    a->rep = NULL;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->go);
    pthread_cond_destroy(&j->done);
    job_free(j);
    return GNMR_E_NOMEM;
  }
  return GNMR_OK;
}

int gnmr_agent_report_begin(gnmr_agent *a, uint64_t step,
                            const gnmr_tensor *t, size_t n, unsigned threads,
                            const uint8_t *mark_nonfinite) {
  if (a == NULL || (t == NULL && n > 0) || step == 0 ||
      step <= atomic_load(&a->last_reported))
    return GNMR_E_INVAL;
  if (atomic_load(&a->forked))
    return gnmr__agent_refuse_forked(a);
  if (a->rep != NULL && atomic_load(&a->rep_busy))
    return GNMR_E_INVAL; /* one in flight: _end it first */
  for (size_t i = 0; i < n; i++) /* what the pass would refuse, now */
    if (t[i].unit >= a->n_units || (t[i].data == NULL && t[i].numel > 0))
      return GNMR_E_INVAL;
  if (a->observer) { /* no reduction: another replica reports */
    gnmr__agent_mark_reported(a, step);
    return GNMR_OK;
  }
  if (a->rep == NULL) {
    int rv = job_open(a);
    if (rv != GNMR_OK)
      return rv;
  }
  gnmr__report_job *j = a->rep;
  if (n > j->cap) {
    gnmr_tensor *p = realloc(j->t, n * sizeof *p);
    if (p == NULL)
      return GNMR_E_NOMEM;
    j->t = p;
    j->cap = n;
  }
  if (n > 0)
    memcpy(j->t, t, n * sizeof *t);
  j->n = n;
  j->threads = threads;
  j->any_mark = 0;
  if (mark_nonfinite != NULL) {
    memcpy(j->mark, mark_nonfinite, a->n_units);
    for (uint32_t u = 0; u < a->n_units; u++)
      j->any_mark |= j->mark[u] != 0;
  }
  /* the step is this agent's from now on, as the CUDA backend's is */
  gnmr__agent_mark_reported(a, step);
  atomic_store(&a->rep_busy, 1);
  /* experiment (bench/report_async.py): the pass off the caller's CPU */
  if (getenv("GNMR_REP_AWAY")) {
    cpu_set_t set;
    int me = sched_getcpu();
    if (me >= 0 && sched_getaffinity(0, sizeof set, &set) == 0 &&
        CPU_COUNT(&set) > 1) {
      CPU_CLR(me, &set);
      pthread_setaffinity_np(j->th, sizeof set, &set);
    }
  }
  pthread_mutex_lock(&j->mu);
  j->step = step;
  j->rv = GNMR_OK;
  j->state = QUEUED;
  pthread_cond_signal(&j->go);
  pthread_mutex_unlock(&j->mu);
  return GNMR_OK;
}

int gnmr_agent_report_end(gnmr_agent *a, uint64_t step, double *sumsq,
                          uint64_t *nonfinite, uint8_t *seen) {
  if (a == NULL)
    return GNMR_E_INVAL;
  if (atomic_load(&a->forked))
    return gnmr__agent_refuse_forked(a);
  gnmr__report_job *j = a->rep;
  if (a->observer && (j == NULL || !atomic_load(&a->rep_busy))) {
    /* an observer's begin reduces nothing: its results are empty */
    if (step == 0 || step != atomic_load(&a->last_reported))
      return GNMR_E_INVAL;
    const uint32_t nu = a->n_units;
    if (sumsq)
      memset(sumsq, 0, nu * sizeof *sumsq);
    if (nonfinite)
      memset(nonfinite, 0, nu * sizeof *nonfinite);
    if (seen)
      memset(seen, 0, nu);
    return GNMR_OK;
  }
  if (j == NULL || !atomic_load(&a->rep_busy))
    return GNMR_E_INVAL; /* nothing in flight */
  pthread_mutex_lock(&j->mu);
  if (j->step != step) {
    pthread_mutex_unlock(&j->mu);
    return GNMR_E_INVAL;
  }
  while (j->state != DONE)
    pthread_cond_wait(&j->done, &j->mu);
  j->state = IDLE;
  int rv = j->rv;
  pthread_mutex_unlock(&j->mu);
  const uint32_t nu = a->n_units;
  if (sumsq)
    memcpy(sumsq, j->sumsq, nu * sizeof *sumsq);
  if (nonfinite)
    memcpy(nonfinite, j->nonfinite, nu * sizeof *nonfinite);
  if (seen)
    memcpy(seen, j->seen, nu);
  atomic_store(&a->rep_busy, 0);
  return rv;
}

/* gnmr_agent_close: lets a report in flight finish (its tensors are the
 * caller's to keep until then), then stops the thread. */
void gnmr__agent_report_thread_stop(gnmr_agent *a) {
  gnmr__report_job *j = a->rep;
  if (j == NULL)
    return;
  pthread_mutex_lock(&j->mu);
  j->stop = 1;
  pthread_cond_signal(&j->go);
  pthread_mutex_unlock(&j->mu);
  pthread_join(j->th, NULL);
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->go);
  pthread_cond_destroy(&j->done);
  job_free(j);
  a->rep = NULL;
}

/* A forked child's copy: the thread is the parent's; free the memory. */
void gnmr__agent_report_job_forget(gnmr_agent *a) {
  gnmr__report_job *j = a->rep;
  if (j == NULL)
    return;
  job_free(j);
  a->rep = NULL;
}
