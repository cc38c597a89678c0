/* SPDX-License-Identifier: MIT */
/* refusals.c — connections either endpoint refuses (server.c's
 * callbacks): counted by kind and logged at most once per kind every ten
 * seconds; a connection past a cap told why (BUSY) before it is closed;
 * which keys are operators. Loop thread only. */
#include <assert.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "gnmr/error.h"
#include "gnmrd.h"
#include "keys.h"
#include "log.h"
#include "refusals.h"
#include "wire.h"

/* Counts a refused connection by kind and logs it, at most one line per
 * kind every REFUSAL_LOG_MS, saying how many were not logged since. */
#define REFUSAL_LOG_MS 10000
void refusals_on_handshake_failed(server *s, server_refusal why, void *ctx) {
  static const struct {
    const char *what;
    size_t counter; /* offset in gnmrd_counters */
  } kinds[] = {
      [SERVER_REFUSED_PLAINTEXT] = {"a peer without CURVE (plaintext)",
                                    offsetof(gnmrd_counters,
                                             refused_plaintext)},
      [SERVER_REFUSED_SERVER_KEY] = {"a CURVE peer with the wrong server key",
                                     offsetof(gnmrd_counters,
                                              refused_server_key)},
      [SERVER_REFUSED_CLIENT_KEY] = {"a CURVE key not in the allow list",
                                     offsetof(gnmrd_counters,
                                              refused_client_key)},
      [SERVER_REFUSED_JUNK] = {"a connection that spoke no ZMTP",
                               offsetof(gnmrd_counters, refused_junk)},
      [SERVER_REFUSED_CONNECTIONS] = {"a connection past the connection cap "
                                      "([limits] max_connections) or the "
                                      "descriptor limit",
                                      offsetof(gnmrd_counters,
                                               refused_connections)},
      [SERVER_REFUSED_IDLE] = {"a connection that sent nothing within "
                               "[limits] first_message_ms",
                               offsetof(gnmrd_counters, refused_idle)},
      [SERVER_REFUSED_KEY_PLACES] = {"an agent key's admin connection past "
                                     "its places",
                                     offsetof(gnmrd_counters,
                                              refused_key_places)},
  };
  enum { N_KINDS = sizeof kinds / sizeof kinds[0] };
  static uint64_t last_ms[N_KINDS], quiet[N_KINDS];
  gnmrd *d = ctx;
  (void)s;
  assert((unsigned)why < N_KINDS);
  if (why != SERVER_REFUSED_CONNECTIONS && why != SERVER_REFUSED_IDLE &&
      why != SERVER_REFUSED_KEY_PLACES)
    /* not a handshake: counted apart */
    d->c.handshake_failures++;
  (*(uint64_t *)((char *)&d->c + kinds[why].counter))++;
  uint64_t now = uv_now(d->loop);
  if (last_ms[why] != 0 && now - last_ms[why] < REFUSAL_LOG_MS) {
    quiet[why]++;
    return;
  }
  char more[64] = "";
  if (quiet[why] > 0)
    snprintf(more, sizeof more, " (and %llu more not logged since)",
             (unsigned long long)quiet[why]);
  LOG(WARN, "PEER-REFUSED", "refused %s%s%s", kinds[why].what,
      why == SERVER_REFUSED_PLAINTEXT ? ": it must use CURVE and the server "
                                        "key" : "",
      more);
  last_ms[why] = now ? now : 1;
  quiet[why] = 0;
}

int refusals_is_operator(const char *user, void *ctx) {
  gnmrd *d = ctx;
  return gnmr__allow_operator(d->allow, user);
}

/* A connection refused a place: BUSY, saying why (it is closed after). */
static void busy_connection(server *s, const void *id, size_t id_len,
                            const char *msg) {
  uint8_t *buf;
  size_t len;
  if (gnmr__wire_error(GNMR_E_BUSY, msg, "connection", 0, &buf, &len) ==
      GNMR_OK) {
    server_send(s, id, id_len, buf, len);
    free(buf);
  }
}

/* A key past its places on an endpoint (what: "admin", "agent"; where:
 * the limit's name): BUSY, saying so. */
static void key_cap(server *s, const void *id, size_t id_len,
                    uint32_t key_max, const char *what, const char *where) {
  char msg[240];
  snprintf(msg, sizeof msg,
           "this key holds %u %s connections already%s, or the places left"
           " are kept for operator keys; this one is closed: try again "
           "later", key_max, what, where);
  busy_connection(s, id, id_len, msg);
}

void refusals_on_key_cap(server *s, const void *id, size_t id_len,
                         uint32_t key_max, void *ctx) {
  (void)ctx;
  key_cap(s, id, id_len, key_max, "admin", "");
}

void refusals_on_agent_key_cap(server *s, const void *id, size_t id_len,
                               uint32_t key_max, void *ctx) {
  (void)ctx;
  key_cap(s, id, id_len, key_max, "agent",
          " (a quarter of [limits] max_connections)");
}

/* A message from a connection past the cap: the reason, as an Error the
 * agent library and gnmrctl show (GNMR_E_BUSY: try again later). */
void refusals_on_over_cap(server *s, const void *id, size_t id_len,
                          uint32_t max_conns, void *ctx) {
  char msg[200];
  (void)ctx;
  snprintf(msg, sizeof msg,
           "gnmrd serves at most %u connections on this endpoint ([limits] "
           "max_connections); this one is closed: try again later",
           max_conns);
  busy_connection(s, id, id_len, msg);
}
