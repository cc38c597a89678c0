/* SPDX-License-Identifier: MIT */
/* refusals.h — connections either endpoint refuses (refusals.c): the
 * server's callbacks for a failed handshake, a cap, a key's places, and
 * whether a key is an operator's. Loop thread only. */
#ifndef GNMRD_REFUSALS_H
#define GNMRD_REFUSALS_H

#include "gnmrd.h"

/* Counts a failed handshake (either endpoint). */
void refusals_on_handshake_failed(server *s, server_refusal why, void *ctx);
/* Answers a message from a connection past the cap (server_cap_cb). */
void refusals_on_over_cap(server *s, const void *id, size_t id_len,
                          uint32_t max_conns, void *ctx);
/* Whether a key has every right (an operator, or tenancy off). */
int refusals_is_operator(const char *user, void *ctx);
/* Answers a connection refused for its key's places. */
void refusals_on_key_cap(server *s, const void *id, size_t id_len,
                         uint32_t key_max, void *ctx);
/* The same on the agents endpoint (a quarter of max_connections a key). */
void refusals_on_agent_key_cap(server *s, const void *id, size_t id_len,
                               uint32_t key_max, void *ctx);

#endif /* GNMRD_REFUSALS_H */
