/* SPDX-License-Identifier: MIT */
/* policy.h — the pure GNMR engine of docs/policy.md:
 * per-unit statistics, GNMR and delta-GNMR scores, budgeted selection with
 * locks. No I/O, no allocation per step: all buffers are sized at create,
 * resize or parameter change. One engine is owned by one thread at a time. */
#ifndef GNMR_POLICY_H
#define GNMR_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "params.h"

/* Per-unit input status for one step. */
enum policy_input {
  POLICY_REPORTED = 0,     /* norm[u] is the unit's norm (may be 0, NaN, Inf) */
  POLICY_NOT_REPORTED = 1, /* the reporters sent no value for u */
  POLICY_MISSING = 2,      /* a shard of u had no report at decision time */
};

/* The policy's events: XX(ID, value, name); the name is the history's
 * event kind (gnmrctl history --kind). */
#define POLICY_EVENTS(XX)                                                    \
  XX(EXCEED, 1, "exceed")            /* u risky; see outcome */              \
  XX(PROMOTE, 2, "promote")          /* u entered the active set */          \
  XX(DEMOTE, 3, "demote")            /* u left the active set */             \
  XX(NONFINITE, 4, "nonfinite")      /* u reported a NaN/Inf norm */         \
  XX(BUDGET_SATURATED, 5, "budget_saturated") /* |pool| > max_active;       \
                                                 unit = UINT32_MAX */        \
  XX(MISSING, 6, "missing")          /* u (or a shard of it) had no report */ \
  XX(SHADOWED, 7, "shadowed")        /* gnmrd's, not the engine's: u's     \
                                        non-finite score came only from    \
                                        Report.shadowed (the recipe's      \
                                        measure of its low-cost path) */

enum policy_event_kind {
#define POLICY__EV_ENUM(id, v, name) POLICY_EV_##id = v,
  POLICY_EVENTS(POLICY__EV_ENUM)
#undef POLICY__EV_ENUM
};
#define POLICY__EV_COUNT(id, v, name) +1
#define POLICY_N_EVENTS (0 POLICY_EVENTS(POLICY__EV_COUNT))

enum policy_outcome {
  POLICY_OUT_NONE = 0,
  POLICY_OUT_SELECTED = 1, /* risky and in the active set */
  POLICY_OUT_DROPPED = 2,  /* risky but the budget was full */
  POLICY_OUT_WARMUP = 3,   /* risky during warm-up: nobody is selected */
};

/* One event of a step. Scores of an EXCEED event are read from the step's
 * result arrays (g[unit], d[unit], s[unit]); the norm is the caller's. */
/* Which signal made an EXCEED event's unit risky (bits; both when both
 * scores are above 1): its gradient norm, or its recipe's measure
 * (docs/policy.md, "Measured signal"). */
enum policy_signal {
  POLICY_SIGNAL_NORM = 1,
  POLICY_SIGNAL_MEASURE = 2,
};

typedef struct policy_event {
  uint32_t unit;   /* unit id, UINT32_MAX for job-wide events */
  uint8_t kind;    /* enum policy_event_kind */
  uint8_t outcome; /* enum policy_outcome, for EXCEED */
  uint8_t signal;  /* enum policy_signal bits, for EXCEED; otherwise 0 */
  uint32_t count;  /* BUDGET_SATURATED: |P_t|; otherwise 0 */
} policy_event;

/* "norm", "measure" or "norm+measure" for an EXCEED event's signal bits
 * ("" for 0). */
const char *policy_signal_name(int signal);

/* The result of one step. Every pointer is owned by the engine and stays
 * valid until the next policy_step(), policy_set_params(), policy_resize()
 * or policy_destroy() on the same engine. */
typedef struct policy_result {
  uint64_t step;
  const uint32_t *active; /* A_t, ascending unit ids */
  uint32_t n_active;
  uint32_t n_risky;
  uint32_t n_pool;
  const double *g; /* per unit; NAN where not computed this step */
  const double *d; /* per unit; NAN where not computed this step */
  const double *s; /* per unit score; 0 when no usable report */
  /* The measured signal (NULL while its rule is off): per unit its ratio
   * gm, delta-ratio dm (NAN where not computed) and score sm, s being the
   * larger of sm and the norm's score. */
  const double *gm, *dm, *sm;
  const policy_event *events;
  uint32_t n_events;
} policy_result;

typedef struct policy policy;

/* Creates an engine for n_units units (ids 0..n_units-1) with validated
 * parameters. On success *out owns a new engine (free with policy_destroy);
 * on failure *out is NULL and nothing leaks. Errors: GNMR_E_INVAL,
 * GNMR_E_RANGE, GNMR_E_NOMEM. */
int policy_create(const policy_params *params, uint32_t n_units,
                  policy **out);

/* Frees *pp and sets it to NULL; NULL-safe. */
void policy_destroy(policy **pp);

/* Runs one step t (t >= 1) over every unit. norm has n_units entries;
 * input (may be NULL = all reported) says which are usable. Fills *res.
 * No allocation, no I/O. Errors: GNMR_E_INVAL (t == 0, NULL arrays). */
int policy_step(policy *p, uint64_t t, const double *norm,
                const uint8_t *input, policy_result *res);

/* policy_step() with each unit's measure (docs/policy.md, "Measured
 * signal"): measure (may be NULL: nothing measured) has n_units entries,
 * each a finite number >= 0, +inf, or NaN (not measured); ignored while
 * the rule is off. A negative measure is GNMR_E_INVAL. */
int policy_step_measured(policy *p, uint64_t t, const double *norm,
                         const uint8_t *input, const double *measure,
                         policy_result *res);

/* The same-step bound of unit u (docs/policy.md, "Same-step mode"): the
 * measure above which u's measure alone would score it above 1 at the
 * next step by the plain thresholds; +inf when its measure has no history
 * yet or the rule is off. */
double policy_measure_bound(const policy *p, uint32_t u);

/* Replaces the parameters, effective from the next step. The window ring
 * keeps its newest min(len, new window) values; statistics and locks are
 * kept (a lock above a new lock_steps is clipped to it). May allocate.
 * On error nothing changes. */
int policy_set_params(policy *p, const policy_params *params);

/* Grows the unit count (new units start with no history). Shrinking is
 * GNMR_E_INVAL. May allocate; on error nothing changes. */
int policy_resize(policy *p, uint32_t n_units);

/* Moves the units to new places: old unit u becomes unit to[u] of
 * n_units (UINT32_MAX: dropped); units nothing moves to start with no
 * history. Used when units are numbered in another order (gnmrd keeps a
 * job's units in ascending id order). to must be injective: else
 * GNMR_E_INVAL. May allocate; on error nothing changes. */
int policy_remap(policy *p, uint32_t n_units, const uint32_t *to);

const policy_params *policy_get_params(const policy *p);
uint32_t policy_units(const policy *p);
/* The last step run (0 before the first). */
uint64_t policy_last_step(const policy *p);

/* A read-only view of one unit's state, for status queries. */
typedef struct policy_unit_info {
  uint64_t cnt;
  double mean;  /* sum / cnt, NAN when cnt == 0 */
  double last_g, last_d, last_s;
  uint32_t lock;
  int active;   /* in the last step's active set */
  uint64_t promotions;
  /* the measured signal's (mcnt 0, NAN, while its rule is off) */
  uint64_t mcnt;
  double mmean;
  double last_gm, last_dm, last_sm;
} policy_unit_info;
int policy_unit(const policy *p, uint32_t u, policy_unit_info *info);

/* Export: the whole state (parameters, every unit's statistics, window,
 * lock, active flag, promotion count, last step) as a self-describing,
 * versioned little-endian byte string. policy_export_size() gives the
 * exact size; policy_export() writes it into buf (cap bytes) and returns
 * GNMR_E_RANGE when cap is too small. */
size_t policy_export_size(const policy *p);
int policy_export(const policy *p, void *buf, size_t cap, size_t *len);

/* A unit id table after the export, for an engine whose unit u stands
 * for an id other than u (gnmrd's sparse ids; units kept in ascending id
 * order): n little-endian u32 ids, u32 n, "GNMRSID1". policy_ids_size()
 * is its size; policy_ids_write() writes it at out. policy_ids_split()
 * splits stored bytes: *pol_len bytes for policy_import(), and the ids
 * (*ids malloc'd; NULL when there is no table: ids 0..n-1). GNMR_E_PARSE
 * for a table that does not hold together (ids not ascending, or
 * UINT32_MAX), GNMR_E_NOMEM. */
size_t policy_ids_size(uint32_t n);
void policy_ids_write(void *out, const uint32_t *ids, uint32_t n);
int policy_ids_split(const void *blob, size_t len, size_t *pol_len,
                     uint32_t **ids, uint32_t *n_ids);

/* A snapshot taken off the engine's thread. policy_snap_begin() owes the
 * state as of now to the returned handle in O(1): it finds room for the
 * bytes and serializes nothing (NULL on no memory: use policy_export).
 * Another thread then gets the policy_export() bytes with
 * policy_snap_take(): *buf stays the handle's, valid until
 * policy_snap_free() (a second take is GNMR_E_INVAL).
 * policy_snap_begin_ids() takes the units' ids too (n_ids must be the
 * engine's unit count; copied): take then appends their table
 * (policy_ids_write) to the bytes, what policy_ids_split() reads back. The
 * engine's own thread keeps reading; its next change (step, resize, set_params,
 * destroy, another begin) first makes sure the bytes exist: it serializes,
 * alongside the other thread, whatever pieces nobody has started. Only one
 * thread may change the engine, as always; take and free may run on another.
 * policy_snap_free() releases the consumer's reference (NULL-safe).
 *
 * Buffers of 2 MiB or more are kept for the next snapshot (at most
 * POLICY_SNAP_SPARES of them, process-wide) rather than unmapped: a fresh
 * mapping costs a page fault per page at first touch, which on a VM can
 * cost more than writing the bytes (97 MB: 0.3 s where a fault takes
 * 12 us), so a job's snapshots reuse pages already mapped. */
#define POLICY_SNAP_SPARES 4
typedef struct policy_snap policy_snap;
policy_snap *policy_snap_begin(policy *p);
policy_snap *policy_snap_begin_ids(policy *p, const uint32_t *ids,
                                   uint32_t n_ids);
int policy_snap_take(policy_snap *s, void **buf, size_t *len);
void policy_snap_free(policy_snap **s);
/* Another reference to s, released with policy_snap_free (NULL-safe);
 * whether the caller's is the only one left (the engine changed since,
 * the consumer and any other holder let go). */
policy_snap *policy_snap_ref(policy_snap *s);
int policy_snap_unshared(const policy_snap *s);
/* Writes, on the calling thread, the pieces that nobody has started, and
 * returns without waiting for pieces that others write: serializes early
 * (gnmrd: on a worker as soon as the snapshot begins), so that neither
 * the consumer nor the engine's next change has anything left to do. Any
 * thread that holds a reference; NULL-safe. */
void policy_snap_fill(policy_snap *s);
/* The engine's last step at begin, and the room the bytes take until
 * taken (every window full: at least policy_export_size(), and the id
 * table's). */
uint64_t policy_snap_step(const policy_snap *s);
size_t policy_snap_size(const policy_snap *s);
/* Process-wide: snapshots begun, and those whose engine changed before
 * they were taken, so that its own thread serialized part of them. */
void policy_snap_counts(uint64_t *snapshots, uint64_t *owner_helped);
/* Process-wide: large snapshot buffers kept for reuse now (count and
 * bytes), and snapshots that found one. */
void policy_snap_spares(uint32_t *buffers, uint64_t *bytes,
                        uint64_t *reused);
/* Unmaps every kept buffer (a large job ended: its buffers would stay
 * until a larger snapshot came); returns the bytes given back. Any
 * thread; a snapshot after it maps its buffer anew. */
uint64_t policy_snap_spares_drop(void);

/* The steps' SIMD path (policy_simd.c): each lane does the scalar
 * engine's arithmetic in its order, so results are identical whichever
 * runs. Chosen once per process, the widest the CPU has, narrowed by
 * GNMR_POLICY_SIMD=off|avx2|avx512; policy_simd_set() picks one
 * (GNMR_E_UNSUPPORTED when the CPU lacks it; process-wide, set it before
 * engines step on other threads). */
enum { POLICY_SIMD_OFF = 0, POLICY_SIMD_AVX2 = 1, POLICY_SIMD_AVX512 = 2 };
int policy_simd_set(int level);
int policy_simd_get(void);
const char *policy_simd_name(int level);

/* Import: a new engine from an export. Malformed, truncated or oversized
 * input is GNMR_E_PARSE (never a crash); bad parameters inside it are
 * GNMR_E_INVAL/GNMR_E_RANGE. On failure *out is NULL. */
int policy_import(const void *buf, size_t len, policy **out);

const char *policy_event_name(int kind);
const char *policy_outcome_name(int outcome);

#endif /* GNMR_POLICY_H */
