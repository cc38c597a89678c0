/* SPDX-License-Identifier: MIT */
/* cuda_fake.c — a stand-in for the CUDA runtime, so that `make check` runs
 * the CUDA backend's host code (cuda_backend.c: tables, uploads, the result
 * ring, the completion thread, the agent hand-off, every error path) on a
 * machine without a GPU, under ASan and valgrind too.
 *
 * "Device" memory is host memory. Stream work is not run when it is
 * issued: each stream keeps a queue, and work runs only when the program
 * must see it done (a stream or event synchronization, a wait of one
 * stream on another's event, a free, a synchronous call), and then only
 * what that needs. This laziness is the adversary: work that nothing
 * orders before a reader is still pending when the reader runs. With
 * fake_cuda_seed(n) some other ready work also runs early, at random
 * (seeded), to vary the orders tried.
 *
 * It fails the test (fake_cuda_violations() > 0, the first described by
 * fake_cuda_violation()) on:
 *   - an operation reading device memory that an earlier-issued, unordered
 *     operation still has to write (a copy of the result before the kernel
 *     that writes it), or writing memory an unordered earlier one still
 *     reads or writes (a reset of counters under a running kernel);
 *   - a wait on, or synchronization of, an event never recorded;
 *   - a free of memory a captured graph uses (a graph captured through
 *     cudaStreamBeginCapture keeps its kernels' buffers).
 * As the runtime does (seen on an H200, CUDA 13): a plain cudaEventRecord
 * on a capturing stream is internal to the capture (no node of the
 * graph), and a wait on, or synchronization of, such an event once
 * outside the capture is cudaErrorInvalidValue; only
 * cudaEventRecordWithFlags(cudaEventRecordExternal) puts a record in the
 * graph. A failed call leaves its error for this thread's next
 * cudaGetLastError, which a kernel launch's check reads.
 * The kernel launch runs the kernel's host model (gnmr__cuda_model) over
 * the uploaded table image. A failure can be injected into the Nth call
 * of a named function. Only what the backend calls is here. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "cuda_fake.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char fail_name[64];
static int fail_after = -1; /* calls of fail_name to let through */
static int devices = 1;
static atomic_int launches, live_allocs, device_syncs;

void fake_cuda_fail(const char *name, int after) {
  pthread_mutex_lock(&mu);
  snprintf(fail_name, sizeof fail_name, "%s", name ? name : "");
  fail_after = name ? after : -1;
  pthread_mutex_unlock(&mu);
}

void fake_cuda_devices(int n) { devices = n; }
int fake_cuda_launches(void) { return atomic_load(&launches); }
int fake_cuda_live_allocs(void) { return atomic_load(&live_allocs); }
int fake_cuda_device_syncs(void) { return atomic_load(&device_syncs); }

/* The runtime's per-thread last error: every failed call sets it, and
 * cudaGetLastError (which the kernel launch's check calls) returns and
 * clears it. */
static _Thread_local cudaError_t last_error;
static cudaError_t failed(cudaError_t e) {
  last_error = e;
  return e;
}

/* cudaErrorMemoryAllocation when the injected failure is due here. */
static cudaError_t maybe_fail(const char *name) {
  cudaError_t e = cudaSuccess;
  pthread_mutex_lock(&mu);
  if (fail_after >= 0 && strcmp(name, fail_name) == 0) {
    if (fail_after == 0) {
      e = failed(cudaErrorMemoryAllocation);
      fail_after = -1;
    } else {
      fail_after--;
    }
  }
  pthread_mutex_unlock(&mu);
  return e;
}

/* ---- the ordering model (everything below under `mu`) ---------------------- */

enum { OP_MEMSET = 1, OP_COPY, OP_LAUNCH, OP_RECORD, OP_WAIT };
#define OP_BUFS 5

typedef struct fstream fstream;
typedef struct fevent fevent;

typedef struct op {
  int kind;
  uint64_t seq; /* issue order, all streams */
  fstream *st;
  struct op *next; /* in its stream */
  struct op *all_next, *all_prev; /* pending ops, in issue order */
  int done;
  /* buffers touched: device allocations (their base), read or written */
  void *rd[OP_BUFS], *wr[OP_BUFS];
  /* OP_MEMSET / OP_COPY */
  void *dst;
  const void *src;
  size_t n;
  int val;
  /* OP_LAUNCH */
  gnmr__launch l;
  /* OP_RECORD: the event; OP_WAIT: the record waited for */
  fevent *ev;
  struct op *rec;
} op;

struct fstream {
  op *head, *tail; /* not yet run, in order */
  int capturing;
  struct fgraph *graph; /* being captured into */
};

struct fevent {
  op *latest; /* the last record issued (kept until the event dies) */
  int recorded;
  int internal; /* last recorded inside a capture, not as a graph node */
};

/* A captured graph: its kernels and event records, replayed in order by
 * cudaGraphLaunch. */
typedef struct fnode {
  int kind; /* OP_LAUNCH or OP_RECORD */
  gnmr__launch l;
  fevent *ev;
} fnode;
typedef struct fgraph {
  fnode node[32];
  int n;
  int live; /* instantiated and not destroyed */
} fgraph;

static fstream legacy; /* the NULL stream */
static op *pending_head, *pending_tail;
static uint64_t next_seq;
static int violations;
static char violation[256];
static unsigned rng_state; /* 0: no early progress */
static fgraph *graphs[64];
static int global_captures; /* streams capturing in global mode */
static _Thread_local enum cudaStreamCaptureMode thread_mode =
    cudaStreamCaptureModeGlobal;


static void violate(const char *fmt, const char *what) {
  if (violations++ == 0)
    snprintf(violation, sizeof violation, fmt, what);
}

/* A synchronization while a stream captures in global mode invalidates
 * the capture, unless this thread is in relaxed mode. Under mu. */
static void check_sync_allowed(const char *call) {
  if (global_captures > 0 && thread_mode != cudaStreamCaptureModeRelaxed)
    violate("%s during a global-mode capture (CUDA invalidates the "
            "capture; the thread must be in relaxed mode)",
            call);
}

int fake_cuda_violations(void) {
  pthread_mutex_lock(&mu);
  int n = violations;
  pthread_mutex_unlock(&mu);
  return n;
}

const char *fake_cuda_violation(void) { return violation; }

void fake_cuda_reset_violations(void) {
  pthread_mutex_lock(&mu);
  violations = 0;
  violation[0] = '\0';
  pthread_mutex_unlock(&mu);
}

void fake_cuda_seed(unsigned seed) {
  pthread_mutex_lock(&mu);
  rng_state = seed;
  pthread_mutex_unlock(&mu);
}

static fstream *stream_of(cudaStream_t s) {
  return s == NULL ? &legacy : (fstream *)s;
}

static int touches(void *const *set, const void *b) {
  for (int i = 0; i < OP_BUFS; i++)
    if (set[i] != NULL && set[i] == b)
      return 1;
  return 0;
}

/* Whether an earlier-issued op still pending conflicts with x. */
static void check_hazards(const op *x) {
  for (const op *w = pending_head; w != NULL && w->seq < x->seq;
       w = w->all_next) {
    if (w->done || w->st == x->st)
      continue;
    for (int i = 0; i < OP_BUFS; i++) {
      if (x->rd[i] != NULL && touches(w->wr, x->rd[i])) {
        violate("%s reads device memory that an earlier, unordered "
                "operation has not written yet",
                x->kind == OP_COPY ? "a copy" : "a kernel");
        return;
      }
      if (x->wr[i] != NULL &&
          (touches(w->wr, x->wr[i]) || touches(w->rd, x->wr[i]))) {
        violate("%s overwrites device memory that an earlier, unordered "
                "operation still uses",
                x->kind == OP_MEMSET ? "a memset" :
                x->kind == OP_COPY ? "a copy" : "a kernel");
        return;
      }
    }
  }
}

static void run_launch(const gnmr__launch *l);
static void run_until(op *target);

/* Runs the head op of its stream (its dependencies first). */
static void run_one(fstream *st) {
  op *o = st->head;
  if (o == NULL)
    return;
  if (o->kind == OP_WAIT && o->rec != NULL && !o->rec->done)
    run_until(o->rec);
  if (st->head != o) /* ran meanwhile (recursion) */
    return;
  check_hazards(o);
  switch (o->kind) {
  case OP_MEMSET:
    memset(o->dst, o->val, o->n);
    break;
  case OP_COPY:
    memcpy(o->dst, o->src, o->n);
    break;
  case OP_LAUNCH:
    run_launch(&o->l);
    break;
  default:
    break;
  }
  o->done = 1;
  st->head = o->next;
  if (st->head == NULL)
    st->tail = NULL;
  /* off the pending list; a record stays alive while its event points at
   * it (freed when the event is recorded again or destroyed) */
  if (o->all_prev)
    o->all_prev->all_next = o->all_next;
  else
    pending_head = o->all_next;
  if (o->all_next)
    o->all_next->all_prev = o->all_prev;
  else
    pending_tail = o->all_prev;
  o->all_next = o->all_prev = NULL;
  if (o->kind != OP_RECORD)
    free(o);
}

/* Runs target's stream up to and including target (which is freed once
 * run, unless it is a record: only its place in the stream is used). */
static void run_until(op *target) {
  if (target->done)
    return;
  fstream *st = target->st;
  uint64_t seq = target->seq;
  while (st->head != NULL && st->head->seq <= seq)
    run_one(st);
}

static void run_stream(fstream *st) {
  while (st->head != NULL)
    run_one(st);
}

static void run_all(void) {
  while (pending_head != NULL)
    run_one(pending_head->st);
  atomic_fetch_add(&device_syncs, 1);
}

/* With a seed: now and then, some ready work runs early. */
static void progress(void) {
  if (rng_state == 0 || pending_head == NULL)
    return;
  rng_state = rng_state * 1103515245u + 12345u;
  if ((rng_state >> 16) % 3 != 0)
    return;
  int k = (int)((rng_state >> 8) % 4);
  op *o = pending_head;
  while (k-- > 0 && o->all_next != NULL)
    o = o->all_next;
  run_until(o);
}

static op *enqueue(cudaStream_t s, int kind) {
  op *o = calloc(1, sizeof *o);
  if (o == NULL)
    abort();
  o->kind = kind;
  o->seq = ++next_seq;
  o->st = stream_of(s);
  if (o->st->tail)
    o->st->tail->next = o;
  else
    o->st->head = o;
  o->st->tail = o;
  o->all_prev = pending_tail;
  if (pending_tail)
    pending_tail->all_next = o;
  else
    pending_head = o;
  pending_tail = o;
  return o;
}

/* Device allocations, to tell device pointers from host ones. */
typedef struct alloc {
  void *p;
  size_t n;
  int device;
} alloc;
static alloc allocs[4096];
static int n_allocs;

static void *device_base(const void *p) {
  for (int i = 0; i < n_allocs; i++)
    if (allocs[i].device && (const char *)p >= (char *)allocs[i].p &&
        (const char *)p < (char *)allocs[i].p + (allocs[i].n ? allocs[i].n
                                                              : 1))
      return allocs[i].p;
  return NULL;
}

const char *cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess            ? "no error"
         : e == cudaErrorInvalidValue ? "invalid argument (fake CUDA)"
                                      : "injected failure (fake CUDA)";
}

const char *cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess              ? "cudaSuccess"
         : e == cudaErrorInvalidValue ? "cudaErrorInvalidValue"
                                      : "cudaErrorMemoryAllocation";
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaGetDeviceCount(int *n) {
  *n = devices;
  return devices ? cudaSuccess : cudaErrorNoDevice;
}

static _Thread_local int current;
cudaError_t cudaGetDevice(int *d) {
  *d = current;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= devices)
    return cudaErrorInvalidDevice;
  current = d;
  return maybe_fail("cudaSetDevice");
}

/* Records are kept until exit: a pending wait may still point at one. */
static op *records[1 << 16];
static int n_records;
__attribute__((destructor)) static void free_records(void) {
  for (int i = 0; i < n_records; i++)
    free(records[i]);
  n_records = 0;
}

static cudaError_t do_alloc(void **p, size_t n, int device) {
  *p = malloc(n ? n : 1);
  if (*p == NULL)
    return cudaErrorMemoryAllocation;
  pthread_mutex_lock(&mu);
  if (n_allocs < (int)(sizeof allocs / sizeof allocs[0]))
    allocs[n_allocs++] = (alloc){*p, n, device};
  pthread_mutex_unlock(&mu);
  atomic_fetch_add(&live_allocs, 1);
  return cudaSuccess;
}

/* Whether a live captured graph's kernels use p. Under mu. */
static int graph_uses(const void *p) {
  for (int g = 0; g < 64; g++)
    for (int k = 0; graphs[g] != NULL && k < graphs[g]->n; k++) {
      const gnmr__launch *l = &graphs[g]->node[k].l;
      if (graphs[g]->node[k].kind != OP_LAUNCH)
        continue;
      if (p == l->tables || p == (void *)l->partial ||
          p == (void *)l->pcount || p == (void *)l->unit_done ||
          p == (void *)l->result)
        return 1;
    }
  return 0;
}

static void do_free(void *p) {
  if (p == NULL)
    return;
  for (int i = 0; i < n_allocs; i++)
    if (allocs[i].p == p) {
      allocs[i] = allocs[--n_allocs];
      break;
    }
  atomic_fetch_sub(&live_allocs, 1);
  free(p);
}

cudaError_t cudaMalloc(void **p, size_t n) {
  cudaError_t e = maybe_fail("cudaMalloc");
  if (e != cudaSuccess)
    return e;
  return do_alloc(p, n, 1);
}

cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
  (void)s; /* usable by work issued after it on s (and by what waits) */
  cudaError_t e = maybe_fail("cudaMallocAsync");
  if (e != cudaSuccess)
    return e;
  return do_alloc(p, n, 1);
}

/* cudaFree waits for the whole device first (CUDA's own behaviour). */
cudaError_t cudaFree(void *p) {
  pthread_mutex_lock(&mu);
  if (p != NULL && graph_uses(p))
    violate("%s: memory a captured graph uses is freed", "cudaFree");
  run_all();
  do_free(p);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

/* Freed once the stream reaches this point: no device-wide wait. */
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  pthread_mutex_lock(&mu);
  if (p != NULL && graph_uses(p))
    violate("%s: memory a captured graph uses is freed", "cudaFreeAsync");
  run_stream(stream_of(s));
  do_free(p);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags) {
  (void)flags;
  cudaError_t e = maybe_fail("cudaHostAlloc");
  if (e != cudaSuccess)
    return e;
  return do_alloc(p, n, 0);
}

cudaError_t cudaFreeHost(void *p) {
  pthread_mutex_lock(&mu);
  run_all();
  do_free(p);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

static op *mem_op(cudaStream_t s, int kind, void *dst, const void *src,
                  size_t n, int val) {
  op *o = enqueue(s, kind);
  o->dst = dst;
  o->src = src;
  o->n = n;
  o->val = val;
  o->wr[0] = device_base(dst);
  if (src != NULL)
    o->rd[0] = device_base(src);
  return o;
}

cudaError_t cudaMemset(void *p, int v, size_t n) {
  pthread_mutex_lock(&mu);
  mem_op(NULL, OP_MEMSET, p, NULL, n, v);
  run_stream(&legacy);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  cudaError_t e = maybe_fail("cudaMemsetAsync");
  if (e != cudaSuccess)
    return e;
  pthread_mutex_lock(&mu);
  if (!stream_of(s)->capturing)
    mem_op(s, OP_MEMSET, p, NULL, n, v);
  progress();
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                            enum cudaMemcpyKind k, cudaStream_t s) {
  (void)k;
  cudaError_t e = maybe_fail("cudaMemcpyAsync");
  if (e != cudaSuccess)
    return e;
  pthread_mutex_lock(&mu);
  if (!stream_of(s)->capturing)
    mem_op(s, OP_COPY, dst, src, n, 0);
  progress();
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

/* Streams and events: heap objects, so that leaks show. */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  (void)flags;
  fstream *st = calloc(1, sizeof *st);
  if (st == NULL)
    return cudaErrorMemoryAllocation;
  atomic_fetch_add(&live_allocs, 1);
  *s = (cudaStream_t)st;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  pthread_mutex_lock(&mu);
  run_stream(stream_of(s)); /* its work completes first */
  pthread_mutex_unlock(&mu);
  atomic_fetch_sub(&live_allocs, 1);
  free(s);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  cudaError_t e = maybe_fail("cudaStreamSynchronize");
  if (e != cudaSuccess)
    return e;
  pthread_mutex_lock(&mu);
  check_sync_allowed("cudaStreamSynchronize");
  run_stream(stream_of(s));
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e,
                                unsigned int flags) {
  (void)flags;
  cudaError_t err = maybe_fail("cudaStreamWaitEvent");
  if (err != cudaSuccess)
    return err;
  fevent *ev = (fevent *)e;
  pthread_mutex_lock(&mu);
  if (!ev->recorded)
    violate("%s: a stream waits on an event never recorded",
            "cudaStreamWaitEvent");
  if (!stream_of(s)->capturing && ev->internal) {
    pthread_mutex_unlock(&mu);
    return failed(cudaErrorInvalidValue);
  }
  if (!stream_of(s)->capturing) {
    op *o = enqueue(s, OP_WAIT);
    o->rec = ev->latest;
  }
  progress();
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s,
                                  enum cudaStreamCaptureStatus *st) {
  pthread_mutex_lock(&mu);
  *st = s != NULL && stream_of(s)->capturing ? cudaStreamCaptureStatusActive
                                             : cudaStreamCaptureStatusNone;
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s,
                                   enum cudaStreamCaptureMode mode) {
  (void)mode;
  fgraph *g = calloc(1, sizeof *g);
  if (s == NULL || g == NULL) {
    free(g);
    return cudaErrorStreamCaptureUnsupported;
  }
  pthread_mutex_lock(&mu);
  stream_of(s)->capturing = mode == cudaStreamCaptureModeGlobal ? 2 : 1;
  global_captures += mode == cudaStreamCaptureModeGlobal;
  stream_of(s)->graph = g;
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
  pthread_mutex_lock(&mu);
  *graph = (cudaGraph_t)stream_of(s)->graph;
  global_captures -= stream_of(s)->capturing == 2;
  stream_of(s)->capturing = 0;
  stream_of(s)->graph = NULL;
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags) {
  (void)flags;
  fgraph *g = (fgraph *)graph;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < 64; i++)
    if (graphs[i] == NULL) {
      graphs[i] = g;
      break;
    }
  g->live = 1;
  pthread_mutex_unlock(&mu);
  *exec = (cudaGraphExec_t)g;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  fgraph *g = (fgraph *)exec;
  pthread_mutex_lock(&mu);
  for (int k = 0; k < g->n; k++) {
    const fnode *nd = &g->node[k];
    op *o = enqueue(s, nd->kind);
    if (nd->kind == OP_RECORD) {
      o->ev = nd->ev;
      if (n_records < (int)(sizeof records / sizeof records[0]))
        records[n_records++] = o;
      nd->ev->latest = o;
      nd->ev->recorded = 1;
      nd->ev->internal = 0;
      continue;
    }
    o->l = nd->l;
    o->rd[0] = (void *)nd->l.tables;
    o->wr[0] = nd->l.partial;
    o->wr[1] = nd->l.pcount;
    o->wr[2] = nd->l.unit_done;
    o->wr[3] = nd->l.result;
  }
  progress();
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  fgraph *g = (fgraph *)exec;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < 64; i++)
    if (graphs[i] == g)
      graphs[i] = NULL;
  pthread_mutex_unlock(&mu);
  free(g);
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  (void)graph; /* the exec owns the fake's graph */
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(
    enum cudaStreamCaptureMode *mode) {
  enum cudaStreamCaptureMode prev = thread_mode;
  thread_mode = *mode;
  *mode = prev;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  (void)flags;
  fevent *ev = calloc(1, sizeof *ev);
  if (ev == NULL)
    return cudaErrorMemoryAllocation;
  atomic_fetch_add(&live_allocs, 1);
  *e = (cudaEvent_t)ev;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  atomic_fetch_sub(&live_allocs, 1);
  free(e);
  return cudaSuccess;
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s,
                                     unsigned int flags) {
  cudaError_t err = maybe_fail("cudaEventRecord");
  if (err != cudaSuccess)
    return err;
  fevent *ev = (fevent *)e;
  pthread_mutex_lock(&mu);
  fstream *st = stream_of(s);
  if (st->capturing && (flags & cudaEventRecordExternal)) {
    /* a record node: every replay records it */
    if (st->graph->n < 32)
      st->graph->node[st->graph->n++] = (fnode){OP_RECORD, {0}, ev};
  } else if (st->capturing) { /* internal to the capture */
    ev->recorded = 1;
    ev->internal = 1;
  } else {
    op *o = enqueue(s, OP_RECORD);
    o->ev = ev;
    if (n_records < (int)(sizeof records / sizeof records[0]))
      records[n_records++] = o;
    ev->latest = o;
    ev->recorded = 1;
    ev->internal = 0;
  }
  progress();
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  return cudaEventRecordWithFlags(e, s, cudaEventRecordDefault);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  cudaError_t err = maybe_fail("cudaEventSynchronize");
  if (err != cudaSuccess)
    return err;
  fevent *ev = (fevent *)e;
  pthread_mutex_lock(&mu);
  check_sync_allowed("cudaEventSynchronize");
  if (ev->internal) {
    pthread_mutex_unlock(&mu);
    return failed(cudaErrorInvalidValue);
  }
  if (!ev->recorded)
    violate("%s: an event never recorded is waited on",
            "cudaEventSynchronize");
  else if (!ev->latest->done)
    run_until(ev->latest);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

/* nvcc's registration of the (model-only) object's empty fat binary */
void **__cudaRegisterFatBinary(void *fat);
void __cudaRegisterFatBinaryEnd(void **h);
void __cudaUnregisterFatBinary(void **h);
static void *fat_handle;
void **__cudaRegisterFatBinary(void *fat) {
  (void)fat;
  return &fat_handle;
}
void __cudaRegisterFatBinaryEnd(void **h) { (void)h; }
void __cudaUnregisterFatBinary(void **h) { (void)h; }

/* The kernel's two host entry points, over host memory. */
int gnmr__cuda_grid_max(int device, uint32_t *grid) {
  (void)device;
  *grid = 8;
  return (int)maybe_fail("gnmr__cuda_grid_max");
}

/* The kernel, when its turn comes: the host model over "device" memory. */
static void run_launch(const gnmr__launch *l) {
  const char *b = l->tables;
  gnmr__dev_header h;
  memcpy(&h, b, sizeof h);
  gnmr__plan p = {
      .n_units = h.n_units,
      .n_chunks = h.n_chunks,
      .segs = (gnmr__seg *)(b + h.segs_off),
      .chunks = (gnmr__chunk *)(b + h.chunks_off),
      .unit_begin = (uint32_t *)(b + h.unit_begin_off),
      .seen = (uint8_t *)(b + h.seen_off),
  };
  size_t n = h.n_units;
  if (gnmr__cuda_model(&p, (double *)l->result,
                       (uint64_t *)(l->result + GNMR_RESULT_NONFINITE_OFF(n))) != GNMR_OK)
    abort(); /* the model allocates nothing it could fail on */
  memcpy(l->result + GNMR_RESULT_SEEN_OFF(n), p.seen, n);
}

int gnmr__cuda_launch(const gnmr__launch *l, void *stream) {
  cudaError_t e = maybe_fail("gnmr__cuda_launch");
  if (e != cudaSuccess)
    return (int)e;
  pthread_mutex_lock(&mu);
  fstream *st = stream_of((cudaStream_t)stream);
  if (st->capturing) {
    if (st->graph->n < 32)
      st->graph->node[st->graph->n++] = (fnode){OP_LAUNCH, *l, NULL};
  } else {
    op *o = enqueue((cudaStream_t)stream, OP_LAUNCH);
    o->l = *l;
    o->rd[0] = (void *)l->tables;
    o->wr[0] = l->partial;
    o->wr[1] = l->pcount;
    o->wr[2] = l->unit_done;
    o->wr[3] = l->result;
  }
  progress();
  pthread_mutex_unlock(&mu);
  atomic_fetch_add(&launches, 1);
  return (int)cudaGetLastError(); /* as norm_kernel.cu's check does */
}
