/* SPDX-License-Identifier: MIT */
/* server.h — a ZeroMQ ROUTER socket served from the libuv loop. ZMQ_FD is
 * an edge-triggered hint: on each wake-up the socket is drained while
 * ZMQ_EVENTS says POLLIN, at most SERVER_DRAIN_CAP messages per pass, the
 * rest continued from a uv_idle so one busy socket cannot starve the loop.
 * After sends, server_kick() re-checks the socket. Loop thread only. */
#ifndef GNMRD_SERVER_H
#define GNMRD_SERVER_H

#include <stddef.h>
#include <uv.h>

#define SERVER_DRAIN_CAP 64

typedef struct server server;

/* Called for each well-formed [identity][payload] message. */
typedef void (*server_msg_cb)(server *s, const void *id, size_t id_len,
                              const void *data, size_t len, void *ctx);
/* Called for each message that is not two frames (already discarded). */
typedef void (*server_bad_cb)(server *s, void *ctx);

/* Binds a ROUTER socket (LINGER 0, ROUTER_MANDATORY, ROUTER_HANDOVER,
 * MAXMSGSIZE max_msg, heartbeats) to endpoint and watches it on loop.
 * The endpoint actually bound (wildcard port resolved) is copied to
 * bound (cap bytes). Returns 0 or GNMR_E_IO with errno-like detail in
 * err. On success *out is owned by the caller: server_close(). */
int server_open(uv_loop_t *loop, void *zctx, const char *endpoint,
                int64_t max_msg, server_msg_cb on_msg, server_bad_cb on_bad,
                void *ctx, char *bound, size_t cap, char *err, size_t errlen,
                server **out);

/* Sends [id][data] without blocking. Returns 0, or GNMR_E_CLOSED when the
 * peer is gone, GNMR_E_BUSY when its queue is full. */
int server_send(server *s, const void *id, size_t id_len, const void *data,
                size_t len);

/* Schedules a drain pass (call after sends from outside a drain). */
void server_kick(server *s);

/* Stops watching, closes the handles and then the socket. The struct is
 * freed from the handles' close callbacks: run the loop afterwards. */
void server_close(server *s);

#endif /* GNMRD_SERVER_H */
