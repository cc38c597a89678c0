/* SPDX-License-Identifier: MIT */
/* gnmr/agent_cuda.h — the agent's CUDA backend: per-unit gradient norms of
 * device tensors in one fused kernel launch that never synchronises the
 * training stream.
 *
 *   gnmr_cuda_open(agent, &cfg, &c);          once, after gnmr_agent_open
 *   per step, after backward:
 *     gnmr_cuda_register(c, tensors, n);      cheap when nothing changed
 *     gnmr_cuda_report(c, step, stream);      one launch + one async copy
 *     (side_stream: cudaStreamWaitEvent(stream, gnmr_cuda_done_event(c))
 *      before anything overwrites the gradients)
 *
 * register builds the segment/chunk tables on the host and uploads them
 * only when a pointer, size, dtype, scale or unit changed (that upload
 * waits for this backend's previous launch, nothing else). report launches
 * the kernel on the caller's stream (or on a side stream ordered after it
 * by an event), copies the small result into the next pinned ring slot and
 * records the slot's event; the backend's completion thread waits on the
 * events in order and hands each result to the agent, which sends it. When
 * every slot is still in flight the step is skipped and counted
 * (skipped_steps), never waited for.
 *
 * Ordering: launches share the device buffers whatever their stream, so
 * each launch waits (on the device) for the previous launch and the last
 * copy of the result; submit and read wait for the last launch, so a
 * result is never read before the kernel that writes it, side stream or
 * not. The completion thread synchronizes in relaxed capture mode, so it
 * never invalidates a graph the training thread captures meanwhile.
 *
 * CUDA graphs: gnmr_cuda_reduce_async() is the launch alone (no host
 * metadata copy), so it can be captured; it records an event inside the
 * graph, so that every replay marks itself done and a later registration
 * waits for it. After each replay, gnmr_cuda_submit() copies the result
 * into the ring like report does. report and submit refuse a capturing
 * stream (GNMR_E_INVAL). The kernel reads the table sizes from device
 * memory, so a captured graph stays valid across re-registrations that fit
 * the buffers it was captured with; a larger one allocates new buffers
 * (stream-ordered: no device-wide wait), keeps the old ones for the graph
 * until close, and changes gnmr_cuda_generation(): capture again.
 *
 * Built only where nvcc exists (make prints which); otherwise every call
 * returns GNMR_E_UNSUPPORTED. Streams and events are cudaStream_t and
 * cudaEvent_t passed as void *. Calls on one gnmr_cuda must come from one
 * thread at a time; the device of every call is cfg.device (the caller's
 * current device is restored). */
#ifndef GNMR_AGENT_CUDA_H
#define GNMR_AGENT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "gnmr/agent.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Receives each result when there is no agent: sumsq, nonfinite and seen
 * have n_units entries (seen[u] == 0: unit u was not reported). Called on
 * the completion thread. */
typedef void (*gnmr_cuda_result_fn)(void *ctx, uint64_t step,
                                    const double *sumsq,
                                    const uint64_t *nonfinite,
                                    const uint8_t *seen, uint32_t n_units);

typedef struct gnmr_cuda_config {
  int device;            /* CUDA device of the tensors */
  uint32_t n_units;      /* without an agent; with one, 0 (the agent's) */
  uint32_t ring_slots;   /* results in flight before steps are skipped;
                            0 = 4 */
  uint32_t side_stream;  /* 1: reduce on an internal stream */
  uint32_t grid_blocks;  /* 0: as many as the device holds at once */
  gnmr_cuda_result_fn on_result; /* without an agent */
  void *on_result_ctx;
} gnmr_cuda_config;

typedef struct gnmr_cuda_stats {
  uint64_t launches;      /* kernel launches */
  uint64_t reports;       /* results put in the ring */
  uint64_t delivered;     /* results read back (the kernel done), counted
                             as they are handed to the agent or callback */
  uint64_t skipped_steps; /* ring full: step not reduced */
  uint64_t uploads;       /* table uploads (registrations that changed) */
  uint64_t cuda_errors;   /* CUDA calls that failed */
  uint32_t grid;          /* blocks per launch */
  uint32_t chunks;        /* chunks in the registered tables */
} gnmr_cuda_stats;

typedef struct gnmr_cuda gnmr_cuda;

/* Number of CUDA devices usable here: 0 with no driver or no device. */
GNMR_EXPORT int gnmr_cuda_device_count(void);

/* Opens the backend for agent (may be NULL: then cfg->n_units and
 * cfg->on_result are required). Errors: GNMR_E_UNSUPPORTED (built without
 * CUDA), GNMR_E_CUDA (no such device, or a CUDA call failed: see
 * gnmr_cuda_last_error), GNMR_E_INVAL, GNMR_E_NOMEM. */
GNMR_EXPORT int gnmr_cuda_open(gnmr_agent *agent, const gnmr_cuda_config *cfg,
                               gnmr_cuda **out);
/* Delivers the results still in flight, then frees everything. Close it
 * before its agent. NULL-safe; sets *c to NULL. */
GNMR_EXPORT void gnmr_cuda_close(gnmr_cuda **c);

/* Registers the device tensors every later report reduces (the same rules
 * as gnmr_agent_report's tensors, and data aligned to its element size, as
 * every framework's tensors are; units without a tensor are "not
 * reported"). Errors: GNMR_E_INVAL, GNMR_E_TOOBIG, GNMR_E_NOMEM,
 * GNMR_E_CUDA; the previous registration then stays. */
GNMR_EXPORT int gnmr_cuda_register(gnmr_cuda *c, const gnmr_tensor *t,
                                   size_t n);

/* Reports step (>= 1, above the last one): reduce_async + submit. With an
 * observer agent it only records the step. Errors: GNMR_E_INVAL (no
 * registration, bad step), GNMR_E_CUDA. */
GNMR_EXPORT int gnmr_cuda_report(gnmr_cuda *c, uint64_t step, void *stream);

/* The launch alone, on stream (capturable); the result stays on the
 * device until gnmr_cuda_submit or gnmr_cuda_read. */
GNMR_EXPORT int gnmr_cuda_reduce_async(gnmr_cuda *c, void *stream);
/* Copies the device result into the next ring slot on stream and records
 * its event; the completion thread delivers it as step. */
GNMR_EXPORT int gnmr_cuda_submit(gnmr_cuda *c, uint64_t step, void *stream);
/* Copies the device result to the host, waiting for stream. Arrays have
 * n_units entries; any may be NULL. */
GNMR_EXPORT int gnmr_cuda_read(gnmr_cuda *c, void *stream, double *sumsq,
                               uint64_t *nonfinite, uint8_t *seen);

/* Recorded after the last report's copy (cudaEvent_t). */
GNMR_EXPORT void *gnmr_cuda_done_event(gnmr_cuda *c);
/* The generation of the device buffers a launch uses: it changes when a
 * registration outgrows them and new ones are allocated. A graph captured
 * (reduce_async under capture) before the change still reads the old
 * buffers and the old tables, which stay allocated until close: capture
 * it again to reduce the new registration. */
GNMR_EXPORT unsigned gnmr_cuda_generation(gnmr_cuda *c);
/* Waits up to timeout_ms until every submitted result is delivered:
 * GNMR_OK or GNMR_E_TIMEDOUT. */
GNMR_EXPORT int gnmr_cuda_flush(gnmr_cuda *c, int timeout_ms);
GNMR_EXPORT int gnmr_cuda_stats_get(gnmr_cuda *c, gnmr_cuda_stats *out);
/* The last CUDA error as text ("" if none), in a per-thread buffer valid
 * until this thread calls it again. */
GNMR_EXPORT const char *gnmr_cuda_last_error(gnmr_cuda *c);

#ifdef __cplusplus
}
#endif
#endif /* GNMR_AGENT_CUDA_H */
