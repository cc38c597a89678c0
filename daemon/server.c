/* SPDX-License-Identifier: MIT */
/* server.c — ROUTER socket (and its handshake monitor) on zwatch (see
 * server.h). */
#include "server.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <zmq.h>

#include "gnmr/error.h"
#include "hmap.h"
#include "zwatch.h"

/* ZMQ_ZAP_ENFORCE_DOMAIN is declared only under DRAFT in Debian's header,
 * but libzmq 4.3 accepts it: with it, no ZAP handler means no connection. */
#define GNMR_ZMQ_ZAP_ENFORCE_DOMAIN 93

/* A connection past the cap, closed at its deadline. */
typedef struct over_conn {
  int fd;
  uint64_t deadline; /* the loop's ms */
} over_conn;

struct server {
  void *sock, *monitor;
  zwatch *w, *mw;
  server_opts o;
  uv_loop_t *loop;
  uint32_t live;      /* accepted, not yet disconnected */
  over_conn *over;    /* connections past the cap, until closed */
  size_t n_over, cap_over;
  uv_timer_t *timer;  /* closes them; its own allocation (see close) */
  /* accepted connections that have not yet sent a whole message: the
   * deadline (loop ms) by descriptor, 0 for none */
  uint64_t *first_by_fd;
  size_t cap_first, n_first;
  int msg_fd; /* the connection of the message on_msg has */
  char msg_group[64]; /* its peer's address group (server_msg_group) */
  /* the connection of the message on_readable holds while it drains the
   * monitor: it spoke, so evict_idle must not take it (-1: none) */
  int spoke_fd;
  /* descriptors of connections accepted and not yet gone */
  uint8_t *live_by_fd;
  size_t cap_live;
  /* places per key: the key of each connection that has spoken (by
   * descriptor), how many each key holds, and how many are held by keys
   * that are not privileged */
  struct key_place *key_by_fd;
  size_t cap_key;
  hmap key_count;
  uint32_t n_plain;
};

typedef struct key_place {
  char *key; /* NULL: none registered */
  int privileged;
} key_place;

static void on_monitor(void *sock, void *ctx);

static void live_set(server *s, int fd, uint8_t on) {
  if (fd < 0)
    return;
  if ((size_t)fd >= s->cap_live) {
    if (!on)
      return;
    size_t cap = s->cap_live ? s->cap_live : 64;
    while (cap <= (size_t)fd)
      cap *= 2;
    uint8_t *l = realloc(s->live_by_fd, cap);
    if (l == NULL)
      return;
    memset(l + s->cap_live, 0, cap - s->cap_live);
    s->live_by_fd = l;
    s->cap_live = cap;
  }
  s->live_by_fd[fd] = on;
}

/* A connection that is gone gives back its key's place. */
static void key_forget(server *s, int fd) {
  if (fd < 0 || (size_t)fd >= s->cap_key || s->key_by_fd[fd].key == NULL)
    return;
  key_place *p = &s->key_by_fd[fd];
  uint64_t n = 0;
  size_t len = strlen(p->key);
  if (hmap_get(&s->key_count, p->key, len, &n) && n > 1)
    hmap_put(&s->key_count, p->key, len, n - 1);
  else
    hmap_del(&s->key_count, p->key, len);
  if (!p->privileged && s->n_plain > 0)
    s->n_plain--;
  free(p->key);
  p->key = NULL;
}

/* Whether the connection on fd, speaking as key, may have a place: once
 * admitted it keeps it until it goes. */
static int key_admit(server *s, int fd, const char *key) {
  if (fd < 0)
    return 1;
  if ((size_t)fd >= s->cap_key) {
    size_t cap = s->cap_key ? s->cap_key : 64;
    while (cap <= (size_t)fd)
      cap *= 2;
    key_place *k = realloc(s->key_by_fd, cap * sizeof *k);
    if (k == NULL)
      return 1; /* not counted: the cap still bounds it */
    memset(k + s->cap_key, 0, (cap - s->cap_key) * sizeof *k);
    s->key_by_fd = k;
    s->cap_key = cap;
  }
  key_place *p = &s->key_by_fd[fd];
  if (p->key != NULL)
    return 1;
  size_t len = strlen(key);
  uint64_t n = 0;
  hmap_get(&s->key_count, key, len, &n);
  int priv = s->o.privileged != NULL && s->o.privileged(key, s->o.ctx);
  uint32_t plain_max = s->o.max_conns > s->o.reserve
                           ? s->o.max_conns - s->o.reserve
                           : 0;
  if (!priv && (n >= s->o.key_max || s->n_plain >= plain_max))
    return 0;
  if ((p->key = strdup(key)) == NULL ||
      hmap_put(&s->key_count, key, len, n + 1) != GNMR_OK) {
    free(p->key);
    p->key = NULL;
    return 1;
  }
  p->privileged = priv;
  if (!priv)
    s->n_plain++;
  return 1;
}

int server_fd_live(server *s, int fd) {
  on_monitor(s->monitor, s); /* current: a DISCONNECTED may be waiting */
  return fd >= 0 && (size_t)fd < s->cap_live && s->live_by_fd[fd];
}

static void refused(server *s, server_refusal why);
static void peer_group(const char *addr, char *out, size_t size);

static over_conn *over_find(server *s, int fd) {
  for (size_t i = 0; i < s->n_over; i++)
    if (s->over[i].fd == fd)
      return &s->over[i];
  return NULL;
}

static void over_del(server *s, over_conn *c) {
  *c = s->over[--s->n_over];
}

/* Closes the connections past the cap whose time is up. The monitor is
 * drained first, so that a descriptor ZeroMQ has closed (and the system
 * may have reused) is forgotten before anything is shut down. */
static void on_over_timer(uv_timer_t *t) {
  server *s = t->data;
  if (s == NULL)
    return;
  on_monitor(s->monitor, s);
  uint64_t now = uv_now(s->loop);
  for (size_t i = 0; i < s->n_over;) {
    if (s->over[i].deadline <= now) {
      shutdown(s->over[i].fd, SHUT_RDWR);
      over_del(s, &s->over[i]);
    } else {
      i++;
    }
  }
  for (size_t fd = 0; s->n_first > 0 && fd < s->cap_first; fd++)
    if (s->first_by_fd[fd] != 0 && s->first_by_fd[fd] <= now) {
      s->first_by_fd[fd] = 0;
      s->n_first--;
      shutdown((int)fd, SHUT_RDWR);
      refused(s, SERVER_REFUSED_IDLE);
    }
  if (s->n_over == 0 && s->n_first == 0)
    uv_timer_stop(t);
}

/* A connection accepted within the cap: it has first_msg_ms to speak. */
static void first_add(server *s, int fd) {
  if (s->o.first_msg_ms == 0 || fd < 0)
    return;
  if ((size_t)fd >= s->cap_first) {
    size_t cap = s->cap_first ? s->cap_first : 64;
    while (cap <= (size_t)fd)
      cap *= 2;
    uint64_t *f = realloc(s->first_by_fd, cap * sizeof *f);
    if (f == NULL)
      return; /* not watched: the cap still bounds it */
    memset(f + s->cap_first, 0, (cap - s->cap_first) * sizeof *f);
    s->first_by_fd = f;
    s->cap_first = cap;
  }
  if (s->first_by_fd[fd] == 0)
    s->n_first++;
  s->first_by_fd[fd] = uv_now(s->loop) + s->o.first_msg_ms;
  if (s->timer != NULL && !uv_is_active((uv_handle_t *)s->timer))
    uv_timer_start(s->timer, on_over_timer, 50, 50);
}

/* At the cap, a new connection takes the place of the oldest one that has
 * not yet said anything (closed, counted as idle): connections that never
 * speak cannot keep one that does (an operator's gnmrctl) out, however
 * fast they come back. Returns whether one was closed. */
static int evict_idle(server *s) {
  size_t oldest = SIZE_MAX;
  for (size_t fd = 0; s->n_first > 0 && fd < s->cap_first; fd++)
    if (s->first_by_fd[fd] != 0 && (int)fd != s->spoke_fd &&
        (oldest == SIZE_MAX || s->first_by_fd[fd] < s->first_by_fd[oldest]))
      oldest = fd;
  if (oldest == SIZE_MAX)
    return 0;
  s->first_by_fd[oldest] = 0;
  s->n_first--;
  shutdown((int)oldest, SHUT_RDWR);
  refused(s, SERVER_REFUSED_IDLE);
  return 1;
}

/* The connection spoke (or went): no deadline any more. */
static void first_del(server *s, int fd) {
  if (fd >= 0 && (size_t)fd < s->cap_first && s->first_by_fd[fd] != 0) {
    s->first_by_fd[fd] = 0;
    s->n_first--;
  }
}

/* A connection past the cap: counted, then closed after the grace; with
 * SERVER_POLITE_MAX already waiting (a flood), closed at once, so that
 * the flood cannot use the descriptors the cap keeps free. */
static void over_add(server *s, int fd) {
  if (s->n_over >= SERVER_POLITE_MAX) {
    shutdown(fd, SHUT_RDWR);
    return;
  }
  if (s->n_over == s->cap_over) {
    size_t cap = s->cap_over ? 2 * s->cap_over : 16;
    over_conn *o = realloc(s->over, cap * sizeof *o);
    if (o == NULL) { /* no memory to wait: close it now */
      shutdown(fd, SHUT_RDWR);
      return;
    }
    s->over = o;
    s->cap_over = cap;
  }
  s->over[s->n_over++] = (over_conn){fd, uv_now(s->loop) + SERVER_GRACE_MS};
  if (s->timer != NULL && !uv_is_active((uv_handle_t *)s->timer))
    uv_timer_start(s->timer, on_over_timer, 50, 50);
}

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
  over_conn *oc = NULL;
  if (frames == 2 && s->n_over > 0) {
    on_monitor(s->monitor, s); /* its ACCEPTED may still be queued */
    oc = over_find(s, zmq_msg_get(&body, ZMQ_SRCFD));
  }
  if (s->o.first_msg_ms != 0) {
    /* ZeroMQ queues a connection's ACCEPTED before its first message can
     * be read: drained here, the deadline is never set after it spoke.
     * The ACCEPTEDs of others drained meanwhile may each evict the oldest
     * silent connection; this one has spoken, and evicted now its message
     * would be answered into a closed connection (its sender waiting out
     * its timeout), so the drain passes it over. */
    int fd = zmq_msg_get(frames == 2 ? &body : &id, ZMQ_SRCFD);
    s->spoke_fd = fd;
    on_monitor(s->monitor, s);
    s->spoke_fd = -1;
    if (s->n_first > 0)
      first_del(s, fd);
  }
  if (oc != NULL) { /* past the cap: answered, then closed */
    if (s->o.on_over_cap)
      s->o.on_over_cap(s, zmq_msg_data(&id), zmq_msg_size(&id),
                       s->o.max_conns, s->o.ctx);
    uint64_t soon = uv_now(s->loop) + SERVER_FLUSH_MS;
    if (oc->deadline > soon)
      oc->deadline = soon;
  } else if (frames == 2) {
    const char *user = s->o.curve_secret ? zmq_msg_gets(&body, "User-Id")
                                         : NULL;
    s->msg_fd = zmq_msg_get(&body, ZMQ_SRCFD);
    peer_group(zmq_msg_gets(&body, "Peer-Address"), s->msg_group,
               sizeof s->msg_group);
    if (s->o.key_max != 0 && user != NULL &&
        !key_admit(s, s->msg_fd, user)) {
      /* its key holds its places already: answered, then closed */
      if (s->o.on_key_cap)
        s->o.on_key_cap(s, zmq_msg_data(&id), zmq_msg_size(&id),
                        s->o.key_max, s->o.ctx);
      refused(s, SERVER_REFUSED_KEY_PLACES);
      if (over_find(s, s->msg_fd) == NULL)
        over_add(s, s->msg_fd);
      over_conn *c = over_find(s, s->msg_fd);
      if (c != NULL)
        c->deadline = uv_now(s->loop) + SERVER_FLUSH_MS;
      zmq_msg_close(&id);
      zmq_msg_close(&body);
      return;
    }
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
/* Takes one monitor event; 0 when none was waiting. */
static int monitor_event(server *s, void *sock) {
  zmq_msg_t m;
  uint16_t ev = 0;
  uint32_t value = 0;
  zmq_msg_init(&m);
  if (zmq_msg_recv(&m, sock, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&m);
    return 0;
  }
  if (zmq_msg_size(&m) >= 6) {
    memcpy(&ev, zmq_msg_data(&m), sizeof ev);
    memcpy(&value, (const char *)zmq_msg_data(&m) + 2, sizeof value);
  }
  while (zmq_msg_more(&m) && zmq_msg_recv(&m, sock, ZMQ_DONTWAIT) >= 0)
    ;
  zmq_msg_close(&m);
  switch (ev) {
  case ZMQ_EVENT_ACCEPTED:
    s->live++;
    live_set(s, (int)value, 1);
    if (s->o.max_conns != 0 && s->live > s->o.max_conns &&
        !evict_idle(s)) {
      over_add(s, (int)value);
      refused(s, SERVER_REFUSED_CONNECTIONS);
    } else {
      first_add(s, (int)value);
    }
    break;
  case ZMQ_EVENT_ACCEPT_FAILED: /* no descriptor left (EMFILE) */
    refused(s, SERVER_REFUSED_CONNECTIONS);
    break;
  case ZMQ_EVENT_DISCONNECTED: {
    over_conn *oc = over_find(s, (int)value);
    if (oc != NULL)
      over_del(s, oc);
    first_del(s, (int)value);
    live_set(s, (int)value, 0);
    key_forget(s, (int)value);
    if (s->live > 0)
      s->live--;
    if (s->o.on_gone)
      s->o.on_gone(s, (int)value, s->o.ctx);
    break;
  }
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
  return 1;
}

/* A peer's address group from ZeroMQ's Peer-Address (NULL or "" where it
 * says none): a TCP peer's IP address; an IPC peer's "localhost:UID:GID"
 * (ZeroMQ says "localhost:UID:GID:PID": a user's processes are one
 * group). Written to out, "" for none. */
static void peer_group(const char *addr, char *out, size_t size) {
  out[0] = '\0';
  if (addr == NULL || addr[0] == '\0' || strlen(addr) >= size)
    return;
  snprintf(out, size, "%s", addr);
  if (strncmp(out, "localhost:", 10) == 0) {
    char *pid = strrchr(out, ':');
    if (pid > out + 9)
      *pid = '\0';
  }
}

/* Every waiting monitor event (zwatch calls this per wake-up; the timer
 * and the cap check call it to be current). */
static void on_monitor(void *sock, void *ctx) {
  while (monitor_event(ctx, sock))
    ;
}

uint32_t server_connections(const server *s) { return s ? s->live : 0; }

int server_msg_fd(const server *s) { return s ? s->msg_fd : -1; }

const char *server_msg_group(const server *s) {
  return s != NULL && s->msg_group[0] != '\0' ? s->msg_group : NULL;
}

static void free_timer(uv_handle_t *h) { free(h); }

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
  s->loop = loop;
  s->spoke_fd = -1;
  if ((s->timer = malloc(sizeof *s->timer)) == NULL) {
    free(s);
    return GNMR_E_NOMEM;
  }
  uv_timer_init(loop, s->timer);
  s->timer->data = s;
  if ((s->sock = zmq_socket(zctx, ZMQ_ROUTER)) == NULL)
    goto err;
  zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(s->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
  zmq_setsockopt(s->sock, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
  zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
  if (o->sndhwm > 0)
    zmq_setsockopt(s->sock, ZMQ_SNDHWM, &o->sndhwm, sizeof o->sndhwm);
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
  /* unique in the process: ZeroMQ unbinds a closed server's monitor
   * endpoint later, on its own thread, and a new server may be allocated
   * where it was (the loop thread alone opens servers) */
  static unsigned opened;
  snprintf(mon, sizeof mon, "inproc://gnmrd-monitor-%p-%u", (void *)s,
           opened++);
  if (zmq_socket_monitor(s->sock, mon,
                         ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                             ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_ACCEPT_FAILED |
                             ZMQ_EVENT_DISCONNECTED) != 0 ||
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
  zwatch_close(&s->w);
  zwatch_close(&s->mw);
  if (s->monitor)
    zmq_close(s->monitor);
  if (s->sock)
    zmq_close(s->sock);
  s->timer->data = NULL;
  uv_close((uv_handle_t *)s->timer, free_timer);
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

int server_send_owned(server *s, const void *id, size_t id_len, void *data,
                      size_t len, void (*freed)(void *data, void *hint),
                      void *hint) {
  zmq_msg_t m;
  if (zmq_send(s->sock, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
    int e = zmq_errno();
    freed(data, hint);
    return e == EAGAIN ? GNMR_E_BUSY : GNMR_E_CLOSED;
  }
  if (zmq_msg_init_data(&m, data, len, freed, hint) != 0) {
    freed(data, hint);
    return GNMR_E_NOMEM;
  }
  if (zmq_msg_send(&m, s->sock, ZMQ_DONTWAIT) < 0) {
    int e = zmq_errno();
    zmq_msg_close(&m); /* calls freed */
    return e == EAGAIN ? GNMR_E_BUSY : GNMR_E_CLOSED;
  }
  return GNMR_OK;
}

void server_kick(server *s) {
  if (s != NULL)
    zwatch_kick(s->w);
}

void server_close(server **sp) {
  server *s = *sp;
  if (s == NULL)
    return;
  *sp = NULL;
  zwatch_close(&s->w);
  zwatch_close(&s->mw);
  /* monitoring stops first: libzmq leaks an event it cannot deliver, and
   * closing the socket disconnects every peer (one event each) */
  zmq_socket_monitor(s->sock, NULL, 0);
  zmq_close(s->monitor); /* after their polls stopped */
  zmq_close(s->sock);
  s->timer->data = NULL;
  uv_close((uv_handle_t *)s->timer, free_timer);
  free(s->over);
  free(s->first_by_fd);
  free(s->live_by_fd);
  for (size_t fd = 0; fd < s->cap_key; fd++)
    free(s->key_by_fd[fd].key);
  free(s->key_by_fd);
  hmap_clear(&s->key_count);
  free(s);
}
