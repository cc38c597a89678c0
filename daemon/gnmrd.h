/* SPDX-License-Identifier: MIT */
/* gnmrd.h — the daemon's shared context. Everything in it is owned by the
 * loop thread: job state, registries, counters and sockets. */
#ifndef GNMRD_H
#define GNMRD_H

#include <uv.h>

#include "config.h"
#include "counters.h"
#include "hmap.h"
#include "server.h"
#include "store.h"

typedef struct job job;

#define GNMRD_LAT_BUCKETS 15 /* see METRICS_LATENCY_BUCKETS */

typedef struct gnmrd {
  uv_loop_t *loop;
  void *zctx;
  server *agents;
  server *admin;
  gnmrd_counters c;
  hmap jobs;          /* name -> job * */
  hmap peers;         /* connection identity -> peer * (see jobs.c) */
  store *st;          /* history; NULL when running without one */
  const gnmrd_config *cfg;
  uv_timer_t watchdog;  /* systemd watchdog pings (notify.c) */
  struct zap *zap;      /* the ZAP handler, under CURVE */
  struct metrics *metrics;
  uint64_t lat_buckets[GNMRD_LAT_BUCKETS]; /* decision latency histogram */
  uint64_t lat_count;
  double lat_sum;
  int stopping;
} gnmrd;

/* jobs.c: the agent protocol */
void jobs_on_message(server *s, const void *id, size_t id_len,
                     const void *data, size_t len, const char *user,
                     void *ctx);
void jobs_on_bad_frames(server *s, void *ctx);
/* Frees every job (their timers close through the loop). */
void jobs_shutdown(gnmrd *d);
/* Writes the names of the live jobs (at most cap) into names. */
size_t jobs_names(gnmrd *d, const char **names, size_t cap);
/* Recreates an unfinished job from the store (start-up). */
void jobs_restore(const store_job *sj, void *ctx);
/* Queues a snapshot of every live job (shutdown). */
void jobs_snapshot_all(gnmrd *d);
job *jobs_find(gnmrd *d, const char *name);
/* Applies key=value settings to a live job's parameters from its next
 * step; all or nothing. Returns 0 or an error with a message in err. */
int jobs_set_params(job *j, char **settings, size_t n, char *err,
                    size_t errlen);
/* A job's gauges for the metrics endpoint. */
typedef struct jobs_metrics {
  uint64_t step;
  uint32_t active, units;
} jobs_metrics;
void jobs_get_metrics(gnmrd *d, const char *name, jobs_metrics *m);

/* Read-only views for the admin service. */
struct json_t;
struct json_t *jobs_status_json(job *j);
struct json_t *jobs_units_json(job *j, uint32_t top);

/* admin.c: the admin protocol */
void admin_on_message(server *s, const void *id, size_t id_len,
                      const void *data, size_t len, const char *user,
                      void *ctx);
/* Counts a failed handshake (either endpoint). */
void gnmrd_on_handshake_failed(server *s, server_refusal why, void *ctx);
void admin_on_bad_frames(server *s, void *ctx);

#endif /* GNMRD_H */
