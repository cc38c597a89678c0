/* SPDX-License-Identifier: MIT */
/* store_rec.h — one record of the history as gnmrd hands it to the store:
 * a job, its units and ranks, a decided step with its events and
 * snapshot, an operational event, a state change, parameters, a snapshot.
 * gnmrd builds them (daemon/history.c) and queues them (daemon/store.c);
 * store_apply.c writes them to the schema. */
#ifndef GNMR_STORE_REC_H
#define GNMR_STORE_REC_H

#include <stddef.h>
#include <stdint.h>

#include "policy.h"

/* How far a run's history is committed (daemon/store.h): a record of a
 * step carries its run's mark, advanced by the writer once committed. */
typedef struct store_mark store_mark;

enum store_rec_kind {
  REC_JOB = 1,   /* job started or resumed: reporters, barrier, params */
  REC_UNITS,     /* units (id, name) of a job */
  REC_RANK,      /* the unit ids of one rank, in its Hello order */
  REC_STEP,      /* a decided step: summary, decision, events, snapshot */
  REC_EVENT,     /* an operational event (agent joined, params changed...) */
  REC_STATE,     /* job state change (running, finished) */
  REC_PARAMS,    /* parameters in force from step `step` on */
  REC_SNAPSHOT,  /* a policy-state snapshot alone (at shutdown) */
};

/* One policy event as stored. */
typedef struct store_event {
  uint32_t unit; /* UINT32_MAX: job-wide */
  uint8_t kind;  /* enum policy_event_kind */
  uint8_t outcome;
  uint8_t signal; /* EXCEED: enum policy_signal bits (0: none) */
  uint32_t count;
  double norm, g, d, s;
  double x, gm, dm; /* EXCEED with the measured rule on: the unit's measure,
                       its ratio and Delta ratio (NaN: none) */
} store_event;

/* A record: built on the loop thread, owned by the store once put. Fields
 * not used by a kind stay zero. */
typedef struct store_rec {
  struct store_rec *next;
  int kind;
  uint64_t share; /* whose fair share of the writer it takes: its job's
                     tenant (store_rec_tenant), else its job name's */
  uint64_t held; /* the bytes the store's queue counts for it (store.c) */
  char *job;
  uint64_t run;          /* the run of the job (never reused) */
  uint32_t pass;
  uint64_t step;
  /* REC_JOB */
  uint32_t reporters, barrier_ms;
  policy_params params; /* REC_JOB, REC_PARAMS */
  /* REC_UNITS / REC_RANK */
  uint32_t rank, n;
  uint32_t *ids;
  char **names;
  char *names_block;  /* when set, names point into it (one allocation of
                         names_bytes, the names NUL-ended in turn) */
  size_t names_bytes;
  /* REC_STEP */
  uint32_t reports, risky, pool, missing, by_deadline;
  uint64_t latency_us;
  char *active;          /* "1 5 7": the decisions CSV's field */
  store_event *events;
  uint32_t n_events;
  void *snapshot; /* policy_export() bytes, then the units' id
                     table when they are not 0..n-1
                     (policy_ids_split), or NULL */
  size_t snapshot_len;
  policy_snap *snap;     /* or the snapshot still owed: the writer takes
                            it (policy_snap_take) before its batch */
  store_mark *mark;      /* REC_STEP: the run's mark, advanced once the
                            record is committed (a reference, or NULL) */
  int restored;          /* REC_STEP: a decision an agent handed back after
                            a restart: stored only where the history
                            lacks the step, and holding the mark back
                            (store_mark_hold) until it is freed */
  /* REC_EVENT / REC_STATE */
  char *text;            /* event kind, state, or (REC_JOB) the owner */
  char *detail;
} store_rec;

#endif /* GNMR_STORE_REC_H */
