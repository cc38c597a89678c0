/* SPDX-License-Identifier: MIT */
/* synth.h — gnmr-sim's synthetic traces and shard sums. */
#ifndef GNMR_SIM_SYNTH_H
#define GNMR_SIM_SYNTH_H

#include <stdint.h>

#include "trace.h"

/* Splits n*n over k partials so that summing them in order and taking the
 * square root gives exactly n (the last partial is nudged by ulps). */
void sim_split_norm(double n, uint32_t k, double *parts);
/* A synthetic trace of units x steps (seeded), made a step at a time. */
typedef struct sim_synth {
  uint32_t units;
  uint64_t steps, step; /* step: the last one made */
  unsigned seed;        /* rand_r's state */
  double *scale, *spike_mag;
  uint32_t *spike_left;
} sim_synth;
/* 0, or -1 out of memory (g then needs no close). */
int sim_synth_open(sim_synth *g, uint32_t units, uint64_t steps,
                   unsigned seed);
/* The next step's norms, norm[u] for every unit (0: idle). */
void sim_synth_step(sim_synth *g, double *norm);
/* Frees what g holds (g may be zeroed or cleared already). */
void sim_synth_clear(sim_synth *g);
/* Writes the trace sim_synth_open(units, steps, seed) makes as a
 * step,unit,norm CSV; 0 or -1 (errno set). */
int sim_synth_write(const char *path, uint32_t units, uint64_t steps,
                    unsigned seed);
/* Writes t as a step,unit,norm CSV; 0 or -1. */
int sim_write_trace(const char *path, const trace *t);

#endif /* GNMR_SIM_SYNTH_H */
