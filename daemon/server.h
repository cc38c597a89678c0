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
  SERVER_REFUSED_CONNECTIONS,/* past the connection cap (or no descriptor
                                left to accept it) */
  SERVER_REFUSED_IDLE,       /* no whole message within first_msg_ms of
                                being accepted: closed, its place freed */
  SERVER_REFUSED_KEY_PLACES, /* its key holds key_max places already, or
                                the places left are reserved */
} server_refusal;

/* Called for each refused connection (may be NULL). */
typedef void (*server_fail_cb)(server *s, server_refusal why, void *ctx);
/* Called for a message from a connection past the cap, instead of
 * server_msg_cb: answer it (server_send) with why it is refused; the
 * connection is closed SERVER_FLUSH_MS later. May be NULL. */
typedef void (*server_cap_cb)(server *s, const void *id, size_t id_len,
                              uint32_t max_conns, void *ctx);

typedef struct server_opts {
  const char *endpoint;
  int64_t max_msg;
  const char *curve_secret; /* Z85 server secret key, or NULL: no CURVE */
  server_msg_cb on_msg;
  server_bad_cb on_bad;
  server_fail_cb on_handshake_failed;
  void *ctx;
  /* The connection cap: at most max_conns connections at once (0: none).
   * ZeroMQ gives no way to refuse one before it is accepted, so one past
   * the cap is accepted, counted (SERVER_REFUSED_CONNECTIONS), given
   * SERVER_GRACE_MS to say something, answered through on_over_cap, and
   * then closed under ZeroMQ (shutdown(2) on its descriptor, which ZeroMQ
   * reports through the socket monitor). Past SERVER_POLITE_MAX such
   * connections waiting at once (a flood), more are closed at once. */
  uint32_t max_conns;
  server_cap_cb on_over_cap;
  /* A connection that has sent no whole message first_msg_ms after it was
   * accepted (a peer that holds a place and says nothing, or trickles one
   * huge message) is closed and counted (SERVER_REFUSED_IDLE); 0: never.
   * Agents send Hello and gnmrctl its request as soon as they connect. */
  uint32_t first_msg_ms;
  /* Messages queued for one connection that is not reading them (ZeroMQ's
   * SNDHWM); past it server_send says GNMR_E_BUSY and the message is not
   * sent. 0: ZeroMQ's default (1000). */
  int sndhwm;
  /* Called when a connection goes (its descriptor, as server_msg_fd gave
   * for its messages). May be NULL. */
  void (*on_gone)(server *s, int fd, void *ctx);
  /* Places per key (CURVE): a key that privileged() does not name may
   * hold at most key_max connections that have spoken, and such keys
   * together at most max_conns - reserve; the other places are kept for
   * privileged keys (operators). A connection whose first message is past
   * that is answered through on_key_cap, counted
   * (SERVER_REFUSED_KEY_PLACES) and closed SERVER_FLUSH_MS later. key_max
   * 0: no places per key. */
  uint32_t key_max, reserve;
  int (*privileged)(const char *user, void *ctx);
  void (*on_key_cap)(server *s, const void *id, size_t id_len,
                     uint32_t key_max, void *ctx);
} server_opts;

#define SERVER_GRACE_MS 1000
#define SERVER_FLUSH_MS 200
#define SERVER_POLITE_MAX 32

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

/* Sends [id][data] without blocking, handing data (malloc'd, len bytes)
 * to ZeroMQ: it calls freed(data, hint) once it has written the bytes or
 * dropped them (the peer gone), on its I/O thread, or at once here when
 * the send fails. Returns as server_send. */
int server_send_owned(server *s, const void *id, size_t id_len, void *data,
                      size_t len, void (*freed)(void *data, void *hint),
                      void *hint);

/* Connections open now (accepted and not yet gone). */
/* The descriptor of the connection whose message on_msg is given (valid
 * in on_msg; -1 when ZeroMQ does not say). */
int server_msg_fd(const server *s);
/* The address group of the peer whose message on_msg is given (valid in
 * on_msg): its IP address over TCP, "localhost:UID:GID" over IPC; NULL
 * when ZeroMQ does not say. What shares places fairly without tenancy
 * (dispatch.c, reopen.c). */
const char *server_msg_group(const server *s);
/* Whether the connection on descriptor fd is still there (the monitor's
 * events read first). */
int server_fd_live(server *s, int fd);

uint32_t server_connections(const server *s);

/* Schedules a drain pass (call after sends from outside a drain). */
void server_kick(server *s);

/* Stops watching and closes the sockets; memory goes with the loop's close
 * callbacks: run the loop afterwards. NULL-safe. */
void server_close(server **sp);

#endif /* GNMRD_SERVER_H */
