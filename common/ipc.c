/* SPDX-License-Identifier: MIT */
/* ipc.c — checks on ipc:// endpoints (ipc.h). */
#include "ipc.h"

#include <errno.h>
#include <stdio.h>
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

int gnmr__ipc_dir_check(const char *ep, char *err, size_t errlen) {
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
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    snprintf(err, errlen, "%s belongs to uid %u, not to this user (uid %u) "
             "or root: its owner could sit between gnmrd and its peers",
             dir, (unsigned)st.st_uid, (unsigned)geteuid());
    return GNMR_E_INVAL;
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
    snprintf(err, errlen, "%s is writable by others (mode %04o): they could "
             "replace the socket; chmod go-w it", dir,
             (unsigned)(st.st_mode & 07777));
    return GNMR_E_INVAL;
  }
  return GNMR_OK;
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
