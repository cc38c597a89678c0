/* SPDX-License-Identifier: MIT */
/* params.c — the parameter table (gnmr/params.h) expanded at run time:
 * defaults, validation, comparison, conversion, options and settings. */
#include "params.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "gnmr/error.h"
#include "num.h"

static int index_of(const char *name);

const policy_param policy_param_table[GNMR_NPARAMS] = {
#define GNMR__PARAM_ROW(name, ctype, kind, opt, env, def, inh)               \
  {#name, opt, env, POLICY_PK_##kind, offsetof(policy_params, name),         \
   offsetof(gnmr_params, name), def},
    GNMR_PARAMS_MAP(GNMR__PARAM_ROW)
#undef GNMR__PARAM_ROW
};

/* the inherits column, by index (resolved once; the table is const) */
static const char *const inherits_of[GNMR_NPARAMS] = {
#define GNMR__PARAM_INH(name, ctype, kind, opt, env, def, inh) inh,
    GNMR_PARAMS_MAP(GNMR__PARAM_INH)
#undef GNMR__PARAM_INH
};

static int inherits(int i) {
  return inherits_of[i][0] ? index_of(inherits_of[i]) : -1;
}

int policy_param_inherits(int i) { return inherits(i); }

static int index_of(const char *name) {
  for (int i = 0; i < GNMR_NPARAMS; i++)
    if (strcmp(policy_param_table[i].name, name) == 0)
      return i;
  return -1;
}

/* Field access by kind; the C types follow the kinds (checked below). */
#define FIELD(p, i, T) ((T *)(void *)((char *)(p) + policy_param_table[i].off))
#define CFIELD(p, i, T)                                                       \
  ((const T *)(const void *)((const char *)(p) + policy_param_table[i].off))

#define GNMR__PARAM_TYPECHECK(name, ctype, kind, opt, env, def, inh)         \
  _Static_assert(sizeof(ctype) == (POLICY_PK_##kind == POLICY_PK_U64 ? 8     \
                                   : POLICY_PK_##kind == POLICY_PK_THRESHOLD \
                                       ? sizeof(double)                      \
                                   : POLICY_PK_##kind == POLICY_PK_SIGNAL    \
                                       ? sizeof(double)                      \
                                       : 4),                                 \
                 "parameter " #name ": C type does not match its kind");
GNMR_PARAMS_MAP(GNMR__PARAM_TYPECHECK)
#undef GNMR__PARAM_TYPECHECK

double policy_param_f64(const policy_params *p, int i) {
  return *CFIELD(p, i, double);
}

uint64_t policy_param_u64(const policy_params *p, int i) {
  switch (policy_param_table[i].kind) {
  case POLICY_PK_U64:
    return *CFIELD(p, i, uint64_t);
  case POLICY_PK_THRESHOLD:
  case POLICY_PK_SIGNAL:
    return 0;
  default:
    return *CFIELD(p, i, uint32_t);
  }
}

void policy_param_set_f64(policy_params *p, int i, double v) {
  if (policy_param_is_f64(i))
    *FIELD(p, i, double) = v;
}

void policy_param_set_u64(policy_params *p, int i, uint64_t v) {
  switch (policy_param_table[i].kind) {
  case POLICY_PK_U64:
    *FIELD(p, i, uint64_t) = v;
    break;
  case POLICY_PK_THRESHOLD:
  case POLICY_PK_SIGNAL:
    break;
  default:
    *FIELD(p, i, uint32_t) = (uint32_t)v;
  }
}

double policy_param_value(const policy_params *p, int i) {
  if (policy_param_is_f64(i)) {
    double v = policy_param_f64(p, i);
    int from = inherits(i);
    return isnan(v) && from >= 0 ? policy_param_f64(p, from) : v;
  }
  return (double)policy_param_u64(p, i);
}

void policy_params_default(policy_params *p) {
  for (int i = 0; i < GNMR_NPARAMS; i++) {
    const policy_param *d = &policy_param_table[i];
    if (policy_param_is_f64(i))
      policy_param_set_f64(p, i, inherits(i) >= 0 ? NAN : d->deflt);
    else
      policy_param_set_u64(p, i, (uint64_t)d->deflt);
  }
}

static int threshold_ok(double x) { return isfinite(x) && x > 0; }

int policy_params_validate(const policy_params *p, const char **what) {
  const char *bad = NULL;
  int rv = GNMR_E_INVAL;
  if (p == NULL)
    bad = "params";
  for (int i = 0; p != NULL && bad == NULL && i < GNMR_NPARAMS; i++) {
    const policy_param *d = &policy_param_table[i];
    if (d->kind == POLICY_PK_THRESHOLD) {
      double v = policy_param_f64(p, i);
      if (!(inherits(i) >= 0 && isnan(v)) && !threshold_ok(v))
        bad = d->name;
    } else if (d->kind == POLICY_PK_SIGNAL) {
      double v = policy_param_f64(p, i);
      if (!(isfinite(v) && v >= 0))
        bad = d->name;
    } else if (d->kind == POLICY_PK_FLAG) {
      if (policy_param_u64(p, i) > 1)
        bad = d->name;
    } else if (d->kind == POLICY_PK_WINDOW) {
      uint64_t v = policy_param_u64(p, i);
      if (v < 1) {
        bad = d->name;
      } else if (v > POLICY_MAX_WINDOW) {
        bad = d->name;
        rv = GNMR_E_RANGE;
      }
    }
  }
  if (what != NULL)
    *what = bad;
  return bad == NULL ? GNMR_OK : rv;
}

int policy_params_equal(const policy_params *a, const policy_params *b) {
  for (int i = 0; i < GNMR_NPARAMS; i++) {
    if (policy_param_is_f64(i)) {
      double x = policy_param_f64(a, i), y = policy_param_f64(b, i);
      if (!(x == y || (isnan(x) && isnan(y))))
        return 0;
    } else if (policy_param_u64(a, i) != policy_param_u64(b, i)) {
      return 0;
    }
  }
  return 1;
}

void policy_params_from_public(const gnmr_params *g, policy_params *p) {
#define GNMR__PARAM_FROM(name, ctype, kind, opt, env, def, inh)              \
  p->name = g->name;
  GNMR_PARAMS_MAP(GNMR__PARAM_FROM)
#undef GNMR__PARAM_FROM
  for (int i = 0; i < GNMR_NPARAMS; i++)
    if (inherits(i) >= 0 && policy_param_f64(p, i) == 0)
      policy_param_set_f64(p, i, NAN);
}

void policy_params_to_public(const policy_params *p, gnmr_params *g) {
#define GNMR__PARAM_TO(name, ctype, kind, opt, env, def, inh) g->name = p->name;
  GNMR_PARAMS_MAP(GNMR__PARAM_TO)
#undef GNMR__PARAM_TO
  for (int i = 0; i < GNMR_NPARAMS; i++)
    if (inherits(i) >= 0 && isnan(policy_param_f64(p, i)))
      *(double *)(void *)((char *)g + policy_param_table[i].pub_off) = 0;
}

/* ---- options and settings ------------------------------------------------------ */

const char *policy_param_names(void) {
  static const char names[] =
#define GNMR__PARAM_NAME(name, ctype, kind, opt, env, def, inh) ", " #name
      GNMR_PARAMS_MAP(GNMR__PARAM_NAME)
#undef GNMR__PARAM_NAME
      ;
  return names + 2; /* past the first ", " */
}

void gnmr__policy_opts_longopts(struct option *rows, int base) {
  for (int i = 0; i < GNMR_POLICY_NOPTS; i++) {
    rows[i].name = policy_param_table[i].option;
    rows[i].has_arg = required_argument;
    rows[i].flag = NULL;
    rows[i].val = base + i;
  }
}

/* Sets parameter i from arg; a refusal names it as the user wrote it:
 * "--alpha 'abc'" for an option, "alpha=abc" for a setting (key given). */
static int apply_as(policy_params *p, int i, const char *arg, const char *key,
                    char *err, size_t errlen) {
  int rv;
  if (i < 0 || i >= GNMR_POLICY_NOPTS)
    return GNMR_E_INVAL;
  const policy_param *d = &policy_param_table[i];
  char said[200];
  if (key != NULL)
    snprintf(said, sizeof said, "%s=%.64s", key, arg);
  else
    snprintf(said, sizeof said, "--%s '%.64s'", d->option, arg);
  if (policy_param_is_f64(i)) {
    double v;
    int sig = d->kind == POLICY_PK_SIGNAL;
    rv = gnmr__parse_double(arg, 0, &v);
    if (rv == 0 && !(sig ? v >= 0 : v > 0))
      rv = GNMR_E_RANGE;
    if (rv != 0) {
      snprintf(err, errlen, "%s: expected a finite number %s", said,
               sig ? ">= 0 (0: off)" : "> 0");
      return rv;
    }
    policy_param_set_f64(p, i, v);
    return 0;
  }
  uint64_t v, max = d->kind == POLICY_PK_U64    ? UINT64_MAX
                    : d->kind == POLICY_PK_FLAG ? 1
                                                : UINT32_MAX;
  rv = gnmr__parse_u64(arg, max, &v);
  if (rv != 0) {
    snprintf(err, errlen, "%s: expected an integer from 0 to %llu", said,
             (unsigned long long)max);
    return rv;
  }
  policy_param_set_u64(p, i, v);
  return 0;
}

int gnmr__policy_opts_apply(policy_params *p, int i, const char *arg,
                            char *err, size_t errlen) {
  return apply_as(p, i, arg, NULL, err, errlen);
}

/* The parameters as a whole; a refusal names the parameter as an option
 * (--window) or, settings 1, as a setting's key (window). */
static int check_as(const policy_params *p, int settings, char *err,
                    size_t errlen) {
  const char *what = NULL;
  int rv = policy_params_validate(p, &what);
  if (rv == 0)
    return 0;
  int i = what != NULL ? index_of(what) : -1;
  const char *dash = settings ? "" : "--",
             *nm = i >= 0 ? (settings ? policy_param_table[i].name
                                      : policy_param_table[i].option)
                          : "";
  if (i >= 0 && policy_param_table[i].kind == POLICY_PK_WINDOW)
    snprintf(err, errlen, "%s%s must be from 1 to %u", dash, nm,
             POLICY_MAX_WINDOW);
  else if (i >= 0)
    snprintf(err, errlen, "%s%s: invalid value (%s)", dash, nm,
             gnmr_strerror(rv));
  else
    snprintf(err, errlen, "invalid policy parameters (%s)", gnmr_strerror(rv));
  return rv;
}

int gnmr__policy_opts_check(const policy_params *p, char *err, size_t errlen) {
  return check_as(p, 0, err, errlen);
}

int gnmr__policy_opts_find(const char *name) {
  for (int i = 0; i < GNMR_POLICY_NOPTS; i++)
    if (strcmp(name, policy_param_table[i].option) == 0 ||
        strcmp(name, policy_param_table[i].name) == 0)
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
      snprintf(err, errlen, "unknown parameter '%s' (%s)", key,
               policy_param_names());
      return GNMR_E_INVAL;
    }
    if (apply_as(&q, k, eq + 1, key, err, errlen) != 0)
      return GNMR_E_INVAL;
  }
  if (check_as(&q, 1, err, errlen) != 0)
    return GNMR_E_INVAL;
  *p = q;
  return 0;
}

/* ---- python/gnmr/_params.py -------------------------------------------------- */

int policy_params_python(char *buf, size_t cap) {
  static const char *const ctypes_of[] = {
      [POLICY_PK_THRESHOLD] = "c_double", [POLICY_PK_WINDOW] = "c_uint32",
      [POLICY_PK_U32] = "c_uint32", [POLICY_PK_U64] = "c_uint64",
      [POLICY_PK_FLAG] = "c_uint32", [POLICY_PK_SIGNAL] = "c_double"};
  static const char *const kinds[] = {
      [POLICY_PK_THRESHOLD] = "threshold", [POLICY_PK_WINDOW] = "window",
      [POLICY_PK_U32] = "u32", [POLICY_PK_U64] = "u64",
      [POLICY_PK_FLAG] = "flag", [POLICY_PK_SIGNAL] = "signal"};
  size_t off = 0;
  int n = snprintf(buf, cap,
                   "# SPDX-License-Identifier: MIT\n"
                   "# Generated from include/gnmr/params.h by `make "
                   "python-params`; do not edit.\n"
                   "# (name, ctypes type, default, inherits, kind): "
                   "gnmr_params in its C order.\n"
                   "PARAMS = [\n");
  for (int i = 0; n >= 0 && i < GNMR_NPARAMS; i++) {
    off += (size_t)n;
    const policy_param *d = &policy_param_table[i];
    n = snprintf(off < cap ? buf + off : NULL, off < cap ? cap - off : 0,
                 policy_param_is_f64(i)
                     ? "    (\"%s\", \"%s\", %.1f, \"%s\", \"%s\"),\n"
                     : "    (\"%s\", \"%s\", %.0f, \"%s\", \"%s\"),\n",
                 d->name, ctypes_of[d->kind], d->deflt, inherits_of[i],
                 kinds[d->kind]);
  }
  if (n < 0)
    return n;
  off += (size_t)n;
  n = snprintf(off < cap ? buf + off : NULL, off < cap ? cap - off : 0,
               "]\n");
  return n < 0 ? n : (int)(off + (size_t)n);
}
