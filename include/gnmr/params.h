/* SPDX-License-Identifier: MIT */
/* gnmr/params.h — the policy parameters of docs/policy.md, one table.
 * Everything that names a parameter is generated from it: gnmr_params and
 * gnmrd's policy_params, validation, the defaults, the command-line
 * options, gnmrd.conf's [policy] keys, `gnmrctl set` keys, the agent's
 * GNMR_* variables, the protobuf conversion (fields of the same name in
 * proto/gnmr.proto's Params), the store's SQL columns, the JSON views and
 * python/gnmr/_params.py. Adding a parameter is one row here, one field in
 * gnmr.proto, and the policy's use of it.
 *
 *   XX(name, ctype, kind, option, env, default, inherits)
 *
 * kind      THRESHOLD: a finite number > 0; WINDOW: 1..POLICY_MAX_WINDOW;
 *           U32 / U64: any count; FLAG: 0 (off) or 1 (on), a uint32_t;
 *           SIGNAL: a finite number >= 0, 0 meaning off (a double).
 * default   the default in force (docs/policy.md, "Defaults": the first
 *           ones were alpha = beta = 2 with the optional rules off).
 * inherits  for an optional threshold, the parameter it takes while unset
 *           (0 in gnmr_params and on the wire, NaN inside gnmrd); else "".
 * The order is gnmr_params' layout (the agent's ABI): append only. */
#ifndef GNMR_PARAMS_H
#define GNMR_PARAMS_H

#include <stdint.h>

#define GNMR_PARAMS_MAP(XX)                                                   \
  XX(alpha, double, THRESHOLD, "alpha", "GNMR_ALPHA", 6.0, "")                \
  XX(beta, double, THRESHOLD, "beta", "GNMR_BETA", 8.0, "")                   \
  XX(window, uint32_t, WINDOW, "window", "GNMR_WINDOW", 8, "")                \
  XX(max_active, uint32_t, U32, "max-active", "GNMR_MAX_ACTIVE", 4, "")       \
  XX(lock_steps, uint32_t, U32, "lock-steps", "GNMR_LOCK_STEPS", 4, "")       \
  XX(warmup_steps, uint64_t, U64, "warmup-steps", "GNMR_WARMUP_STEPS", 5,    \
     "")                                                                      \
  XX(early_alpha, double, THRESHOLD, "early-alpha", "GNMR_EARLY_ALPHA", 0,    \
     "alpha")                                                                 \
  XX(early_beta, double, THRESHOLD, "early-beta", "GNMR_EARLY_BETA", 0,       \
     "beta")                                                                  \
  XX(early_steps, uint64_t, U64, "early-steps", "GNMR_EARLY_STEPS", 0, "")  \
  XX(mean_horizon, uint64_t, U64, "mean-horizon", "GNMR_MEAN_HORIZON", 20,  \
     "")                                                                      \
  XX(job_relative, uint32_t, FLAG, "job-relative", "GNMR_JOB_RELATIVE", 1,   \
     "")                                                                      \
  XX(confirm_steps, uint32_t, U32, "confirm-steps", "GNMR_CONFIRM_STEPS", 2, \
     "")                                                                      \
  XX(measure_alpha, double, SIGNAL, "measure-alpha", "GNMR_MEASURE_ALPHA",    \
     4.0, "")                                                                 \
  XX(measure_beta, double, SIGNAL, "measure-beta", "GNMR_MEASURE_BETA", 3.0,  \
     "")                                                                      \
  XX(same_step, uint32_t, FLAG, "same-step", "GNMR_SAME_STEP", 0, "")

#define GNMR__PARAM_FIELD(name, ctype, kind, opt, env, def, inh) ctype name;
#define GNMR__PARAM_COUNT(name, ctype, kind, opt, env, def, inh) +1
/* The number of parameters. */
#define GNMR_NPARAMS (0 GNMR_PARAMS_MAP(GNMR__PARAM_COUNT))

#endif /* GNMR_PARAMS_H */
