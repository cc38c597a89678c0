/* SPDX-License-Identifier: MIT */
/* gnmr/agent.h — libgnmr-agent, linked into each training rank.
 * It reduces per-unit gradient norms (CPU backend for host tensors), streams
 * them to gnmrd over ZeroMQ from its own I/O thread, and answers "which path
 * does unit u take now". It never prints, never exits, and never blocks the
 * training thread beyond the deadline the caller gives. */
#ifndef GNMR_AGENT_H
#define GNMR_AGENT_H

#include <stddef.h>
#include <stdint.h>

#include "gnmr/error.h"
#include "gnmr/params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Routes: the low-cost path and the recovery (higher-fidelity) path. */
enum gnmr_route { GNMR_ROUTE_LOW = 0, GNMR_ROUTE_HIGH = 1 };

/* What a training process says of itself when it joins
 * (gnmr_agent_config.start; docs/python.md, "Runs and resumes"). */
enum gnmr_start {
  GNMR_START_ANY = 0,    /* nothing: gnmrd's rule alone */
  GNMR_START_FRESH = 1,  /* from the first step: never an old run's state */
  GNMR_START_RESUME = 2  /* from a checkpoint */
};

enum gnmr_dtype {
  GNMR_DTYPE_F32 = 0,
  GNMR_DTYPE_F16 = 1,
  GNMR_DTYPE_BF16 = 2,
  GNMR_DTYPE_F64 = 3,
  GNMR_DTYPE_F8E4M3 = 4, /* OCP FP8 E4M3 (no Inf; S.1111.111 is NaN) */
  GNMR_DTYPE_F8E5M2 = 5, /* OCP FP8 E5M2 */
};

/* The job's policy parameters (docs/policy.md). early_alpha/early_beta 0
 * means "same as alpha/beta". gnmr_params_default() gives the spec's
 * defaults. Every agent of a job must send the same parameters. */
typedef struct gnmr_params {
  GNMR_PARAMS_MAP(GNMR__PARAM_FIELD) /* gnmr/params.h: alpha, beta, window,
                                        max_active, lock_steps, warmup_steps,
                                        early_alpha, early_beta, early_steps,
                                        mean_horizon, job_relative,
                                        confirm_steps */
} gnmr_params;

typedef struct gnmr_agent_config {
  const char *endpoint;   /* gnmrd's agent endpoint, e.g. ipc:///run/gnmr/agents;
                             "A,B": an active gnmrd and its standbys
                             (PostgreSQL store), the one serving is used */
  const char *job;        /* job name, 1..128 printable bytes */
  uint32_t rank;          /* this reporter, 0 <= rank < reporters */
  uint32_t reporters;     /* reports per step (model-parallel shards) */
  const char *const *unit_names; /* this reporter's units; same name on
                                    several reporters = shards of one unit */
  uint32_t n_units;
  const uint32_t *unit_ids;/* optional: the job-wide id of each unit (e.g. a
                              global parameter-group index), the same on
                              every rank; NULL: the daemon numbers them */
  gnmr_params params;
  uint32_t barrier_ms;    /* daemon waits at most this for a step; 0 = 1000 */
  uint32_t fallback_route;/* route when no fresh decision: GNMR_ROUTE_LOW */
  uint32_t fallback_after;/* steps a stale decision is still used; 0 = 3 */
  /* An observer (a data-parallel replica whose shard another replica
   * reports) receives every decision but never reports: report calls only
   * record the step. Its unit names and reporters must match the job's. */
  uint32_t observer;
  /* CURVE (all three, as 40-character Z85 strings, or none): gnmrd's public
   * key and this agent's key pair (gnmrctl keygen writes them). */
  const char *curve_server_key;
  const char *curve_public_key;
  const char *curve_secret_key;
  /* enum gnmr_start, said on the agent's first Hello only: a fresh start
   * under the name of a run that did not finish (its processes gone)
   * ends that run and begins a new one instead of taking its state */
  uint32_t start;
  /* Ranks per node (Hello.node_ranks, docs/protocol.md): the ranks r with
   * the same r / node_ranks share a node, whose relay sums their shards
   * ("Node relays"); every rank of a job says the same. 0 and 1: each
   * rank its own node. At most 4096. GNMR_NODE_RANKS. */
  uint32_t node_ranks;
} gnmr_agent_config;

/* One tensor of a report: numel elements of dtype at data (host memory for
 * gnmr_agent_report, device memory for the CUDA backend), belonging to this
 * reporter's unit `unit` (index into unit_names). scale multiplies every
 * element (an FP8 tensor's per-tensor dequantisation scale): the tensor
 * adds scale^2 times its raw sum of squares. 0 means 1, so a zeroed
 * struct needs no scale. */
typedef struct gnmr_tensor {
  const void *data;
  uint64_t numel;
  uint32_t dtype;  /* enum gnmr_dtype */
  uint32_t unit;
  double scale;
} gnmr_tensor;

/* The agent's counters, one table: XX(type, name, what it counts), in the
 * order of gnmr_agent_stats' fields (its layout, and python/gnmr/_lib.py's
 * Stats, which python/tests checks against this table). */
#define GNMR_AGENT_STATS(XX)                                                 \
  XX(uint64_t, reports_sent, "handed to the I/O thread")                     \
  XX(uint64_t, reports_dropped, "I/O thread behind, or no daemon connected") \
  XX(uint64_t, decisions, "decisions received")                              \
  XX(uint64_t, late_decisions, "gnmr_agent_wait() deadlines missed")         \
  XX(uint64_t, fallback_routes, "route() answers from the fallback")         \
  XX(uint64_t, errors, "Error replies from the daemon")                      \
  XX(uint64_t, hellos, "Hello messages sent (1 + re-joins)")                 \
  XX(int32_t, last_error, "code of the last Error reply, 0 if none")         \
  XX(uint64_t, reports_stale, "held across a re-join for steps the job "     \
                              "decided meanwhile: dropped, never sent")      \
  XX(uint64_t, decisions_fenced, "decisions of an older leadership term "    \
                                 "than one already seen: dropped")

typedef struct gnmr_agent_stats {
#define GNMR__AGENT_STAT_FIELD(type, name, what) type name;
  GNMR_AGENT_STATS(GNMR__AGENT_STAT_FIELD)
#undef GNMR__AGENT_STAT_FIELD
} gnmr_agent_stats;

typedef struct gnmr_agent gnmr_agent;

GNMR_EXPORT void gnmr_params_default(gnmr_params *p);

/* Opens an agent: copies cfg (the caller may free it afterwards), starts the
 * I/O thread, which connects and joins the job in the background (no daemon
 * is not an error). On success *out owns the agent (gnmr_agent_close); on
 * failure *out is NULL. Errors: GNMR_E_INVAL (bad config, names the field
 * nowhere: see the header), GNMR_E_DENIED (an unsafe socket directory:
 * gnmr_endpoint_check says why), GNMR_E_NOMEM, GNMR_E_IO (socket setup). */
GNMR_EXPORT int gnmr_agent_open(const gnmr_agent_config *cfg,
                                gnmr_agent **out);

/* Overlays settings from the environment onto cfg: each variable that is
 * set replaces the field (unit names are never taken from it).
 *
 *   GNMR_ENDPOINT        endpoint          GNMR_ALPHA          params.alpha
 *   GNMR_JOB             job               GNMR_BETA           params.beta
 *   GNMR_RANK            rank              GNMR_WINDOW         params.window
 *   GNMR_REPORTERS       reporters         GNMR_MAX_ACTIVE     params.max_active
 *   GNMR_BARRIER_MS      barrier_ms        GNMR_LOCK_STEPS     params.lock_steps
 *   GNMR_FALLBACK_ROUTE  fallback_route    GNMR_WARMUP_STEPS   params.warmup_steps
 *                        ("low"/"high")    GNMR_EARLY_ALPHA    params.early_alpha
 *   GNMR_FALLBACK_AFTER  fallback_after    GNMR_EARLY_BETA     params.early_beta
 *   GNMR_CURVE_SERVER_KEY curve_server_key GNMR_EARLY_STEPS    params.early_steps
 *   GNMR_CURVE_PUBLIC_KEY curve_public_key GNMR_OBSERVER       observer (0/1)
 *   GNMR_CURVE_SECRET_KEY curve_secret_key GNMR_MEAN_HORIZON   params.mean_horizon
 *                                          GNMR_JOB_RELATIVE   params.job_relative
 *   GNMR_NODE_RANKS      node_ranks        GNMR_CONFIRM_STEPS  params.confirm_steps
 *
 * and checks GNMR_WAIT_SPIN_US (gnmr_agent_wait), which is not a field:
 * gnmr_agent_open reads it, and takes the default for a bad value.
 *
 * String fields point into the environment (keep it unchanged while cfg is
 * used). Returns 0, or GNMR_E_INVAL with the variable's name in bad_var
 * (may be NULL) for a value that is not a valid number; cfg is then left
 * unchanged. */
GNMR_EXPORT int gnmr_agent_config_from_env(gnmr_agent_config *cfg,
                                           const char **bad_var);

/* Sends Bye (best effort), stops the I/O thread, frees everything and sets
 * *a to NULL. NULL-safe.
 *
 * Fork: an agent belongs to the process that opened it. In a child forked
 * after the open, the agent has no I/O thread and its sockets are the
 * parent's: reports and waits there return GNMR_E_CLOSED at once (the last
 * error says why), routes read the last decision, and closing it frees
 * memory only, touching nothing the parent uses. An agent the child opens
 * gets a ZeroMQ context of its own. */
GNMR_EXPORT void gnmr_agent_close(gnmr_agent **a);

/* Reports step (>= 1) from host tensors: reduces them on the calling thread
 * (fp64 sums of squares per unit, counting NaN/Inf elements) and queues the
 * report; never waits for the network. Units with no tensor are "not
 * reported". Calls on one agent must not run concurrently. Errors:
 * GNMR_E_INVAL (unit out of range, bad dtype, NULL data with numel > 0,
 * step 0 or not above the last reported step), GNMR_E_NOMEM. A report that
 * cannot be queued is counted in reports_dropped and is not an error. */
GNMR_EXPORT int gnmr_agent_report(gnmr_agent *a, uint64_t step,
                                  const gnmr_tensor *tensors, size_t n);

/* Reports already-reduced values: sumsq[i] >= 0 per unit, nonfinite[i]
 * (may be NULL = none), not_reported[i] != 0 where there is no value (may
 * be NULL = all reported). Same rules as gnmr_agent_report(). */
GNMR_EXPORT int gnmr_agent_report_sums(gnmr_agent *a, uint64_t step,
                                       const double *sumsq,
                                       const uint64_t *nonfinite,
                                       const uint8_t *not_reported);

/* gnmr_agent_report_sums() with shadowed[i] != 0 (may be NULL = none)
 * for each unit whose low-cost path the recipe measured as damaged at
 * this step (an FP8 cast that overflowed): gnmrd scores it as a
 * non-finite norm (risky at once) and records it as `shadowed`, apart
 * from the real NaN/Inf gradients of nonfinite. */
GNMR_EXPORT int gnmr_agent_report_sums_shadowed(gnmr_agent *a, uint64_t step,
                                                const double *sumsq,
                                                const uint64_t *nonfinite,
                                                const uint8_t *not_reported,
                                                const uint8_t *shadowed);

/* The recipe's own measure of each unit's low-cost path error at `step`
 * (docs/policy.md, "Measured signal"): measure[i] for each of the agent's
 * units, a finite number >= 0, +inf (the low path's result would not be
 * finite) or NaN (not measured). Copied; sent with that step's report,
 * whichever call reports it (a later measure for another step replaces
 * it). Call before the step's report. Errors: GNMR_E_INVAL (NULL, a
 * negative value, step 0 or not above the last reported step). */
GNMR_EXPORT int gnmr_agent_measure(gnmr_agent *a, uint64_t step,
                                   const double *measure);

/* Waits up to timeout_ms for the decision of `step`. Returns 0 when it (or
 * a later one) is in, GNMR_E_TIMEDOUT otherwise (counted as late). It
 * first spins, yielding its CPU to any thread that wants it, for up to
 * GNMR_WAIT_SPIN_US microseconds (read at gnmr_agent_open; default 2000,
 * 0 to 1000000, 0: off) of the timeout, then sleeps: a thread asleep on an
 * idle CPU is woken by an interrupt, which on a virtual machine costs tens
 * of microseconds at each hop of the round trip. At most (CPUs the caller
 * may run on - 1) waits spin at once in a process, none on one CPU; the
 * CPUs are its affinity mask's, or its cgroup's CPU quota (read at open)
 * where that is fewer. */
GNMR_EXPORT int gnmr_agent_wait(gnmr_agent *a, uint64_t step, int timeout_ms);

/* The route of unit `unit` for the step after the last reported one:
 * the latest decision, unless none has arrived or it is more than
 * fallback_after steps old; then the configured fallback route. A
 * lock-free read; any thread. Out-of-range units get the fallback. */
GNMR_EXPORT int gnmr_agent_route(gnmr_agent *a, uint32_t unit);

/* Every unit's route at once: out[u] = gnmr_agent_route(a, u) for u below
 * n (at most the agent's units), all from one decision (or all the
 * fallback), in one lock-free read. Returns the number written, 0 for a
 * NULL agent or out. For a caller with many units (a Python loop over
 * gnmr_agent_route costs about half a microsecond a unit). */
GNMR_EXPORT uint32_t gnmr_agent_routes(gnmr_agent *a, uint8_t *out,
                                       uint32_t n);

/* The step of the latest decision received (0: none yet). */
GNMR_EXPORT uint64_t gnmr_agent_decided_step(const gnmr_agent *a);

/* The units of this agent that exceeded a threshold at the latest
 * decision (local indices, ascending), with their GNMR g, Delta-GNMR d
 * and score s: why the active set is what it is. Fills up to cap entries
 * of each array (any may be NULL); *n gets the count (may exceed cap).
 * Returns that decision's step (0: none yet). Any thread. */
GNMR_EXPORT uint64_t gnmr_agent_risky(gnmr_agent *a, uint32_t *units,
                                      double *g, double *d, double *s,
                                      uint32_t cap, uint32_t *n);

/* The same-step mode (docs/policy.md, "Same-step mode"; the job's
 * same_step parameter): the latest decision's bound for each of this
 * agent's units, into bounds (up to cap; +inf where the unit's measure
 * has no history, or the decision carried none), the measure above which
 * the unit's measure alone would make it risky at the next step; and in
 * *spare the units this rank may move to their recovery path within that
 * step (0 when the decision carried none). Returns that decision's step
 * (0: none yet). Any thread. */
GNMR_EXPORT uint64_t gnmr_agent_bounds(gnmr_agent *a, float *bounds,
                                       uint32_t cap, uint32_t *spare);

/* Whether the daemon has accepted this agent (Welcome received). */
GNMR_EXPORT int gnmr_agent_joined(const gnmr_agent *a);

/* What the first Welcome said this agent joined: the job's run (0 from a
 * gnmrd before runs were told) and the step gnmrd had decided up to (0:
 * none, a new run; above 0: a live run that goes on with its statistics).
 * Returns 1 once joined, else 0 and writes nothing. Any thread. */
GNMR_EXPORT int gnmr_agent_run(const gnmr_agent *a, uint64_t *run,
                               uint64_t *last_step);

/* The code of gnmrd's last Error reply to this agent (0: none) and, in
 * buf (cap bytes, may be NULL), its message: why a Hello was refused, say
 * ("rank 0 of job j is held by a live agent (...)"). Any thread. */
GNMR_EXPORT int gnmr_agent_last_error(gnmr_agent *a, char *buf, size_t cap);

/* Whether endpoints (what gnmr_agent_config.endpoint takes: ipc://PATH,
 * tcp://HOST:PORT, or a comma-separated list of them) is well formed:
 * GNMR_OK, or GNMR_E_INVAL with, in why (cap bytes, may be NULL), what is
 * wrong and the forms accepted; GNMR_E_DENIED when an ipc:// socket
 * directory is one another user could serve from as gnmrd (a symlink,
 * writable by others, or owned by another ordinary user: only this user,
 * root and system accounts below uid 1000 may own it). gnmr_agent_open
 * checks the same, and the agent checks the directories again before
 * every Hello (refused: gnmr_agent_last_error says why, code DENIED). */
GNMR_EXPORT int gnmr_endpoint_check(const char *endpoints, char *why,
                                    size_t cap);

GNMR_EXPORT int gnmr_agent_stats_get(const gnmr_agent *a,
                                     gnmr_agent_stats *out);

/* The CPU reduction alone: adds each tensor's sum of squares (fp64) into
 * sumsq[unit] and its NaN/Inf count into nonfinite[unit]; sets seen[unit]
 * (may be NULL). Arrays have n_units entries and are not cleared here.
 * Non-finite elements are excluded from sumsq. Errors: GNMR_E_INVAL. */
GNMR_EXPORT int gnmr_reduce_cpu(const gnmr_tensor *tensors, size_t n,
                                uint32_t n_units, double *sumsq,
                                uint64_t *nonfinite, uint8_t *seen);

/* gnmr_reduce_cpu on `threads` threads: the caller and threads - 1 helpers
 * the library starts on first use and keeps asleep in between (at most 7).
 * 0: the GNMR_REDUCE_THREADS environment variable, else one per CPU this
 * process may run on, at most 8. Same arguments, errors and results, bit
 * for bit, whatever the thread count: every tensor's 4096-element blocks
 * are summed in order by the caller. Below 2^18 elements in all, or while
 * another thread's reduction holds the helpers, the caller reduces alone.
 * Meant for a synchronous step, when the training's own threads wait; pass
 * 1 where the reduction overlaps other work. */
GNMR_EXPORT int gnmr_reduce_cpu_threads(const gnmr_tensor *tensors, size_t n,
                                        uint32_t n_units, double *sumsq,
                                        uint64_t *nonfinite, uint8_t *seen,
                                        unsigned threads);

#ifdef __cplusplus
}
#endif
#endif /* GNMR_AGENT_H */
