/* SPDX-License-Identifier: MIT */
/* gnmrd.h — the daemon's shared context. Everything in it is owned by the
 * loop thread: job state, registries, counters and sockets. */
#ifndef GNMRD_H
#define GNMRD_H

#include <uv.h>

#include "config.h"
#include "core.h"
#include "counters.h"
#include "hmap.h"
#include "latency.h"
#include "server.h"
#include "store.h"

typedef struct gnmrd {
  uv_loop_t *loop;
  void *zctx;
  server *agents;
  server *admin;
  gnmrd_counters c;
  core_registry jobs; /* the live jobs (core.h); each core_job's data is
                         its loop half (jobs.c) */
  hmap peers;         /* connection identity -> membership (jobs.c) */
  hmap owners;        /* job name -> its owner's key (malloc'd): the key
                         of its first run, kept after the job ends */
  store *st;          /* history; NULL when running without one */
  const gnmrd_config *cfg;
  const struct gnmr_allow *allow; /* the CURVE allow list, NULL without */
  uv_timer_t watchdog;  /* systemd watchdog pings (notify.c) */
  struct zap *zap;      /* the ZAP handler, under CURVE */
  struct metrics *metrics;
  latency_hist decision_latency; /* first report to decision */
  size_t held_bytes;  /* reports held for undecided steps ([limits]) */
  uint64_t last_run;  /* the newest run id: a new job takes the next */
  uv_timer_t sweep;   /* retires idle jobs (jobs.c) */
  struct workers *workers; /* decide large steps; NULL: all on the loop */
  uint64_t worker_min;     /* steps of fewer unit-shards stay on the loop */
  struct snap_fill *fills; /* snapshots being serialized on workers */
  int stopping;
} gnmrd;

/* jobs.c: the agent protocol */
void jobs_on_message(server *s, const void *id, size_t id_len,
                     const void *data, size_t len, const char *user,
                     void *ctx);
void jobs_on_bad_frames(server *s, void *ctx);
/* Starts retiring jobs idle for [limits] job_idle_s. */
void jobs_start(gnmrd *d);
/* Frees every job (their timers close through the loop). */
void jobs_shutdown(gnmrd *d);
/* Names and their owners (tenancy). A job name belongs to the key whose
 * Hello created its first run, for as long as the store keeps a run of it:
 * ending the job, or restarting gnmrd, does not free the name for another
 * tenant. jobs_name_owner: the owner, NULL when the name has none.
 * jobs_name_claim: records owner as the name's unless it has one already;
 * 0 or GNMR_E_NOMEM. jobs_owner_restore: store_owners()'s callback. */
const char *jobs_name_owner(const gnmrd *d, const char *name);
int jobs_name_claim(gnmrd *d, const char *name, const char *owner);
void jobs_owner_restore(const char *name, const char *owner, void *ctx);
/* Recreates an unfinished job from the store (start-up). */
void jobs_restore(const store_job *sj, void *ctx);
/* Waits for every job's step on a worker (jobs.c): the loop may then
 * read any job's engine and scratch (views, metrics, admin commands). */
void jobs_quiesce_all(gnmrd *d);
/* Waits for the snapshots being serialized on workers (before
 * workers_close). */
void jobs_fills_wait(gnmrd *d);
/* Queues a snapshot of every live job (shutdown). */
void jobs_snapshot_all(gnmrd *d);
/* Ends a live job now, as if every rank had said Bye (gnmrctl finish: a
 * job whose processes are gone). Its agents, should any come back, join
 * a new job of that name. */
void jobs_finish(gnmrd *d, core_job *c);
/* Applies key=value settings to a live job's parameters from its next
 * step; all or nothing. Returns 0 or an error with a message in err. */
int jobs_set_params(gnmrd *d, core_job *c, char **settings, size_t n,
                    char *err, size_t errlen);

/* admin.c: the admin protocol */
void admin_on_message(server *s, const void *id, size_t id_len,
                      const void *data, size_t len, const char *user,
                      void *ctx);
/* Counts a failed handshake (either endpoint). */
void gnmrd_on_handshake_failed(server *s, server_refusal why, void *ctx);
/* Answers a message from a connection past the cap (server_cap_cb). */
void gnmrd_on_over_cap(server *s, const void *id, size_t id_len,
                       uint32_t max_conns, void *ctx);
/* Whether a key has every right (an operator, or tenancy off). */
int gnmrd_is_operator(const char *user, void *ctx);
/* Answers a connection refused for its key's places. */
void gnmrd_on_key_cap(server *s, const void *id, size_t id_len,
                      uint32_t key_max, void *ctx);
void admin_on_bad_frames(server *s, void *ctx);
/* A connection to the admin endpoint went: its queries stop. */
void admin_on_gone(server *s, int fd, void *ctx);
/* Closes the export streams in progress (shutdown). */
void admin_shutdown(gnmrd *d);

#endif /* GNMRD_H */
