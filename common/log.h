/* SPDX-License-Identifier: MIT */
/* log.h — the one logging macro of GNMR's programs (gnmrd, gnmrctl, tools).
 * Libraries never log. The level is checked before any formatting; each line
 * carries a stable message id and goes to stderr (journald adds the time). */
#ifndef GNMR_LOG_H
#define GNMR_LOG_H

enum gnmr__log_level {
  GNMR_LOG_ERROR = 0,
  GNMR_LOG_WARN = 1,
  GNMR_LOG_INFO = 2,
  GNMR_LOG_DEBUG = 3,
};

extern int gnmr__log_level;

/* LOG(WARN, "STORE-OPEN", "open %s: %s", path, msg) */
#define LOG(level, id, ...)                                          \
  do {                                                               \
    if (GNMR_LOG_##level <= gnmr__log_level)                         \
      gnmr__log_write(GNMR_LOG_##level, (id), __VA_ARGS__);          \
  } while (0)

void gnmr__log_write(int level, const char *id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parse "error", "warn", "info" or "debug"; returns 0 or GNMR_E_INVAL. */
int gnmr__log_parse_level(const char *s, int *level);

#endif /* GNMR_LOG_H */
