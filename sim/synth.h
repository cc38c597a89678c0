/* SPDX-License-Identifier: MIT */
/* synth.h — gnmr-sim's synthetic traces and shard sums. */
#ifndef GNMR_SIM_SYNTH_H
#define GNMR_SIM_SYNTH_H

#include <stdint.h>

#include "trace.h"

/* Splits n*n over k partials so that summing them in order and taking the
 * square root gives exactly n (the last partial is nudged by ulps). */
void sim_split_norm(double n, uint32_t k, double *parts);
/* Fills t with a synthetic trace of units x steps (seeded); 0 or -1. */
int sim_synth(trace *t, uint32_t units, uint64_t steps, unsigned seed);
/* Writes t as a step,unit,norm CSV; 0 or -1. */
int sim_write_trace(const char *path, const trace *t);

#endif /* GNMR_SIM_SYNTH_H */
