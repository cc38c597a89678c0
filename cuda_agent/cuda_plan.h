/* SPDX-License-Identifier: MIT */
/* cuda_plan.h — the CUDA backend's tables, built on the host when tensors
 * are registered and uploaded to the device only when they change.
 *
 * A report reduces `segments` (one per non-empty tensor) cut into `chunks`
 * of at most GNMR_CUDA_CHUNK elements. Chunks are ordered by unit, then by
 * the order the tensors were registered in, then by offset, so unit u owns
 * the contiguous chunk range [unit_begin[u], unit_begin[u+1]). One block
 * reduces one chunk at a time into its own slot; the block that completes a
 * unit's last chunk adds the unit's slots in a fixed order in fp64. No
 * float atomics, so results do not depend on the grid size or on
 * scheduling.
 *
 * The device copy of the tables is one buffer laid out as
 *   gnmr__dev_header | segs[n_segs] | chunks[n_chunks] |
 *   unit_begin[n_units + 1] | seen[n_units]
 * and the result of a reduction (device buffer and pinned ring slots) as
 *   sumsq[n_units] (double) | nonfinite[n_units] (u64) | seen[n_units] (u8)
 * This header is shared by C (host code) and CUDA C++ (the kernel). */
#ifndef GNMR_CUDA_PLAN_H
#define GNMR_CUDA_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "gnmr/agent.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GNMR_CUDA_CHUNK 32768u  /* elements per chunk: a multiple of 16 */
#define GNMR_CUDA_THREADS 256u  /* threads per block */
#define GNMR_SEG_ALIGNED 1u     /* segment base is 16-byte aligned */

typedef struct gnmr__seg {
  uint64_t addr;   /* device address of element 0 */
  uint64_t numel;
  uint16_t dtype;  /* enum gnmr_dtype */
  uint16_t flags;  /* GNMR_SEG_* */
  uint32_t unit;
  double scale2;   /* scale^2, applied to each chunk's sum */
} gnmr__seg;

typedef struct gnmr__chunk {
  uint64_t start;  /* first element, within its segment */
  uint32_t seg;
  uint32_t len;    /* 1..GNMR_CUDA_CHUNK */
} gnmr__chunk;

/* Read by the kernel from the device tables, so that a captured CUDA graph
 * follows a later registration that fits the same buffers. */
typedef struct gnmr__dev_header {
  uint32_t n_chunks;
  uint32_t n_units;
  uint64_t segs_off, chunks_off, unit_begin_off, seen_off; /* bytes */
} gnmr__dev_header;

typedef struct gnmr__plan {
  uint32_t n_units, n_segs, n_chunks;
  gnmr__seg *segs;
  gnmr__chunk *chunks;
  uint32_t *unit_begin; /* n_units + 1 */
  uint8_t *seen;        /* n_units: the unit has a registered tensor */
} gnmr__plan;

/* Builds p from n tensors (dtype, unit, scale checked as gnmr_reduce_cpu
 * does; data is not read, but must be aligned to its element size). Errors: GNMR_E_INVAL,
 * GNMR_E_TOOBIG (more than 2^32 - 1 chunks), GNMR_E_NOMEM; p is then
 * empty. */
int gnmr__plan_build(gnmr__plan *p, const gnmr_tensor *t, size_t n,
                     uint32_t n_units);
void gnmr__plan_clear(gnmr__plan *p);
/* 1 when both plans would upload the same tables. */
int gnmr__plan_equal(const gnmr__plan *a, const gnmr__plan *b);
/* Size of the device tables and the offsets of their parts. */
size_t gnmr__plan_tables_size(const gnmr__plan *p, gnmr__dev_header *h);
/* Writes the device image of the tables into buf (tables_size bytes). */
void gnmr__plan_tables_write(const gnmr__plan *p, void *buf);
/* Bytes of one result: 17 per unit, rounded up to 16. */
size_t gnmr__result_size(uint32_t n_units);
/* Where a result's nonfinite and seen arrays start (sumsq at 0). */
#define GNMR_RESULT_NONFINITE_OFF(n_units) (8 * (size_t)(n_units))
#define GNMR_RESULT_SEEN_OFF(n_units) (16 * (size_t)(n_units))

#ifdef __cplusplus
}
#endif
#endif /* GNMR_CUDA_PLAN_H */
