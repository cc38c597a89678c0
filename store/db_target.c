/* SPDX-License-Identifier: MIT */
/* db_target.c — a store's target string (db.h): which backend it names,
 * and how it is shown with its password masked. Below db.c and the
 * backends: it calls neither. */
#include <stdio.h>
#include <string.h>

#include "db.h"

int db_target_is_pg(const char *target) {
  return target != NULL && (strncmp(target, "postgresql://", 13) == 0 ||
                            strncmp(target, "postgres://", 11) == 0);
}

void db_target_display(const char *target, char *out, size_t cap) {
  if (cap == 0)
    return;
  if (!db_target_is_pg(target)) {
    snprintf(out, cap, "%s", target ? target : "");
    return;
  }
  /* scheme://[user[:password]@]host...: the password is masked */
  const char *auth = strstr(target, "://") + 3;
  const char *at = strchr(auth, '@');
  const char *slash = strchr(auth, '/');
  const char *colon = strchr(auth, ':');
  if (at != NULL && (slash == NULL || at < slash) && colon != NULL &&
      colon < at)
    snprintf(out, cap, "%.*s:***%s", (int)(colon - target), target, at);
  else
    snprintf(out, cap, "%s", target);
  /* a password=... parameter is masked too */
  char *pw = strstr(out, "password=");
  if (pw != NULL) {
    char *end = strchr(pw, '&');
    char tail[512] = "";
    if (end != NULL)
      snprintf(tail, sizeof tail, "%s", end);
    snprintf(pw, cap - (size_t)(pw - out), "password=***%s", tail);
  }
}
