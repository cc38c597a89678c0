/* SPDX-License-Identifier: MIT */
/* cuda_none.c — the CUDA backend's entry points in a build without nvcc:
 * every call says so with GNMR_E_UNSUPPORTED; nothing pretends to work. */
#include <stddef.h>

#include "gnmr/agent_cuda.h"

int gnmr_cuda_device_count(void) { return 0; }

int gnmr_cuda_open(gnmr_agent *agent, const gnmr_cuda_config *cfg,
                   gnmr_cuda **out) {
  (void)agent;
  (void)cfg;
  if (out)
    *out = NULL;
  return GNMR_E_UNSUPPORTED;
}

void gnmr_cuda_close(gnmr_cuda **c) {
  if (c)
    *c = NULL;
}

int gnmr_cuda_register(gnmr_cuda *c, const gnmr_tensor *t, size_t n) {
  (void)c, (void)t, (void)n;
  return GNMR_E_UNSUPPORTED;
}

int gnmr_cuda_report(gnmr_cuda *c, uint64_t step, void *stream) {
  (void)c, (void)step, (void)stream;
  return GNMR_E_UNSUPPORTED;
}

int gnmr_cuda_reduce_async(gnmr_cuda *c, void *stream) {
  (void)c, (void)stream;
  return GNMR_E_UNSUPPORTED;
}

int gnmr_cuda_submit(gnmr_cuda *c, uint64_t step, void *stream) {
  (void)c, (void)step, (void)stream;
  return GNMR_E_UNSUPPORTED;
}

int gnmr_cuda_read(gnmr_cuda *c, void *stream, double *sumsq,
                   uint64_t *nonfinite, uint8_t *seen) {
  (void)c, (void)stream, (void)sumsq, (void)nonfinite, (void)seen;
  return GNMR_E_UNSUPPORTED;
}

void *gnmr_cuda_done_event(gnmr_cuda *c) {
  (void)c;
  return NULL;
}

unsigned gnmr_cuda_generation(gnmr_cuda *c) {
  (void)c;
  return 0;
}

int gnmr_cuda_flush(gnmr_cuda *c, int timeout_ms) {
  (void)c, (void)timeout_ms;
  return GNMR_E_UNSUPPORTED;
}

int gnmr_cuda_stats_get(gnmr_cuda *c, gnmr_cuda_stats *out) {
  (void)c, (void)out;
  return GNMR_E_UNSUPPORTED;
}

const char *gnmr_cuda_last_error(gnmr_cuda *c) {
  (void)c;
  return "GNMR was built without CUDA (no nvcc)";
}
