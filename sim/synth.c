/* SPDX-License-Identifier: MIT */
/* synth.c — gnmr-sim's synthetic traces (synth.h). */
#include "synth.h"

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
 * idle steps. */
int sim_synth(trace *t, uint32_t units, uint64_t steps, unsigned seed) {
  size_t n = (size_t)units * steps;
  t->rows = calloc(n, sizeof *t->rows);
  if (t->rows == NULL)
    return -1;
  double *scale = malloc(units * sizeof *scale);
  uint32_t *spike_left = calloc(units, sizeof *spike_left);
  double *spike_mag = calloc(units, sizeof *spike_mag);
  if (!scale || !spike_left || !spike_mag) {
    free(scale);
    free(spike_left);
    free(spike_mag);
    return -1;
  }
  for (uint32_t u = 0; u < units; u++)
    scale[u] = pow(10, (rand_r(&seed) % 4000) / 1000.0 - 2);
  size_t k = 0;
  uint64_t burst = steps * 2 / 3;
  for (uint64_t s = 1; s <= steps; s++) {
    for (uint32_t u = 0; u < units; u++) {
      double x = scale[u] * (0.9 + 0.2 * (rand_r(&seed) % 1000) / 1000.0);
      if (s == burst && burst > 25 && u % 4 == 1) {
        spike_left[u] = 2;
        spike_mag[u] = 6 + (rand_r(&seed) % 1000) / 100.0;
      }
      if (spike_left[u] == 0 && s > 25 && rand_r(&seed) % 1000 < 2) {
        spike_left[u] = 1 + (uint32_t)(rand_r(&seed) % 3);
        spike_mag[u] = 4 + (rand_r(&seed) % 1600) / 100.0;
      }
      if (spike_left[u] > 0) {
        x *= spike_mag[u];
        spike_left[u]--;
      } else if (rand_r(&seed) % 1000 < 2) {
        x = 0; /* idle */
      }
      t->rows[k++] = (trace_row){.step = s, .norm = x, .measure = NAN,
                                 .unit = u, .line = 0};
    }
  }
  t->n_rows = k;
  t->first_step = 1;
  t->last_step = steps;
  t->n_units = units;
  free(scale);
  free(spike_left);
  free(spike_mag);
  return 0;
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

