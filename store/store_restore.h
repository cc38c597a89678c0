/* SPDX-License-Identifier: MIT */
/* store_restore.h — reading a job back from the history: the unfinished
 * jobs at gnmrd's start (store_restore), every name's owner
 * (store_owners), and one job's units, ranks, parameters and newest
 * snapshot (store__load_job, also for a finished job's views). */
#ifndef GNMR_STORE_RESTORE_H
#define GNMR_STORE_RESTORE_H

#include <stddef.h>
#include <stdint.h>

#include "db.h"
#include "params.h"

/* A step the history holds: (pass, step). */
typedef struct store_kept {
  uint32_t pass;
  uint64_t step;
} store_kept;

/* How many of a run's newest steps a restore reads (store_job.kept): twice
 * what agents hold back (GNMR_MAX_HELD), so that every decision an agent
 * can hand back is either among them or older than all of them. */
#define STORE_KEPT_MAX 2048u

/* A job to restore: what the store knew at its last commit. */
typedef struct store_job {
  char *name;
  uint64_t run;
  uint32_t reporters, barrier_ms, pass;
  policy_params params;       /* in force at the snapshot */
  policy_params hello_params; /* what agents send in Hello */
  uint32_t n_units;
  uint32_t *unit_ids;         /* the units' ids and names, any order */
  char **unit_names;
  uint32_t n_ranks;           /* = reporters */
  uint32_t *rank_n;           /* units per rank, 0 = never joined */
  uint32_t **rank_ids;
  void *snapshot;             /* NULL when none was taken */
  size_t snapshot_len;
  char *owner;                /* the CURVE key that created it, or NULL */
  uint64_t last_step;         /* the newest committed step of its pass
                                 (0: none), at or after the snapshot's */
  uint32_t kept_pass;         /* the newest step the history holds, of any
                                 pass ((0, 0): none). The job row's pass can */
  uint64_t kept_step;         /* be newer: a restart commits it before the
                                 steps it adopts from agents */
  store_kept *kept;           /* the newest steps it holds, at most
                                 STORE_KEPT_MAX, ascending by (pass, step): */
  uint32_t n_kept;            /* not a prefix of the run (decisions restored
                                 from agents commit after later steps) */
} store_job;

/* Reads every unfinished job. Calls fn for each (fn takes nothing; the
 * store_job is freed after fn returns). Returns 0 or GNMR_E_STORE. */
/* Calls fn(name, owner, ctx) for every run with an owner, oldest run first
 * (start-up: the first owner of a name stays its owner, hello.c). */
int store_owners(const char *where,
                 void (*fn)(const char *name, const char *owner, void *ctx),
                 void *ctx, char *err, size_t errlen);
int store_restore(const char *where, void (*fn)(const store_job *, void *),
                  void *ctx, char *err, size_t errlen);

/* The newest run id of the store (0: none yet) into *run: GNMR_OK or
 * GNMR_E_STORE. */
int store_newest_run(db_conn *db, uint64_t *run);
/* Run run's job row into j (run, reporters, barrier_ms, pass, n_ranks,
 * hello_params) and its state ("running", "finished", ...) into state:
 * GNMR_OK, GNMR_E_NOJOB (no such run) or GNMR_E_STORE. */
int store_job_row(db_conn *db, uint64_t run, store_job *j, char *state,
                  size_t cap);
/* The newest run of job `name` in the store at target (store_target's
 * path) into j (as store_restore gives it, name and owner included) and its
 * state ("running", "finished", ...) into state: GNMR_OK, GNMR_E_NOJOB (the
 * history has no run of that name) or GNMR_E_STORE (message in err). Opens its
 * own reader: any thread (gnmrd calls it on libuv's pool, for a resume after
 * the run ended). Free j with store__job_clear. */
int store_load_newest(const char *target, const char *name, store_job *j,
                      char *state, size_t cap, char *err, size_t errlen);
/* Loads a job's units, ranks, parameters in force and newest snapshot
 * into j (name, run, reporters and hello_params set by the caller); free
 * with store__job_clear. */
int store__load_job(db_conn *db, store_job *j);
void store__job_clear(store_job *j);
/* The parameter columns at at..at+GNMR_NPARAMS-1 (NULL: unset). */
void store__read_params(db_stmt *st, int at, policy_params *p);

#endif /* GNMR_STORE_RESTORE_H */
