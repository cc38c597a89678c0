/* SPDX-License-Identifier: MIT */
/* jobs_priv.h — the agent protocol's layers and what they share:
 * dispatch.c (each message) -> hello.c (joining), lifecycle.c (finishing,
 * retiring, restoring, retuning) -> jobs.c (live jobs, connections,
 * decisions) -> core.h. A layer calls only the layers below it. Loop
 * thread only. */
#ifndef GNMRD_JOBS_PRIV_H
#define GNMRD_JOBS_PRIV_H

#include "agents.h"
#include "gnmrd.h"
#include "store_restore.h"
#include "wire.h"
#include "workers.h"

/* The loop's half of a job: its timer. core->data points back here. */
typedef struct job {
  core_job *core;
  gnmrd *d;
  uv_timer_t timer;
  uint64_t last_report_ms; /* loop time of the last accepted report, or of
                              its creation: idle jobs are retired */
  /* A large step is decided on a worker (workers.h): at most one per job,
   * so its steps stay in order. While task is busy the loop may only take
   * reports and Byes for the job; everything else that touches it waits
   * first (jobs__quiesce). */
  workers_task task;
  core_decision dd;
  core_outcome out;
  int hold; /* quiescing: decide on the loop */
  /* Its last large snapshot (a reference; jobs.c, snapshots): while the
   * store still holds it, the next one is owed, not taken. */
  policy_snap *snap_last;
  int snap_owed;
  /* How far its history is committed (store.h), sent in every Decision. */
  store_mark *mark;
  /* The decisions sent and not yet committed, oldest first (a ring of
   * GNMR_MAX_HELD: what its agents hold for a restarted gnmrd): with a
   * store, a step is decided only while fewer are (jobs.c, durable_room),
   * so that a SIGKILL loses no decision a rank acted on, whatever else
   * keeps the store busy. */
  struct undurable {
    uint32_t pass;
    uint64_t step;
  } *undur;
  uint32_t undur_head, undur_n;
  int durable_waiting; /* a step waits for the store: said once */
  /* A restored job (lifecycle.c): the pass it resumed in (0 for a job
   * this gnmrd started, which made every decision of its run itself), the
   * newest (pass, step) adopted from an agent's held decisions (they come
   * in order), and the newest steps the history held at the restart
   * (store_job.kept, ascending; owned): a held decision is stored unless
   * it is among them, or older than all of a full window of them. */
  uint32_t first_pass;
  uint32_t known_pass;
  uint64_t known_step;
  store_kept *hist;
  uint32_t n_hist;
} job;

/* A report held for an undecided step: the decoded envelope and the bytes
 * it came in, counted against [limits] max_held_mb. */
typedef struct held {
  Gnmr__Envelope *env;
  size_t len;
  gnmrd *d;
} held;

/* A connection identity's membership. */
typedef struct peer {
  job *j;
  uint32_t rank;  /* for an observer: its index in the job's observers */
  int observer;
} peer;

static inline job *job_of(core_job *c) {
  return c ? (job *)c->data : NULL;
}

/* jobs.c */
void jobs__reply(gnmrd *d, const void *id, size_t id_len, uint8_t *buf,
                 size_t len);
void jobs__reply_error(gnmrd *d, const void *id, size_t id_len, int code,
                       const char *ref, uint64_t step, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
/* Forgets a registration's connection: its peer entry and identity. */
void jobs__drop_connection(gnmrd *d, core_rank *rr, int observer);
/* Binds connection id to rr as (j, rank): a new peer entry. */
int jobs__bind_connection(gnmrd *d, job *j, core_rank *rr, uint32_t rank,
                          int observer, const void *id, size_t id_len);
/* A connection ZeroMQ no longer has: nothing more is sent to it. */
void jobs__connection_gone(job *j, core_rank *rr, int observer);
job *jobs__create(gnmrd *d, const char *name, const policy_params *prm,
                  uint32_t reporters, uint32_t barrier_ms);
/* Frees a job: its peers' memberships, its core state, then (via the
 * loop) the struct itself. */
void jobs__free(job **jp);
/* Decides every ready step (a large one on a worker), then arms the
 * timer for the next deadline. */
void jobs__decide_ready(job *j);
/* Waits for j's step on a worker, if any, and publishes it: afterwards
 * the loop may touch j freely until it next calls jobs__decide_ready. */
void jobs__quiesce(job *j);

/* Takes the decisions a rank held for gnmrd (Hello.held) that a
 * restarted gnmrd never committed: stored, their steps decided for good,
 * and the newest sent to every rank (docs/reliability.md). Only those
 * sealed by a gnmrd of this store (seal.h) and naming the job's units;
 * the others are counted and logged (jobs__held_refused). from: the rank
 * they came from, for the history. */
void jobs__adopt_held(job *j, Gnmr__Decision *const *hd, size_t n,
                      const char *from);
/* 1 when h carries the seal a gnmrd of this store put on it for job. */
int jobs__held_sealed(const gnmrd *d, const char *name,
                      const Gnmr__Decision *h);
/* Counts n refused held decisions and logs why (rate-limited). */
void jobs__held_refused(gnmrd *d, const char *name, size_t n,
                        const char *from, const char *why);

/* hello.c */
void hello__on_hello(gnmrd *d, const void *id, size_t id_len, Gnmr__Hello *h,
                     const char *user);
/* A Hello that gnmr__validate_hello accepted (giving prm and barrier),
 * counted in hellos already: joins it (hello.c). The loop's part of a
 * Hello that was decoded and checked on the thread pool (dispatch.c),
 * with its unit table made there (prep, may be NULL: taken over when the
 * Hello creates its job, else left to the caller). */
void hello__on_hello_checked(gnmrd *d, const void *id, size_t id_len,
                             Gnmr__Hello *h, const char *user,
                             const policy_params *prm, uint32_t barrier,
                             core_prepared **prep);

/* lifecycle.c: how a job ends */
enum { FINISH_BYES, FINISH_IDLE, FINISH_OPERATOR, FINISH_FRESH };
void lifecycle__finish(job *j, int how);
/* A job made from the history's record of its run (sj), its statistics
 * from the run's last snapshot and a new pass; why: the history event's
 * words ("gnmrd restarted", ...). NULL when it cannot be (logged). */
job *lifecycle__restore_as(gnmrd *d, const store_job *sj, const char *why);

/* reopen.c: a run that ended, read back for a rank that resumes */
enum { REOPEN_NONE, REOPEN_PENDING };
/* For a rank's Hello that resumes from a checkpoint (Hello.start 2) under
 * name, which has no live job: REOPEN_PENDING while the name's newest run
 * is read back (answer BUSY "run": the agent says Hello again soon, and
 * then joins the run if it ended and was restored), REOPEN_NONE when there
 * is nothing to resume (a new run, as ever). id: the asking connection's
 * routing id; key: its agent key under tenancy (NULL without): each has a
 * bounded share of the reads. */
int reopen__ask(gnmrd *d, const char *name, const void *id, size_t id_len,
                const char *key);

#endif /* GNMRD_JOBS_PRIV_H */
