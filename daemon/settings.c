/* SPDX-License-Identifier: MIT */
/* settings.c — what gnmrd derives and checks of its settings before it
 * takes anything: the default directories, the checks that need no socket
 * and no lock (the same for --check-config as for a start), and the
 * directories it makes for its data and its ipc sockets. */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gnmr/error.h"
#include "ipc.h"
#include "keys.h"
#include "metrics.h"
#include "settings.h"

/* mkdir -p with mode 0700 for directories it creates. */
int settings_mkdirs(const char *path) {
  char buf[4096];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
    return -1;
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(buf, 0700) != 0 && errno != EEXIST)
      return -1;
    *p = '/';
  }
  return mkdir(buf, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

void settings_default_dirs(char *run, size_t rcap, char *data, size_t dcap) {
  const char *e;
  if ((e = getenv("RUNTIME_DIRECTORY")) != NULL)
    snprintf(run, rcap, "%s", e);
  else if ((e = getenv("XDG_RUNTIME_DIR")) != NULL)
    snprintf(run, rcap, "%s/gnmr", e);
  else
    snprintf(run, rcap, "/tmp/gnmr-%u", (unsigned)getuid());
  if ((e = getenv("STATE_DIRECTORY")) != NULL)
    snprintf(data, dcap, "%s", e);
  else if (getuid() == 0)
    snprintf(data, dcap, "/var/lib/gnmr");
  else if ((e = getenv("XDG_STATE_HOME")) != NULL)
    snprintf(data, dcap, "%s/gnmr", e);
  else if ((e = getenv("HOME")) != NULL && e[0] == '/')
    snprintf(data, dcap, "%s/.local/state/gnmr", e);
  else
    data[0] = '\0'; /* not /tmp/.local/state: a place others can make */
}

/* For ipc:// endpoints, creates the socket's directory. */
int settings_prepare_endpoint(const char *ep) {
  if (strncmp(ep, "ipc://", 6) != 0)
    return 0;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", ep + 6);
  char *slash = strrchr(dir, '/');
  if (slash == NULL || slash == dir)
    return 0;
  *slash = '\0';
  return settings_mkdirs(dir);
}

/* Whether an endpoint can be reached from other hosts: TCP off the
 * loopback, or another network transport of ZeroMQ. ipc://, inproc:// and
 * loopback TCP are local; unknown schemes fail at bind anyway. */
int settings_endpoint_is_network(const char *ep) {
  static const char *const net[] = {"pgm://", "epgm://", "udp://", "ws://",
                                    "wss://", "tipc://", "vmci://"};
  for (size_t i = 0; i < sizeof net / sizeof net[0]; i++)
    if (strncmp(ep, net[i], strlen(net[i])) == 0)
      return 1;
  if (strncmp(ep, "tcp://", 6) != 0)
    return 0;
  const char *host = ep + 6;
  return !(strncmp(host, "127.", 4) == 0 ||
           strncmp(host, "localhost:", 10) == 0 ||
           strncmp(host, "[::1]:", 6) == 0);
}

/* Whether a --metrics HOST:PORT stays on this host (IPv4 127.0.0.0/8 or
 * localhost). */
int settings_metrics_addr_is_loopback(const char *addr) {
  return strncmp(addr, "127.", 4) == 0 || strncmp(addr, "localhost:", 10) == 0;
}

/* The checks of a configuration that need no socket and no lock: CURVE
 * files (both or neither, readable, private), plaintext network
 * endpoints, metrics off the loopback, abstract sockets, and socket
 * directories that exist. 0, or -1 with the reason in err. */
int settings_check(const gnmrd_config *cfg, char *pub, char *sec,
                   gnmr_allow *allowed, char *err, size_t errlen) {
  int curve = cfg->curve_key_file[0] != '\0';
  if (cfg->standby && cfg->store[0] == '\0') {
    snprintf(err, errlen, "standby needs a PostgreSQL store (--store "
                          "postgresql://...): SQLite's file has one gnmrd");
    return -1;
  }
  if (curve != (cfg->curve_allow_file[0] != '\0')) {
    snprintf(err, errlen, "CURVE needs both curve_key_file and "
                          "curve_allow_file (--curve-key, --curve-allow)");
    return -1;
  }
  if (curve &&
      (gnmr__key_file_read(cfg->curve_key_file, pub, sec, err, errlen) !=
           GNMR_OK ||
       gnmr__allow_load(cfg->curve_allow_file, allowed, err, errlen) !=
           GNMR_OK))
    return -1;
  if (!curve && !cfg->insecure &&
      (settings_endpoint_is_network(cfg->agents) ||
       settings_endpoint_is_network(cfg->admin))) {
    snprintf(err, errlen, "refusing to serve %s without CURVE: give "
             "curve_key_file and curve_allow_file, or --insecure",
             settings_endpoint_is_network(cfg->agents) ? cfg->agents
                                                       : cfg->admin);
    return -1;
  }
  struct sockaddr_in msa;
  if (cfg->metrics[0] != '\0' &&
      metrics_addr_parse(cfg->metrics, &msa, err, errlen) != GNMR_OK)
    return -1;
  if (cfg->metrics[0] != '\0' &&
      !settings_metrics_addr_is_loopback(cfg->metrics) &&
      !cfg->insecure) {
    snprintf(err, errlen, "refusing to serve metrics on %s: they are "
             "plaintext HTTP without authentication; serve them on "
             "127.0.0.1 (and scrape them there), or give --insecure",
             cfg->metrics);
    return -1;
  }
  for (int i = 0; i < 2; i++) {
    const char *ep = i ? cfg->admin : cfg->agents;
    if (gnmr__ipc_abstract(ep) && !cfg->insecure) {
      snprintf(err, errlen, "%s: an abstract socket has no permissions, any "
               "local user can connect; use a path, or give --insecure", ep);
      return -1;
    }
    char why[600];
    if (gnmr__ipc_dir_check(ep, why, sizeof why) == GNMR_E_INVAL) {
      snprintf(err, errlen, "refusing %s: %s", ep, why);
      return -1;
    }
  }
  return 0;
}
