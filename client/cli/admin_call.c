/* SPDX-License-Identifier: MIT */
/* admin_call.c — one request/reply with gnmrd's admin endpoint, bounded by
 * a timeout, shared by gnmrctl's subcommands. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "cli.h"
#include "commands.h"
#include "gnmr/error.h"
#include "ipc.h"
#include "keys.h"

/* Sends one admin request and waits for its reply. Returns the decoded
 * envelope (caller frees) or NULL with a message on stderr. */
/* The server key: a Z85 key itself, or a file holding `public = KEY`. */
static int server_key(const char *arg, char *key, char *err, size_t n) {
  if (gnmr__key_valid(arg)) {
    memcpy(key, arg, 41);
    return 0;
  }
  return gnmr__key_file_read(arg, key, NULL, err, n);
}

/* Whether req may be sent twice: a read (stats, or a command whose row
 * neither changes a job nor streams: a stream's chunks are asked for in
 * order) may; `set` and `finish` may not. */
static int again(const Gnmr__Envelope *req) {
  if (req->body_case == GNMR__ENVELOPE__BODY_STATS_REQUEST)
    return 1;
  if (req->body_case != GNMR__ENVELOPE__BODY_ADMIN_REQUEST)
    return 0;
  int k = gnmr__admin_command_find(req->admin_request->command);
  return k >= 0 && !gnmr_admin_commands[k].changes &&
         !gnmr_admin_commands[k].stream;
}

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Whether a connection dropped: reads every event the monitor holds. */
static int dropped(void *mon) {
  int any = 0;
  zmq_msg_t m;
  zmq_msg_init(&m);
  while (zmq_msg_recv(&m, mon, ZMQ_DONTWAIT) >= 0) {
    uint16_t ev = 0;
    if (zmq_msg_size(&m) >= 6)
      memcpy(&ev, zmq_msg_data(&m), sizeof ev);
    any |= ev == ZMQ_EVENT_DISCONNECTED;
    while (zmq_msg_more(&m) && zmq_msg_recv(&m, mon, ZMQ_DONTWAIT) >= 0)
      ;
  }
  zmq_msg_close(&m);
  return any;
}

/* Waits up to timeout_ms for the reply to the request (buf, len) sent on
 * s. ZeroMQ reconnects a dropped connection by itself, but a request
 * written to the old one is gone with it: gnmrd restarted, a standby took
 * over, or gnmrd closed a connection it took for a silent one while a
 * flood of them held its places. A read is then sent again on the new
 * connection (a second answer, if the first request got through after
 * all, is dropped with the socket); a command that changes a job is not,
 * and waits as before. The decoded reply, or NULL after saying why. */
static Gnmr__Envelope *await_reply(void *s, void *mon, const uint8_t *buf,
                                   size_t len, int resend, const char *endpoint,
                                   int timeout_ms) {
  int64_t deadline = now_ms() + timeout_ms;
  int owed = 0; /* the request, to send again */
  for (;;) {
    int64_t left = deadline - now_ms();
    if (left <= 0) {
      fprintf(stderr, "gnmrctl: no answer from gnmrd at %s within %d ms\n",
              endpoint, timeout_ms);
      return NULL;
    }
    zmq_pollitem_t it[2] = {{s, 0, ZMQ_POLLIN, 0}, {mon, 0, ZMQ_POLLIN, 0}};
    /* a resend that found no pipe yet is tried again every 20 ms */
    if (zmq_poll(it, 2, owed && left > 20 ? 20 : (long)left) < 0 &&
        zmq_errno() != EINTR) {
      fprintf(stderr, "gnmrctl: %s: %s\n", endpoint, zmq_strerror(zmq_errno()));
      return NULL;
    }
    if (it[0].revents & ZMQ_POLLIN) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, s, ZMQ_DONTWAIT) >= 0) {
        Gnmr__Envelope *env = NULL;
        char err[128];
        if (gnmr__wire_decode(zmq_msg_data(&m), zmq_msg_size(&m), &env, err,
                              sizeof err) != GNMR_OK)
          fprintf(stderr, "gnmrctl: bad reply from %s: %s\n", endpoint, err);
        zmq_msg_close(&m);
        return env;
      }
      zmq_msg_close(&m);
    }
    if ((it[1].revents & ZMQ_POLLIN) && dropped(mon) && resend)
      owed = 1;
    if (owed && zmq_send(s, buf, len, ZMQ_DONTWAIT) >= 0)
      owed = 0;
  }
}

/* Whether an ipc:// endpoint's socket file is there, waiting up to 200 ms
 * for it (a gnmrd starting); any other endpoint is taken as there. A
 * missing socket is said at once (issue 63: it waited out the whole
 * timeout, 3.3 s, to say "no answer"). */
static int socket_there(const char *endpoint) {
  if (strncmp(endpoint, "ipc://", 6) != 0 || endpoint[6] == '@')
    return 1;
  for (int tries = 0; tries < 10; tries++) {
    struct stat st;
    if (stat(endpoint + 6, &st) == 0)
      return 1;
    usleep(20000);
  }
  return 0;
}

Gnmr__Envelope *cli_admin_call(const cli_globals *g, Gnmr__Envelope *req,
                               int timeout_ms) {
  const char *endpoint = cli_admin_endpoint(g);
  void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER), *mon = NULL;
  int zero = 0;
  uint8_t *buf = NULL;
  size_t len;
  Gnmr__Envelope *env = NULL;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
  /* a send can block too: with no pipe to queue into (a refused CURVE
   * handshake tears the session down between retries) a DEALER waits */
  zmq_setsockopt(s, ZMQ_SNDTIMEO, &timeout_ms, sizeof timeout_ms);
  if (g->server_key != NULL || g->key_file != NULL) {
    char srv[41], pub[41], sec[41], err[300];
    if (g->server_key == NULL || g->key_file == NULL) {
      fprintf(stderr, "gnmrctl: CURVE needs both --curve-server-key and "
                      "--key-file\n");
      goto out;
    }
    if (server_key(g->server_key, srv, err, sizeof err) != 0 ||
        gnmr__key_file_read(g->key_file, pub, sec, err, sizeof err) != 0) {
      fprintf(stderr, "gnmrctl: %s\n", err);
      goto out;
    }
    zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, srv, 41);
    zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, 41);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sec, 41);
  }
  char why[600];
  if (gnmr__ipc_dir_check_peer(endpoint, why, sizeof why) == GNMR_E_INVAL) {
    fprintf(stderr, "gnmrctl: %s\n", why);
    goto out;
  }
  if (!socket_there(endpoint)) {
    fprintf(stderr, "gnmrctl: nothing listens at %s (no socket there): is "
                    "gnmrd running? Give --admin its admin endpoint, or "
                    "--store DATA_DIR to read a history with no gnmrd\n",
            endpoint);
    goto out;
  }
  /* the connection's drops, watched before it is made */
  if (zmq_socket_monitor(s, "inproc://gnmrctl-monitor",
                         ZMQ_EVENT_DISCONNECTED) != 0 ||
      (mon = zmq_socket(ctx, ZMQ_PAIR)) == NULL ||
      zmq_setsockopt(mon, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
      zmq_connect(mon, "inproc://gnmrctl-monitor") != 0) {
    fprintf(stderr, "gnmrctl: cannot watch the connection: %s\n",
            zmq_strerror(zmq_errno()));
    goto out;
  }
  if (zmq_connect(s, endpoint) != 0) {
    fprintf(stderr, "gnmrctl: %s: %s\n", endpoint, zmq_strerror(zmq_errno()));
    goto out;
  }
  if (gnmr__wire_encode(req, &buf, &len) != GNMR_OK ||
      zmq_send(s, buf, len, 0) < 0) {
    fprintf(stderr, "gnmrctl: no answer from gnmrd at %s within %d ms "
                    "(cannot send)\n", endpoint, timeout_ms);
    goto out;
  }
  env = await_reply(s, mon, buf, len, again(req), endpoint, timeout_ms);
out:
  free(buf);
  if (mon != NULL)
    zmq_close(mon);
  zmq_close(s);
  zmq_ctx_term(ctx);
  return env;
}

