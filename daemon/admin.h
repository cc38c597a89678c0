/* SPDX-License-Identifier: MIT */
/* admin.h — the admin endpoint's callbacks (admin.c): gnmrctl's commands,
 * refused connections of either endpoint, and the export streams in
 * progress. Loop thread only. */
#ifndef GNMRD_ADMIN_H
#define GNMRD_ADMIN_H

#include "gnmrd.h"

void admin_on_message(server *s, const void *id, size_t id_len,
                      const void *data, size_t len, const char *user,
                      void *ctx);
/* Counts a failed handshake (either endpoint). */
void gnmrd_on_handshake_failed(server *s, server_refusal why, void *ctx);
/* Answers a message from a connection past the cap (server_cap_cb). */
void gnmrd_on_over_cap(server *s, const void *id, size_t id_len,
                       uint32_t max_conns, void *ctx);
/* Whether a key has every right (an operator, or tenancy off). */
int gnmrd_is_operator(const char *user, void *ctx);
/* Answers a connection refused for its key's places. */
void gnmrd_on_key_cap(server *s, const void *id, size_t id_len,
                      uint32_t key_max, void *ctx);
void admin_on_bad_frames(server *s, void *ctx);
/* A connection to the admin endpoint went: its queries stop. */
void admin_on_gone(server *s, int fd, void *ctx);
/* Closes the export streams in progress (shutdown). */
void admin_shutdown(gnmrd *d);

#endif /* GNMRD_ADMIN_H */
