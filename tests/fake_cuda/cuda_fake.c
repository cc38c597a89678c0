/* SPDX-License-Identifier: MIT */
/* cuda_fake.c — a stand-in for the CUDA runtime, so that `make check` runs
 * the CUDA backend's host code (cuda_backend.c: tables, uploads, the result
 * ring, the completion thread, the agent hand-off, every error path) on a
 * machine without a GPU, under ASan and valgrind too.
 *
 * "Device" memory is host memory; every stream operation runs at once, so
 * events are complete when recorded. The kernel launch runs the kernel's
 * host model (gnmr__cuda_model) over the uploaded table image. A failure
 * can be injected into the Nth call of a named function. Only what the
 * backend calls is here. */
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
static atomic_int launches, live_allocs;

void fake_cuda_fail(const char *name, int after) {
  pthread_mutex_lock(&mu);
  snprintf(fail_name, sizeof fail_name, "%s", name ? name : "");
  fail_after = name ? after : -1;
  pthread_mutex_unlock(&mu);
}

void fake_cuda_devices(int n) { devices = n; }
int fake_cuda_launches(void) { return atomic_load(&launches); }
int fake_cuda_live_allocs(void) { return atomic_load(&live_allocs); }

/* cudaErrorMemoryAllocation when the injected failure is due here. */
static cudaError_t maybe_fail(const char *name) {
  cudaError_t e = cudaSuccess;
  pthread_mutex_lock(&mu);
  if (fail_after >= 0 && strcmp(name, fail_name) == 0) {
    if (fail_after == 0) {
      e = cudaErrorMemoryAllocation;
      fail_after = -1;
    } else {
      fail_after--;
    }
  }
  pthread_mutex_unlock(&mu);
  return e;
}

const char *cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "injected failure (fake CUDA)";
}

const char *cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess ? "cudaSuccess" : "cudaErrorMemoryAllocation";
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }

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

cudaError_t cudaMalloc(void **p, size_t n) {
  cudaError_t e = maybe_fail("cudaMalloc");
  if (e != cudaSuccess)
    return e;
  *p = malloc(n ? n : 1);
  if (*p == NULL)
    return cudaErrorMemoryAllocation;
  atomic_fetch_add(&live_allocs, 1);
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
  if (p != NULL)
    atomic_fetch_sub(&live_allocs, 1);
  free(p);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags) {
  (void)flags;
  cudaError_t e = maybe_fail("cudaHostAlloc");
  if (e != cudaSuccess)
    return e;
  return cudaMalloc(p, n);
}

cudaError_t cudaFreeHost(void *p) { return cudaFree(p); }

cudaError_t cudaMemset(void *p, int v, size_t n) {
  memset(p, v, n);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  (void)s;
  memset(p, v, n);
  return maybe_fail("cudaMemsetAsync");
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                            enum cudaMemcpyKind k, cudaStream_t s) {
  (void)k, (void)s;
  cudaError_t e = maybe_fail("cudaMemcpyAsync");
  if (e == cudaSuccess)
    memcpy(dst, src, n);
  return e;
}

/* Streams and events: small heap objects, so that leaks show. */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  (void)flags;
  return cudaMalloc((void **)s, 8);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) { return cudaFree(s); }
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  (void)s;
  return maybe_fail("cudaStreamSynchronize");
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e,
                                unsigned int flags) {
  (void)s, (void)e, (void)flags;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s,
                                  enum cudaStreamCaptureStatus *st) {
  (void)s;
  *st = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  (void)flags;
  return cudaMalloc((void **)e, 8);
}

cudaError_t cudaEventDestroy(cudaEvent_t e) { return cudaFree(e); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  (void)e, (void)s;
  return maybe_fail("cudaEventRecord");
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  (void)e;
  return maybe_fail("cudaEventSynchronize");
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

int gnmr__cuda_launch(const gnmr__launch *l, void *stream) {
  (void)stream;
  cudaError_t e = maybe_fail("gnmr__cuda_launch");
  if (e != cudaSuccess)
    return (int)e;
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
    return (int)cudaErrorMemoryAllocation;
  memcpy(l->result + GNMR_RESULT_SEEN_OFF(n), p.seen, n);
  atomic_fetch_add(&launches, 1);
  return cudaSuccess;
}
