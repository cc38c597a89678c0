/* SPDX-License-Identifier: MIT */
/* latency.h — gnmrd's latency histograms (decisions, store commits): one
 * table of bucket bounds, used to count and to print them (metrics.c). */
#ifndef GNMRD_LATENCY_H
#define GNMRD_LATENCY_H

#include <stdint.h>

/* Upper bounds of the buckets, in seconds (Prometheus' "le"). */
#define LATENCY_BUCKETS(XX)                                                  \
  XX(0.0001) XX(0.00025) XX(0.0005) XX(0.001) XX(0.0025) XX(0.005) XX(0.01)  \
  XX(0.025) XX(0.05) XX(0.1) XX(0.25) XX(0.5) XX(1) XX(2.5) XX(5)

#define LATENCY__COUNT(le) +1
#define LATENCY_N_BUCKETS (0 LATENCY_BUCKETS(LATENCY__COUNT))

static const double latency_le[LATENCY_N_BUCKETS] = {
#define LATENCY__LE(le) le,
    LATENCY_BUCKETS(LATENCY__LE)
#undef LATENCY__LE
};

/* The bucket of a duration; LATENCY_N_BUCKETS when above the last bound
 * (counted only in the total, Prometheus' +Inf). */
static inline int latency_bucket(double seconds) {
  int i = 0;
  while (i < LATENCY_N_BUCKETS && seconds > latency_le[i])
    i++;
  return i;
}

/* A histogram owned by one thread. */
typedef struct latency_hist {
  uint64_t buckets[LATENCY_N_BUCKETS];
  uint64_t count;
  double sum;
} latency_hist;

static inline void latency_observe(latency_hist *h, double seconds) {
  int i = latency_bucket(seconds);
  if (i < LATENCY_N_BUCKETS)
    h->buckets[i]++;
  h->count++;
  h->sum += seconds;
}

#endif /* GNMRD_LATENCY_H */
