/* SPDX-License-Identifier: MIT */
/* records.c — a job's history records (see records.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "records.h"

/* A record of job j's current run. */
static store_rec *rec(int kind, const core_job *j) {
  store_rec *r = store_rec_new(kind, j->name);
  if (r != NULL)
    r->run = j->run;
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

void records_event(store *st, const core_job *j, int kind, uint32_t rank,
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

void records_params(store *st, const core_job *j) {
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

void records_job(store *st, const core_job *j) {
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
    records_params(st, j);
}

void records_rank(store *st, const core_job *j, uint32_t rank) {
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
 * serializes it off the loop (policy_snap_*); the loop does only when the
 * job changes first, or when no handle can be had. */
static store_rec *snapshot_rec(const core_job *j, int kind) {
  store_rec *r = rec(kind, j);
  if (r == NULL)
    return NULL;
  r->pass = j->pass;
  r->step = policy_last_step(j->pol);
  if (!core_dense(j)) { /* the engine's unit u is id unit_id[u] */
    if ((r->snap_ids = malloc((size_t)j->n_units * sizeof *r->snap_ids)) ==
        NULL) {
      store_rec_free(&r);
      return NULL;
    }
    memcpy(r->snap_ids, j->unit_id, (size_t)j->n_units * sizeof *r->snap_ids);
    r->n_snap_ids = j->n_units;
  }
  /* room for the id table that the writer appends (store.c) */
  size_t room = r->snap_ids ? policy_ids_size(r->n_snap_ids) : 0;
  if ((r->snap = policy_snap_begin_room(j->pol, room)) != NULL)
    return r;
  size_t len = policy_export_size(j->pol);
  if ((r->snapshot = malloc(len)) == NULL ||
      policy_export(j->pol, r->snapshot, len, &r->snapshot_len) != GNMR_OK) {
    store_rec_free(&r);
    return NULL;
  }
  return r;
}

void records_snapshot(store *st, const core_job *j) {
  if (st != NULL)
    put(st, snapshot_rec(j, REC_SNAPSHOT));
}

void records_state(store *st, const core_job *j, const char *state) {
  if (st == NULL)
    return;
  store_rec *r = rec(REC_STATE, j);
  if (r == NULL)
    return;
  r->text = strdup(state);
  put(st, r);
}

int records_snapshot_due(store *st, const core_job *j, uint64_t step) {
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

void records_restored_step(store *st, const core_job *j, uint32_t pass,
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

policy_snap *records_step(store *st, const core_job *j,
                          const core_outcome *o, uint64_t latency_us,
                          int snap, store_mark *mark) {
  const policy_result *res = &o->res;
  if (st == NULL)
    return NULL;
  store_rec *r = snap ? snapshot_rec(j, REC_STEP)
                      : rec(REC_STEP, j);
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
    }
  }
  policy_snap *early = policy_snap_ref(r->snap); /* NULL when none */
  put(st, r);
  return early;
}
