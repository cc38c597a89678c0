/* SPDX-License-Identifier: MIT */
/* server.c — ROUTER socket (and its handshake monitor) on zwatch (see
 * server.h). */
#include "server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "gnmr/error.h"
#include "zwatch.h"

/* ZMQ_ZAP_ENFORCE_DOMAIN is declared only under DRAFT in Debian's header,
 * but libzmq 4.3 accepts it: with it, no ZAP handler means no connection. */
#define GNMR_ZMQ_ZAP_ENFORCE_DOMAIN 93

struct server {
  void *sock, *monitor;
  zwatch *w, *mw;
  server_opts o;
};

/* Receives one whole message (all its frames). */
static void on_readable(void *sock, void *ctx) {
  server *s = ctx;
  zmq_msg_t id, body, extra;
  int more, frames = 1;
  zmq_msg_init(&id);
  zmq_msg_init(&body);
  if (zmq_msg_recv(&id, sock, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&id);
    zmq_msg_close(&body);
    return;
  }
  more = zmq_msg_more(&id);
  if (more) {
    zmq_msg_recv(&body, sock, ZMQ_DONTWAIT);
    frames++;
    more = zmq_msg_more(&body);
  }
  while (more) { /* discard any further frames */
    zmq_msg_init(&extra);
    if (zmq_msg_recv(&extra, sock, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&extra);
      break;
    }
    frames++;
    more = zmq_msg_more(&extra);
    zmq_msg_close(&extra);
  }
  if (frames == 2) {
    const char *user = s->o.curve_secret ? zmq_msg_gets(&body, "User-Id")
                                         : NULL;
    s->o.on_msg(s, zmq_msg_data(&id), zmq_msg_size(&id), zmq_msg_data(&body),
                zmq_msg_size(&body), user, s->o.ctx);
  } else if (s->o.on_bad) {
    s->o.on_bad(s, s->o.ctx);
  }
  zmq_msg_close(&id);
  zmq_msg_close(&body);
}

static void refused(server *s, server_refusal why) {
  if (s->o.on_handshake_failed)
    s->o.on_handshake_failed(s, why, s->o.ctx);
}

/* One monitor event: two frames (event id + value, endpoint). A failed
 * handshake carries its reason: a mechanism mismatch (a plaintext peer), a
 * cryptographic error (a CURVE peer that expects another server key), a
 * ZAP refusal (a key not allowed), or anything else: junk, such as bytes
 * that are not ZMTP, or a connection that closed before its handshake
 * ended. ZeroMQ's success events carry no connection, so a connection that
 * says nothing at all and is dropped by ZeroMQ without an event cannot be
 * counted. */
static void on_monitor(void *sock, void *ctx) {
  server *s = ctx;
  zmq_msg_t m;
  uint16_t ev = 0;
  uint32_t value = 0;
  zmq_msg_init(&m);
  if (zmq_msg_recv(&m, sock, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&m);
    return;
  }
  if (zmq_msg_size(&m) >= 6) {
    memcpy(&ev, zmq_msg_data(&m), sizeof ev);
    memcpy(&value, (const char *)zmq_msg_data(&m) + 2, sizeof value);
  }
  while (zmq_msg_more(&m) && zmq_msg_recv(&m, sock, ZMQ_DONTWAIT) >= 0)
    ;
  zmq_msg_close(&m);
  switch (ev) {
  case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
    refused(s, SERVER_REFUSED_CLIENT_KEY);
    break;
  case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
    refused(s, value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
                   ? SERVER_REFUSED_PLAINTEXT
               : value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC ||
                       value ==
                           ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_HELLO
                   ? SERVER_REFUSED_SERVER_KEY
                   : SERVER_REFUSED_JUNK);
    break;
  case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
    refused(s, SERVER_REFUSED_JUNK);
    break;
  default:
    break;
  }
}

int server_open(uv_loop_t *loop, void *zctx, const server_opts *o,
                char *bound, size_t cap, char *err, size_t errlen,
                server **out) {
  int zero = 0, one = 1, hb_ivl = 1000, hb_tmo = 5000;
  int64_t max_msg = o->max_msg;
  size_t sz;
  char mon[64];
  server *s = calloc(1, sizeof *s);
  *out = NULL;
  if (s == NULL)
    return GNMR_E_NOMEM;
  s->o = *o;
  if ((s->sock = zmq_socket(zctx, ZMQ_ROUTER)) == NULL)
    goto err;
  zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(s->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
  zmq_setsockopt(s->sock, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
  zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
  zmq_setsockopt(s->sock, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl);
  zmq_setsockopt(s->sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_tmo, sizeof hb_tmo);
  if (o->curve_secret != NULL &&
      (zmq_setsockopt(s->sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
       zmq_setsockopt(s->sock, ZMQ_CURVE_SECRETKEY, o->curve_secret, 41) !=
           0 ||
       zmq_setsockopt(s->sock, ZMQ_ZAP_DOMAIN, "gnmr", 4) != 0 ||
       zmq_setsockopt(s->sock, GNMR_ZMQ_ZAP_ENFORCE_DOMAIN, &one,
                      sizeof one) != 0))
    goto err;
  snprintf(mon, sizeof mon, "inproc://gnmrd-monitor-%p", (void *)s);
  if (zmq_socket_monitor(s->sock, mon,
                         ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0 ||
      (s->monitor = zmq_socket(zctx, ZMQ_PAIR)) == NULL)
    goto err;
  zmq_setsockopt(s->monitor, ZMQ_LINGER, &zero, sizeof zero);
  if (zmq_connect(s->monitor, mon) != 0 || zmq_bind(s->sock, o->endpoint) != 0)
    goto err;
  sz = cap;
  if (zmq_getsockopt(s->sock, ZMQ_LAST_ENDPOINT, bound, &sz) != 0)
    snprintf(bound, cap, "%s", o->endpoint);
  if (zwatch_start(loop, s->sock, on_readable, s, &s->w) != GNMR_OK ||
      zwatch_start(loop, s->monitor, on_monitor, s, &s->mw) != GNMR_OK)
    goto err;
  *out = s;
  return GNMR_OK;
err:
  snprintf(err, errlen, "%s: %s", o->endpoint, zmq_strerror(zmq_errno()));
  zwatch_close(s->w);
  zwatch_close(s->mw);
  if (s->monitor)
    zmq_close(s->monitor);
  if (s->sock)
    zmq_close(s->sock);
  free(s);
  return GNMR_E_IO;
}

int server_send(server *s, const void *id, size_t id_len, const void *data,
                size_t len) {
  if (zmq_send(s->sock, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
    return zmq_errno() == EAGAIN ? GNMR_E_BUSY : GNMR_E_CLOSED;
  if (zmq_send(s->sock, data, len, ZMQ_DONTWAIT) < 0)
    return zmq_errno() == EAGAIN ? GNMR_E_BUSY : GNMR_E_CLOSED;
  return GNMR_OK;
}

void server_kick(server *s) {
  if (s != NULL)
    zwatch_kick(s->w);
}

void server_close(server *s) {
  if (s == NULL)
    return;
  zwatch_close(s->w);
  zwatch_close(s->mw);
  zmq_close(s->monitor); /* after their polls stopped */
  zmq_close(s->sock);
  free(s);
}
