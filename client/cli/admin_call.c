/* SPDX-License-Identifier: MIT */
/* admin_call.c — one request/reply with gnmrd's admin endpoint, bounded by
 * a timeout, shared by gnmrctl's subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "cli.h"
#include "ipc.h"
#include "gnmr/error.h"
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

Gnmr__Envelope *cli_admin_call(const cli_globals *g, Gnmr__Envelope *req,
                               int timeout_ms) {
  const char *endpoint = cli_admin_endpoint(g);
  void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
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
  zmq_msg_t m;
  zmq_msg_init(&m);
  if (zmq_msg_recv(&m, s, 0) < 0) {
    fprintf(stderr, "gnmrctl: no answer from gnmrd at %s within %d ms\n",
            endpoint, timeout_ms);
    zmq_msg_close(&m);
    goto out;
  }
  char err[128];
  if (gnmr__wire_decode(zmq_msg_data(&m), zmq_msg_size(&m), &env, err,
                        sizeof err) != GNMR_OK)
    fprintf(stderr, "gnmrctl: bad reply from %s: %s\n", endpoint, err);
  zmq_msg_close(&m);
out:
  free(buf);
  zmq_close(s);
  zmq_ctx_term(ctx);
  return env;
}

