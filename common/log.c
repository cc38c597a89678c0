/* SPDX-License-Identifier: MIT */
/* log.c — writes one formatted line per LOG() call to stderr as
 * "<level> <ID> message", using systemd's <N> priority prefix when stderr is
 * the journal (JOURNAL_STREAM set), so journald files the right priority. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"

int gnmr__log_level = GNMR_LOG_INFO;

static const struct {
  const char *name;
  int syslog_prio;
} log_levels[] = {
    [GNMR_LOG_ERROR] = {"error", 3},
    [GNMR_LOG_WARN] = {"warn", 4},
    [GNMR_LOG_INFO] = {"info", 6},
    [GNMR_LOG_DEBUG] = {"debug", 7},
};

void gnmr__log_write(int level, const char *id, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (getenv("JOURNAL_STREAM") != NULL)
    fprintf(stderr, "<%d>%s %s\n", log_levels[level].syslog_prio, id, msg);
  else
    fprintf(stderr, "%s %s %s\n", log_levels[level].name, id, msg);
}

int gnmr__log_parse_level(const char *s, int *level) {
  for (int i = 0; i < (int)(sizeof log_levels / sizeof log_levels[0]); i++) {
    if (strcmp(s, log_levels[i].name) == 0) {
      *level = i;
      return GNMR_OK;
    }
  }
  return GNMR_E_INVAL;
}
