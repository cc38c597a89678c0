/* SPDX-License-Identifier: MIT */
/* reduce_cpu.h — internals of the CPU backend shared with tests and
 * benchmarks: which kernel set runs, and a switch to force the portable
 * one (so that both are tested on machines with AVX2). */
#ifndef GNMR_REDUCE_CPU_H
#define GNMR_REDUCE_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "gnmr/agent.h"

/* Elements per block: the unit of the kernels and of their summation order
 * (a tensor's sum is its blocks' sums added in order, then scaled). */
#define GNMR_REDUCE_BLOCK 4096

/* GNMR_OK when every tensor is one gnmr_reduce_cpu accepts (unit below
 * n_units, a known dtype, data unless empty, a finite scale >= 0). */
int gnmr__reduce_check(const gnmr_tensor *tensors, size_t n,
                       uint32_t n_units);

/* The sum of squares of the finite elements of t's n elements from off (n
 * <= GNMR_REDUCE_BLOCK) at SIMD level simd; adds the others' count to *bad.
 * Any thread. */
double gnmr__reduce_block(const gnmr_tensor *t, uint64_t off, size_t n,
                          uint64_t *bad, int simd);

/* gnmr_reduce_cpu_threads' count for 0 (GNMR_REDUCE_THREADS, else the
 * CPUs this process may run on), 1 to 8. */
unsigned gnmr__reduce_default_threads(void);

/* How many helper threads gnmr_reduce_cpu_threads has started (0 before
 * its first reduction that used them, and in a fork's child). */
unsigned gnmr__reduce_helpers(void);

/* A tensor's sum of its blocks' sums times its scale squared (0: 1). */
static inline double gnmr__reduce_scale(const gnmr_tensor *t, double total) {
  return t->scale != 0 ? total * (t->scale * t->scale) : total;
}

/* 0 for the portable kernels, 1 AVX2/F16C, 2 AVX2 with AVX-512 for fp32. */
int gnmr__reduce_simd_level(void);

/* Caps the level (0 forces the portable kernels, 1 AVX2); -1 or a level
 * above the CPU's restores the detection. */
void gnmr__reduce_set_simd(int max_level);

/* Whether any x[i] is negative or NaN where skip is NULL or skip[i] is 0
 * (gnmr_agent_report_sums' check), as many at a time as the level allows.
 * -0 and +inf pass. */
int gnmr__sums_invalid(const double *x, const uint8_t *skip, uint32_t n);

/* Copies n doubles from x to dst (any alignment; the host's byte order,
 * little-endian as the wire's) and, when check, returns whether any is
 * invalid as gnmr__sums_invalid says, in the same pass. */
int gnmr__sums_copy_check(uint8_t *dst, const double *x, const uint8_t *skip,
                          uint32_t n, int check);

#endif /* GNMR_REDUCE_CPU_H */
