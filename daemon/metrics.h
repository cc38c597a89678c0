/* SPDX-License-Identifier: MIT */
/* metrics.h — gnmrd's Prometheus endpoint: GET /metrics over HTTP
 * (libmicrohttpd with an external epoll, driven by the libuv loop, so the
 * handler runs on the loop thread and reads the counters directly). */
#ifndef GNMRD_METRICS_H
#define GNMRD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "gnmrd.h"

struct sockaddr_in;
/* Parses "HOST:PORT" (HOST an IPv4 address, PORT 0..65535) as
 * metrics_open() will: --check-config says valid only for what starts. */
int metrics_addr_parse(const char *addr, struct sockaddr_in *sa,
                       char *err, size_t errlen);
/* Starts serving on addr ("HOST:PORT", port 0 = any); the bound address
 * goes to bound ("http://HOST:PORT/metrics"). 0 or GNMR_E_IO/INVAL. */
int metrics_open(gnmrd *d, const char *addr, char *bound, size_t cap,
                 char *err, size_t errlen);
/* Stops serving and closes the loop handles (no-op when not started);
 * metrics_clear() after the loop has run their close callbacks. */
void metrics_stop(gnmrd *d);
void metrics_clear(gnmrd *d);

#endif /* GNMRD_METRICS_H */
