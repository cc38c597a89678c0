/* SPDX-License-Identifier: MIT */
/* ipc.c — checks on ipc:// endpoints (ipc.h). */
#include "ipc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "gnmr/error.h"

static const char *ipc_path(const char *ep) {
  return strncmp(ep, "ipc://", 6) == 0 ? ep + 6 : NULL;
}

int gnmr__ipc_abstract(const char *ep) {
  const char *p = ipc_path(ep);
  return p != NULL && p[0] == '@';
}

/* Below this uid an account is a system one (Debian's FIRST_SYSTEM_UID
 * .. LAST_SYSTEM_UID, login.defs' UID_MIN): what a service such as
 * systemd's User=gnmr runs as, and what no ordinary local user is. */
#define GNMR_FIRST_USER_UID 1000u

static int dir_check(const char *ep, int peer, char *err, size_t errlen);

int gnmr__ipc_dir_check(const char *ep, char *err, size_t errlen) {
  return dir_check(ep, 0, err, errlen);
}

int gnmr__ipc_dir_check_peer(const char *ep, char *err, size_t errlen) {
  int rv = GNMR_OK;
  char *list = strdup(ep ? ep : ""), *save = NULL;
  if (list == NULL)
    return GNMR_E_NOMEM;
  for (char *one = strtok_r(list, ",", &save); one != NULL && rv != GNMR_E_INVAL;
       one = strtok_r(NULL, ",", &save)) {
    int r = dir_check(one, 1, err, errlen);
    if (r == GNMR_E_INVAL) {
      char why[600];
      snprintf(why, sizeof why, "%s", err);
      snprintf(err, errlen, "refusing %s: %s", one, why);
      rv = r;
    }
  }
  free(list);
  return rv;
}

/* Whoever may rename or replace a directory on the way to the socket's
 * (its owner, or anyone where it is writable and not sticky) may put
 * another directory, and another gnmrd, in its place: every directory above
 * it, symbolic links resolved (/var/run -> /run), must pass the owner and
 * mode rules too, as sshd's StrictModes asks of a home directory. */
static int ancestors_check(const char *dir, int peer, char *err,
                           size_t errlen) {
  char up[4200], *real;
  snprintf(up, sizeof up, "%s/..", dir);
  if ((real = realpath(up, NULL)) == NULL)
    return GNMR_OK; /* the directory itself was checked; nothing above */
  for (;;) {
    struct stat st;
    if (stat(real, &st) == 0) {
      int owner_ok = st.st_uid == geteuid() || st.st_uid == 0 ||
                     (peer && st.st_uid < GNMR_FIRST_USER_UID);
      int mode_ok = !(st.st_mode & (S_IWGRP | S_IWOTH)) ||
                    (st.st_mode & S_ISVTX);
      if (!owner_ok || !mode_ok) {
        snprintf(err, errlen, "%s, above the socket directory %s, %s: they "
                 "could move the socket directory away and put their own "
                 "in its place", real, dir,
                 !owner_ok ? "belongs to another user" : "is writable by "
                                                         "others");
        free(real);
        return GNMR_E_INVAL;
      }
    }
    char *slash = strrchr(real, '/');
    if (slash == NULL || slash == real)
      break;
    *slash = '\0';
  }
  free(real);
  return GNMR_OK;
}

static int dir_check(const char *ep, int peer, char *err, size_t errlen) {
  const char *p = ipc_path(ep);
  if (p == NULL || p[0] == '@')
    return GNMR_OK;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", p);
  char *slash = strrchr(dir, '/');
  if (slash == NULL)
    snprintf(dir, sizeof dir, ".");
  else if (slash == dir)
    dir[1] = '\0';
  else
    *slash = '\0';
  struct stat st;
  if (lstat(dir, &st) != 0) {
    snprintf(err, errlen, "%s: %s", dir, strerror(errno));
    return GNMR_E_IO;
  }
  if (S_ISLNK(st.st_mode)) {
    snprintf(err, errlen, "%s is a symbolic link: refusing a socket "
             "directory that can point anywhere", dir);
    return GNMR_E_INVAL;
  }
  if (!S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "%s is not a directory", dir);
    return GNMR_E_INVAL;
  }
  if (st.st_uid != geteuid() && st.st_uid != 0 &&
      (!peer || st.st_uid >= GNMR_FIRST_USER_UID)) {
    snprintf(err, errlen, "%s belongs to uid %u, not to this user (uid %u)"
             "%s: its owner could sit between gnmrd and its peers", dir,
             (unsigned)st.st_uid, (unsigned)geteuid(),
             peer ? ", root or a system account (a service's user)"
                  : " or root");
    return GNMR_E_INVAL;
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
    snprintf(err, errlen, "%s is writable by others (mode %04o): they could "
             "replace the socket; chmod go-w it", dir,
             (unsigned)(st.st_mode & 07777));
    return GNMR_E_INVAL;
  }
  return ancestors_check(dir, peer, err, errlen);
}

int gnmr__ipc_free(const char *ep, char *err, size_t errlen) {
  const char *p = ipc_path(ep);
  struct stat st;
  if (p == NULL || p[0] == '@' || strcmp(p, "*") == 0 ||
      lstat(p, &st) != 0)
    return GNMR_OK;
  if (!S_ISSOCK(st.st_mode)) {
    snprintf(err, errlen, "%s exists and is not a socket", p);
    return GNMR_E_INVAL;
  }
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(p) >= sizeof sa.sun_path)
    return GNMR_OK; /* ZeroMQ refuses it at bind, with its own error */
  memcpy(sa.sun_path, p, strlen(p) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return GNMR_OK;
  int live = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  if (live) {
    snprintf(err, errlen, "%s is served by another process (another "
             "gnmrd?): binding would take it over", p);
    return GNMR_E_BUSY;
  }
  return GNMR_OK;
}

/* One endpoint of a list (len bytes at ep), for connecting or binding. */
static int endpoint_one(const char *ep, size_t len, int bind, char *err,
                        size_t errlen) {
  static const char forms[] =
      "ipc:///path/to/socket (a path of at most 107 bytes, or ipc://@name) "
      "or tcp://HOST:PORT (PORT 1-65535)";
  char shown[96];
  if (len == 0) {
    snprintf(err, errlen, "an empty endpoint in the list (a comma at an end, "
             "or two together): the list is ENDPOINT[,ENDPOINT...]");
    return GNMR_E_INVAL;
  }
  snprintf(shown, sizeof shown, "%.*s%s", len > 80 ? 80 : (int)len, ep,
           len > 80 ? "..." : "");
  for (size_t i = 0; shown[i] != '\0'; i++)
    if ((unsigned char)shown[i] < 0x20 || shown[i] == 0x7f)
      shown[i] = '?';
  if (len > 6 && strncmp(ep, "ipc://", 6) == 0) {
    struct sockaddr_un sa;
    if (len - 6 >= sizeof sa.sun_path) {
      snprintf(err, errlen, "'%s': an ipc:// path is at most %zu bytes, this "
               "one is %zu: use a shorter one", shown, sizeof sa.sun_path - 1,
               len - 6);
      return GNMR_E_INVAL;
    }
    return GNMR_OK;
  }
  if (len > 6 && strncmp(ep, "tcp://", 6) == 0) {
    const char *host = ep + 6, *end = ep + len, *colon = NULL;
    for (const char *p = end; p > host; p--)
      if (p[-1] == ':') {
        colon = p - 1;
        break;
      }
    if (colon == NULL || colon == host || colon + 1 == end) {
      snprintf(err, errlen, "'%s' has no HOST:PORT: use tcp://HOST:PORT "
               "(for example tcp://127.0.0.1:5555)", shown);
      return GNMR_E_INVAL;
    }
    const char *port = colon + 1;
    if (bind && end - port == 1 && port[0] == '*')
      return GNMR_OK; /* a port the system picks */
    unsigned long v = 0;
    for (const char *p = port; p < end; p++) {
      if (*p < '0' || *p > '9' || v > 65535) {
        v = 65536;
        break;
      }
      v = v * 10 + (unsigned long)(*p - '0');
    }
    if (v > 65535 || (v == 0 && !bind)) {
      snprintf(err, errlen, "'%s': the port must be a number from %d to "
               "65535", shown, bind ? 0 : 1);
      return GNMR_E_INVAL;
    }
    return GNMR_OK;
  }
  if ((len > 9 && strncmp(ep, "inproc://", 9) == 0) ||
      (bind == 0 && len > 6 && strncmp(ep, "pgm://", 6) == 0))
    return GNMR_OK;
  snprintf(err, errlen, "'%s' is not an endpoint: use %s", shown, forms);
  return GNMR_E_INVAL;
}

int gnmr__endpoint_check(const char *eps, int bind, char *err,
                         size_t errlen) {
  if (eps == NULL || eps[0] == '\0') {
    snprintf(err, errlen, "no endpoint given: use ipc:///path/to/socket or "
             "tcp://HOST:PORT");
    return GNMR_E_INVAL;
  }
  for (const char *p = eps;;) {
    const char *comma = bind ? NULL : strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    int rv = endpoint_one(p, len, bind, err, errlen);
    if (rv != GNMR_OK)
      return rv;
    if (comma == NULL)
      return GNMR_OK;
    p = comma + 1;
  }
}
