/* SPDX-License-Identifier: MIT */
/* reduce_cpu.h — internals of the CPU backend shared with tests and
 * benchmarks: which kernel set runs, and a switch to force the portable
 * one (so that both are tested on machines with AVX2). */
#ifndef GNMR_REDUCE_CPU_H
#define GNMR_REDUCE_CPU_H

/* 1 when the AVX2/F16C kernels run, 0 for the portable ones. */
int gnmr__reduce_simd_level(void);

/* on = 0 forces the portable kernels; on = 1 restores the detection. */
void gnmr__reduce_set_simd(int on);

#endif /* GNMR_REDUCE_CPU_H */
