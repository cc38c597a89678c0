/* SPDX-License-Identifier: MIT */
/* metrics.h — gnmrd's Prometheus endpoint: GET /metrics over HTTP
 * (libmicrohttpd with an external epoll, driven by the libuv loop, so the
 * handler runs on the loop thread and reads the counters directly). */
#ifndef GNMRD_METRICS_H
#define GNMRD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "gnmrd.h"

/* Decision-latency histogram buckets, in seconds. */
#define METRICS_LATENCY_BUCKETS                                             \
  {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,   \
   0.25, 0.5, 1, 2.5, 5}
#define METRICS_N_BUCKETS GNMRD_LAT_BUCKETS

/* Starts serving on addr ("HOST:PORT", port 0 = any); the bound address
 * goes to bound ("http://HOST:PORT/metrics"). 0 or GNMR_E_IO/INVAL. */
int metrics_open(gnmrd *d, const char *addr, char *bound, size_t cap,
                 char *err, size_t errlen);
/* Stops serving and closes the loop handles (no-op when not started);
 * metrics_free() after the loop has run their close callbacks. */
void metrics_close(gnmrd *d);
void metrics_free(gnmrd *d);

/* Records one decision's latency (first report to decision). */
void metrics_observe_decision(gnmrd *d, double seconds);

#endif /* GNMRD_METRICS_H */
