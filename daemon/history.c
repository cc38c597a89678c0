/* SPDX-License-Identifier: MIT */
/* history.c — what a job leaves in the history (see history.h): its
 * records, built from the core's state and outcomes and handed to the
 * store (store_put never waits), and the whole life of its policy-state
 * snapshots. Loop thread only, but for the snapshots serialized early on
 * a worker.
 *
 * A snapshot is due every snapshot_every steps, at a phase set by the
 * run id. Its bytes are owed from the step it is taken in (the policy's
 * handle, policy_snap_*, which also appends the units' id table). Left to
 * the store's writer, they are written when it comes to them, which is
 * after the commit it is busy with: a large job's next step then finds
 * them unwritten and writes them itself before the engine can change (a
 * million units: about 20 ms on the step's path, and the step after every
 * snapshot twice as long). A snapshot of SNAP_EARLY_MIN bytes or more is
 * therefore written on a worker at once, beside the decision's send and
 * the next report's arrival; the writer and the next step find it done.
 * The task holds only a reference to the snapshot, so the job may end
 * meanwhile.
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
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "history.h"

/* A record of job j's current run. */
static store_rec *rec(int kind, const core_job *j) {
  store_rec *r = store_rec_new(kind, j->name);
  if (r != NULL)
    r->run = j->run;
  store_rec_tenant(r, j->owner); /* a tenant's jobs share one share */
  return r;
}

static void put(store *st, store_rec *r) {
  if (r == NULL)
    return;
  if (st == NULL)
    store_rec_free(&r);
  else
    store_put(st, r);
}

void history_event(store *st, const core_job *j, int kind, uint32_t rank,
                   const char *detail) {
  if (st == NULL)
    return;
  store_rec *r = rec(REC_EVENT, j);
  if (r == NULL)
    return;
  r->pass = j->pass;
  r->step = j->last_decided;
  r->rank = rank;
  r->text = strdup(store_op_event_name(kind));
  r->detail = detail ? strdup(detail) : NULL;
  put(st, r);
}

void history_params(store *st, const core_job *j) {
  if (st == NULL)
    return;
  store_rec *r = rec(REC_PARAMS, j);
  if (r == NULL)
    return;
  r->pass = j->pass;
  r->step = j->last_decided + 1;
  r->params = j->params;
  put(st, r);
}

void history_job(store *st, const core_job *j) {
  if (st == NULL)
    return;
  store_rec *r = rec(REC_JOB, j);
  if (r == NULL)
    return;
  r->pass = j->pass;
  r->step = j->last_decided + 1;
  r->reporters = j->reporters;
  r->barrier_ms = j->barrier_ms;
  r->params = j->hello_params;
  r->text = j->owner ? strdup(j->owner) : NULL;
  put(st, r);
  if (!policy_params_equal(&j->params, &j->hello_params))
    history_params(st, j);
}

void history_rank(store *st, const core_job *j, uint32_t rank) {
  if (st == NULL)
    return;
  const core_rank *rr = &j->ranks[rank];
  store_rec *u = rec(REC_UNITS, j);
  store_rec *r = rec(REC_RANK, j);
  size_t n = rr->n_units ? rr->n_units : 1, bytes = 0;
  /* the names copied into one block (a million units: one allocation,
   * not a million strdups on the loop) */
  size_t *len = malloc(n * sizeof *len);
  for (uint32_t i = 0; len != NULL && i < rr->n_units; i++)
    bytes += (len[i] = strlen(j->unit_names[rr->slots[i]]) + 1);
  if (u && r && len && (u->ids = malloc(n * sizeof *u->ids)) &&
      (u->names = calloc(n, sizeof *u->names)) &&
      (u->names_block = malloc(bytes ? bytes : 1)) &&
      (r->ids = malloc(n * sizeof *r->ids))) {
    u->n = r->n = rr->n_units;
    u->names_bytes = bytes;
    r->rank = rank;
    char *at = u->names_block;
    for (uint32_t i = 0; i < rr->n_units; i++) {
      u->ids[i] = r->ids[i] = rr->ids[i];
      memcpy(at, j->unit_names[rr->slots[i]], len[i]);
      u->names[i] = at;
      at += len[i];
    }
    free(len);
    put(st, u);
    put(st, r);
    return;
  }
  free(len);
  store_rec_free(&u);
  store_rec_free(&r);
}

/* A record that owes the job's state as of now: the store's writer
 * serializes it off the loop (policy_snap_*), with the units' id table
 * when ids are sparse; the loop does only when the job changes first, or
 * when no handle can be had (then the export and its table here). */
static store_rec *snapshot_rec(const core_job *j, int kind) {
  store_rec *r = rec(kind, j);
  if (r == NULL)
    return NULL;
  r->pass = j->pass;
  r->step = policy_last_step(j->pol);
  /* the engine's unit u is id unit_id[u] */
  const uint32_t *ids = core_dense(j) ? NULL : j->unit_id;
  if ((r->snap = policy_snap_begin_ids(j->pol, ids, j->n_units)) != NULL)
    return r;
  size_t len = policy_export_size(j->pol);
  size_t extra = ids != NULL ? policy_ids_size(j->n_units) : 0;
  if ((r->snapshot = malloc(len + extra)) == NULL ||
      policy_export(j->pol, r->snapshot, len, &r->snapshot_len) != GNMR_OK) {
    store_rec_free(&r);
    return NULL;
  }
  if (ids != NULL) {
    policy_ids_write((uint8_t *)r->snapshot + r->snapshot_len, ids, j->n_units);
    r->snapshot_len += extra;
  }
  return r;
}

void history_snapshot(store *st, const core_job *j) {
  if (st != NULL)
    put(st, snapshot_rec(j, REC_SNAPSHOT));
}

void history_state(store *st, const core_job *j, const char *state) {
  if (st == NULL)
    return;
  store_rec *r = rec(REC_STATE, j);
  if (r == NULL)
    return;
  r->text = strdup(state);
  put(st, r);
}

static int snapshot_due_now(store *st, const core_job *j, uint64_t step) {
  if (st == NULL)
    return 0;
  /* every `every` steps, at a phase set by the run id: jobs in lockstep
   * (runs created one after another) snapshot in different steps, so the
   * writer gets them in turn, not all at once; a store's first job (run
   * 1) snapshots at multiples of every */
  uint64_t every = store_snapshot_every(st);
  return (step + (j->run > 0 ? (j->run - 1) % every : 0)) % every == 0;
}

/* "1 5 7": the decisions CSV's field (NULL on no memory). */
static char *active_text(const uint32_t *ids, size_t n) {
  char *t = malloc(n * 11 + 1);
  if (t == NULL)
    return NULL;
  size_t off = 0;
  t[0] = '\0';
  for (size_t i = 0; i < n; i++)
    off += (size_t)sprintf(t + off, i ? " %u" : "%u", ids[i]);
  return t;
}

void history_restored_step(store *st, const core_job *j, uint32_t pass,
                           uint64_t step, const uint32_t *active,
                           size_t n_active, store_mark *mark) {
  if (st == NULL)
    return;
  store_rec *r = rec(REC_STEP, j);
  if (r == NULL)
    return;
  r->pass = pass;
  r->step = step;
  r->n = (uint32_t)n_active;
  r->active = active_text(active, n_active);
  r->mark = store_mark_ref(mark);
  /* adopted after this gnmrd may have decided (and queued) later steps:
   * the mark must not pass this one before it is committed */
  store_mark_hold(mark, pass, step);
  r->restored = 1;
  put(st, r);
}

static policy_snap *step_rec(store *st, const core_job *j,
                             const core_outcome *o, uint64_t latency_us,
                             int snap, store_mark *mark) {
  const policy_result *res = &o->res;
  if (st == NULL)
    return NULL;
  store_rec *r = snap ? snapshot_rec(j, REC_STEP) : rec(REC_STEP, j);
  if (r == NULL)
    return NULL;
  r->kind = REC_STEP;
  r->pass = j->pass;
  r->step = o->step;
  r->reports = o->reports;
  r->risky = res->n_risky;
  r->pool = res->n_pool;
  r->n = res->n_active;
  r->missing = o->missing;
  r->by_deadline = (uint32_t)o->by_deadline;
  r->latency_us = latency_us;
  r->mark = store_mark_ref(mark);
  r->active = active_text(o->active_ids, res->n_active);
  if (res->n_events > 0 &&
      (r->events = malloc(res->n_events * sizeof *r->events)) != NULL) {
    r->n_events = res->n_events;
    for (uint32_t i = 0; i < res->n_events; i++) {
      const policy_event *e = &res->events[i];
      store_event *ev = &r->events[i];
      int has_unit = e->unit != UINT32_MAX; /* e->unit is a slot */
      ev->unit = has_unit ? o->unit_id[e->unit] : UINT32_MAX;
      /* a non-finite score that only a rank's recipe measured (an FP8
       * overflow of the low path) is not a NaN gradient */
      ev->kind = e->kind == POLICY_EV_NONFINITE && has_unit &&
                         o->shadowed != NULL && o->shadowed[e->unit]
                     ? POLICY_EV_SHADOWED
                     : e->kind;
      ev->outcome = e->outcome;
      ev->count = e->count;
      ev->norm = has_unit && o->input[e->unit] == POLICY_REPORTED
                     ? o->norm[e->unit]
                     : NAN;
      ev->g = has_unit ? res->g[e->unit] : NAN;
      ev->d = has_unit ? res->d[e->unit] : NAN;
      ev->s = has_unit ? res->s[e->unit] : NAN;
      ev->signal = e->signal;
      ev->x = has_unit && o->measure ? o->measure[e->unit] : NAN;
      ev->gm = has_unit && res->gm ? res->gm[e->unit] : NAN;
      ev->dm = has_unit && res->dm ? res->dm[e->unit] : NAN;
    }
  }
  policy_snap *early = policy_snap_ref(r->snap); /* NULL when none */
  put(st, r);
  return early;
}

/* ---- snapshots -------------------------------------------------------- */

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

void history_wait(gnmrd *d) {
  while (d->fills != NULL)
    workers_wait(d->workers, &d->fills->task); /* its done unlinks it */
}

/* Whether step's record takes a snapshot: due now or owed from before,
 * unless the store still holds the job's last large one (deferred,
 * counted). */
static int snapshot_due(job *j, uint64_t step) {
  gnmrd *d = j->d;
  if (snapshot_due_now(d->st, j->core, step))
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

/* After the record: snap as snapshot_due() said, s the snapshot it took
 * (a reference, or NULL), kept while the store writes it if it is large
 * and serialized on a worker at once. */
static void snapshot_taken(job *j, int snap, policy_snap *s) {
  if (snap)
    j->snap_owed = 0; /* taken, or failed (the next due one will try) */
  if (s != NULL && policy_snap_size(s) >= SNAP_EARLY_MIN) {
    j->snap_last = policy_snap_ref(s);
    fill_early(j->d, s);
  } else {
    policy_snap_free(&s);
  }
}

void history_step(job *j, const core_outcome *o, uint64_t latency_us) {
  gnmrd *d = j->d;
  if (d->st == NULL)
    return;
  int snap = snapshot_due(j, o->step);
  snapshot_taken(j, snap,
                 step_rec(d->st, j->core, o, latency_us, snap, j->mark));
}

void history_forget(job *j) { policy_snap_free(&j->snap_last); }
