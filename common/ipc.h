/* SPDX-License-Identifier: MIT */
/* ipc.h — ZeroMQ ipc:// endpoints as local users can attack them, checked
 * the way ssh-agent and PostgreSQL check their socket directories. */
#ifndef GNMR_IPC_H
#define GNMR_IPC_H

#include <stddef.h>

/* For an ipc:// endpoint with a path: its directory must be a real
 * directory (not a symlink) owned by this user or root, and not writable
 * by group or others unless sticky (like /tmp, where nobody else can
 * remove or rename our socket). Other endpoints pass. Returns 0,
 * GNMR_E_IO when the directory cannot be read (missing), or GNMR_E_INVAL
 * when it is not safe; the reason in err. */
int gnmr__ipc_dir_check(const char *endpoint, char *err, size_t errlen);

/* The same for a peer that connects (an agent, gnmrctl), over a list of
 * endpoints: the directory may also belong to a system account (below
 * uid 1000: the user a packaged gnmrd runs as, /run/gnmr), never to
 * another ordinary user, who could serve there as gnmrd. GNMR_E_INVAL
 * with "refusing ENDPOINT: why" for the first unsafe one; a missing
 * directory is not an error here (gnmrd may not have started yet). */
int gnmr__ipc_dir_check_peer(const char *endpoints, char *err,
                             size_t errlen);

/* 1 for an abstract ipc://@name endpoint (no file, no permissions: any
 * local user can connect). */
int gnmr__ipc_abstract(const char *endpoint);

/* Before binding an ipc:// path: GNMR_E_BUSY when a process accepts
 * connections on it (binding would silently take it over), GNMR_E_INVAL
 * when the path exists and is not a socket; 0 when it is free or a stale
 * socket (which ZeroMQ replaces). */
int gnmr__ipc_free(const char *endpoint, char *err, size_t errlen);

/* A ZeroMQ endpoint as a user wrote it: ipc://PATH (at most 107 bytes,
 * or ipc://@name), tcp://HOST:PORT with PORT 1-65535 (0 or * to bind),
 * inproc://NAME; to connect (bind 0), a comma-separated list (an active
 * gnmrd and its standbys). 0, or GNMR_E_INVAL with a message in err that
 * names the accepted forms. */
int gnmr__endpoint_check(const char *endpoints, int bind, char *err,
                         size_t errlen);

#endif /* GNMR_IPC_H */
