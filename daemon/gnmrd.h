/* SPDX-License-Identifier: MIT */
/* gnmrd.h — the daemon's shared context, and nothing else. Everything in
 * it is owned by the loop thread: job state, registries, counters and
 * sockets. The protocols that work on it have their own headers:
 * agents.h (the agent endpoint) and admin.h (the admin endpoint). */
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
  hmap ended;         /* job name -> the newest run this gnmrd ended
                         (lifecycle.c; a resume reads no older: reopen.c) */
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
  struct leader *lead;     /* the store's leadership (leader.h); NULL for
                              a store of one gnmrd (SQLite) */
  uint64_t term;           /* this gnmrd's leadership term (store_term) */
  const char *bound_agents, *bound_admin; /* as bound (serve()'s) */
  uint64_t started_ms;     /* uv_now at start: gnmrctl stats' uptime */
  int64_t started_unix;    /* the wall clock at start: /metrics */
  uv_timer_t lease_wait;   /* steps wait while the lease is out (jobs.c) */
  /* the address group (server_msg_group) of the peer whose Hello is
   * being taken in, NULL when none or unknown: set around
   * hello__on_hello and hello__on_hello_checked (dispatch.c) for the
   * places a Hello may take (fair.h) */
  const char *hello_group;
  int stopping;
} gnmrd;

#endif /* GNMRD_H */
