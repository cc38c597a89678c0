/* SPDX-License-Identifier: MIT */
/* policy_opts.c — one row per policy option: its name, the field it sets,
 * its type and range. Thresholds must be finite and > 0, counts are
 * non-negative integers, window >= 1 (policy_params_validate has the rest). */
#include "policy_opts.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gnmr/error.h"
#include "num.h"

enum opt_type { OPT_F64, OPT_U32, OPT_U64 };

static const struct {
  const char *name;  /* command-line spelling */
  const char *field; /* policy_params_validate()'s name for it */
  enum opt_type type;
  size_t off;
} opts[GNMR_POLICY_NOPTS] = {
    {"alpha", "alpha", OPT_F64, offsetof(policy_params, alpha)},
    {"beta", "beta", OPT_F64, offsetof(policy_params, beta)},
    {"window", "window", OPT_U32, offsetof(policy_params, window)},
    {"max-active", "max_active", OPT_U32, offsetof(policy_params, max_active)},
    {"lock-steps", "lock_steps", OPT_U32, offsetof(policy_params, lock_steps)},
    {"warmup-steps", "warmup_steps", OPT_U64,
     offsetof(policy_params, warmup_steps)},
    {"early-alpha", "early_alpha", OPT_F64,
     offsetof(policy_params, early_alpha)},
    {"early-beta", "early_beta", OPT_F64, offsetof(policy_params, early_beta)},
    {"early-steps", "early_steps", OPT_U64,
     offsetof(policy_params, early_steps)},
};

void gnmr__policy_opts_longopts(struct option *rows, int base) {
  for (int i = 0; i < GNMR_POLICY_NOPTS; i++) {
    rows[i].name = opts[i].name;
    rows[i].has_arg = required_argument;
    rows[i].flag = NULL;
    rows[i].val = base + i;
  }
}

int gnmr__policy_opts_apply(policy_params *p, int i, const char *arg,
                            char *err, size_t errlen) {
  int rv;
  char *field;
  if (i < 0 || i >= GNMR_POLICY_NOPTS)
    return GNMR_E_INVAL;
  field = (char *)p + opts[i].off;
  switch (opts[i].type) {
  case OPT_F64: {
    double v;
    rv = gnmr__parse_double(arg, 0, &v);
    if (rv == 0 && !(v > 0))
      rv = GNMR_E_RANGE;
    if (rv != 0) {
      snprintf(err, errlen, "--%s '%s': expected a finite number > 0",
               opts[i].name, arg);
      return rv;
    }
    memcpy(field, &v, sizeof v);
    return 0;
  }
  case OPT_U32:
  case OPT_U64: {
    uint64_t v, max = opts[i].type == OPT_U32 ? UINT32_MAX : UINT64_MAX;
    rv = gnmr__parse_u64(arg, max, &v);
    if (rv != 0) {
      snprintf(err, errlen, "--%s '%s': expected an integer from 0 to %llu",
               opts[i].name, arg, (unsigned long long)max);
      return rv;
    }
    if (opts[i].type == OPT_U32) {
      uint32_t v32 = (uint32_t)v;
      memcpy(field, &v32, sizeof v32);
    } else {
      memcpy(field, &v, sizeof v);
    }
    return 0;
  }
  }
  return GNMR_E_INVAL;
}

int gnmr__policy_opts_check(const policy_params *p, char *err, size_t errlen) {
  const char *what = NULL;
  int rv = policy_params_validate(p, &what);
  if (rv == 0)
    return 0;
  for (int i = 0; i < GNMR_POLICY_NOPTS; i++) {
    if (what != NULL && strcmp(what, opts[i].field) == 0) {
      if (strcmp(what, "window") == 0)
        snprintf(err, errlen, "--window must be from 1 to %u",
                 POLICY_MAX_WINDOW);
      else
        snprintf(err, errlen, "--%s: invalid value (%s)", opts[i].name,
                 gnmr_strerror(rv));
      return rv;
    }
  }
  snprintf(err, errlen, "invalid policy parameters (%s)", gnmr_strerror(rv));
  return rv;
}

int gnmr__policy_opts_find(const char *name) {
  for (int i = 0; i < GNMR_POLICY_NOPTS; i++)
    if (strcmp(name, opts[i].name) == 0 || strcmp(name, opts[i].field) == 0)
      return i;
  return -1;
}

int gnmr__policy_settings_apply(policy_params *p, char *const *settings,
                                size_t n, char *err, size_t errlen) {
  policy_params q = *p;
  if (n == 0) {
    snprintf(err, errlen, "nothing to set: give key=value");
    return GNMR_E_INVAL;
  }
  for (size_t i = 0; i < n; i++) {
    char key[64];
    const char *eq = strchr(settings[i], '=');
    if (eq == NULL || eq == settings[i] ||
        (size_t)(eq - settings[i]) >= sizeof key) {
      snprintf(err, errlen, "'%.64s': expected key=value", settings[i]);
      return GNMR_E_INVAL;
    }
    snprintf(key, sizeof key, "%.*s", (int)(eq - settings[i]), settings[i]);
    int k = gnmr__policy_opts_find(key);
    if (k < 0) {
      snprintf(err, errlen,
               "unknown parameter '%s' (alpha, beta, window, max_active, "
               "lock_steps, warmup_steps, early_alpha, early_beta, "
               "early_steps)",
               key);
      return GNMR_E_INVAL;
    }
    if (gnmr__policy_opts_apply(&q, k, eq + 1, err, errlen) != 0)
      return GNMR_E_INVAL;
  }
  if (gnmr__policy_opts_check(&q, err, errlen) != 0)
    return GNMR_E_INVAL;
  *p = q;
  return 0;
}
