/* SPDX-License-Identifier: MIT */
/* history.h — what a job leaves in the history (history.c): its records,
 * built from the core's state and outcomes and handed to the store
 * (store_put never waits), and its policy-state snapshots, whose whole
 * life (due, owed, deferred, serialized early on a worker, written with
 * their id table) is history.c's. With no store (st NULL) each is a
 * no-op. Loop thread only. */
#ifndef GNMRD_HISTORY_H
#define GNMRD_HISTORY_H

#include <stdint.h>

#include "core.h"
#include "jobs_priv.h"
#include "store.h"

/* A decided step: its summary, decision, events with norms and scores
 * and, when one is due (or owed and the store is done with the last), the
 * policy state after it. Queued before any rank is sent the decision, so
 * a crash after a send never leaves an acted-on decision out. */
void history_step(job *j, const core_outcome *o, uint64_t latency_us);
/* An operational event (enum store_op_event); rank or UINT32_MAX. */
void history_event(store *st, const core_job *j, int kind, uint32_t rank,
                   const char *detail);
/* The job's row (started or resumed), and its parameters when a retune
 * changed them from what the agents send. */
void history_job(store *st, const core_job *j);
/* Parameters in force from the next step. */
void history_params(store *st, const core_job *j);
/* A rank's units: (id, name) pairs and its id list. */
void history_rank(store *st, const core_job *j, uint32_t rank);
/* A step of an earlier pass decided before gnmrd restarted, as an agent
 * held its decision (pass, step, active ids ascending): the step's row
 * without norms, counts or events, which went with that gnmrd. */
void history_restored_step(store *st, const core_job *j, uint32_t pass,
                           uint64_t step, const uint32_t *active,
                           size_t n_active, store_mark *mark);
/* The policy state alone (shutdown, finish). */
void history_snapshot(store *st, const core_job *j);
/* The job's state ("finished"). */
void history_state(store *st, const core_job *j, const char *state);
/* A job ends: its last snapshot is the store's alone. */
void history_forget(job *j);
/* Waits for the snapshots being serialized on workers (before
 * workers_close). */
void history_wait(gnmrd *d);

#endif /* GNMRD_HISTORY_H */
