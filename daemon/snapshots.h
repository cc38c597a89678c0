/* SPDX-License-Identifier: MIT */
/* snapshots.h — when a job's policy-state snapshot is taken
 * (snapshots.c). Loop thread only. */
#ifndef GNMRD_SNAPSHOTS_H
#define GNMRD_SNAPSHOTS_H

#include <stdint.h>

#include "jobs_priv.h"

/* Whether step's record takes a snapshot: due now or owed from before,
 * unless the store still holds the job's last large one (deferred,
 * counted). */
int snapshots_due(job *j, uint64_t step);
/* After the record: snap as snapshots_due() said, s the snapshot it took
 * (a reference, or NULL), kept while the store writes it if it is large
 * and serialized on a worker at once. */
void snapshots_taken(job *j, int snap, policy_snap *s);
/* A job ends: its last snapshot is the store's alone. */
void snapshots_forget(job *j);
/* Waits for the snapshots being serialized on workers (before
 * workers_close). */
void snapshots_wait(gnmrd *d);

#endif /* GNMRD_SNAPSHOTS_H */
