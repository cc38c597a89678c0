/* SPDX-License-Identifier: MIT */
/* params.h — gnmrd's side of the parameter table (gnmr/params.h): the
 * policy_params struct, its defaults, validation and comparison, the
 * conversion from the agent's gnmr_params, and the parameters as
 * command-line options and key=value settings (gnmrctl replay and set,
 * gnmr-sim, gnmrd.conf's [policy]). No engine: the agent links this
 * without the policy. */
#ifndef GNMR_POLICY_PARAMS_H
#define GNMR_POLICY_PARAMS_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>

#include "gnmr/agent.h"
#include "gnmr/params.h"

/* One job's parameters; an unset inheriting threshold is NAN here. */
typedef struct policy_params {
  GNMR_PARAMS_MAP(GNMR__PARAM_FIELD)
} policy_params;

/* Limits that keep a job's memory bounded; parameters beyond them are
 * GNMR_E_RANGE. */
#define POLICY_MAX_WINDOW 65536u
#define POLICY_MAX_UNITS (1u << 24)

enum policy_param_kind {
  POLICY_PK_THRESHOLD, POLICY_PK_WINDOW, POLICY_PK_U32, POLICY_PK_U64,
  POLICY_PK_FLAG, POLICY_PK_SIGNAL
};

/* One row of the table, at run time. */
typedef struct policy_param {
  const char *name;     /* field, INI key, SQL column, JSON key */
  const char *option;   /* command-line spelling, without "--" */
  const char *env;      /* the agent's environment variable */
  int kind;             /* enum policy_param_kind */
  size_t off;           /* in policy_params */
  size_t pub_off;       /* in gnmr_params */
  double deflt;
} policy_param;

extern const policy_param policy_param_table[GNMR_NPARAMS];
/* The index of the parameter that i takes while unset, or -1. */
int policy_param_inherits(int i);

/* The defaults in force (docs/policy.md, "Defaults"): alpha 6, beta 8,
 * window 8, max_active 4, lock_steps 4, warmup 20, early_* = alpha/beta
 * (NAN), early_steps 0, mean_horizon 20, job_relative 1, confirm_steps
 * 2, measure_alpha and measure_beta as the table says. The first
 * defaults were alpha = beta = 2 with the optional rules off. */
void policy_params_default(policy_params *p);

/* Checks every constraint of the spec and the limits above. Returns 0,
 * GNMR_E_INVAL (non-positive or non-finite threshold, window 0) or
 * GNMR_E_RANGE (beyond a limit). On error, *what (if not NULL) names the
 * offending parameter. */
int policy_params_validate(const policy_params *p, const char **what);

/* Equal, an unset threshold equal only to an unset one. */
int policy_params_equal(const policy_params *a, const policy_params *b);

/* A parameter's value in force: an unset threshold reads as the one it
 * inherits. Counts come back exactly up to 2^53. */
double policy_param_value(const policy_params *p, int i);
/* Raw accessors by kind: thresholds as double (NAN when unset), counts as
 * uint64_t. */
double policy_param_f64(const policy_params *p, int i);
uint64_t policy_param_u64(const policy_params *p, int i);
void policy_param_set_f64(policy_params *p, int i, double v);
void policy_param_set_u64(policy_params *p, int i, uint64_t v);
static inline int policy_param_is_f64(int i) {
  return policy_param_table[i].kind == POLICY_PK_THRESHOLD ||
         policy_param_table[i].kind == POLICY_PK_SIGNAL;
}

/* Whether the measured signal's rule is on (docs/policy.md: either of its
 * thresholds above 0). */
static inline int policy_params_measured(const policy_params *p) {
  return p->measure_alpha > 0 || p->measure_beta > 0;
}

/* gnmr_params (0 = unset) <-> policy_params (NAN = unset). */
void policy_params_from_public(const gnmr_params *g, policy_params *p);
void policy_params_to_public(const policy_params *p, gnmr_params *g);

/* ---- as options and settings ---------------------------------------------- */

#define GNMR_POLICY_NOPTS GNMR_NPARAMS

/* Fills rows[0..GNMR_POLICY_NOPTS) with getopt_long rows (required
 * argument) whose val is base + i. */
void gnmr__policy_opts_longopts(struct option *rows, int base);

/* Applies option index i (val - base) with argument arg to *p. Returns 0,
 * or GNMR_E_PARSE/GNMR_E_RANGE with a message in err. */
int gnmr__policy_opts_apply(policy_params *p, int i, const char *arg,
                            char *err, size_t errlen);

/* Index of the option named name ("max-active" or "max_active"), or -1. */
int gnmr__policy_opts_find(const char *name);

/* Applies "key=value" settings (keys as options or fields: max-active or
 * max_active) to a copy of *p and validates the result; *p changes only
 * when all are good. Returns 0 or GNMR_E_INVAL with a message. */
int gnmr__policy_settings_apply(policy_params *p, char *const *settings,
                                size_t n, char *err, size_t errlen);

/* Validates the whole set; on error writes which option is wrong. */
int gnmr__policy_opts_check(const policy_params *p, char *err, size_t errlen);

/* "alpha, beta, ..., early_steps": the names, for messages. */
const char *policy_param_names(void);

/* The usage text of the options, one line. */
#define GNMR__PARAM_USAGE(name, ctype, kind, opt, env, def, inh)             \
  "[--" opt " " GNMR__PARAM_METAVAR_##kind "] "
#define GNMR__PARAM_METAVAR_THRESHOLD "X"
#define GNMR__PARAM_METAVAR_WINDOW "N"
#define GNMR__PARAM_METAVAR_U32 "N"
#define GNMR__PARAM_METAVAR_U64 "N"
#define GNMR__PARAM_METAVAR_FLAG "0|1"
#define GNMR__PARAM_METAVAR_SIGNAL "X"
#define GNMR_POLICY_OPTS_USAGE GNMR_PARAMS_MAP(GNMR__PARAM_USAGE)

/* Writes python/gnmr/_params.py's text (the table for the ctypes
 * declarations) to buf; returns its length (as snprintf). */
int policy_params_python(char *buf, size_t cap);

#endif /* GNMR_POLICY_PARAMS_H */
