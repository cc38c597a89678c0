/* SPDX-License-Identifier: MIT */
/* synth.c — gnmr-sim's synthetic traces (synth.h). */
#include "synth.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Splits n*n over k partials so that summing them in order and taking the
 * square root gives exactly n (the last partial is nudged by ulps). */
void sim_split_norm(double n, uint32_t k, double *parts) {
  double sq = n * n, acc = 0;
  for (uint32_t j = 0; j + 1 < k; j++) {
    parts[j] = sq / k;
    acc += parts[j];
  }
  double last = sq - acc;
  if (last < 0)
    last = 0;
  for (int tries = 0; tries < 200; tries++) {
    double root = sqrt(acc + last);
    if (root == n)
      break;
    last = nextafter(last, root < n ? INFINITY : 0);
  }
  parts[k - 1] = last;
}

/* A synthetic trace: per-unit scales over four decades, +-10% noise,
 * transient spikes (1-3 steps, 4-20x) starting in about 0.2% of
 * unit-steps, a burst at two thirds of the run where a quarter of the
 * units spike together for two steps (the budget saturates), and a few
 * idle steps. Made a step at a time, so that a simulator holds one
 * step's norms, not the run's (a node of a 1,024-rank job would hold
 * units x steps rows otherwise). */
int sim_synth_open(sim_synth *g, uint32_t units, uint64_t steps,
                   unsigned seed) {
  *g = (sim_synth){.units = units, .steps = steps, .seed = seed};
  g->scale = malloc((units ? units : 1) * sizeof *g->scale);
  g->spike_left = calloc(units ? units : 1, sizeof *g->spike_left);
  g->spike_mag = calloc(units ? units : 1, sizeof *g->spike_mag);
  if (!g->scale || !g->spike_left || !g->spike_mag) {
    sim_synth_clear(g);
    return -1;
  }
  for (uint32_t u = 0; u < units; u++)
    g->scale[u] = pow(10, (rand_r(&g->seed) % 4000) / 1000.0 - 2);
  return 0;
}

void sim_synth_step(sim_synth *g, double *norm) {
  uint64_t s = ++g->step, burst = g->steps * 2 / 3;
  for (uint32_t u = 0; u < g->units; u++) {
    double x = g->scale[u] * (0.9 + 0.2 * (rand_r(&g->seed) % 1000) / 1000.0);
    if (s == burst && burst > 25 && u % 4 == 1) {
      g->spike_left[u] = 2;
      g->spike_mag[u] = 6 + (rand_r(&g->seed) % 1000) / 100.0;
    }
    if (g->spike_left[u] == 0 && s > 25 && rand_r(&g->seed) % 1000 < 2) {
      g->spike_left[u] = 1 + (uint32_t)(rand_r(&g->seed) % 3);
      g->spike_mag[u] = 4 + (rand_r(&g->seed) % 1600) / 100.0;
    }
    if (g->spike_left[u] > 0) {
      x *= g->spike_mag[u];
      g->spike_left[u]--;
    } else if (rand_r(&g->seed) % 1000 < 2) {
      x = 0; /* idle */
    }
    norm[u] = x;
  }
}

void sim_synth_clear(sim_synth *g) {
  free(g->scale);
  free(g->spike_left);
  free(g->spike_mag);
  g->scale = g->spike_mag = NULL;
  g->spike_left = NULL;
}

int sim_synth_write(const char *path, uint32_t units, uint64_t steps,
                    unsigned seed) {
  sim_synth g;
  double *norm = malloc((units ? units : 1) * sizeof *norm);
  if (norm == NULL || sim_synth_open(&g, units, steps, seed) != 0) {
    free(norm);
    errno = ENOMEM;
    return -1;
  }
  FILE *f = fopen(path, "w");
  if (f != NULL) {
    fputs("step,unit,norm\n", f);
    for (uint64_t s = 1; s <= steps; s++) {
      sim_synth_step(&g, norm);
      for (uint32_t u = 0; u < units; u++)
        fprintf(f, "%llu,%u,%.17g\n", (unsigned long long)s, u, norm[u]);
    }
  }
  sim_synth_clear(&g);
  free(norm);
  return f == NULL ? -1 : fclose(f);
}

int sim_write_trace(const char *path, const trace *t) {
  FILE *f = fopen(path, "w");
  if (f == NULL)
    return -1;
  fputs("step,unit,norm\n", f);
  for (size_t i = 0; i < t->n_rows; i++)
    fprintf(f, "%llu,%u,%.17g\n", (unsigned long long)t->rows[i].step,
            t->rows[i].unit, t->rows[i].norm);
  return fclose(f);
}

