/* SPDX-License-Identifier: MIT */
/* store_sql.h — the writer's private parts, shared by store.c (the
 * writer thread), store_apply.c (the statements; the schema is
 * store/store_migrate.c's),
 * store_restore.c and store_view.c (reading a job back). The parameter
 * columns come from store/store_schema.h: the jobs and params tables have
 * one column per parameter, of its name; a new parameter needs a
 * migration (store/store_migrate.c, per backend) adding its two columns. */
#ifndef GNMRD_STORE_SQL_H
#define GNMRD_STORE_SQL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "db.h"
#include "gnmr/params.h"
#include "latency.h"
#include "store.h"
#include "store_migrate.h"

#define STORE_EVENT_ROWS 64 /* events per INSERT */
#define STORE_MAX_GAPS 64   /* runs whose dropped steps are told apart */

/* The store (store.c's writer, store_apply.c's statements). */
struct store {
  char path[4096];  /* the target: a SQLite file or a PostgreSQL URL */
  char shown[4096]; /* the target as logs show it (no password) */
  uint32_t snapshot_every;
  uint64_t last_run;
  uint64_t retain_steps;
  db_conn *db; /* the writer thread's connection */
  /* the step path's statements, prepared once (writer thread) */
  db_stmt *st_step, *st_last;
  db_stmt *st_events[STORE_EVENT_ROWS + 1]; /* by rows per statement */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  store_rec *head, *tail; /* queue, under mu */
  uint64_t queued, queued_bytes;
  uint64_t batch_bytes;     /* the writer's batch, until committed */
  uint64_t queue_cap_bytes; /* 0: none */
  int dropping;             /* in a drop episode (logged once) */
  /* what was dropped, per run, until the queue takes records again: then
   * each becomes a history_gap event naming the steps (under mu) */
  struct store_gap {
    char *job;
    uint64_t run, pass, first, last, records;
  } gaps[STORE_MAX_GAPS];
  size_t n_gaps;
  int stop;
  atomic_uint_fast64_t records, batches, errors, dropped;
  atomic_uint_fast64_t commit_buckets[LATENCY_N_BUCKETS], commit_ns; /* commit times */
  /* Test hook (SQLite): GNMR_STORE_FAULT=full:T or readonly:T makes the
   * database full (max_page_count pinned to its size: SQLITE_FULL) or
   * read-only (query_only: SQLITE_READONLY) for T ms after open, so that
   * commits fail with SQLite's own errors and the retry path runs for
   * real. (PostgreSQL's tests make the server itself refuse.) */
  db_fault *fault; /* tests: GNMR_STORE_FAULT (db.h) */
  int corrupt; /* a damaged SQLite file: records are dropped (writer) */
};


/* store_apply.c: the records applied to the schema (writer thread) */
int64_t store__now_ms(void);
/* Applies one record (inside the caller's transaction). */
int store__apply(store *s, const store_rec *r);
/* Drops a run's history older than retain_steps behind step. */
int store__retain(store *s, uint64_t run, uint64_t step);

#endif /* GNMRD_STORE_SQL_H */
