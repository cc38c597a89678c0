/* SPDX-License-Identifier: MIT */
/* store_query.h — history queries of the store (store_query.c). */
#ifndef GNMRD_STORE_QUERY_H
#define GNMRD_STORE_QUERY_H

#include <jansson.h>
#include <stdint.h>

typedef struct store_query {
  /* in */
  int command;            /* GNMR_CMD_JOBS, _HISTORY, _DECISIONS, _EXPORT */
  const char *job, *unit, *kind; /* "" = any */
  uint64_t from, to;      /* steps; to 0 = no bound */
  uint32_t limit;         /* history rows */
  uint64_t run;           /* the run of the job name; 0: its latest */
  const char *who;        /* tenancy: only jobs this key owns (or that
                             who_jobs matches, or nobody owns); NULL: all */
  const char *who_jobs;   /* fnmatch pattern, or NULL */
  /* out */
  json_t *result;         /* the answer, NULL on error */
  int code;               /* GNMR_OK or the error */
  uint64_t resolved;      /* the run answered for */
  char err[256];
} store_query;

/* Runs q against the database at path. Any thread. */
void store_query_run(const char *path, store_query *q);

#endif /* GNMRD_STORE_QUERY_H */
