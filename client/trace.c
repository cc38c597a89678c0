/* SPDX-License-Identifier: MIT */
/* trace.c — parser of the offline trace CSV (see trace.h). Each line is
 * split into exactly three fields; surrounding blanks and a trailing CR are
 * allowed. Rows are sorted afterwards so that duplicates can be named. */
#include "trace.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "num.h"

static int fail(trace_error *err, size_t line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(trace_error *err, size_t line, const char *fmt, ...) {
  if (err != NULL) {
    va_list ap;
    err->line = line;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return GNMR_E_PARSE;
}

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* Trims blanks (and a CR) from both ends of [*s, *s + *n). */
static void trim(const char **s, size_t *n) {
  while (*n > 0 && is_blank((*s)[0])) {
    (*s)++;
    (*n)--;
  }
  while (*n > 0 && is_blank((*s)[*n - 1]))
    (*n)--;
}

static int row_cmp(const void *a, const void *b) {
  const trace_row *x = a, *y = b;
  if (x->step != y->step)
    return x->step < y->step ? -1 : 1;
  if (x->unit != y->unit)
    return x->unit < y->unit ? -1 : 1;
  return x->line < y->line ? -1 : x->line > y->line;
}

/* Shows a field in an error message, shortened and with control bytes as
 * '?', so that a hostile trace cannot garble the terminal. */
static const char *show(const char *s, size_t n, char *buf, size_t cap) {
  size_t k = n < cap - 4 ? n : cap - 4;
  for (size_t i = 0; i < k; i++)
    buf[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
  if (k < n)
    memcpy(buf + k, "...", 4);
  else
    buf[k] = '\0';
  return buf;
}

/* The measure column's field (empty or nan: none). 0 or the error. */
static int parse_measure(const char *f, size_t fl, size_t line,
                         trace_row *row, trace_error *err) {
  char shown[40];
  double x;
  row->measure = NAN;
  if (fl == 0)
    return 0;
  int rv = gnmr__parse_doublen(f, fl, 1, &x);
  if (rv == GNMR_E_RANGE)
    return fail(err, line, "measure '%s' overflows a double",
                show(f, fl, shown, sizeof shown));
  if (rv != 0)
    return fail(err, line,
                "measure '%s' is not a number (decimal, inf, nan or empty)",
                show(f, fl, shown, sizeof shown));
  if (x < 0)
    return fail(err, line, "measure %s is negative",
                show(f, fl, shown, sizeof shown));
  row->measure = x == 0 ? 0.0 : x;
  return 0;
}

static int parse_row(const char *s, size_t n, size_t line, int measured,
                     trace_row *row, trace_error *err) {
  const char *f[4];
  size_t fl[4], nf = 0, want = measured ? 4 : 3;
  const char *cols = measured ? "step,unit,norm,measure" : "step,unit,norm";
  char shown[40];
  const char *p = s, *end = s + n;
  for (;;) {
    const char *c = memchr(p, ',', (size_t)(end - p));
    const char *fe = c ? c : end;
    if (nf == want)
      return fail(err, line, "expected %zu columns (%s), got more", want,
                  cols);
    f[nf] = p;
    fl[nf] = (size_t)(fe - p);
    trim(&f[nf], &fl[nf]);
    nf++;
    if (c == NULL)
      break;
    p = c + 1;
  }
  if (nf != want)
    return fail(err, line, "expected %zu columns (%s), got %zu", want, cols,
                nf);
  uint64_t v;
  int rv = gnmr__parse_u64n(f[0], fl[0], TRACE_MAX_STEP, &v);
  if (rv == GNMR_E_RANGE)
    return fail(err, line, "step '%s' is larger than %llu",
                show(f[0], fl[0], shown, sizeof shown),
                (unsigned long long)TRACE_MAX_STEP);
  if (rv != 0)
    return fail(err, line, "step '%s' is not a non-negative integer",
                show(f[0], fl[0], shown, sizeof shown));
  if (v == 0)
    return fail(err, line, "step 0: steps start at 1");
  row->step = v;
  rv = gnmr__parse_u64n(f[1], fl[1], TRACE_MAX_UNIT, &v);
  if (rv == GNMR_E_RANGE)
    return fail(err, line, "unit '%s' is larger than %u",
                show(f[1], fl[1], shown, sizeof shown), TRACE_MAX_UNIT);
  if (rv != 0)
    return fail(err, line, "unit '%s' is not a non-negative integer",
                show(f[1], fl[1], shown, sizeof shown));
  row->unit = (uint32_t)v;
  double x;
  rv = gnmr__parse_doublen(f[2], fl[2], 1, &x);
  if (rv == GNMR_E_RANGE)
    return fail(err, line, "norm '%s' overflows a double",
                show(f[2], fl[2], shown, sizeof shown));
  if (rv != 0)
    return fail(err, line,
                "norm '%s' is not a number (decimal, nan, inf or -inf)",
                show(f[2], fl[2], shown, sizeof shown));
  if (x < 0 && x != -INFINITY)
    return fail(err, line, "norm %s is negative",
                show(f[2], fl[2], shown, sizeof shown));
  row->norm = x == 0 ? 0.0 : x; /* -0 is 0 */
  row->line = line > UINT32_MAX ? UINT32_MAX : (uint32_t)line;
  if (measured)
    return parse_measure(f[3], fl[3], line, row, err);
  row->measure = NAN;
  return 0;
}

/* The rows after the header, in file order (t->rows grown as they come).
 * *line: the last line read. 0 or the error. */
static int read_rows(const char *buf, size_t len, trace *t, trace_error *err,
                     size_t *line) {
  size_t cap = 0, pos = 0;
  int have_header = 0, rv;
  while (pos < len) {
    const char *s = buf + pos;
    const char *nl = memchr(s, '\n', len - pos);
    size_t n = nl ? (size_t)(nl - s) : len - pos;
    pos += n + (nl != NULL);
    (*line)++;
    trim(&s, &n);
    if (n == 0 || s[0] == '#')
      continue;
    if (!have_header) {
      char shown[40];
      if (n == 22 && memcmp(s, "step,unit,norm,measure", 22) == 0)
        t->measured = 1;
      else if (n != 14 || memcmp(s, "step,unit,norm", 14) != 0)
        return fail(err, *line,
                    "expected the header 'step,unit,norm' (or "
                    "'step,unit,norm,measure'), got '%s'",
                    show(s, n, shown, sizeof shown));
      have_header = 1;
      continue;
    }
    if (t->n_rows == cap) {
      size_t ncap = cap ? cap * 2 : 1024;
      trace_row *r = realloc(t->rows, ncap * sizeof *r);
      if (r == NULL)
        return GNMR_E_NOMEM;
      t->rows = r;
      cap = ncap;
    }
    if ((rv = parse_row(s, n, *line, t->measured, &t->rows[t->n_rows],
                        err)) != 0)
      return rv;
    t->n_rows++;
  }
  if (!have_header)
    return fail(err, 0, "empty trace: expected the header 'step,unit,norm'");
  return 0;
}

/* The rows sorted, each (step, unit) once, and what replaying them costs
 * bounded: sets the span and the unit count. 0 or the error. */
static int check_rows(trace *t, trace_error *err) {
  if (t->n_rows == 0)
    return 0;
  qsort(t->rows, t->n_rows, sizeof *t->rows, row_cmp);
  for (size_t i = 1; i < t->n_rows; i++) {
    const trace_row *a = &t->rows[i - 1], *b = &t->rows[i];
    if (a->step == b->step && a->unit == b->unit)
      return fail(err, b->line,
                  "duplicate (step %llu, unit %u), first given on line %u",
                  (unsigned long long)b->step, b->unit, a->line);
  }
  t->first_step = t->rows[0].step;
  t->last_step = t->rows[t->n_rows - 1].step;
  if (t->last_step - t->first_step >= TRACE_MAX_SPAN)
    return fail(err, 0, "steps %llu..%llu span more than %llu steps",
                (unsigned long long)t->first_step,
                (unsigned long long)t->last_step,
                (unsigned long long)TRACE_MAX_SPAN);
  for (size_t i = 0; i < t->n_rows; i++)
    if (t->rows[i].unit >= t->n_units)
      t->n_units = t->rows[i].unit + 1;
  /* what replaying costs is every unit at every step of the span, rows or
   * not: a trace of two rows far apart (steps and unit ids) made `gnmrctl
   * replay` run for minutes. The work a trace asks for is bounded by what
   * it says: TRACE_MAX_WORK, and TRACE_WORK_PER_ROW unit-steps more per
   * row */
  uint64_t span = t->last_step - t->first_step + 1, work;
  if (__builtin_mul_overflow(span, (uint64_t)t->n_units, &work) ||
      work > TRACE_MAX_WORK + TRACE_WORK_PER_ROW * (uint64_t)t->n_rows)
    return fail(err, 0,
                "%zu rows over steps %llu..%llu and unit ids "
                "0..%u: %llu unit-steps to replay, more than %llu per row "
                "(beyond the first %llu): a trace lists the steps and units "
                "it replays",
                t->n_rows, (unsigned long long)t->first_step,
                (unsigned long long)t->last_step, t->n_units - 1,
                (unsigned long long)(work ? work : UINT64_MAX),
                (unsigned long long)TRACE_WORK_PER_ROW,
                (unsigned long long)TRACE_MAX_WORK);
  return 0;
}

int trace_parse(const char *buf, size_t len, trace *out, trace_error *err) {
  size_t line = 0;
  int rv;
  trace t = {0};
  if (err != NULL) {
    err->line = 0;
    err->msg[0] = '\0';
  }
  if (out == NULL || (buf == NULL && len > 0))
    return GNMR_E_INVAL;
  memset(out, 0, sizeof *out);
  if (memchr(buf, '\0', len) != NULL) {
    const char *z = memchr(buf, '\0', len);
    size_t l = 1;
    for (const char *q = buf; q < z; q++)
      l += *q == '\n';
    return fail(err, l, "NUL byte: not a text file");
  }
  if ((rv = read_rows(buf, len, &t, err, &line)) == 0 &&
      (rv = check_rows(&t, err)) == 0) {
    *out = t;
    return 0;
  }
  free(t.rows);
  if (rv == GNMR_E_NOMEM && err != NULL) {
    err->line = line;
    snprintf(err->msg, sizeof err->msg, "out of memory");
  }
  return rv;
}

void trace_clear(trace *t) {
  if (t == NULL)
    return;
  free(t->rows);
  memset(t, 0, sizeof *t);
}

int trace_read_file(const char *path, char **buf, size_t *len) {
  FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
  size_t cap = 1 << 16, n = 0;
  char *b;
  int rv = 0;
  *buf = NULL;
  *len = 0;
  if (f == NULL)
    return GNMR_E_IO;
  if ((b = malloc(cap)) == NULL) {
    rv = GNMR_E_NOMEM;
    goto out;
  }
  for (;;) {
    if (n == cap) {
      char *nb = realloc(b, cap * 2);
      if (nb == NULL) {
        rv = GNMR_E_NOMEM;
        goto out;
      }
      b = nb;
      cap *= 2;
    }
    size_t r = fread(b + n, 1, cap - n, f);
    n += r;
    if (r == 0) {
      if (ferror(f))
        rv = GNMR_E_IO;
      break;
    }
  }
out:
  if (f != stdin) {
    int e = errno;
    fclose(f);
    errno = e;
  }
  if (rv != 0) {
    free(b);
    return rv;
  }
  *buf = b;
  *len = n;
  return 0;
}
