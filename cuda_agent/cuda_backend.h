/* SPDX-License-Identifier: MIT */
/* cuda_backend.h — internals of the CUDA backend shared by its host code
 * (cuda_backend.c), its kernel (norm_kernel.cu) and the tests. */
#ifndef GNMR_CUDA_BACKEND_H
#define GNMR_CUDA_BACKEND_H

#include <stdint.h>

#include "cuda_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device buffers of one launch (see cuda_plan.h for their layouts). */
typedef struct gnmr__launch {
  const void *tables;
  double *partial;       /* one slot per chunk */
  uint32_t *pcount;      /* one count per chunk */
  unsigned int *unit_done; /* per unit: chunks done, mod their count */
  unsigned char *result; /* gnmr__result_size(n_units) bytes */
  uint32_t grid;         /* blocks, >= 1 */
} gnmr__launch;

/* Launches the kernel on stream (a cudaStream_t); returns a cudaError_t. */
int gnmr__cuda_launch(const gnmr__launch *l, void *stream);
/* The kernel as the device runs it (cudaFuncGetAttributes): registers per
 * thread, local (spill) memory, PTX and binary versions (90: real sm_90
 * code). A cudaError_t. */
int gnmr__cuda_kernel_attrs(int *regs, size_t *local_bytes, int *ptx,
                            int *binary);
/* Blocks that fill the device (SMs x resident blocks); a cudaError_t. */
int gnmr__cuda_grid_max(int device, uint32_t *grid);
/* The kernel's arithmetic on the host, over a plan whose addresses are host
 * pointers: the reference the GPU results must equal bit for bit.
 * nonfinite and sumsq have n_units entries. GNMR_OK or GNMR_E_NOMEM. */
int gnmr__cuda_model(const gnmr__plan *p, double *sumsq,
                     uint64_t *nonfinite);

/* The per-unit chunk counters after the last launch (n_units entries;
 * ordered after it on stream): all zero between launches, since each
 * wraps to 0 by itself when its unit's last chunk is done. For tests. */
struct gnmr_cuda;
int gnmr__cuda_counters(struct gnmr_cuda *c, void *stream, unsigned int *out);

#ifdef __cplusplus
}
#endif
#endif /* GNMR_CUDA_BACKEND_H */
