/* SPDX-License-Identifier: MIT */
/* store_sql.h — the writer's private parts (store.c: the queue and the
 * writer thread). What a record writes is store/store_apply.c's, the
 * schema store/store_migrate.c's, reading a job back
 * store/store_restore.c's. The parameter columns come from
 * store/store_schema.h: the jobs and params tables have one column per
 * parameter, of its name; a new parameter needs a migration
 * (store/store_migrate.c, per backend) adding its two columns. */
#ifndef GNMRD_STORE_SQL_H
#define GNMRD_STORE_SQL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "db.h"
#include "gnmr/params.h"
#include "hmap.h"
#include "latency.h"
#include "owner.h"
#include "store.h"
#include "store_apply.h"
#include "store_migrate.h"

#define STORE_MAX_GAPS 64   /* runs whose dropped steps are told apart */

/* The store (store.c's queue and writer). */
struct store {
  char path[4096];  /* the target: a SQLite file or a PostgreSQL URL */
  char shown[4096]; /* the target as logs show it (no password) */
  uint32_t snapshot_every;
  uint64_t last_run;
  uint8_t seal_key[STORE_SEAL_KEY_BYTES]; /* store__seal_key */
  uint64_t term; /* store__term_next, at open */
  /* the writer thread's connection and statements, and retain_steps */
  store_stmts sql;
  pthread_t thread;
  gnmr_owner loop; /* the thread that opened it: it alone queues */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  store_rec *head, *tail; /* queue, under mu */
  uint64_t queued, queued_bytes;
  uint64_t batch_bytes;     /* the writer's batch, until committed */
  uint64_t fair_batches;    /* batches take_fair made (under mu) */
  uint64_t queue_cap_bytes; /* 0: none */
  int dropping;             /* in a drop episode (logged once) */
  /* per run: the bytes of its records held (queued, or in the writer's
   * batch until committed), so that one run's flood cannot take every
   * other run's room (under mu) */
  hmap run_bytes;
  uint64_t n_runs_held;
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
  /* SQLite: the file opened (device, inode), checked before each batch:
   * a file renamed over it, or removed, would take the history to an
   * unlinked inode nobody can read */
  uint64_t file_dev, file_ino;
  int file_known, file_gone;
};


#endif /* GNMRD_STORE_SQL_H */
