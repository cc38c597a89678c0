/* SPDX-License-Identifier: MIT */
/* store_query.h — history queries of the store (store_query.c). */
#ifndef GNMRD_STORE_QUERY_H
#define GNMRD_STORE_QUERY_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>

struct db;
typedef struct store_query store_query;
struct store_query {
  /* in */
  int command;            /* GNMR_CMD_JOBS, _HISTORY, _DECISIONS, _EXPORT */
  const char *job, *unit, *kind; /* "" = any */
  uint64_t from, to;      /* steps; to 0 = no bound */
  uint32_t limit;         /* history rows */
  uint64_t run;           /* the run of the job name; 0: its latest */
  const char *who;        /* tenancy: only jobs this key owns (or that
                             who_jobs matches, or nobody owns); NULL: all */
  const char *who_jobs;   /* fnmatch pattern, or NULL */
  /* set by another thread when nobody waits for the answer any more (its
   * client is gone): the query stops at its next rows, GNMR_E_CLOSED;
   * NULL: never */
  const atomic_int *cancel;
  /* export streams: the answer comes as JSON text in chunks of about
   * STORE_EXPORT_CHUNK bytes; the query keeps its connection and cursor
   * between them (any thread, one at a time) */
  struct db *db;
  struct db_stmt *cursor;
  int section;
  uint64_t section_rows;  /* rows of the current section so far */
  json_t *stats;          /* the unit_stats section (view's units) */
  size_t stats_at;        /* its next element */
  char *chunk;            /* out: this chunk's text (the caller frees) */
  size_t chunk_len;
  int more;               /* out: another chunk follows */
  /* out */
  json_t *result;         /* the answer, NULL on error */
  int code;               /* GNMR_OK or the error */
  uint64_t resolved;      /* the run answered for */
  char err[256];
  /* status, units, top: a job's view from the store (gnmrd's
   * store_view_job, linked by gnmrctl too); NULL: the query fails */
  json_t *(*view)(store_query *q, struct db *db);
};

/* The run asked for (q->run, or the name's latest) into q->resolved; 0
 * with q->err set when there is none (or it is another tenant's). */
int store_query_resolve(store_query *q, struct db *db);
void store_query_fail(store_query *q, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The SQL of a history query (parameters ?1 run, ?2..?3 steps, ?4 unit id,
 * ?5 kind, ?6 limit), with the unit and kind filters or without: for
 * EXPLAIN QUERY PLAN in the tests. Returns buf. */
const char *store_query_history_sql(int by_unit, int by_kind, char *buf,
                                    size_t cap);
/* The SQL of a decisions query (?1 run, ?2..?3 steps), for the same. */
const char *store_query_decisions_sql(void);

#define STORE_EXPORT_CHUNK (1u << 20)
/* An export's unit_stats for runs of at most this many units (null for
 * larger ones: the snapshot's view is built whole) */
#define STORE_EXPORT_STATS_MAX (1u << 16)

/* Ends an export stream early (its connection and cursor). */
void store_query_clear(store_query *q);

/* Runs q against the database at path (a SQLite file or a PostgreSQL
 * URL: store_target). Any thread. An export answers in
 * chunk (not result); while more is set, running q again gives the next
 * chunk. */
void store_query_run(const char *path, store_query *q);

#endif /* GNMRD_STORE_QUERY_H */
