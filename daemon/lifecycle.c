/* SPDX-License-Identifier: MIT */
/* lifecycle.c — how jobs end and come back: finished (every rank said
 * Bye, or gnmrctl finish), retired (no report for [limits] job_idle_s),
 * freed at shutdown, restored at start from the store, snapshotted, and
 * retuned (gnmrctl set). Loop thread only. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "history.h"
#include "jobs_priv.h"
#include "log.h"
#include "text.h"
#include "validate.h"

/* Ends a job. Its history and final state stay in the store. */
void lifecycle__finish(job *j, int how) {
  gnmrd *d = j->d;
  core_job *c = j->core;
  jobs__quiesce(j); /* its last step is recorded before it ends */
  int retired = how == FINISH_IDLE;
  LOG(INFO, retired ? "JOB-RETIRE" : "JOB-FINISH", "job %s %s at step %llu",
      c->name, retired                 ? "retired, no report for [limits] "
                                         "job_idle_s,"
               : how == FINISH_OPERATOR ? "finished by gnmrctl finish"
               : how == FINISH_FRESH    ? "ended: a fresh start under its "
                                          "name, its processes gone,"
                                        : "finished",
      (unsigned long long)c->last_decided);
  history_event(d->st, c,
                retired ? STORE_EV_JOB_RETIRED : STORE_EV_JOB_FINISHED,
                UINT32_MAX,
                how == FINISH_OPERATOR ? "gnmrctl finish"
                : how == FINISH_FRESH  ? "a fresh start under its name"
                                       : NULL);
  history_snapshot(d->st, c);
  history_state(d->st, c, retired ? "retired" : "finished");
  uint64_t was; /* the newest run of the name this gnmrd ended */
  if (!hmap_get(&d->ended, c->name, strlen(c->name), &was) || was < c->run)
    (void)hmap_put(&d->ended, c->name, strlen(c->name), c->run);
  if (retired)
    d->c.jobs_retired++;
  else
    d->c.jobs_finished++;
  jobs__free(&j);
}

void lifecycle_finish(gnmrd *d, core_job *c) {
  assert(job_of(c)->d == d);
  lifecycle__finish(job_of(c), FINISH_OPERATOR);
}

static void sweep_cb(uv_timer_t *t) {
  gnmrd *d = t->data;
  uint64_t idle_ms = d->cfg->job_idle_s * 1000, now = uv_now(d->loop);
  size_t pos = 0, n = 0;
  core_job *c;
  job **old = malloc((core_count(&d->jobs) + 1) * sizeof *old);
  while (old != NULL && (c = core_next_job(&d->jobs, &pos)) != NULL)
    if (now - job_of(c)->last_report_ms >= idle_ms)
      old[n++] = job_of(c);
  for (size_t i = 0; i < n; i++) /* lifecycle__finish() edits d->jobs */
    lifecycle__finish(old[i], FINISH_IDLE);
  free(old);
}

void lifecycle_start(gnmrd *d) {
  uv_timer_init(d->loop, &d->lease_wait);
  d->lease_wait.data = d;
  uv_timer_init(d->loop, &d->sweep);
  d->sweep.data = d;
  if (d->cfg == NULL || d->cfg->job_idle_s == 0)
    return;
  uint64_t every = d->cfg->job_idle_s * 1000 / 4;
  every = every < 100 ? 100 : every > 10000 ? 10000 : every;
  uv_timer_start(&d->sweep, sweep_cb, every, every);
  uv_unref((uv_handle_t *)&d->sweep);
}

void lifecycle_shutdown(gnmrd *d) {
  size_t pos = 0;
  core_job *c;
  jobs_quiesce_all(d);
  history_wait(d);
  job **all = malloc((core_count(&d->jobs) + 1) * sizeof *all);
  size_t n = 0;
  while (all != NULL && (c = core_next_job(&d->jobs, &pos)) != NULL)
    all[n++] = job_of(c);
  for (size_t i = 0; i < n; i++) /* jobs__free() edits d->jobs */
    jobs__free(&all[i]);
  free(all);
  core_registry_clear(&d->jobs);
  uint64_t v;
  pos = 0;
  while (hmap_next(&d->peers, &pos, NULL, NULL, &v))
    free((peer *)(uintptr_t)v);
  hmap_clear(&d->peers);
  pos = 0;
  while (hmap_next(&d->owners, &pos, NULL, NULL, &v))
    free((char *)(uintptr_t)v);
  hmap_clear(&d->owners);
  hmap_clear(&d->ended);
}

/* ---- names and owners ----------------------------------------------------- */

const char *lifecycle_name_owner(const gnmrd *d, const char *name) {
  uint64_t v;
  return hmap_get(&d->owners, name, strlen(name), &v)
             ? (const char *)(uintptr_t)v
             : NULL;
}

int lifecycle_name_claim(gnmrd *d, const char *name, const char *owner) {
  if (owner == NULL || lifecycle_name_owner(d, name) != NULL)
    return GNMR_OK;
  char *o = strdup(owner);
  if (o == NULL ||
      hmap_put(&d->owners, name, strlen(name), (uint64_t)(uintptr_t)o) !=
          GNMR_OK) {
    free(o);
    return GNMR_E_NOMEM;
  }
  return GNMR_OK;
}

void lifecycle_owner_restore(const char *name, const char *owner, void *ctx) {
  gnmrd *d = ctx;
  char esc[600];
  if (lifecycle_name_claim(d, name, owner) != GNMR_OK)
    LOG(ERROR, "OWNER-RESTORE", "job %s: out of memory; its name is not "
        "reserved for its owner until gnmrd restarts",
        gnmr__escape(name, esc, sizeof esc));
}

/* ---- restore, snapshots, retuning -------------------------------------------- */

void lifecycle_restore(const store_job *sj, void *ctx) {
  lifecycle__restore_as(ctx, sj, "gnmrd restarted");
}

job *lifecycle__restore_as(gnmrd *d, const store_job *sj, const char *cause) {
  char why[96], esc[600];
  /* names are checked where they enter; an older gnmrd did not check */
  int ok = gnmr__name_check(sj->name, GNMR_MAX_JOB_NAME, why, sizeof why);
  for (uint32_t u = 0; ok && u < sj->n_units; u++)
    ok = sj->unit_names[u] == NULL ||
         gnmr__name_check(sj->unit_names[u], GNMR_MAX_UNIT_NAME, why,
                          sizeof why);
  if (!ok) {
    LOG(ERROR, "JOB-RESTORE", "job %s: not restored, a name is invalid (%s);"
        " its history stays queryable", gnmr__escape(sj->name, esc,
                                                     sizeof esc), why);
    return NULL;
  }
  job *j = jobs__create(d, sj->name, &sj->hello_params, sj->reporters,
                      sj->barrier_ms);
  if (j == NULL) {
    LOG(ERROR, "JOB-RESTORE", "job %s: out of memory", sj->name);
    return NULL;
  }
  core_job *c = j->core;
  c->pass = sj->pass + 1;
  c->run = sj->run;
  c->owner = sj->owner ? strdup(sj->owner) : NULL;
  policy *pol = NULL;
  uint32_t *pol_ids = NULL, n_pol_ids = 0;
  size_t pol_len = 0;
  if (sj->snapshot != NULL &&
      (policy_ids_split(sj->snapshot, sj->snapshot_len, &pol_len,
                            &pol_ids, &n_pol_ids) != GNMR_OK ||
       policy_import(sj->snapshot, pol_len, &pol) != GNMR_OK ||
       (pol_ids != NULL && n_pol_ids != policy_units(pol)))) {
    LOG(ERROR, "JOB-RESTORE", "job %s: snapshot unreadable, statistics "
                              "start afresh", sj->name);
    policy_destroy(&pol);
  }
  if (pol == NULL && policy_set_params(c->pol, &sj->params) == GNMR_OK)
    c->params = sj->params;
  int rrv = core_restart_restore(c, pol, pol_ids, sj->n_units, sj->unit_ids,
                                 sj->unit_names, sj->n_ranks, sj->rank_n,
                                 sj->rank_ids);
  free(pol_ids);
  if (rrv != GNMR_OK) {
    LOG(ERROR, "JOB-RESTORE", "job %s: out of memory", sj->name);
    jobs__free(&j);
    return NULL;
  }
  /* steps the history holds past the snapshot stay decided: the job goes
   * on after the last of them, never deciding one again */
  uint64_t snap_step = c->last_decided;
  core_restart_adopt_decided(c, sj->last_step);
  j->first_pass = c->pass;
  /* what the history holds: its newest steps, not the job row's pass (a
   * restart killed after committing that row, and before the decisions it
   * adopted, leaves the agents holding those; they are stored now). Not a
   * prefix of the run either: decisions restored after a restart commit
   * after later steps, so each held decision is looked up. */
  if (sj->n_kept > 0 &&
      (j->hist = malloc(sj->n_kept * sizeof *j->hist)) != NULL) {
    memcpy(j->hist, sj->kept, sj->n_kept * sizeof *j->hist);
    j->n_hist = sj->n_kept;
  }
  store_mark_advance(j->mark, sj->kept_pass, sj->kept_step);
  history_job(d->st, c);
  char detail[160];
  if (c->last_decided > snap_step)
    snprintf(detail, sizeof detail, "pass %u: %s; state from the snapshot "
             "at step %llu, steps decided to %llu", c->pass, cause,
             (unsigned long long)snap_step,
             (unsigned long long)c->last_decided);
  else
    snprintf(detail, sizeof detail, "pass %u: %s; state from the snapshot "
             "at step %llu", c->pass, cause, (unsigned long long)snap_step);
  history_event(d->st, c, STORE_EV_JOB_RESUMED, UINT32_MAX, detail);
  LOG(INFO, "JOB-RESTORE", "job %s: %s", c->name, detail);
  return j;
}

void lifecycle_snapshot_all(gnmrd *d) {
  size_t pos = 0;
  core_job *c;
  jobs_quiesce_all(d);
  while ((c = core_next_job(&d->jobs, &pos)) != NULL)
    if (policy_last_step(c->pol) > 0)
      history_snapshot(d->st, c);
}

int lifecycle_set_params(gnmrd *d, core_job *c, char **settings, size_t n,
                         char *err, size_t errlen) {
  policy_params p = c->params;
  if (gnmr__policy_settings_apply(&p, settings, n, err, errlen) != 0)
    return GNMR_E_INVAL;
  int rv = policy_set_params(c->pol, &p);
  if (rv != GNMR_OK) {
    snprintf(err, errlen, "%s", gnmr_strerror(rv));
    return rv;
  }
  c->params = p;
  history_params(d->st, c);
  char detail[512];
  size_t off = 0;
  for (size_t i = 0; i < n && off < sizeof detail - 1; i++)
    off += (size_t)snprintf(detail + off, sizeof detail - off, "%s%s",
                            i ? " " : "", settings[i]);
  history_event(d->st, c, STORE_EV_PARAMS_CHANGED, UINT32_MAX, detail);
  LOG(INFO, "JOB-RETUNE", "job %s: %s (from step %llu)", c->name, detail,
      (unsigned long long)c->last_decided + 1);
  return GNMR_OK;
}
