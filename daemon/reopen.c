/* SPDX-License-Identifier: MIT */
/* reopen.c — a run that ended, read back from the history for a rank that
 * resumes from a checkpoint (issue 48, item 4; docs/python.md, "Runs and
 * resumes").
 *
 * A rank's Hello that says it resumes (Hello.start = 2) under a name with
 * no live job is answered BUSY with ref "run" while the name's newest run
 * is read from the history on libuv's thread pool (a run's units and
 * snapshot: a read the loop must not wait for). The agent says Hello again
 * a quarter of a second later. By then, if that run ended (finished,
 * retired, or ended by a fresh start) and nothing of it, nor of a newer
 * run of the name that this gnmrd ended, still waits for the store's
 * writer, it is a live job again, restored as a restart restores an
 * unfinished run (its statistics from its last snapshot, a new pass, its
 * row 'running' again), and the repeated Hello joins it. Otherwise the
 * repeated Hello makes a new run, as any Hello under a name without a live
 * job. A read that found the history behind (the run's last records still
 * queued) is thrown away, and the next Hello reads again.
 *
 * At most REOPEN_MAX names are read at once, at most one for a
 * connection (a rank resumes one job) and, under tenancy, at most
 * REOPEN_PER_KEY for an agent key (without tenancy, an address group
 * as many while another group waits: fair.h); past that, BUSY as well. A read that
 * found nothing to resume holds no read place while its answer waits for
 * the repeated Hello (issue 62: a peer's ~400 resume Hellos a second of
 * fresh names left every place waiting for 10 s, and the owner's resume
 * of its finished run got BUSY 60 times in 15 s): those answers are kept
 * apart, at most REOPEN_NONE_KEPT, the oldest forgotten first (its Hello
 * then reads again). Loop thread, but for the pool's read (reopen_work),
 * which touches only its own request. */
#include <stdlib.h>
#include <string.h>

#include "agents.h"
#include "fair.h"
#include "gnmr/error.h"
#include "jobs_priv.h"
#include "log.h"

#define REOPEN_MAX 8
#define REOPEN_PER_KEY 2
#define REOPEN_NONE_KEPT 4096
#define REOPEN_PEER_MAX 64 /* a ZeroMQ routing id: 1 to 255 bytes */
/* How long "nothing to resume" waits for the repeated Hello it answers
 * (an agent that went away leaves it: it must not hold a place) */
#define REOPEN_NONE_MS 10000

enum { R_LOADING, R_NONE };

typedef struct reopen {
  uv_work_t req;
  gnmrd *d;
  char *name, *where; /* where: the store's path (store_target's) */
  int state; /* R_LOADING, then R_NONE (nothing to resume) or gone */
  uint64_t none_at; /* uv_now when it became R_NONE */
  unsigned char peer[REOPEN_PEER_MAX]; /* the asking connection */
  size_t peer_len;
  char *key; /* the asking agent key (tenancy), or NULL */
  char group[FAIR_GROUP_MAX]; /* the asker's address group, "" unknown */
  int rv;    /* the pool's: store_load_newest's */
  char run_state[32];
  char err[256];
  store_job sj;
  struct reopen *next;
} reopen;

static reopen *reopens; /* loop thread, the newest first */
static fair_wait read_wait; /* who waited for a read place lately */
static unsigned n_reopens, n_loading;

static void reopen_free(reopen *r) {
  store__job_clear(&r->sj);
  free(r->name);
  free(r->where);
  free(r->key);
  free(r);
}

static void reopen_unlink(reopen *r) {
  for (reopen **p = &reopens; *p != NULL; p = &(*p)->next)
    if (*p == r) {
      *p = r->next;
      n_reopens--;
      n_loading -= r->state == R_LOADING;
      return;
    }
}

/* A read's place back: its answer (nothing to resume) waits apart. */
static void reopen_none(reopen *r, uint64_t now) {
  n_loading -= r->state == R_LOADING;
  r->state = R_NONE;
  r->none_at = now;
}

/* Answers nobody came for within REOPEN_NONE_MS, and past
 * REOPEN_NONE_KEPT the oldest, forgotten. */
static void reopen_expire(uint64_t now) {
  unsigned kept = 0;
  for (reopen **p = &reopens; *p != NULL;) {
    reopen *r = *p;
    if (r->state == R_NONE &&
        (now - r->none_at >= REOPEN_NONE_MS || ++kept > REOPEN_NONE_KEPT)) {
      *p = r->next;
      n_reopens--;
      reopen_free(r);
    } else {
      p = &r->next;
    }
  }
}

/* Whether this connection, or this key, holds as many reads as it may;
 * *of_group: the reads its address group holds. Without tenancy a group
 * takes more than REOPEN_PER_KEY only while no other group waits
 * (fair.h). */
static int reopen_peer_full(const void *id, size_t id_len, const char *key,
                            const char *group, unsigned *of_group,
                            uint64_t now) {
  unsigned of_key = 0;
  *of_group = 0;
  for (reopen *r = reopens; r != NULL; r = r->next) {
    if (r->state != R_LOADING)
      continue;
    if (r->peer_len == id_len && memcmp(r->peer, id, id_len) == 0)
      return 1;
    if (key != NULL && r->key != NULL && strcmp(r->key, key) == 0 &&
        ++of_key >= REOPEN_PER_KEY)
      return 1;
    if (group != NULL && strcmp(r->group, group) == 0)
      ++*of_group;
  }
  return key == NULL && *of_group >= REOPEN_PER_KEY &&
         fair_contested(&read_wait, group, now);
}

static void reopen_work(uv_work_t *req) {
  reopen *r = req->data;
  r->rv = store_load_newest(r->where, r->name, &r->sj, r->run_state,
                            sizeof r->run_state, r->err, sizeof r->err);
}

static void reopen_done(uv_work_t *req, int status) {
  reopen *r = req->data;
  gnmrd *d = r->d;
  if (status != 0 || d->stopping) {
    reopen_unlink(r);
    reopen_free(r);
    return;
  }
  uint64_t newest = 0;
  (void)hmap_get(&d->ended, r->name, strlen(r->name), &newest);
  if (r->rv == GNMR_OK &&
      (newest > r->sj.run || store_run_pending(d->st, r->sj.run))) {
    /* the history is behind what this gnmrd ended: read it again at the
     * agent's next Hello */
    reopen_unlink(r);
    reopen_free(r);
    return;
  }
  if (r->rv == GNMR_E_STORE)
    LOG(WARN, "JOB-REOPEN", "job %s: %s; a resume begins a new run",
        r->name, r->err);
  if (r->rv == GNMR_OK && strcmp(r->run_state, "running") != 0 &&
      core_find(&d->jobs, r->name) == NULL &&
      (d->cfg == NULL || core_count(&d->jobs) < d->cfg->max_jobs)) {
    char cause[80];
    snprintf(cause, sizeof cause, "resumed from a checkpoint after the run "
             "was %s", r->run_state);
    if (lifecycle__restore_as(d, &r->sj, cause) != NULL) {
      reopen_unlink(r); /* the next Hello joins the job */
      reopen_free(r);
      return;
    }
  }
  reopen_none(r, uv_now(d->loop)); /* the next Hello begins a new run */
  store__job_clear(&r->sj);
  memset(&r->sj, 0, sizeof r->sj);
}

int reopen__ask(gnmrd *d, const char *name, const void *id, size_t id_len,
                const char *key) {
  if (d->st == NULL || d->stopping)
    return REOPEN_NONE;
  reopen_expire(uv_now(d->loop));
  for (reopen *r = reopens; r != NULL; r = r->next) {
    if (strcmp(r->name, name) != 0)
      continue;
    if (r->state == R_LOADING)
      return REOPEN_PENDING;
    reopen_unlink(r); /* R_NONE: said once, to this Hello */
    reopen_free(r);
    return REOPEN_NONE;
  }
  const char *group = d->hello_group;
  if (group != NULL && strlen(group) >= FAIR_GROUP_MAX)
    group = NULL;
  uint64_t now = uv_now(d->loop);
  unsigned of_group;
  if (id_len > REOPEN_PEER_MAX ||
      reopen_peer_full(id, id_len, key, group, &of_group, now)) {
    d->c.resumes_busy++;
    return REOPEN_PENDING;
  }
  if (n_loading >= REOPEN_MAX) {
    fair_refused(&read_wait, group, of_group, REOPEN_PER_KEY, now);
    d->c.resumes_busy++;
    return REOPEN_PENDING;
  }
  reopen *r = calloc(1, sizeof *r);
  if (r == NULL || (r->name = strdup(name)) == NULL ||
      (r->where = strdup(store_path(d->st))) == NULL ||
      (key != NULL && (r->key = strdup(key)) == NULL)) {
    if (r != NULL)
      reopen_free(r);
    return REOPEN_NONE; /* out of memory: a new run, as before */
  }
  r->d = d;
  r->state = R_LOADING;
  memcpy(r->peer, id, id_len);
  r->peer_len = id_len;
  if (group != NULL)
    snprintf(r->group, sizeof r->group, "%s", group);
  r->req.data = r;
  if (uv_queue_work(d->loop, &r->req, reopen_work, reopen_done) != 0) {
    reopen_free(r);
    return REOPEN_NONE;
  }
  r->next = reopens;
  reopens = r;
  n_reopens++;
  n_loading++;
  return REOPEN_PENDING;
}

void reopen_shutdown(void) {
  /* reads still on the pool free themselves (reopen_done, stopping) */
  for (reopen **p = &reopens; *p != NULL;) {
    reopen *r = *p;
    if (r->state == R_LOADING) {
      p = &r->next;
      continue;
    }
    *p = r->next;
    n_reopens--;
    reopen_free(r);
  }
}
