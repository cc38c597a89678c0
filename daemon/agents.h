/* SPDX-License-Identifier: MIT */
/* agents.h — the agent protocol as the rest of gnmrd sees it: the agent
 * endpoint's callbacks (dispatch.c), starting, stopping, restoring and
 * retuning jobs (lifecycle.c), and waiting for the steps and snapshots
 * on workers (jobs.c). Its layers share jobs_priv.h. Loop thread only. */
#ifndef GNMRD_AGENTS_H
#define GNMRD_AGENTS_H

#include "gnmrd.h"

void dispatch_on_message(server *s, const void *id, size_t id_len,
                         const void *data, size_t len, const char *user,
                         void *ctx);
void dispatch_on_bad_frames(server *s, void *ctx);
/* Starts retiring jobs idle for [limits] job_idle_s. */
void lifecycle_start(gnmrd *d);
/* Frees every job (their timers close through the loop). */
void lifecycle_shutdown(gnmrd *d);
/* Frees what reopen.c keeps between a resume's Hellos (reads still on
 * the thread pool free themselves). */
void reopen_shutdown(void);
/* Names and their owners (tenancy). A job name belongs to the key whose
 * Hello created its first run, for as long as the store keeps a run of it:
 * ending the job, or restarting gnmrd, does not free the name for another
 * tenant. lifecycle_name_owner: the owner, NULL when the name has none.
 * lifecycle_name_claim: records owner as the name's unless it has one already;
 * 0 or GNMR_E_NOMEM. lifecycle_owner_restore: store_owners()'s callback. */
const char *lifecycle_name_owner(const gnmrd *d, const char *name);
int lifecycle_name_claim(gnmrd *d, const char *name, const char *owner);
void lifecycle_owner_restore(const char *name, const char *owner, void *ctx);
/* Recreates an unfinished job from the store (start-up). */
void lifecycle_restore(const store_job *sj, void *ctx);
/* Waits for every job's step on a worker (jobs.c): the loop may then
 * read any job's engine and scratch (views, metrics, admin commands). */
void jobs_quiesce_all(gnmrd *d);
/* Queues a snapshot of every live job (shutdown). */
void lifecycle_snapshot_all(gnmrd *d);
/* Ends a live job now, as if every rank had said Bye (gnmrctl finish: a
 * job whose processes are gone). Its agents, should any come back, join
 * a new job of that name. */
void lifecycle_finish(gnmrd *d, core_job *c);
/* Applies key=value settings to a live job's parameters from its next
 * step; all or nothing. Returns 0 or an error with a message in err. */
int lifecycle_set_params(gnmrd *d, core_job *c, char **settings, size_t n,
                         char *err, size_t errlen);

#endif /* GNMRD_AGENTS_H */
