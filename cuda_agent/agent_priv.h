/* SPDX-License-Identifier: MIT */
/* agent_priv.h — the agent's state shared by its parts: configuration
 * (agent_config.c), the process-wide ZeroMQ context (agent_ctx.c), the I/O
 * thread (agent_io.c), report encoding (agent_report.c) and the public
 * calls (agent.c). Threads: the training thread calls the public API; the
 * CUDA completion thread queues reports; the I/O thread owns the DEALER,
 * PULL and monitor sockets. */
#ifndef GNMR_AGENT_PRIV_H
#define GNMR_AGENT_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "gnmr/agent.h"
#include "owner.h"
#include "params.h"
#include "wire.h"

/* A buffer a report is packed into and handed to ZeroMQ without a copy;
 * ZeroMQ's free callback (any thread) clears busy when it is done. */
#define REPORT_POOL 4
typedef struct pool_buf {
  uint8_t *p;
  size_t cap;
  atomic_int busy;
} pool_buf;

/* Buffers reused by every report of an agent, grown once. */
typedef struct report_scratch {
  double *sumsq;
  uint64_t *nonfinite;
  protobuf_c_boolean *not_reported;
  protobuf_c_boolean *shadowed;
  double *measure;      /* enc: gnmr_agent_measure's values */
  uint64_t measure_step;/* enc: their step (0: none) */
  uint8_t *seen;
  uint8_t *pack;
  size_t pack_cap;
} report_scratch;

#define HELLO_RETRY_MS 500   /* Hello sent, no Welcome yet: the first wait */
#define HELLO_RETRY_MAX_MS 4000 /* the waits double up to this */
#define HELLO_CONNECT_MS 20  /* Hello could not be sent: not connected */
#define HELD_MAX 8           /* reports kept while not joined */
#define HELLO_REFUSED_MS 5000 /* back-off after a refused Hello */
#define HELLO_LAYOUT_MS 250  /* an observer before its job's ranks */
#define IO_POLL_MS 50
#define WAIT_SPIN_US 2000    /* gnmr_agent_wait spins this long at most... */
#define WAIT_SPIN_MAX_US 1000000 /* ...or GNMR_WAIT_SPIN_US, up to this */
#define MAX_MSG (256 << 20)

struct gnmr_agent {
  /* configuration, immutable after open */
  char *endpoint, *job;
  char curve_server[41], curve_public[41], curve_secret[41]; /* "" = off */
  uint32_t rank, reporters, n_units, barrier_ms, fallback_route,
      fallback_after;
  char **names;
  uint64_t *req_ids; /* requested job-wide ids (as sent), or NULL */
  int observer;      /* receives decisions, never reports */
  uint32_t start;    /* enum gnmr_start: the first Hello says it */
  uint32_t node_ranks; /* Hello.node_ranks */
  char instance[160];/* "HOST pid N agent K": Hello.instance */
  gnmr_params params;

  void *zctx;
  void *push; /* reporters' end of the report pipe (push_mu) */
  pthread_mutex_t push_mu; /* the training and CUDA completion threads */
  void *dealer, *pull, *monitor; /* made in open(), then owned by the I/O
                                    thread */
  char pipe_addr[64];
  pthread_t io;
  gnmr_owner io_owner; /* the I/O thread, claimed as it starts */
  atomic_int stop;
  atomic_int joined;
  /* the first Welcome's run and last decided step (gnmr_agent_run) */
  atomic_uint_fast64_t welcome_run, welcome_last;

  /* decision, published by the I/O thread under a seqlock */
  atomic_uint_fast64_t seq;
  atomic_uint_fast64_t decided_step;
  _Atomic uint64_t *routes; /* n_units bits */
  size_t n_words;
  pthread_mutex_t mu;       /* for gnmr_agent_wait() only */
  pthread_cond_t cv;

  /* the latest decision's risky units of this agent (local indices,
   * ascending) with their g, d, s: written by the I/O thread, read by
   * gnmr_agent_risky(), under risky_mu; n_units entries each */
  pthread_mutex_t risky_mu;
  uint64_t risky_step;
  uint32_t n_risky;
  uint32_t *risky_units;
  double *risky_gds; /* g[0..n_units), d[...], s[...] */
  /* the same-step mode's (Decision.bound, spare), also under risky_mu:
   * each unit's bound (+inf: none) and the spare budget of that step */
  float *bounds;
  uint32_t spare;

  atomic_uint_fast64_t last_reported; /* written by the training thread */

  /* report encoding scratch (agent_report.c): the per-report path
   * allocates nothing once these have their size */
  report_scratch enc;  /* under push_mu: the values and the packed bytes */
  report_scratch cpu;  /* under cpu_mu: gnmr_agent_report's reduction */
  pool_buf pool[REPORT_POOL]; /* under push_mu, but for busy */
  pthread_mutex_t cpu_mu;

  /* counters */
#define GNMR__AGENT_STAT_ATOMIC(type, name, what) _Atomic type name;
  GNMR_AGENT_STATS(GNMR__AGENT_STAT_ATOMIC) /* gnmr/agent.h */
#undef GNMR__AGENT_STAT_ATOMIC
  pthread_mutex_t err_mu;   /* last_error_text: I/O thread and callers */
  char last_error_text[256];

  /* open agents, for the fork handler (agent.c): a forked child's copy of
   * an agent has no threads and shares the parent's ZeroMQ descriptors */
  struct gnmr_agent *reg_prev, *reg_next;
  atomic_int forked; /* set in the child of a fork: refuse, free only */
  uint32_t wait_spin_us; /* GNMR_WAIT_SPIN_US at open, else WAIT_SPIN_US */
  unsigned quota_cpus;   /* the cgroup's CPU quota at open; 0: none */
};


/* agent_config.c */
int gnmr__agent_check_config(const gnmr_agent_config *c);
/* Frees the copied configuration and the route bitmap. */
void gnmr__agent_free_config(gnmr_agent *a);
uint64_t gnmr__now_ms(void);
/* GNMR_WAIT_SPIN_US: its value (0..WAIT_SPIN_MAX_US), WAIT_SPIN_US when
 * unset, -1 when set to anything else. */
int64_t gnmr__wait_spin_env(void);

/* cpu_quota.c: the CPUs the cgroup CPU quota (v2 cpu.max, v1
 * cpu.cfs_quota_us) allows, the tightest from the process's cgroup up to
 * the mount, rounded down, at least 1; 0 when none is set or readable.
 * root: the cgroup mount; cgroup_text: /proc/self/cgroup's text. */
unsigned gnmr__cgroup_cpus(const char *root, const char *cgroup_text);
unsigned gnmr__process_cgroup_cpus(void); /* for this process */

/* agent_ctx.c: one ZeroMQ context per process, shared by its agents */
void *gnmr__ctx_acquire(void);
void gnmr__ctx_release(void);
/* In the child of a fork: forgets the parent's context (never terminated
 * there: its threads are the parent's), so that an agent opened in the
 * child makes its own. */
void gnmr__ctx_after_fork(void);

/* agent.c: GNMR_E_CLOSED, with the reason as the last error, for a call
 * that would use a's sockets or threads in the child of a fork */
int gnmr__agent_refuse_forked(gnmr_agent *a);
/* How many gnmr_agent_wait calls of this process have spun (tests). */
uint64_t gnmr__agent_waits_spun(void);

/* agent_io.c */
int gnmr__agent_open_io_sockets(gnmr_agent *a);
void *gnmr__agent_io_main(void *arg);

/* agent_report.c */
int gnmr__agent_scratch_init(gnmr_agent *a);
void gnmr__agent_scratch_clear(gnmr_agent *a);
void gnmr__agent_mark_reported(gnmr_agent *a, uint64_t step);

/* Writes pl->len bytes (gnmr__report_plan, proto/wire.h) to out, the
 * sums copied from pl->sumsq; with check, returns 1 when a sum is
 * negative or NaN where skip (may be NULL) is 0, else 0. */
int gnmr__report_pack(gnmr__report_layout *pl, const uint8_t *skip, int check,
                      uint8_t *out);

#endif /* GNMR_AGENT_PRIV_H */
