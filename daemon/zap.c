/* SPDX-License-Identifier: MIT */
/* zap.c — see zap.h. A request is [version "1.0"][request id][domain]
 * [address][identity][mechanism][credentials...]; the reply is [version]
 * [request id][status code][status text][user id][metadata]. */
#include "zap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "gnmr/error.h"
#include "keys.h"
#include "log.h"
#include "zwatch.h"

#define ZAP_MAX_FRAMES 8

struct zap {
  void *sock;
  zwatch *w;
  const gnmr_allow *allowed;
  uint64_t *denied;
};

static void send_reply(void *sock, const zmq_msg_t *req_id, const char *code,
                       const char *text, const char *user) {
  zmq_send(sock, "1.0", 3, ZMQ_SNDMORE);
  zmq_send(sock, zmq_msg_data((zmq_msg_t *)req_id),
           zmq_msg_size((zmq_msg_t *)req_id), ZMQ_SNDMORE);
  zmq_send(sock, code, strlen(code), ZMQ_SNDMORE);
  zmq_send(sock, text, strlen(text), ZMQ_SNDMORE);
  zmq_send(sock, user, strlen(user), ZMQ_SNDMORE);
  zmq_send(sock, "", 0, 0);
}

static void on_request(void *sock, void *ctx) {
  zap *z = ctx;
  zmq_msg_t f[ZAP_MAX_FRAMES];
  int n = 0, more = 1;
  while (more && n < ZAP_MAX_FRAMES) {
    zmq_msg_init(&f[n]);
    if (zmq_msg_recv(&f[n], sock, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&f[n]);
      break;
    }
    more = zmq_msg_more(&f[n]);
    n++;
  }
  while (more) { /* more frames than any valid request: drop the rest */
    zmq_msg_t x;
    zmq_msg_init(&x);
    if (zmq_msg_recv(&x, sock, ZMQ_DONTWAIT) < 0)
      more = 0;
    else
      more = zmq_msg_more(&x);
    zmq_msg_close(&x);
  }
  if (n == 0)
    return;
  char key[GNMR_Z85_KEY_LEN + 1] = "";
  int curve = n >= 7 && zmq_msg_size(&f[5]) == 5 &&
              memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 &&
              zmq_msg_size(&f[6]) == 32;
  if (curve)
    zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
  if (n >= 2) {
    if (curve && gnmr__allow_find(z->allowed, key) != NULL) {
      send_reply(sock, &f[1], "200", "OK", key);
    } else {
      (*z->denied)++;
      LOG(WARN, "AUTH-DENY", "refused %s client%s%s",
          curve ? "CURVE" : "non-CURVE", curve ? " key " : "", key);
      send_reply(sock, &f[1], "400", curve ? "key not allowed"
                                           : "CURVE required", "");
    }
  }
  for (int i = 0; i < n; i++)
    zmq_msg_close(&f[i]);
}

int zap_open(uv_loop_t *loop, void *zctx, const gnmr_allow *allowed,
             uint64_t *denied, zap **out, char *err, size_t errlen) {
  int zero = 0;
  zap *z = calloc(1, sizeof *z);
  *out = NULL;
  if (z == NULL)
    return GNMR_E_NOMEM;
  z->allowed = allowed;
  z->denied = denied;
  if ((z->sock = zmq_socket(zctx, ZMQ_REP)) == NULL ||
      zmq_setsockopt(z->sock, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
      zmq_bind(z->sock, "inproc://zeromq.zap.01") != 0 ||
      zwatch_start(loop, z->sock, on_request, z, &z->w) != GNMR_OK) {
    snprintf(err, errlen, "ZAP handler: %s", zmq_strerror(zmq_errno()));
    if (z->sock)
      zmq_close(z->sock);
    free(z);
    return GNMR_E_IO;
  }
  *out = z;
  return GNMR_OK;
}

void zap_close(zap **zp) {
  zap *z = *zp;
  if (z == NULL)
    return;
  *zp = NULL;
  zwatch_close(&z->w);
  zmq_close(z->sock);
  free(z);
}
