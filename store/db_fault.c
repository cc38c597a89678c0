/* SPDX-License-Identifier: MIT */
/* db_fault.c — the store's test-only fault window (GNMR_STORE_FAULT, db.h):
 * a SQLite database made read-only or full for a while, through db.h's
 * own calls. Above the backends: db.c and they never call it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "db.h"
#include "gnmr/error.h"

struct db_fault {
  int64_t until_ms; /* CLOCK_REALTIME ms */
  int readonly, lifted;
  char *while_path; /* readonly-while: read-only while this file exists */
};

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

db_fault *db_fault_from_env(char *what, size_t cap) {
  const char *spec = getenv("GNMR_STORE_FAULT");
  if (spec == NULL)
    return NULL;
  if (strncmp(spec, "readonly-while:", 15) == 0) {
    if (spec[15] != '/')
      return NULL; /* an absolute path, or nothing */
    db_fault *f = calloc(1, sizeof *f);
    if (f == NULL || (f->while_path = strdup(spec + 15)) == NULL) {
      free(f);
      return NULL;
    }
    f->readonly = 1;
    snprintf(what, cap, "read-only while %.200s exists", f->while_path);
    return f;
  }
  const char *colon = strchr(spec, ':');
  long long ms = colon ? atoll(colon + 1) : 0;
  int ro = strncmp(spec, "readonly:", 9) == 0;
  if (ms <= 0 || (!ro && strncmp(spec, "full:", 5) != 0))
    return NULL;
  db_fault *f = calloc(1, sizeof *f);
  if (f == NULL)
    return NULL;
  f->readonly = ro;
  f->until_ms = now_ms() + ms;
  snprintf(what, cap, "%s for %lld ms", ro ? "read-only" : "full", ms);
  return f;
}

void db_fault_tick(db_fault *f, db_conn *d) {
  char pragma[96];
  if (f == NULL || f->lifted || d == NULL || d->kind != DB_SQLITE)
    return;
  int on = f->while_path != NULL ? access(f->while_path, F_OK) == 0
                                 : now_ms() < f->until_ms;
  if (f->readonly) {
    snprintf(pragma, sizeof pragma, "PRAGMA query_only=%d", on);
  } else if (on) {
    db_stmt *pc;
    long long pages = 1;
    if (db_prepare(d, "PRAGMA page_count", &pc) == GNMR_OK) {
      if (db_step(pc) == DB_ROW)
        pages = db_column_int64(pc, 0);
      db_finalize(pc);
    }
    snprintf(pragma, sizeof pragma, "PRAGMA max_page_count=%lld", pages);
  } else {
    snprintf(pragma, sizeof pragma, "PRAGMA max_page_count=4294967294");
  }
  f->lifted = !on && f->while_path == NULL; /* a file can come back */
  db_exec(d, pragma);
}

void db_fault_free(db_fault **f) {
  if (*f != NULL)
    free((*f)->while_path);
  free(*f);
  *f = NULL;
}

