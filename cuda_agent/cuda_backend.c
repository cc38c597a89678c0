/* SPDX-License-Identifier: MIT */
/* cuda_backend.c — host side of the agent's CUDA backend (gnmr/agent_cuda.h):
 * device buffers, table uploads, the pinned result ring and the completion
 * thread. Every CUDA call is checked; failures return GNMR_E_CUDA with the
 * runtime's message kept for gnmr_cuda_last_error(). Built only with nvcc
 * present (cuda_none.c otherwise). */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent_internal.h"
#include "cuda_backend.h"
#include "cuda_plan.h"
#include "gnmr/agent_cuda.h"
#include "owner.h"

#define RING_DEFAULT 4
#define RING_MAX 64

typedef struct slot {
  unsigned char *host; /* pinned, gnmr__result_size bytes */
  cudaEvent_t ev;
  uint64_t step;
} slot;

struct gnmr_cuda {
  gnmr_agent *agent;
  gnmr_cuda_result_fn on_result;
  void *on_result_ctx;
  int device;
  uint32_t n_units, grid_cfg, grid_max;
  int side;

  gnmr__plan plan; /* registered; n_units == 0 until the first register */
  gnmr_tensor *reg; /* the registered list, to skip the plan when equal */
  size_t reg_n;
  void *d_tables;
  size_t tables_cap;
  double *d_partial;
  uint32_t *d_pcount;
  size_t partial_cap, pcount_cap; /* bytes */
  unsigned int *d_unit_done; /* per unit: chunks done in this launch */
  unsigned char *d_result;
  size_t result_size;
  void *h_staging; /* pinned copy of the tables for their upload */
  size_t staging_cap;

  cudaStream_t s_side, s_upload;
  cudaEvent_t ev_input, ev_last, ev_done;
  int launched; /* ev_last has been recorded */
  unsigned generation; /* of the device buffers (gnmr_cuda_generation) */
  int captured; /* a launch was captured into a graph: its buffers stay */
  void *retired[64]; /* buffers a captured graph may still use, freed at
                        close */
  int n_retired;
  void *retired_host[32]; /* outgrown staging: cudaFreeHost would wait for
                             the whole device, so it waits for close */
  int n_retired_host;

  /* ring: [tail, head) submitted and not yet delivered */
  slot ring[RING_MAX];
  uint32_t n_slots;
  uint64_t head, tail;
  uint64_t last_step;
  pthread_mutex_t mu;
  pthread_cond_t cv_work, cv_done;
  int stop;
  pthread_t thr;
  int thr_started;
  gnmr_owner completion; /* the completion thread, claimed as it starts */

  atomic_uint_fast64_t launches, reports, delivered, skipped, uploads, errs;
  pthread_mutex_t err_mu;
  char err[192];
};

/* Records a failed CUDA call: counts it and keeps its message. */
static int cuda_fail(gnmr_cuda *c, cudaError_t e, const char *what) {
  if (c != NULL) {
    atomic_fetch_add(&c->errs, 1);
    pthread_mutex_lock(&c->err_mu);
    snprintf(c->err, sizeof c->err, "%s: %s (%s)", what,
             cudaGetErrorString(e), cudaGetErrorName(e));
    pthread_mutex_unlock(&c->err_mu);
  }
  return GNMR_E_CUDA;
}

#define CK(c, call)                                                          \
  do {                                                                       \
    cudaError_t e_ = (call);                                                 \
    if (e_ != cudaSuccess) {                                                 \
      rv = cuda_fail((c), e_, #call);                                        \
      goto out;                                                              \
    }                                                                        \
  } while (0)

/* Makes cfg.device current for the duration of a call. */
typedef struct devguard {
  int prev, ok;
} devguard;

static int dev_enter(gnmr_cuda *c, devguard *g) {
  g->ok = cudaGetDevice(&g->prev) == cudaSuccess;
  if (!g->ok || g->prev != c->device) {
    cudaError_t e = cudaSetDevice(c->device);
    if (e != cudaSuccess)
      return cuda_fail(c, e, "cudaSetDevice");
  }
  return GNMR_OK;
}

static void dev_leave(gnmr_cuda *c, devguard *g) {
  if (g->ok && g->prev != c->device)
    cudaSetDevice(g->prev);
}

int gnmr_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* clear the sticky "no driver" error */
    return 0;
  }
  return n;
}

/* The completion thread alone reads a slot between tail and head without
 * the lock (the training thread fills only slots past head). */
static void deliver(gnmr_cuda *c, slot *s) {
  GNMR_OWNED(&c->completion, "delivering a result slot");
  const double *sumsq = (const double *)s->host;
  const uint64_t *nf =
      (const uint64_t *)(s->host + GNMR_RESULT_NONFINITE_OFF(c->n_units));
  const uint8_t *seen = s->host + GNMR_RESULT_SEEN_OFF(c->n_units);
  /* counted first: whoever sees what this result leads to (gnmrd's
   * decision of the step) sees the kernel done, and may free what it
   * read (gnmr.reduction's Reduction.release) */
  atomic_fetch_add(&c->delivered, 1);
  if (c->agent != NULL)
    gnmr__agent_queue_seen(c->agent, s->step, sumsq, nf, seen);
  else
    c->on_result(c->on_result_ctx, s->step, sumsq, nf, seen, c->n_units);
}

/* The completion thread: waits on each slot's event in order (blocking
 * sync, no spinning), then delivers the slot. */
static void *completion_main(void *arg) {
  gnmr_cuda *c = arg;
  gnmr_owner_claim(&c->completion);
  cudaSetDevice(c->device);
  /* this thread's synchronizations must not invalidate a graph that the
   * training thread captures meanwhile (torch.cuda.graph captures in
   * global mode, where any thread's synchronization ends the capture) */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (c->tail == c->head && !c->stop)
      pthread_cond_wait(&c->cv_work, &c->mu);
    if (c->tail == c->head)
      break; /* stop, and nothing left in flight */
    slot *s = &c->ring[c->tail % c->n_slots];
    pthread_mutex_unlock(&c->mu);
    cudaError_t e = cudaEventSynchronize(s->ev);
    if (e == cudaSuccess)
      deliver(c, s);
    else
      cuda_fail(c, e, "cudaEventSynchronize (result slot)");
    pthread_mutex_lock(&c->mu);
    c->tail++;
    pthread_cond_broadcast(&c->cv_done);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

static void free_buffers(gnmr_cuda *c) {
  for (int i = 0; i < c->n_retired; i++)
    cudaFree(c->retired[i]);
  c->n_retired = 0;
  for (int i = 0; i < c->n_retired_host; i++)
    cudaFreeHost(c->retired_host[i]);
  c->n_retired_host = 0;
  cudaFree(c->d_tables);
  cudaFree(c->d_partial);
  cudaFree(c->d_pcount);
  cudaFree(c->d_unit_done);
  cudaFree(c->d_result);
  cudaFreeHost(c->h_staging);
  for (uint32_t i = 0; i < c->n_slots; i++) {
    cudaFreeHost(c->ring[i].host);
    if (c->ring[i].ev)
      cudaEventDestroy(c->ring[i].ev);
  }
  if (c->ev_input)
    cudaEventDestroy(c->ev_input);
  if (c->ev_last)
    cudaEventDestroy(c->ev_last);
  if (c->ev_done)
    cudaEventDestroy(c->ev_done);
  if (c->s_side)
    cudaStreamDestroy(c->s_side);
  if (c->s_upload)
    cudaStreamDestroy(c->s_upload);
}

int gnmr_cuda_open(gnmr_agent *agent, const gnmr_cuda_config *cfg,
                   gnmr_cuda **out) {
  if (out == NULL)
    return GNMR_E_INVAL;
  *out = NULL;
  if (cfg == NULL || cfg->ring_slots > RING_MAX ||
      (agent == NULL && (cfg->n_units == 0 || cfg->on_result == NULL)) ||
      (agent != NULL && cfg->n_units != 0 &&
       cfg->n_units != gnmr__agent_n_units(agent)))
    return GNMR_E_INVAL;
  int ndev = gnmr_cuda_device_count();
  if (cfg->device < 0 || cfg->device >= ndev)
    return GNMR_E_CUDA; /* no driver, no device, or no such device */
  gnmr_cuda *c = calloc(1, sizeof *c);
  if (c == NULL)
    return GNMR_E_NOMEM;
  c->agent = agent;
  c->on_result = cfg->on_result;
  c->on_result_ctx = cfg->on_result_ctx;
  c->device = cfg->device;
  c->n_units = agent ? gnmr__agent_n_units(agent) : cfg->n_units;
  c->grid_cfg = cfg->grid_blocks;
  c->side = cfg->side_stream != 0;
  c->n_slots = cfg->ring_slots ? cfg->ring_slots : RING_DEFAULT;
  c->result_size = gnmr__result_size(c->n_units);
  pthread_mutex_init(&c->mu, NULL);
  pthread_mutex_init(&c->err_mu, NULL);
  pthread_cond_init(&c->cv_work, NULL);
  pthread_cond_init(&c->cv_done, NULL);
  int rv = GNMR_OK;
  devguard g;
  if ((rv = dev_enter(c, &g)) != GNMR_OK)
    goto fail;
  CK(c, (cudaError_t)gnmr__cuda_grid_max(c->device, &c->grid_max));
  CK(c, cudaMalloc((void **)&c->d_unit_done,
                   (size_t)c->n_units * sizeof *c->d_unit_done));
  CK(c, cudaMemset(c->d_unit_done, 0,
                   (size_t)c->n_units * sizeof *c->d_unit_done));
  CK(c, cudaMalloc((void **)&c->d_result, c->result_size));
  CK(c, cudaMemset(c->d_result, 0, c->result_size));
  CK(c, cudaStreamCreateWithFlags(&c->s_upload, cudaStreamNonBlocking));
  if (c->side)
    CK(c, cudaStreamCreateWithFlags(&c->s_side, cudaStreamNonBlocking));
  CK(c, cudaEventCreateWithFlags(&c->ev_input, cudaEventDisableTiming));
  CK(c, cudaEventCreateWithFlags(&c->ev_last, cudaEventDisableTiming));
  CK(c, cudaEventCreateWithFlags(&c->ev_done, cudaEventDisableTiming));
  /* recorded once now, so that every wait on them is on a recorded
   * event: ev_last stands for the last launch or graph replay, ev_done
   * for the last copy of the result */
  CK(c, cudaEventRecord(c->ev_last, c->s_upload));
  CK(c, cudaEventRecord(c->ev_done, c->s_upload));
  for (uint32_t i = 0; i < c->n_slots; i++) {
    CK(c, cudaHostAlloc((void **)&c->ring[i].host, c->result_size,
                        cudaHostAllocPortable));
    CK(c, cudaEventCreateWithFlags(&c->ring[i].ev, cudaEventDisableTiming |
                                                       cudaEventBlockingSync));
  }
  if (pthread_create(&c->thr, NULL, completion_main, c) != 0) {
    rv = GNMR_E_NOMEM;
    goto out;
  }
  c->thr_started = 1;
out:
  dev_leave(c, &g);
  if (rv == GNMR_OK) {
    *out = c;
    return GNMR_OK;
  }
fail:
  free_buffers(c);
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->err_mu);
  pthread_cond_destroy(&c->cv_work);
  pthread_cond_destroy(&c->cv_done);
  free(c);
  return rv;
}

void gnmr_cuda_close(gnmr_cuda **pc) {
  if (pc == NULL || *pc == NULL)
    return;
  gnmr_cuda *c = *pc;
  if (c->agent != NULL && gnmr__agent_forked(c->agent)) {
    /* the copy in a forked child: the completion thread, streams and
     * device memory are the parent's (CUDA is not usable after fork) */
    gnmr__plan_clear(&c->plan);
    free(c->reg);
    free(c);
    *pc = NULL;
    return;
  }
  pthread_mutex_lock(&c->mu);
  c->stop = 1;
  pthread_cond_broadcast(&c->cv_work);
  pthread_mutex_unlock(&c->mu);
  if (c->thr_started)
    pthread_join(c->thr, NULL);
  devguard g;
  if (dev_enter(c, &g) == GNMR_OK) {
    if (c->ev_last)
      cudaEventSynchronize(c->ev_last);
    free_buffers(c);
    dev_leave(c, &g);
  }
  gnmr__plan_clear(&c->plan);
  free(c->reg);
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->err_mu);
  pthread_cond_destroy(&c->cv_work);
  pthread_cond_destroy(&c->cv_done);
  free(c);
  *pc = NULL;
}

/* Grows a device buffer to at least need bytes (contents not kept), on
 * the upload stream: stream-ordered allocation and free, so that no free
 * waits for the whole device. A buffer that a captured graph may use is
 * never freed under it: it is kept until close, and the generation tells
 * the caller to capture again. */
static cudaError_t grow(gnmr_cuda *c, void **p, size_t *cap, size_t need,
                        size_t elem) {
  if (need * elem <= *cap && *p != NULL)
    return cudaSuccess;
  size_t want = need * elem * 2 > 4096 ? need * elem * 2 : 4096;
  if (*p != NULL) {
    if (c->captured && c->n_retired < 64) {
      c->retired[c->n_retired++] = *p;
    } else {
      cudaError_t e = cudaFreeAsync(*p, c->s_upload);
      if (e != cudaSuccess)
        return e;
    }
    c->generation++;
  }
  *p = NULL;
  *cap = 0;
  cudaError_t e = cudaMallocAsync(p, want, c->s_upload);
  if (e == cudaSuccess)
    *cap = want;
  return e;
}

int gnmr_cuda_register(gnmr_cuda *c, const gnmr_tensor *t, size_t n) {
  if (c == NULL)
    return GNMR_E_INVAL;
  /* the common case, every step: the very same list as last time */
  if (c->plan.n_units != 0 && n == c->reg_n &&
      (n == 0 || memcmp(t, c->reg, n * sizeof *t) == 0))
    return GNMR_OK;
  gnmr__plan np;
  int rv = gnmr__plan_build(&np, t, n, c->n_units);
  if (rv != GNMR_OK)
    return rv;
  gnmr_tensor *copy = malloc((n ? n : 1) * sizeof *copy);
  if (copy == NULL) {
    gnmr__plan_clear(&np);
    return GNMR_E_NOMEM;
  }
  if (n)
    memcpy(copy, t, n * sizeof *t);
  if (c->plan.n_units != 0 && gnmr__plan_equal(&np, &c->plan)) {
    gnmr__plan_clear(&np); /* same tables (e.g. reordered units' lists) */
    free(c->reg);
    c->reg = copy;
    c->reg_n = n;
    return GNMR_OK; /* nothing changed: no upload */
  }
  devguard g;
  if ((rv = dev_enter(c, &g)) != GNMR_OK) {
    gnmr__plan_clear(&np);
    return rv;
  }
  size_t tsize = gnmr__plan_tables_size(&np, NULL);
  /* the previous launch or graph replay may still read the buffers being
   * replaced, and the last copy the result: the upload waits for both
   * (on the device), the host only for the upload */
  CK(c, cudaStreamWaitEvent(c->s_upload, c->ev_last, 0));
  CK(c, cudaStreamWaitEvent(c->s_upload, c->ev_done, 0));
  if (tsize > c->staging_cap) {
    if (c->h_staging != NULL && c->n_retired_host < 32)
      c->retired_host[c->n_retired_host++] = c->h_staging;
    else
      cudaFreeHost(c->h_staging);
    c->h_staging = NULL;
    c->staging_cap = 0;
    CK(c, cudaHostAlloc(&c->h_staging, tsize * 2, cudaHostAllocPortable));
    c->staging_cap = tsize * 2;
  }
  CK(c, grow(c, &c->d_tables, &c->tables_cap, tsize, 1));
  CK(c, grow(c, (void **)&c->d_partial, &c->partial_cap, np.n_chunks,
             sizeof(double)));
  CK(c, grow(c, (void **)&c->d_pcount, &c->pcount_cap, np.n_chunks,
             sizeof(uint32_t)));
  CK(c, cudaMemsetAsync(c->d_unit_done, 0,
                        (size_t)c->n_units * sizeof *c->d_unit_done,
                        c->s_upload));
  gnmr__plan_tables_write(&np, c->h_staging);
  CK(c, cudaMemcpyAsync(c->d_tables, c->h_staging, tsize,
                        cudaMemcpyHostToDevice, c->s_upload));
  CK(c, cudaStreamSynchronize(c->s_upload));
  atomic_fetch_add(&c->uploads, 1);
out:
  dev_leave(c, &g);
  if (rv == GNMR_OK) {
    gnmr__plan_clear(&c->plan);
    c->plan = np;
    free(c->reg);
    c->reg = copy;
    c->reg_n = n;
  } else {
    gnmr__plan_clear(&np);
    free(copy);
  }
  return rv;
}

static uint32_t grid_of(const gnmr_cuda *c) {
  uint32_t g = c->grid_cfg ? c->grid_cfg : c->grid_max;
  if (g > c->plan.n_chunks)
    g = c->plan.n_chunks;
  return g ? g : 1;
}

/* Launches on the caller's stream, or on the side stream after it. Sets
 * *used to the stream the result is ready on. Launches share the chunk
 * slots, the counters and the result, whatever their stream: each waits
 * for the previous one (ev_last) and for the last copy of the result
 * (ev_done). Under capture those waits belong to the caller's stream
 * order; the launch records ev_last in the graph (an external record
 * node), so that every replay records it and a later registration, read
 * or submit waits for the replays too. */
static int launch(gnmr_cuda *c, cudaStream_t stream, cudaStream_t *used) {
  int rv = GNMR_OK;
  enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  CK(c, cudaStreamIsCapturing(stream, &cap));
  cudaStream_t s = stream;
  if (cap == cudaStreamCaptureStatusNone) {
    if (c->side) {
      CK(c, cudaEventRecord(c->ev_input, stream));
      CK(c, cudaStreamWaitEvent(c->s_side, c->ev_input, 0));
      s = c->s_side;
    }
    CK(c, cudaStreamWaitEvent(s, c->ev_last, 0));
    CK(c, cudaStreamWaitEvent(s, c->ev_done, 0));
  } else {
    c->captured = 1;
  }
  gnmr__launch l = {
      .tables = c->d_tables,
      .partial = c->d_partial,
      .pcount = c->d_pcount,
      .unit_done = c->d_unit_done,
      .result = c->d_result,
      .grid = grid_of(c),
  };
  /* the launch's own error is read with cudaGetLastError, which also
   * returns one an earlier call left behind (each was reported where it
   * happened): clear it first, so that it is not blamed on this launch */
  (void)cudaGetLastError();
  CK(c, (cudaError_t)gnmr__cuda_launch(&l, s));
  atomic_fetch_add(&c->launches, 1);
  /* Under capture a plain record is internal to the capture: waiting on
   * it after the capture ends is cudaErrorInvalidValue (seen on an H200,
   * CUDA 13). An external record is a node of the graph: every replay
   * records ev_last, as a launch outside a graph does. */
  if (cap == cudaStreamCaptureStatusNone)
    CK(c, cudaEventRecord(c->ev_last, s));
  else
    CK(c, cudaEventRecordWithFlags(c->ev_last, s, cudaEventRecordExternal));
  c->launched = 1;
  *used = s;
out:
  return rv;
}

int gnmr_cuda_reduce_async(gnmr_cuda *c, void *stream) {
  if (c == NULL || c->plan.n_units == 0)
    return GNMR_E_INVAL;
  devguard g;
  int rv = dev_enter(c, &g);
  cudaStream_t used;
  if (rv == GNMR_OK)
    rv = launch(c, (cudaStream_t)stream, &used);
  dev_leave(c, &g);
  return rv;
}

/* Copies the result into the next slot on s and hands it to the
 * completion thread. Called with the step checked and a slot free (only
 * this thread adds slots). */
static int submit_on(gnmr_cuda *c, uint64_t step, cudaStream_t s) {
  int rv = GNMR_OK;
  pthread_mutex_lock(&c->mu);
  slot *sl = &c->ring[c->head % c->n_slots]; /* free: ring_full() said so */
  pthread_mutex_unlock(&c->mu);
  /* the result is the last launch's, whichever stream it ran on */
  CK(c, cudaStreamWaitEvent(s, c->ev_last, 0));
  CK(c, cudaMemcpyAsync(sl->host, c->d_result, c->result_size,
                        cudaMemcpyDeviceToHost, s));
  CK(c, cudaEventRecord(sl->ev, s));
  CK(c, cudaEventRecord(c->ev_done, s));
  sl->step = step;
  pthread_mutex_lock(&c->mu);
  c->head++;
  pthread_cond_signal(&c->cv_work);
  pthread_mutex_unlock(&c->mu);
  atomic_fetch_add(&c->reports, 1);
out:
  return rv;
}

/* The step rules: with an agent, its own (observer: 1); without, above the
 * last step. */
static int begin_step(gnmr_cuda *c, uint64_t step) {
  if (c->agent != NULL)
    return gnmr__agent_begin_step(c->agent, step);
  if (step == 0 || step <= c->last_step)
    return GNMR_E_INVAL;
  c->last_step = step;
  return GNMR_OK;
}

/* Whether every ring slot is in flight. */
static int ring_full(gnmr_cuda *c) {
  pthread_mutex_lock(&c->mu);
  int full = c->head - c->tail >= c->n_slots;
  pthread_mutex_unlock(&c->mu);
  return full;
}

/* report (with_launch) and submit: the step's rules, then the launch (or
 * not) and the copy into the ring. A full ring skips before launching, so
 * a skipped step costs the GPU nothing. */
static int report_step(gnmr_cuda *c, uint64_t step, cudaStream_t stream,
                       int with_launch) {
  if (c == NULL || c->plan.n_units == 0)
    return GNMR_E_INVAL;
  /* a copy into the ring and an event for the completion thread cannot be
   * captured: a replay would copy into a slot the host already took */
  enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  cudaError_t ce = cudaStreamIsCapturing(stream, &cap);
  if (ce != cudaSuccess)
    return cuda_fail(c, ce, "cudaStreamIsCapturing");
  if (cap != cudaStreamCaptureStatusNone) {
    atomic_fetch_add(&c->errs, 1);
    pthread_mutex_lock(&c->err_mu);
    snprintf(c->err, sizeof c->err, "%s on a capturing stream: capture "
             "gnmr_cuda_reduce_async only, and submit after each replay",
             with_launch ? "gnmr_cuda_report" : "gnmr_cuda_submit");
    pthread_mutex_unlock(&c->err_mu);
    return GNMR_E_INVAL;
  }
  int rv = begin_step(c, step);
  if (rv != GNMR_OK)
    return rv < 0 ? rv : GNMR_OK; /* observer: nothing to reduce */
  if (ring_full(c)) {
    atomic_fetch_add(&c->skipped, 1);
    return GNMR_OK;
  }
  devguard g;
  cudaStream_t used = stream;
  if ((rv = dev_enter(c, &g)) != GNMR_OK)
    return rv;
  if (with_launch)
    rv = launch(c, stream, &used);
  if (rv == GNMR_OK)
    rv = submit_on(c, step, used);
  dev_leave(c, &g);
  return rv;
}

int gnmr_cuda_report(gnmr_cuda *c, uint64_t step, void *stream) {
  return report_step(c, step, (cudaStream_t)stream, 1);
}

int gnmr_cuda_submit(gnmr_cuda *c, uint64_t step, void *stream) {
  return report_step(c, step, (cudaStream_t)stream, 0);
}

int gnmr_cuda_read(gnmr_cuda *c, void *stream, double *sumsq,
                   uint64_t *nonfinite, uint8_t *seen) {
  if (c == NULL)
    return GNMR_E_INVAL;
  unsigned char *h = malloc(c->result_size);
  if (h == NULL)
    return GNMR_E_NOMEM;
  devguard g;
  int rv = dev_enter(c, &g);
  if (rv != GNMR_OK) {
    free(h);
    return rv;
  }
  CK(c, cudaStreamWaitEvent((cudaStream_t)stream, c->ev_last, 0));
  CK(c, cudaMemcpyAsync(h, c->d_result, c->result_size,
                        cudaMemcpyDeviceToHost, (cudaStream_t)stream));
  CK(c, cudaStreamSynchronize((cudaStream_t)stream));
  size_t n = c->n_units;
  if (sumsq)
    memcpy(sumsq, h, 8 * n);
  if (nonfinite)
    memcpy(nonfinite, h + GNMR_RESULT_NONFINITE_OFF(n), 8 * n);
  if (seen)
    memcpy(seen, h + GNMR_RESULT_SEEN_OFF(n), n);
out:
  dev_leave(c, &g);
  free(h);
  return rv;
}

int gnmr__cuda_counters(gnmr_cuda *c, void *stream, unsigned int *out) {
  if (c == NULL || out == NULL)
    return GNMR_E_INVAL;
  devguard g;
  int rv = dev_enter(c, &g);
  if (rv != GNMR_OK)
    return rv;
  if (c->n_units > 0 && c->d_unit_done != NULL) {
    if (c->launched)
      CK(c, cudaStreamWaitEvent((cudaStream_t)stream, c->ev_last, 0));
    CK(c, cudaMemcpyAsync(out, c->d_unit_done,
                          (size_t)c->n_units * sizeof *out,
                          cudaMemcpyDeviceToHost, (cudaStream_t)stream));
    CK(c, cudaStreamSynchronize((cudaStream_t)stream));
  }
out:
  dev_leave(c, &g);
  return rv;
}

void *gnmr_cuda_done_event(gnmr_cuda *c) { return c ? (void *)c->ev_done : NULL; }

unsigned gnmr_cuda_generation(gnmr_cuda *c) { return c ? c->generation : 0; }

int gnmr_cuda_flush(gnmr_cuda *c, int timeout_ms) {
  if (c == NULL)
    return GNMR_E_INVAL;
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  int64_t ns = dl.tv_nsec + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000;
  dl.tv_sec += ns / 1000000000;
  dl.tv_nsec = ns % 1000000000;
  int rv = GNMR_OK;
  pthread_mutex_lock(&c->mu);
  while (c->tail != c->head)
    if (pthread_cond_timedwait(&c->cv_done, &c->mu, &dl) == ETIMEDOUT) {
      rv = c->tail == c->head ? GNMR_OK : GNMR_E_TIMEDOUT;
      break;
    }
  pthread_mutex_unlock(&c->mu);
  return rv;
}

int gnmr_cuda_stats_get(gnmr_cuda *c, gnmr_cuda_stats *o) {
  if (c == NULL || o == NULL)
    return GNMR_E_INVAL;
  o->launches = atomic_load(&c->launches);
  o->reports = atomic_load(&c->reports);
  o->delivered = atomic_load(&c->delivered);
  o->skipped_steps = atomic_load(&c->skipped);
  o->uploads = atomic_load(&c->uploads);
  o->cuda_errors = atomic_load(&c->errs);
  o->grid = c->plan.n_units ? grid_of(c) : 0;
  o->chunks = c->plan.n_chunks;
  return GNMR_OK;
}

const char *gnmr_cuda_last_error(gnmr_cuda *c) {
  static _Thread_local char copy[sizeof c->err]; /* the completion thread
                                                    may record one too */
  if (c == NULL)
    return "";
  pthread_mutex_lock(&c->err_mu);
  memcpy(copy, c->err, sizeof copy);
  pthread_mutex_unlock(&c->err_mu);
  return copy;
}
