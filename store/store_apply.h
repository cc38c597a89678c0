/* SPDX-License-Identifier: MIT */
/* store_apply.h — writing records (store_rec.h) to the schema
 * (store_migrate.c): one connection's prepared statements and what each
 * record kind inserts or updates. gnmrd's writer thread (daemon/store.c)
 * owns a store_stmts and calls these inside its batch's transaction. */
#ifndef GNMR_STORE_APPLY_H
#define GNMR_STORE_APPLY_H

#include <stdint.h>

#include "db.h"
#include "store_rec.h"

#define STORE_EVENT_ROWS 64 /* events per INSERT */

/* A connection and the step path's statements, prepared once on first
 * use; retain_steps: history kept per run (0: all). */
typedef struct store_stmts {
  db_conn *db;
  uint64_t retain_steps;
  db_stmt *st_step, *st_restored, *st_last;
  db_stmt *st_events[STORE_EVENT_ROWS + 1]; /* by rows per statement */
  /* PostgreSQL: the batch's step events as COPY rows (db_copy_in), sent
   * by store__flush before anything reads or deletes events and before
   * the commit */
  char *copy;
  size_t copy_len, copy_cap;
} store_stmts;

/* The wall clock in ms, as the history's `at` columns hold it. */
int64_t store__now_ms(void);
/* Applies one record (inside the caller's transaction). */
int store__apply(store_stmts *s, const store_rec *r);
/* Sends the events store__apply kept as COPY rows (PostgreSQL; nothing
 * to send elsewhere). */
int store__flush(store_stmts *s);
/* Forgets rows kept and not sent (a batch begins again after a failed
 * one). */
void store__discard(store_stmts *s);
/* Drops a run's history older than retain_steps behind step. */
int store__retain(store_stmts *s, uint64_t run, uint64_t step);
/* Finalizes the prepared statements (the connection stays open). */
void store__stmts_finalize(store_stmts *s);

#endif /* GNMR_STORE_APPLY_H */
