/* SPDX-License-Identifier: MIT */
/* server.h — a ZeroMQ ROUTER socket served from the libuv loop (through
 * zwatch), optionally with CURVE: then a ZAP handler (zap.c) must be bound
 * in the same context first, and ZAP is enforced, so a peer whose key it
 * does not allow never connects. Handshake failures (plaintext peers,
 * wrong server key, refused key, junk) are reported through a socket
 * monitor, by kind.
 * Loop thread only. */
#ifndef GNMRD_SERVER_H
#define GNMRD_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct server server;

/* Called for each well-formed [identity][payload] message; user is the
 * authenticated key's User-Id under CURVE, else NULL. */
typedef void (*server_msg_cb)(server *s, const void *id, size_t id_len,
                              const void *data, size_t len, const char *user,
                              void *ctx);
/* Called for each message that is not two frames (already discarded). */
typedef void (*server_bad_cb)(server *s, void *ctx);
/* Why a connection was refused before it could send a message. */
typedef enum server_refusal {
  SERVER_REFUSED_PLAINTEXT,  /* no CURVE on a CURVE socket (or the reverse) */
  SERVER_REFUSED_SERVER_KEY, /* a CURVE peer that expects another server key */
  SERVER_REFUSED_CLIENT_KEY, /* a CURVE key the allow list does not hold */
  SERVER_REFUSED_JUNK,       /* any other handshake failure: not ZMTP, or
                                gone before its handshake ended */
} server_refusal;

/* Called for each refused connection (may be NULL). */
typedef void (*server_fail_cb)(server *s, server_refusal why, void *ctx);

typedef struct server_opts {
  const char *endpoint;
  int64_t max_msg;
  const char *curve_secret; /* Z85 server secret key, or NULL: no CURVE */
  server_msg_cb on_msg;
  server_bad_cb on_bad;
  server_fail_cb on_handshake_failed;
  void *ctx;
} server_opts;

/* Binds a ROUTER socket (LINGER 0, ROUTER_MANDATORY, ROUTER_HANDOVER,
 * MAXMSGSIZE, heartbeats) and watches it on loop. The endpoint actually
 * bound (wildcard port resolved) goes to bound. Returns 0 or GNMR_E_IO
 * with a message in err; on success *out is the caller's: server_close(). */
int server_open(uv_loop_t *loop, void *zctx, const server_opts *o,
                char *bound, size_t cap, char *err, size_t errlen,
                server **out);

/* Sends [id][data] without blocking. Returns 0, or GNMR_E_CLOSED when the
 * peer is gone, GNMR_E_BUSY when its queue is full. */
int server_send(server *s, const void *id, size_t id_len, const void *data,
                size_t len);

/* Schedules a drain pass (call after sends from outside a drain). */
void server_kick(server *s);

/* Stops watching and closes the sockets; memory goes with the loop's close
 * callbacks: run the loop afterwards. NULL-safe. */
void server_close(server *s);

#endif /* GNMRD_SERVER_H */
