/* SPDX-License-Identifier: MIT */
/* core.h — gnmrd's decision core: the job registry, unit registration
 * (units shared by name across ranks as shards), the per-step barrier,
 * rank-order shard sums, training restarts (passes) and the one-decision-
 * per-step rule. No libuv, ZeroMQ, SQLite or JSON: time is an argument and
 * a decided step comes back as a core_outcome that the layer above
 * (jobs.c) sends, stores and counts. One thread owns a job (gnmrd's loop).
 * tests/test_core.c drives it directly. */
#ifndef GNMRD_CORE_H
#define GNMRD_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "hmap.h"
#include "policy.h"

#define CORE_MAX_PENDING 16u    /* undecided steps held per job */
#define CORE_MAX_AHEAD 1024u    /* a report may run this far past the last
                                   decided step */
#define CORE_MAX_OBSERVERS 4096u

/* One rank's (or observer's) registration. conn, conn_len, user and
 * instance belong to the layer above: the core keeps and frees them, never
 * reads them. */
typedef struct core_rank {
  int joined;         /* said Hello (and not Bye) */
  int rejoined;       /* said Hello after steps were decided: its next
                         report may restart training from a checkpoint */
  int ever;           /* has ever joined: its units exist */
  uint64_t last_step; /* highest step of its accepted reports in this pass;
                         UINT64_MAX after a restore (not known) */
  uint32_t n_units;
  uint32_t *ids;      /* job-wide id of each local unit */
  uint32_t *slots;    /* the job's slot of each local unit (see core_job) */
  char *conn;         /* current connection identity (layer above) */
  size_t conn_len;
  char *user;         /* the CURVE key it first joined with, or NULL */
  char *instance;     /* the agent that holds it (Hello.instance), or NULL */
} core_rank;

/* One rank's report of one step, held until the step is decided. The
 * arrays stay owned by owner, which the job's release callback frees. */
typedef struct core_report {
  void *owner;               /* NULL = not reported yet */
  const double *sumsq;       /* n_units of the rank */
  const uint64_t *nonfinite; /* NULL: all zero */
  const int *not_reported;   /* NULL: all reported */
  const int *shadowed;       /* NULL: none (Report.shadowed) */
  const double *measure;     /* NULL: none measured (Report.measure) */
  const int *missing;        /* NULL: none (Report.missing) */
} core_report;

typedef struct core_pending {
  uint64_t step;
  uint64_t first_ms;  /* clock of the first report */
  uint64_t first_ns;
  uint64_t deadline;  /* ms */
  uint32_t got;
  core_report *by_rank;
} core_pending;

typedef struct core_job {
  char *name;
  void *data;                /* the layer above's (jobs.c: its job) */
  char *owner;               /* the CURVE key that created it, or NULL
                                (the layer above's; freed with the job) */
  void (*release)(void *owner);
  uint64_t run;              /* the run of this job name (never reused) */
  uint32_t pass;             /* 1, +1 at each resume */
  uint32_t pub_pass;         /* pass of the last published decision */
  uint64_t pub_step;         /* its step: a pass publishes each step once */
  policy_params hello_params;/* what its agents send (fixed) */
  policy_params params;      /* in force (changed by gnmrctl set) */
  uint32_t reporters, barrier_ms, byes;
  /* Hello.node_ranks: a unit's shards are summed node by node, ranks
   * r / node_ranks alike sharing one (0 and 1: each rank its own); a
   * restored job takes its first Hello's (node_ranks_set 0 until then) */
  uint32_t node_ranks;
  int node_ranks_set;
  uint32_t max_units;        /* ids and units above it are refused */
  /* Units live in slots 0..n_units-1 in ascending id order: the engine's
   * unit u is slot u, so memory follows the units that exist, not the
   * largest id, and ties (broken by the engine's index) still go to the
   * smaller id. A new unit whose id falls between others moves the later
   * slots up (policy_remap), at registration only. */
  policy *pol;
  hmap unit_ids;             /* name -> id */
  uint32_t *unit_id;         /* by slot: the job-wide id, ascending */
  char **unit_names;         /* by slot */
  uint32_t *shards;          /* by slot: ranks holding the unit */
  uint32_t n_units, cap_units; /* slots */
  core_rank *ranks;          /* reporters entries */
  core_rank *observers;      /* replicas: decisions only */
  uint32_t n_observers, cap_observers;
  core_pending pend[CORE_MAX_PENDING]; /* sorted by step */
  uint32_t n_pend;
  uint64_t last_decided;
  /* since this gnmrd began serving the job (/metrics): units promoted,
   * and steps decided with a non-finite norm (those the trainer
   * callbacks skip) */
  uint64_t promotions, nonfinite_steps, shadowed_steps;
  /* reports dropped because their step ended up more than CORE_MAX_AHEAD
   * past the last decided one (taken before the job's first decision);
   * the daemon counts and zeroes it */
  uint64_t far_dropped;
  /* decision scratch, by slot */
  double *norm, *acc;
  uint8_t *input;
  uint32_t *got, *nrc;
  uint64_t *nfc;
  uint8_t *shd; /* by slot: shadowed by a rank, with no NaN/Inf of its own */
  uint8_t *mis; /* by slot: a shard said missing (Report.missing) */
  double *part; /* by slot: the node's partial sum (node_ranks > 1) */
  uint8_t *tch; /* by slot: part holds a shard of the node being summed */
  double *meas; /* by slot: the largest measure of its shards (NaN: none) */
  int measured; /* some unit had a measure at the step decided */
  uint32_t *act_ids;         /* the decision's active set, as ids */
} core_job;

typedef struct core_clock {
  uint64_t ms; /* the loop's clock: deadlines */
  uint64_t ns; /* a monotonic clock: latencies */
} core_clock;

/* ---- registry: name -> job ------------------------------------------------ */

typedef struct core_registry {
  hmap jobs;
} core_registry;

core_job *core_find(const core_registry *reg, const char *name);
/* Creates and registers a job (pass 1, no units, at most POLICY_MAX_UNITS
 * units until max_units is set). NULL on no memory. */
/* The slot of unit id, or UINT32_MAX when the job has no such unit. */
uint32_t core_slot(const core_job *j, uint32_t id);
core_job *core_job_new(core_registry *reg, const char *name,
                       const policy_params *prm, uint32_t reporters,
                       uint32_t barrier_ms, void (*release)(void *owner));
/* Unregisters and frees a job, releasing every held report and freeing
 * every registration (conn and user included). */
void core_job_free(core_registry *reg, core_job **jp);
/* Iterates: *pos starts at 0; returns NULL at the end. */
core_job *core_next_job(const core_registry *reg, size_t *pos);
size_t core_count(const core_registry *reg);
/* Frees every job, then the registry. */
void core_registry_clear(core_registry *reg);

/* ---- units -------------------------------------------------------------------- */

/* Registers a rank's (shards = 1) or an observer's (shards = 0) units:
 * known names map to their ids (a requested id must match), new names get
 * the requested ids (ids != NULL; any id below UINT32_MAX) or the ids
 * after the largest one. max_units bounds the job's number of units. All
 * or nothing; on failure why says what conflicts: GNMR_E_MISMATCH,
 * GNMR_E_RANGE, GNMR_E_NOMEM. */
int core_register_units(core_job *j, core_rank *rr, const char *const *names,
                        size_t n, const uint32_t *ids, int shards, char *why,
                        size_t whylen);
/* A new job's unit table made ahead, on any thread: the names copied,
 * numbered 0..n-1 in order, and the map from name to id (its keys the
 * copies). A large Hello's table is made off the loop (dispatch.c), and
 * taken over whole when the Hello creates the job. */
typedef struct core_prepared {
  uint32_t n;
  char **names;
  hmap map;
} core_prepared;
/* *out = the table of n distinct names; GNMR_E_NOMEM. Any thread. */
int core_prepare_units(const char *const *names, size_t n,
                       core_prepared **out);
/* Frees what was not taken over; *p = NULL. Any thread. */
void core_prepared_free(core_prepared **p);
/* Registers a rank's units (shards = 1) from *p when the job has no units
 * yet and the rank none, asks no ids, and names exactly p's names (the
 * Hello p was made from): the table is taken over (*p = NULL), ids
 * 0..n-1, as core_register_units would give them. Returns 1 when it does
 * not apply (nothing changed: call core_register_units), else as
 * core_register_units (GNMR_E_RANGE past max_units, GNMR_E_NOMEM). */
int core_register_prepared(core_job *j, core_rank *rr, core_prepared **p,
                           int shards, char *why, size_t whylen);
/* Whether names (and ids, when not NULL) are exactly rr's units. */
int core_same_units(const core_job *j, const core_rank *rr,
                    const char *const *names, size_t n, const uint32_t *ids);
/* A free observer slot (grown when needed), zeroed. NULL when the job has
 * CORE_MAX_OBSERVERS joined observers (*full = 1) or on no memory. */
core_rank *core_observer_slot(core_job *j, uint32_t *slot, int *full);
/* Forgets a registration's connection (conn = NULL); an observer's slot
 * becomes free. */
void core_disconnect(core_rank *rr, int observer);

/* ---- reports and decisions ------------------------------------------------ */

enum core_report_rc {
  CORE_ACCEPTED = 0, /* held until its step is decided */
  CORE_LATE,         /* for a decided step: dropped */
  CORE_TOO_FAR,      /* more than CORE_MAX_AHEAD past the last decision */
  CORE_FULL,         /* CORE_MAX_PENDING steps already wait */
  CORE_DUPLICATE,    /* this rank already reported this step */
  CORE_NOMEM,
};

/* Takes rank's report of step. On CORE_ACCEPTED the job owns rep->owner;
 * otherwise the caller keeps it. *resumed is set when the report started a
 * new pass (training restarted from a checkpoint); detail then says so. */
int core_report_step(core_job *j, uint32_t rank, uint64_t step,
                     const core_report *rep, core_clock now, int *resumed,
                     char *detail, size_t detail_len);

/* A decided step. Every pointer stays valid until the next core call on
 * the job. */
typedef struct core_outcome {
  uint64_t step;
  int by_deadline;    /* not every expected report came */
  int republish;      /* refused: the pass already published this step */
  int rv;             /* policy_step's result; GNMR_OK when decided */
  uint32_t reports;   /* reports that came */
  uint32_t missing;   /* units decided with a missing shard */
  uint64_t first_ms, first_ns;
  policy_result res;  /* when rv == GNMR_OK and !republish: its units
                         (events, active, g, d, s) are slots */
  const double *norm; /* by slot: the summed norms */
  const uint8_t *input;
  const uint32_t *unit_id;    /* slot -> job-wide id */
  const uint32_t *active_ids; /* res.active as ids (ascending) */
  const uint8_t *shadowed;    /* by slot: its non-finite score is only a
                                 rank's Report.shadowed */
  const double *measure;      /* by slot: its measure (NaN: none); NULL
                                 when no unit had one */
} core_outcome;

/* A step decided before gnmrd restarted (its history, or an agent that
 * held the decision): it stays decided. Moves the last decided step up to
 * step (never down), dropping the reports of pending steps at or below it
 * (late now). Returns whether it moved. Not while a step is being decided
 * on another thread. */
int core_restart_adopt_decided(core_job *j, uint64_t step);

/* Decides the oldest pending step when it, or any later one, is complete
 * or past its deadline. Returns 1 with *out filled (the step is gone from
 * the pending list), 0 when nothing is ready. Call until 0. The same as
 * core_decide_begin, _run and _end in a row. */
int core_decide_next(core_job *j, uint64_t now_ms, core_outcome *out);

/* A step taken off the pending list to be decided, possibly on another
 * thread (gnmrd's workers). Between core_decide_begin and core_decide_end
 * the job's thread may call only core_report_step, core_bye,
 * core_is_pending, core_next_deadline and core_disconnect on the job
 * (they touch neither the engine nor the scratch arrays nor the units),
 * and core_decide_run runs once on any one thread, after begin and
 * before end (a happens-before edge each way, e.g. a mutex). */
typedef struct core_decision {
  core_pending p;    /* detached: its reports stay held until end */
  uint32_t pass;     /* the pass it is decided in */
  int republish;
  int by_deadline;   /* not every expected report came */
  uint64_t work;     /* unit-shards to sum plus units to decide */
} core_decision;

/* The loop's half before: returns 1 with *dd filled when a step is ready
 * (as core_decide_next); the job's last decided step is then dd's. */
int core_decide_begin(core_job *j, uint64_t now_ms, core_decision *dd);
/* The arithmetic: rank-order shard sums and the engine's step. *out's
 * pointers stay valid until the next call that changes the job. */
void core_decide_run(core_job *j, const core_decision *dd,
                     core_outcome *out);
/* The loop's half after: marks the step published in its pass and
 * releases its reports. */
void core_decide_end(core_job *j, core_decision *dd, const core_outcome *out);
/* Whether step has reports waiting (it is neither decided nor new). */
int core_is_pending(const core_job *j, uint64_t step);
/* The earliest pending deadline, UINT64_MAX when nothing is pending. */
uint64_t core_next_deadline(const core_job *j);

/* A rank said Bye. Returns 1 when every reporter has: the job finished. */
int core_bye(core_job *j, uint32_t rank);
/* A rank joined; returning: it had joined and said Bye before (read
 * before registering its units), so it counts as a reporter again. */
void core_join(core_job *j, uint32_t rank, int returning);

/* ---- restart ----------------------------------------------------------------- */

/* Rebuilds a job's units and ranks after a restart of gnmrd: n_units
 * units (ids and names, any order; duplicate or UINT32_MAX ids skipped),
 * ranks' ids (a rank naming an unknown id is left unregistered). pol (may
 * be NULL) replaces the engine: the job's statistics from a snapshot,
 * whose unit u had id pol_ids[u] (pol_ids NULL: id u, as snapshots of
 * dense jobs and of gnmrd before sparse ids are); units the snapshot does
 * not have start with no history. pol is the job's (or freed) whatever
 * the result. */
int core_restart_restore(core_job *j, policy *pol, const uint32_t *pol_ids,
                         uint32_t n_units, const uint32_t *unit_ids,
                         char *const *unit_names, uint32_t n_ranks,
                         const uint32_t *rank_n, uint32_t *const *rank_ids);
/* Whether slot s holds id s for every slot (then snapshots need no id
 * table). */
int core_dense(const core_job *j);

#endif /* GNMRD_CORE_H */
