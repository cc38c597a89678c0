/* SPDX-License-Identifier: MIT */
/* agent.c — libgnmr-agent's public calls: open and close an agent, wait
 * for a decision, read a unit's route (a seqlock read that never waits),
 * and its counters. The parts: agent_config.c, agent_ctx.c, agent_io.c,
 * agent_report.c (agent_priv.h). */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "agent_priv.h"

/* ---- fork ------------------------------------------------------------------
 * A process that forks after opening agents (os.fork, a data loader's
 * workers) gives the child copies of them without their I/O threads, whose
 * sockets share the parent's descriptors. The child handler marks every
 * open agent forked and makes its locks usable again (a parent thread may
 * have held one); a forked agent refuses what would touch the parent's
 * sockets, and closing it frees memory only. The child's next agent gets a
 * context of its own. */

/* Before it sleeps, gnmr_agent_wait spins (yielding its CPU to any thread
 * that wants it) for up to wait_spin_us of its timeout: a decision takes
 * a few hundred microseconds, and a thread asleep on an idle CPU is woken
 * by an interrupt to that CPU, which on a virtual machine costs tens of
 * microseconds at every hop of the round trip. Measured in
 * docs/benchmarks.md ("Spinning for the decision"). Spinners leave one
 * CPU of the caller's free for the threads the round trip runs on: at
 * most (CPUs the caller may use - 1) spin at once in the process, none
 * on one CPU; the CPUs it may use are its affinity mask's, or fewer where
 * its cgroup's CPU quota says so (cpu_quota.c). */
static atomic_int spinners;
static atomic_uint_fast64_t waits_spun; /* for the tests */

uint64_t gnmr__agent_waits_spun(void) { return atomic_load(&waits_spun); }

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static gnmr_agent *reg_head;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;
static int reg_atfork = -1;

static void reg_prepare(void) { pthread_mutex_lock(&reg_mu); }
static void reg_parent(void) { pthread_mutex_unlock(&reg_mu); }

static void reg_child(void) {
  pthread_mutex_init(&reg_mu, NULL);
  for (gnmr_agent *a = reg_head; a != NULL; a = a->reg_next) {
    atomic_store(&a->forked, 1);
    /* a decision the I/O thread was publishing stays half written, but
     * its seqlock must not stay odd: readers would wait forever */
    uint64_t seq = atomic_load(&a->seq);
    if (seq & 1)
      atomic_store(&a->seq, seq + 1);
    pthread_mutex_init(&a->mu, NULL);
    pthread_mutex_init(&a->risky_mu, NULL);
    pthread_mutex_init(&a->push_mu, NULL);
    pthread_mutex_init(&a->cpu_mu, NULL);
    pthread_mutex_init(&a->err_mu, NULL);
  }
  gnmr__ctx_after_fork();
  atomic_store(&spinners, 0); /* the parent's spinning threads are not here */
}

static void reg_init(void) {
  reg_atfork = pthread_atfork(reg_prepare, reg_parent, reg_child);
}

static int reg_add(gnmr_agent *a) {
  pthread_once(&reg_once, reg_init);
  if (reg_atfork != 0)
    return GNMR_E_INTERNAL;
  pthread_mutex_lock(&reg_mu);
  a->reg_prev = NULL;
  a->reg_next = reg_head;
  if (reg_head != NULL)
    reg_head->reg_prev = a;
  reg_head = a;
  pthread_mutex_unlock(&reg_mu);
  return GNMR_OK;
}

static void reg_remove(gnmr_agent *a) {
  pthread_mutex_lock(&reg_mu);
  if (a->reg_prev != NULL)
    a->reg_prev->reg_next = a->reg_next;
  else
    reg_head = a->reg_next;
  if (a->reg_next != NULL)
    a->reg_next->reg_prev = a->reg_prev;
  pthread_mutex_unlock(&reg_mu);
}

/* The agent's own copy of cfg: its settings, unit names and ids, the
 * route bitmap and the report scratch. GNMR_OK or GNMR_E_NOMEM (what was
 * copied stays, for free_copy). */
static int copy_config(gnmr_agent *a, const gnmr_agent_config *cfg) {
  a->rank = cfg->rank;
  a->reporters = cfg->reporters;
  a->n_units = cfg->n_units;
  a->params = cfg->params;
  a->barrier_ms = cfg->barrier_ms ? cfg->barrier_ms : 1000;
  a->fallback_route = cfg->fallback_route;
  a->fallback_after = cfg->fallback_after ? cfg->fallback_after : 3;
  a->n_words = (cfg->n_units + 63) / 64;
  a->observer = cfg->observer != 0;
  a->start = cfg->start;
  a->node_ranks = cfg->node_ranks;
  int64_t spin = gnmr__wait_spin_env(); /* bad: config_from_env said so */
  a->wait_spin_us = (uint32_t)(spin >= 0 ? spin : WAIT_SPIN_US);
  a->quota_cpus = a->wait_spin_us ? gnmr__process_cgroup_cpus() : 0;
  if (cfg->curve_server_key != NULL) {
    memcpy(a->curve_server, cfg->curve_server_key, 41);
    memcpy(a->curve_public, cfg->curve_public_key, 41);
    memcpy(a->curve_secret, cfg->curve_secret_key, 41);
  }
  a->endpoint = strdup(cfg->endpoint);
  a->job = strdup(cfg->job);
  a->names = calloc(cfg->n_units, sizeof *a->names);
  a->routes = calloc(a->n_words, sizeof *a->routes);
  a->risky_units = calloc(cfg->n_units, sizeof *a->risky_units);
  a->risky_gds = calloc(3 * (size_t)cfg->n_units, sizeof *a->risky_gds);
  a->bounds = malloc((cfg->n_units ? cfg->n_units : 1) * sizeof *a->bounds);
  if (!a->endpoint || !a->job || !a->names || !a->routes ||
      !a->risky_units || !a->risky_gds || !a->bounds)
    return GNMR_E_NOMEM;
  for (uint32_t i = 0; i < cfg->n_units; i++)
    a->bounds[i] = INFINITY;
  for (uint32_t i = 0; i < cfg->n_units; i++)
    if ((a->names[i] = strdup(cfg->unit_names[i])) == NULL)
      return GNMR_E_NOMEM;
  if (cfg->unit_ids != NULL) {
    if ((a->req_ids = malloc(cfg->n_units * sizeof *a->req_ids)) == NULL)
      return GNMR_E_NOMEM;
    for (uint32_t i = 0; i < cfg->n_units; i++)
      a->req_ids[i] = cfg->unit_ids[i];
  }
  return gnmr__agent_scratch_init(a);
}

/* What copy_config made, and the agent. */
static void free_copy(gnmr_agent **ap) {
  gnmr_agent *a = *ap;
  *ap = NULL;
  gnmr__agent_scratch_clear(a);
  gnmr__agent_free_config(a);
  free(a);
}

/* The locks and the decision's condition (on the monotonic clock), and
 * the instance a Hello names ("HOST pid N agent K"). */
static void sync_init(gnmr_agent *a) {
  static atomic_uint agent_counter;
  pthread_mutex_init(&a->mu, NULL);
  pthread_mutex_init(&a->risky_mu, NULL);
  pthread_mutex_init(&a->push_mu, NULL);
  pthread_mutex_init(&a->cpu_mu, NULL);
  pthread_mutex_init(&a->err_mu, NULL);
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  snprintf(a->instance, sizeof a->instance, "%s pid %ld agent %u", host,
           (long)getpid(), atomic_fetch_add(&agent_counter, 1));
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&a->cv, &ca);
  pthread_condattr_destroy(&ca);
}

static void sync_clear(gnmr_agent *a) {
  pthread_mutex_destroy(&a->mu);
  pthread_mutex_destroy(&a->risky_mu);
  pthread_mutex_destroy(&a->push_mu);
  pthread_mutex_destroy(&a->cpu_mu);
  pthread_mutex_destroy(&a->err_mu);
  pthread_cond_destroy(&a->cv);
}

/* The report pipe, the I/O thread's sockets (made and connected here, so
 * that a report queued right after open() already has its pipe;
 * pthread_create() is the full barrier ZeroMQ asks for when a socket
 * changes threads), then the thread. On failure, nothing of it is left. */
static int start_io(gnmr_agent *a) {
  static atomic_uint pipe_counter;
  int zero = 0, rv = GNMR_E_IO;
  if ((a->zctx = gnmr__ctx_acquire()) == NULL)
    return GNMR_E_IO;
  snprintf(a->pipe_addr, sizeof a->pipe_addr, "inproc://gnmr-agent-%p-%u",
           (void *)a, atomic_fetch_add(&pipe_counter, 1));
  if ((a->push = zmq_socket(a->zctx, ZMQ_PUSH)) == NULL)
    goto err_ctx;
  zmq_setsockopt(a->push, ZMQ_LINGER, &zero, sizeof zero);
  if (zmq_bind(a->push, a->pipe_addr) != 0 ||
      gnmr__agent_open_io_sockets(a) != GNMR_OK)
    goto err_push;
  if (reg_add(a) != GNMR_OK) { /* before a fork can copy it */
    rv = GNMR_E_INTERNAL;
    goto err_io;
  }
  if (pthread_create(&a->io, NULL, gnmr__agent_io_main, a) != 0) {
    reg_remove(a);
    goto err_io;
  }
  return GNMR_OK;
err_io:
  zmq_close(a->monitor);
  zmq_close(a->dealer);
  zmq_close(a->pull);
err_push:
  zmq_close(a->push);
err_ctx:
  gnmr__ctx_release();
  return rv;
}

int gnmr_agent_open(const gnmr_agent_config *cfg, gnmr_agent **out) {
  int rv;
  gnmr_agent *a;
  if (out == NULL)
    return GNMR_E_INVAL;
  *out = NULL;
  if ((rv = gnmr__agent_check_config(cfg)) != GNMR_OK)
    return rv == GNMR_E_DENIED ? rv : GNMR_E_INVAL;
  if ((a = calloc(1, sizeof *a)) == NULL)
    return GNMR_E_NOMEM;
  if (copy_config(a, cfg) != GNMR_OK) {
    free_copy(&a);
    return GNMR_E_NOMEM;
  }
  sync_init(a);
  if ((rv = start_io(a)) != GNMR_OK) {
    sync_clear(a);
    free_copy(&a);
    return rv;
  }
  *out = a;
  return GNMR_OK;
}

uint64_t gnmr_agent_risky(gnmr_agent *a, uint32_t *units, double *g,
                          double *d, double *s, uint32_t cap, uint32_t *n) {
  if (a == NULL) {
    if (n != NULL)
      *n = 0;
    return 0;
  }
  pthread_mutex_lock(&a->risky_mu);
  uint64_t step = a->risky_step;
  uint32_t k = a->n_risky < cap ? a->n_risky : cap;
  for (uint32_t i = 0; i < k; i++) {
    if (units)
      units[i] = a->risky_units[i];
    if (g)
      g[i] = a->risky_gds[i];
    if (d)
      d[i] = a->risky_gds[a->n_units + i];
    if (s)
      s[i] = a->risky_gds[2 * (size_t)a->n_units + i];
  }
  if (n != NULL)
    *n = a->n_risky;
  pthread_mutex_unlock(&a->risky_mu);
  return step;
}

uint64_t gnmr_agent_bounds(gnmr_agent *a, float *bounds, uint32_t cap,
                           uint32_t *spare) {
  if (a == NULL) {
    if (spare != NULL)
      *spare = 0;
    return 0;
  }
  pthread_mutex_lock(&a->risky_mu);
  uint64_t step = a->risky_step;
  uint32_t k = a->n_units < cap ? a->n_units : cap;
  if (bounds != NULL)
    memcpy(bounds, a->bounds, k * sizeof *bounds);
  if (spare != NULL)
    *spare = a->spare;
  pthread_mutex_unlock(&a->risky_mu);
  return step;
}

void gnmr_agent_close(gnmr_agent **pa) {
  if (pa == NULL || *pa == NULL)
    return;
  gnmr_agent *a = *pa;
  reg_remove(a);
  if (atomic_load(&a->forked)) {
    /* the copy in a forked child: its thread, sockets and context are the
     * parent's; the buffers ZeroMQ held are the parent's to free */
    for (int i = 0; i < REPORT_POOL; i++)
      atomic_store(&a->pool[i].busy, 1);
    *pa = NULL;
    free_copy(&a);
    return;
  }
  atomic_store(&a->stop, 1);
  pthread_join(a->io, NULL);
  zmq_close(a->push);
  gnmr__ctx_release();
  sync_clear(a);
  *pa = NULL;
  free_copy(&a);
}


static int64_t ns_of(const struct timespec *t) {
  return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

/* 1 when the decision of step came while spinning, else 0. */
static int wait_spin(gnmr_agent *a, uint64_t step, const struct timespec *t0,
                     int timeout_ms) {
  cpu_set_t set;
  int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  if (a->quota_cpus != 0 && (int)a->quota_cpus < cpus)
    cpus = (int)a->quota_cpus; /* a container's share of a larger host */
  int cap = cpus - 1;
  if (atomic_fetch_add(&spinners, 1) >= cap) {
    atomic_fetch_sub(&spinners, 1);
    return 0;
  }
  atomic_fetch_add(&waits_spun, 1);
  int64_t spin = (int64_t)a->wait_spin_us * 1000,
          limit = (int64_t)timeout_ms * 1000000;
  int64_t end = ns_of(t0) + (spin < limit ? spin : limit);
  int got = 0;
  struct timespec now;
  do {
    if ((got = atomic_load(&a->decided_step) >= step))
      break;
    sched_yield();
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while (ns_of(&now) < end);
  atomic_fetch_sub(&spinners, 1);
  return got || atomic_load(&a->decided_step) >= step;
}

int gnmr_agent_wait(gnmr_agent *a, uint64_t step, int timeout_ms) {
  if (a == NULL)
    return GNMR_E_INVAL;
  if (atomic_load(&a->forked))
    return gnmr__agent_refuse_forked(a);
  if (atomic_load(&a->decided_step) >= step)
    return GNMR_OK;
  struct timespec dl;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  if (a->wait_spin_us > 0 && timeout_ms > 0 &&
      wait_spin(a, step, &dl, timeout_ms))
    return GNMR_OK;
  int64_t ns = dl.tv_nsec + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) *
                                1000000;
  dl.tv_sec += ns / 1000000000;
  dl.tv_nsec = ns % 1000000000;
  int rv = GNMR_OK;
  pthread_mutex_lock(&a->mu);
  while (atomic_load(&a->decided_step) < step) {
    if (pthread_cond_timedwait(&a->cv, &a->mu, &dl) == ETIMEDOUT) {
      if (atomic_load(&a->decided_step) < step)
        rv = GNMR_E_TIMEDOUT;
      break;
    }
  }
  pthread_mutex_unlock(&a->mu);
  if (rv == GNMR_E_TIMEDOUT)
    atomic_fetch_add(&a->late_decisions, 1);
  return rv;
}

uint32_t gnmr_agent_routes(gnmr_agent *a, uint8_t *out, uint32_t n) {
  if (a == NULL || out == NULL)
    return 0;
  if (n > a->n_units)
    n = a->n_units;
  for (;;) {
    uint64_t s0 = atomic_load_explicit(&a->seq, memory_order_acquire);
    if (s0 & 1)
      continue; /* a writer is publishing */
    uint64_t d = atomic_load_explicit(&a->decided_step, memory_order_relaxed);
    for (uint32_t w = 0; w < (n + 63) / 64; w++) {
      uint64_t bits = atomic_load_explicit(&a->routes[w],
                                           memory_order_relaxed);
      for (uint32_t u = w * 64; u < n && u < w * 64 + 64; u++)
        out[u] = (bits >> (u % 64)) & 1 ? GNMR_ROUTE_HIGH : GNMR_ROUTE_LOW;
    }
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&a->seq, memory_order_relaxed) != s0)
      continue;
    if (d == 0 || atomic_load(&a->last_reported) > d + a->fallback_after) {
      atomic_fetch_add(&a->fallback_routes, n);
      memset(out, (int)a->fallback_route, n);
    }
    return n;
  }
}

int gnmr_agent_route(gnmr_agent *a, uint32_t unit) {
  if (a == NULL)
    return GNMR_ROUTE_LOW;
  for (;;) {
    uint64_t s0 = atomic_load_explicit(&a->seq, memory_order_acquire);
    if (s0 & 1)
      continue; /* a writer is publishing */
    uint64_t d = atomic_load_explicit(&a->decided_step, memory_order_relaxed);
    uint64_t w = unit < a->n_units
                     ? atomic_load_explicit(&a->routes[unit / 64],
                                            memory_order_relaxed)
                     : 0;
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&a->seq, memory_order_relaxed) != s0)
      continue;
    if (unit >= a->n_units || d == 0 ||
        atomic_load(&a->last_reported) > d + a->fallback_after) {
      atomic_fetch_add(&a->fallback_routes, 1);
      return (int)a->fallback_route;
    }
    return (w >> (unit % 64)) & 1 ? GNMR_ROUTE_HIGH : GNMR_ROUTE_LOW;
  }
}

uint64_t gnmr_agent_decided_step(const gnmr_agent *a) {
  return a ? atomic_load(&a->decided_step) : 0;
}

int gnmr_agent_joined(const gnmr_agent *a) {
  return a ? atomic_load(&a->joined) : 0;
}

int gnmr_agent_run(const gnmr_agent *a, uint64_t *run, uint64_t *last_step) {
  if (a == NULL || !atomic_load(&a->joined))
    return 0;
  if (run != NULL)
    *run = atomic_load(&a->welcome_run);
  if (last_step != NULL)
    *last_step = atomic_load(&a->welcome_last);
  return 1;
}

int gnmr_agent_last_error(gnmr_agent *a, char *buf, size_t cap) {
  if (a == NULL)
    return GNMR_E_INVAL;
  if (buf != NULL && cap > 0) {
    pthread_mutex_lock(&a->err_mu);
    snprintf(buf, cap, "%s", a->last_error_text);
    pthread_mutex_unlock(&a->err_mu);
  }
  return atomic_load(&a->last_error);
}

int gnmr_agent_stats_get(const gnmr_agent *a, gnmr_agent_stats *o) {
  if (a == NULL || o == NULL)
    return GNMR_E_INVAL;
#define GNMR__AGENT_STAT_COPY(type, name, what) o->name = atomic_load(&a->name);
  GNMR_AGENT_STATS(GNMR__AGENT_STAT_COPY)
#undef GNMR__AGENT_STAT_COPY
  return GNMR_OK;
}

