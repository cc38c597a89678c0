/* SPDX-License-Identifier: MIT */
/* zwatch.c — uv_poll on ZMQ_FD + uv_idle continuation (see zwatch.h). */
#include "zwatch.h"

#include <stdlib.h>
#include <zmq.h>

#include "gnmr/error.h"

struct zwatch {
  uv_poll_t poll;
  uv_idle_t idle;
  void *sock;
  zwatch_cb cb;
  void *ctx;
  int closing, open_handles;
};

static int readable(zwatch *w) {
  int ev = 0;
  size_t sz = sizeof ev;
  if (zmq_getsockopt(w->sock, ZMQ_EVENTS, &ev, &sz) != 0)
    return 0;
  return (ev & ZMQ_POLLIN) != 0;
}

static void idle_cb(uv_idle_t *h);

static void drain(zwatch *w) {
  for (int i = 0; i < ZWATCH_DRAIN_CAP && !w->closing; i++) {
    if (!readable(w)) {
      uv_idle_stop(&w->idle);
      return;
    }
    w->cb(w->sock, w->ctx);
  }
  if (!w->closing)
    uv_idle_start(&w->idle, idle_cb);
}

static void idle_cb(uv_idle_t *h) { drain(h->data); }

static void poll_cb(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  drain(h->data);
}

int zwatch_start(uv_loop_t *loop, void *sock, zwatch_cb cb, void *ctx,
                 zwatch **out) {
  int fd;
  size_t sz = sizeof fd;
  zwatch *w;
  *out = NULL;
  if (zmq_getsockopt(sock, ZMQ_FD, &fd, &sz) != 0)
    return GNMR_E_IO;
  if ((w = calloc(1, sizeof *w)) == NULL)
    return GNMR_E_NOMEM;
  w->sock = sock;
  w->cb = cb;
  w->ctx = ctx;
  uv_poll_init(loop, &w->poll, fd);
  uv_idle_init(loop, &w->idle);
  w->poll.data = w->idle.data = w;
  uv_poll_start(&w->poll, UV_READABLE, poll_cb);
  uv_idle_start(&w->idle, idle_cb); /* the edge may have passed already */
  *out = w;
  return GNMR_OK;
}

void zwatch_kick(zwatch *w) {
  if (w != NULL && !w->closing)
    uv_idle_start(&w->idle, idle_cb);
}

static void close_cb(uv_handle_t *h) {
  zwatch *w = h->data;
  if (--w->open_handles == 0)
    free(w);
}

void zwatch_close(zwatch **wp) {
  zwatch *w = *wp;
  if (w == NULL)
    return;
  *wp = NULL;
  if (w->closing)
    return;
  w->closing = 1;
  uv_poll_stop(&w->poll);
  uv_idle_stop(&w->idle);
  w->open_handles = 2;
  uv_close((uv_handle_t *)&w->poll, close_cb);
  uv_close((uv_handle_t *)&w->idle, close_cb);
}
