/* SPDX-License-Identifier: MIT */
/* snapshots.c — when a job's policy-state snapshot is taken: due (every
 * snapshot_every steps, records.c), owed (due while the store still
 * holds the job's last large one: deferred), or taken; and a large one
 * serialized early on a worker. jobs.c asks snapshots_due() before each
 * step's record and hands the snapshot taken to snapshots_taken(). Loop
 * thread only.
 *
 * A snapshot's bytes are owed from the step it is taken in (records.c,
 * policy_snap_*). Left to the store's writer, they are written when it
 * comes to them, which is after the commit it is busy with: a large job's
 * next step then finds them unwritten and writes them itself before the
 * engine can change (a million units: about 20 ms on the step's path, and
 * the step after every snapshot twice as long). A snapshot of
 * SNAP_EARLY_MIN bytes or more is therefore written on a worker at once,
 * beside the decision's send and the next report's arrival; the writer and
 * the next step find it done. The task holds only a reference to the
 * snapshot, so the job may end meanwhile.
 *
 * And a job whose snapshots are that large has at most one in the store's
 * hands: a snapshot that comes due while the store has not yet written the
 * job's last one (the job still shares that handle) is owed, and taken
 * after the first step at which the store is done with it. A store slower
 * than the job's snapshots (97 MB every 10 steps of 30 ms is more than
 * some disks write) then spaces them out instead of queueing them: queued,
 * each holds a fresh buffer of its size (a page fault per page to write
 * it) and crowds step records out of the store's bounded queue. Smaller
 * snapshots are taken when due, always. */
#include <stddef.h>
#include <stdlib.h>

#include "jobs_priv.h"
#include "records.h"
#include "snapshots.h"

#define SNAP_EARLY_MIN ((size_t)1 << 20)

typedef struct snap_fill {
  workers_task task;
  policy_snap *snap;
  gnmrd *d;
  struct snap_fill *next;
} snap_fill;

static void fill_run(workers_task *t) {
  snap_fill *f = (snap_fill *)((char *)t - offsetof(snap_fill, task));
  policy_snap_fill(f->snap);
}

static void fill_done(workers_task *t) {
  snap_fill *f = (snap_fill *)((char *)t - offsetof(snap_fill, task));
  snap_fill **p = &f->d->fills;
  while (*p != f)
    p = &(*p)->next;
  *p = f->next;
  policy_snap_free(&f->snap);
  free(f);
}

/* Takes snap (a reference): serialized on a worker when it is large and
 * there are workers, else left to the writer. */
static void fill_early(gnmrd *d, policy_snap *snap) {
  if (snap == NULL)
    return;
  snap_fill *f = NULL;
  if (d->workers == NULL || (f = calloc(1, sizeof *f)) == NULL) {
    policy_snap_free(&snap);
    return;
  }
  d->c.snapshots_early++;
  f->snap = snap;
  f->d = d;
  f->task.run = fill_run;
  f->task.done = fill_done;
  f->next = d->fills;
  d->fills = f;
  workers_submit(d->workers, &f->task);
}

void snapshots_wait(gnmrd *d) {
  while (d->fills != NULL)
    workers_wait(d->workers, &d->fills->task); /* its done unlinks it */
}

int snapshots_due(job *j, uint64_t step) {
  gnmrd *d = j->d;
  if (records_snapshot_due(d->st, j->core, step))
    j->snap_owed = 1;
  if (!j->snap_owed)
    return 0;
  if (j->snap_last != NULL) {
    if (!policy_snap_unshared(j->snap_last)) {
      d->c.snapshots_deferred++; /* the store is still writing the last */
      return 0;
    }
    policy_snap_free(&j->snap_last);
  }
  return 1;
}

void snapshots_taken(job *j, int snap, policy_snap *s) {
  if (snap)
    j->snap_owed = 0; /* taken, or failed (the next due one will try) */
  if (s != NULL && policy_snap_size(s) >= SNAP_EARLY_MIN) {
    j->snap_last = policy_snap_ref(s);
    fill_early(j->d, s);
  } else {
    policy_snap_free(&s);
  }
}

void snapshots_forget(job *j) { policy_snap_free(&j->snap_last); }
