/* SPDX-License-Identifier: MIT */
/* records.h — the history records of a job, built from the core's state
 * and outcomes and handed to the store (store_put never waits). With no
 * store (st NULL) each is a no-op. Loop thread only. */
#ifndef GNMRD_RECORDS_H
#define GNMRD_RECORDS_H

#include "core.h"
#include "store.h"

/* An operational event (enum store_op_event); rank or UINT32_MAX. */
void records_event(store *st, const core_job *j, int kind, uint32_t rank,
                   const char *detail);
/* The job's row (started or resumed), and its parameters when a retune
 * changed them from what the agents send. */
void records_job(store *st, const core_job *j);
/* Parameters in force from the next step. */
void records_params(store *st, const core_job *j);
/* A rank's units: (id, name) pairs and its id list. */
void records_rank(store *st, const core_job *j, uint32_t rank);
/* Whether a job's snapshot is due after step: every snapshot_every
 * steps, at a phase set by its run id (0 without a store). */
int records_snapshot_due(store *st, const core_job *j, uint64_t step);
/* A decided step: summary, decision, events with norms and scores and,
 * when snap, the policy state after it. Returns another reference to the
 * snapshot it began (NULL when none), for the caller to serialize early
 * (policy_snap_fill) and release (policy_snap_free). */
policy_snap *records_step(store *st, const core_job *j, const core_outcome *o,
                          uint64_t latency_us, int snap, store_mark *mark);
/* A step of an earlier pass decided before gnmrd restarted, as an agent
 * held its decision (pass, step, active ids ascending): the step's row
 * without norms, counts or events, which went with that gnmrd. */
void records_restored_step(store *st, const core_job *j, uint32_t pass,
                           uint64_t step, const uint32_t *active,
                           size_t n_active, store_mark *mark);
/* The policy state alone (shutdown, finish). */
void records_snapshot(store *st, const core_job *j);
/* The job's state ("finished"). */
void records_state(store *st, const core_job *j, const char *state);

#endif /* GNMRD_RECORDS_H */
