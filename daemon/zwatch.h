/* SPDX-License-Identifier: MIT */
/* zwatch.h — any ZeroMQ socket served from the libuv loop. ZMQ_FD is an
 * edge-triggered hint: on each wake-up the socket is drained while
 * ZMQ_EVENTS says POLLIN, at most ZWATCH_DRAIN_CAP messages per pass, the
 * rest continued from a uv_idle so one busy socket cannot starve the loop.
 * After a send from outside a drain, zwatch_kick() re-checks. Loop thread
 * only. The socket stays the caller's; zwatch_close() before zmq_close(). */
#ifndef GNMRD_ZWATCH_H
#define GNMRD_ZWATCH_H

#include <uv.h>

#define ZWATCH_DRAIN_CAP 64

typedef struct zwatch zwatch;

/* Called when the socket has a message: receive exactly one whole message
 * (all its frames) with ZMQ_DONTWAIT. */
typedef void (*zwatch_cb)(void *sock, void *ctx);

/* Starts watching sock. Returns 0 or GNMR_E_IO/GNMR_E_NOMEM; *out is
 * freed by the loop after zwatch_close(). */
int zwatch_start(uv_loop_t *loop, void *sock, zwatch_cb cb, void *ctx,
                 zwatch **out);
void zwatch_kick(zwatch *w);
/* Stops watching; the struct is freed from the handles' close callbacks:
 * run the loop afterwards. NULL-safe. */
void zwatch_close(zwatch **wp);

#endif /* GNMRD_ZWATCH_H */
