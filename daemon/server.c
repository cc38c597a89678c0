/* SPDX-License-Identifier: MIT */
/* server.c — ROUTER socket + uv_poll/uv_idle drain (see server.h). */
#include "server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "gnmr/error.h"

struct server {
  uv_poll_t poll;
  uv_idle_t idle;
  void *sock;
  server_msg_cb on_msg;
  server_bad_cb on_bad;
  void *ctx;
  int closing, open_handles;
};

static int readable(server *s) {
  int ev = 0;
  size_t sz = sizeof ev;
  if (zmq_getsockopt(s->sock, ZMQ_EVENTS, &ev, &sz) != 0)
    return 0;
  return (ev & ZMQ_POLLIN) != 0;
}

/* Receives one whole message (all its frames). */
static void recv_one(server *s) {
  zmq_msg_t id, body, extra;
  int more, frames = 1;
  zmq_msg_init(&id);
  zmq_msg_init(&body);
  if (zmq_msg_recv(&id, s->sock, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&id);
    zmq_msg_close(&body);
    return;
  }
  more = zmq_msg_more(&id);
  if (more) {
    zmq_msg_recv(&body, s->sock, ZMQ_DONTWAIT);
    frames++;
    more = zmq_msg_more(&body);
  }
  while (more) { /* discard any further frames */
    zmq_msg_init(&extra);
    if (zmq_msg_recv(&extra, s->sock, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&extra);
      break;
    }
    frames++;
    more = zmq_msg_more(&extra);
    zmq_msg_close(&extra);
  }
  if (frames == 2)
    s->on_msg(s, zmq_msg_data(&id), zmq_msg_size(&id), zmq_msg_data(&body),
              zmq_msg_size(&body), s->ctx);
  else if (s->on_bad)
    s->on_bad(s, s->ctx);
  zmq_msg_close(&id);
  zmq_msg_close(&body);
}

static void idle_cb(uv_idle_t *h);

static void drain(server *s) {
  for (int i = 0; i < SERVER_DRAIN_CAP && !s->closing; i++) {
    if (!readable(s)) {
      uv_idle_stop(&s->idle);
      return;
    }
    recv_one(s);
  }
  if (!s->closing)
    uv_idle_start(&s->idle, idle_cb);
}

static void idle_cb(uv_idle_t *h) { drain(h->data); }

static void poll_cb(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  drain(h->data);
}

void server_kick(server *s) {
  if (!s->closing)
    uv_idle_start(&s->idle, idle_cb);
}

int server_open(uv_loop_t *loop, void *zctx, const char *endpoint,
                int64_t max_msg, server_msg_cb on_msg, server_bad_cb on_bad,
                void *ctx, char *bound, size_t cap, char *err, size_t errlen,
                server **out) {
  int zero = 0, one = 1, hb_ivl = 1000, hb_tmo = 5000, fd;
  size_t sz = sizeof fd;
  server *s = calloc(1, sizeof *s);
  *out = NULL;
  if (s == NULL)
    return GNMR_E_NOMEM;
  s->on_msg = on_msg;
  s->on_bad = on_bad;
  s->ctx = ctx;
  if ((s->sock = zmq_socket(zctx, ZMQ_ROUTER)) == NULL)
    goto err;
  zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(s->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
  zmq_setsockopt(s->sock, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
  zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
  zmq_setsockopt(s->sock, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl);
  zmq_setsockopt(s->sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_tmo, sizeof hb_tmo);
  if (zmq_bind(s->sock, endpoint) != 0)
    goto err;
  sz = cap;
  if (zmq_getsockopt(s->sock, ZMQ_LAST_ENDPOINT, bound, &sz) != 0)
    snprintf(bound, cap, "%s", endpoint);
  sz = sizeof fd;
  if (zmq_getsockopt(s->sock, ZMQ_FD, &fd, &sz) != 0)
    goto err;
  uv_poll_init(loop, &s->poll, fd);
  uv_idle_init(loop, &s->idle);
  s->poll.data = s->idle.data = s;
  uv_poll_start(&s->poll, UV_READABLE, poll_cb);
  /* Messages may already be queued: the edge may have passed. */
  uv_idle_start(&s->idle, idle_cb);
  *out = s;
  return GNMR_OK;
err:
  snprintf(err, errlen, "%s: %s", endpoint, zmq_strerror(zmq_errno()));
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

static void close_cb(uv_handle_t *h) {
  server *s = h->data;
  if (--s->open_handles == 0)
    free(s);
}

void server_close(server *s) {
  if (s == NULL || s->closing)
    return;
  s->closing = 1;
  uv_poll_stop(&s->poll);
  uv_idle_stop(&s->idle);
  s->open_handles = 2;
  uv_close((uv_handle_t *)&s->poll, close_cb);
  uv_close((uv_handle_t *)&s->idle, close_cb);
  zmq_close(s->sock); /* after the poll stopped; fd no longer watched */
  s->sock = NULL;
}
