/* SPDX-License-Identifier: MIT */
/* reduce_cpu.h — internals of the CPU backend shared with tests and
 * benchmarks: which kernel set runs, and a switch to force the portable
 * one (so that both are tested on machines with AVX2). */
#ifndef GNMR_REDUCE_CPU_H
#define GNMR_REDUCE_CPU_H

#include <stdint.h>

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
