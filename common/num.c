/* SPDX-License-Identifier: MIT */
/* num.c — strict number parsing (see num.h). The syntax is checked by hand
 * first; strtod only converts text already known to be a plain decimal. */
#include "num.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gnmr/error.h"

int gnmr__parse_u64n(const char *s, size_t n, uint64_t max, uint64_t *out) {
  uint64_t v = 0;
  if (s == NULL || n == 0)
    return GNMR_E_PARSE;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return GNMR_E_PARSE;
    unsigned dg = (unsigned)(s[i] - '0');
    if (v > (UINT64_MAX - dg) / 10)
      return GNMR_E_RANGE;
    v = v * 10 + dg;
  }
  if (v > max)
    return GNMR_E_RANGE;
  *out = v;
  return 0;
}

int gnmr__parse_u64(const char *s, uint64_t max, uint64_t *out) {
  return gnmr__parse_u64n(s, s ? strlen(s) : 0, max, out);
}

static size_t digits(const char *s, size_t i, size_t n) {
  size_t k = i;
  while (k < n && s[k] >= '0' && s[k] <= '9')
    k++;
  return k - i;
}

int gnmr__parse_doublen(const char *s, size_t n, int allow_nonfinite,
                        double *out) {
  char tmp[64];
  size_t i = 0;
  if (s == NULL || n == 0 || n >= sizeof tmp)
    return GNMR_E_PARSE;
  memcpy(tmp, s, n);
  tmp[n] = '\0';
  if (strlen(tmp) != n)
    return GNMR_E_PARSE; /* embedded NUL */
  if (allow_nonfinite) {
    if (strcasecmp(tmp, "nan") == 0) {
      *out = NAN;
      return 0;
    }
    if (strcasecmp(tmp, "inf") == 0 || strcasecmp(tmp, "+inf") == 0) {
      *out = INFINITY;
      return 0;
    }
    if (strcasecmp(tmp, "-inf") == 0) {
      *out = -INFINITY;
      return 0;
    }
  }
  if (tmp[i] == '+' || tmp[i] == '-')
    i++;
  size_t int_digits = digits(tmp, i, n);
  i += int_digits;
  size_t frac_digits = 0;
  if (i < n && tmp[i] == '.') {
    i++;
    frac_digits = digits(tmp, i, n);
    i += frac_digits;
  }
  if (int_digits + frac_digits == 0)
    return GNMR_E_PARSE;
  if (i < n && (tmp[i] == 'e' || tmp[i] == 'E')) {
    i++;
    if (i < n && (tmp[i] == '+' || tmp[i] == '-'))
      i++;
    size_t exp_digits = digits(tmp, i, n);
    if (exp_digits == 0)
      return GNMR_E_PARSE;
    i += exp_digits;
  }
  if (i != n)
    return GNMR_E_PARSE;
  errno = 0;
  double v = strtod(tmp, NULL);
  if (errno == ERANGE && isinf(v))
    return GNMR_E_RANGE;
  *out = v; /* underflow to a subnormal or 0 is accepted */
  return 0;
}

int gnmr__parse_double(const char *s, int allow_nonfinite, double *out) {
  return gnmr__parse_doublen(s, s ? strlen(s) : 0, allow_nonfinite, out);
}
