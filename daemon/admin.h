/* SPDX-License-Identifier: MIT */
/* admin.h — the admin endpoint's callbacks (admin.c): gnmrctl's commands
 * and the export streams in progress (refused connections of either
 * endpoint: refusals.h). Loop thread only. */
#ifndef GNMRD_ADMIN_H
#define GNMRD_ADMIN_H

#include "gnmrd.h"

void admin_on_message(server *s, const void *id, size_t id_len,
                      const void *data, size_t len, const char *user,
                      void *ctx);
void admin_on_bad_frames(server *s, void *ctx);
/* A connection to the admin endpoint went: its queries stop. */
void admin_on_gone(server *s, int fd, void *ctx);
/* Closes the export streams in progress (shutdown). */
void admin_shutdown(gnmrd *d);

#endif /* GNMRD_ADMIN_H */
