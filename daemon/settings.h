/* SPDX-License-Identifier: MIT */
/* settings.h — gnmrd's settings derived and checked before it takes
 * anything (settings.c; main.c's second and third phases). */
#ifndef GNMRD_SETTINGS_H
#define GNMRD_SETTINGS_H

#include <stddef.h>

#include "config.h"
#include "keys.h"

/* mkdir -p, mode 0700 for the directories it creates; 0 or -1 (errno). */
int settings_mkdirs(const char *path);
/* The default run (sockets) and data directories, from the environment
 * (systemd's, XDG's, HOME); data empty when none is safe to guess. */
void settings_default_dirs(char *run, size_t rcap, char *data, size_t dcap);
/* For an ipc:// endpoint, creates its socket's directory; 0 or -1. */
int settings_prepare_endpoint(const char *ep);
/* Whether an endpoint is reachable from other hosts. */
int settings_endpoint_is_network(const char *ep);
/* Whether a metrics HOST:PORT stays on this host. */
int settings_metrics_addr_is_loopback(const char *addr);
/* Every check that needs no socket and no lock (CURVE files, plaintext
 * network endpoints, metrics, abstract sockets, socket directories);
 * reads the CURVE key pair into pub/sec and the allow list. 0, or -1
 * with the reason in err. */
int settings_check(const gnmrd_config *cfg, char *pub, char *sec,
                   gnmr_allow *allowed, char *err, size_t errlen);

#endif /* GNMRD_SETTINGS_H */
