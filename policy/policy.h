/* SPDX-License-Identifier: MIT */
/* policy.h — the pure GNMR engine of docs/policy.md:
 * per-unit statistics, GNMR and delta-GNMR scores, budgeted selection with
 * locks. No I/O, no allocation per step: all buffers are sized at create,
 * resize or parameter change. One engine is owned by one thread at a time. */
#ifndef GNMR_POLICY_H
#define GNMR_POLICY_H

#include <stddef.h>
#include <stdint.h>

/* Parameters of one job. early_alpha/early_beta NAN means "same as
 * alpha/beta" (the spec's default); policy_params_resolve() fills them. */
typedef struct policy_params {
  double alpha;         /* GNMR threshold, > 0 */
  double beta;          /* delta-GNMR threshold, > 0 */
  double early_alpha;   /* alpha while t <= early_steps; NAN = alpha */
  double early_beta;    /* beta while t <= early_steps; NAN = beta */
  uint32_t window;      /* delta-GNMR window, >= 1 */
  uint32_t max_active;  /* budget: units on the recovery path per step */
  uint32_t lock_steps;  /* calm steps a selected unit stays a candidate */
  uint64_t warmup_steps;
  uint64_t early_steps;
} policy_params;

/* Limits that keep a job's memory bounded; parameters beyond them are
 * GNMR_E_RANGE. */
#define POLICY_MAX_WINDOW 65536u
#define POLICY_MAX_UNITS (1u << 24)

/* Per-unit input status for one step. */
enum policy_input {
  POLICY_REPORTED = 0,     /* norm[u] is the unit's norm (may be 0, NaN, Inf) */
  POLICY_NOT_REPORTED = 1, /* the reporters sent no value for u */
  POLICY_MISSING = 2,      /* a shard of u had no report at decision time */
};

enum policy_event_kind {
  POLICY_EV_EXCEED = 1,           /* u risky; see outcome */
  POLICY_EV_PROMOTE = 2,          /* u entered the active set */
  POLICY_EV_DEMOTE = 3,           /* u left the active set */
  POLICY_EV_NONFINITE = 4,        /* u reported a NaN/Inf norm */
  POLICY_EV_BUDGET_SATURATED = 5, /* |pool| > max_active; unit = UINT32_MAX */
  POLICY_EV_MISSING = 6,          /* u (or a shard of it) had no report */
};

enum policy_outcome {
  POLICY_OUT_NONE = 0,
  POLICY_OUT_SELECTED = 1, /* risky and in the active set */
  POLICY_OUT_DROPPED = 2,  /* risky but the budget was full */
  POLICY_OUT_WARMUP = 3,   /* risky during warm-up: nobody is selected */
};

/* One event of a step. Scores of an EXCEED event are read from the step's
 * result arrays (g[unit], d[unit], s[unit]); the norm is the caller's. */
typedef struct policy_event {
  uint32_t unit;   /* unit id, UINT32_MAX for job-wide events */
  uint8_t kind;    /* enum policy_event_kind */
  uint8_t outcome; /* enum policy_outcome, for EXCEED */
  uint32_t count;  /* BUDGET_SATURATED: |P_t|; otherwise 0 */
} policy_event;

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
  const policy_event *events;
  uint32_t n_events;
} policy_result;

typedef struct policy policy;

/* The spec's defaults: alpha = beta = 2, window 8, max_active 4,
 * lock_steps 4, warmup 20, early_* = alpha/beta (NAN), early_steps 0. */
void policy_params_default(policy_params *p);

/* Checks every constraint of the spec and the limits above. Returns 0,
 * GNMR_E_INVAL (non-positive or non-finite threshold, window 0) or
 * GNMR_E_RANGE (beyond a limit). On error, *what (if not NULL) names the
 * offending parameter. */
int policy_params_validate(const policy_params *p, const char **what);

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

/* Replaces the parameters, effective from the next step. The window ring
 * keeps its newest min(len, new window) values; statistics and locks are
 * kept (a lock above a new lock_steps is clipped to it). May allocate.
 * On error nothing changes. */
int policy_set_params(policy *p, const policy_params *params);

/* Grows the unit count (new units start with no history). Shrinking is
 * GNMR_E_INVAL. May allocate; on error nothing changes. */
int policy_resize(policy *p, uint32_t n_units);

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
} policy_unit_info;
int policy_unit(const policy *p, uint32_t u, policy_unit_info *info);

/* Export: the whole state (parameters, every unit's statistics, window,
 * lock, active flag, promotion count, last step) as a self-describing,
 * versioned little-endian byte string. policy_export_size() gives the
 * exact size; policy_export() writes it into buf (cap bytes) and returns
 * GNMR_E_RANGE when cap is too small. */
size_t policy_export_size(const policy *p);
int policy_export(const policy *p, void *buf, size_t cap, size_t *len);

/* Import: a new engine from an export. Malformed, truncated or oversized
 * input is GNMR_E_PARSE (never a crash); bad parameters inside it are
 * GNMR_E_INVAL/GNMR_E_RANGE. On failure *out is NULL. */
int policy_import(const void *buf, size_t len, policy **out);

const char *policy_event_name(int kind);
const char *policy_outcome_name(int outcome);

#endif /* GNMR_POLICY_H */
