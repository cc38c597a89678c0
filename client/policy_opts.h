/* SPDX-License-Identifier: MIT */
/* policy_opts.h — the policy options of docs/policy.md as command-line
 * options (--alpha ... --early-steps), one table shared by gnmrctl replay
 * and gnmr-sim so that both spell and check them the same way. */
#ifndef GNMR_POLICY_OPTS_H
#define GNMR_POLICY_OPTS_H

#include <getopt.h>
#include <stddef.h>

#include "policy.h"

/* Number of policy options; their getopt rows are written by
 * gnmr__policy_opts_longopts() with val = base + index. */
#define GNMR_POLICY_NOPTS 9

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

/* The usage text of the options, one line. */
#define GNMR_POLICY_OPTS_USAGE                                             \
  "[--alpha A] [--beta B] [--window D] [--max-active K] [--lock-steps L] " \
  "[--warmup-steps W] [--early-alpha A0] [--early-beta B0] [--early-steps T1]"

#endif /* GNMR_POLICY_OPTS_H */
