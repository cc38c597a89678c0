/* SPDX-License-Identifier: MIT */
/* trace.h — the offline trace format of docs/policy.md: CSV with header
 * `step,unit,norm` (or `step,unit,norm,measure`: each row adds the unit's
 * measure, empty or nan for none), '#' comments, rows in any order.
 * Parsing works on a memory buffer (no I/O) and reports the first problem
 * with its line. */
#ifndef GNMR_TRACE_H
#define GNMR_TRACE_H

#include <stddef.h>
#include <stdint.h>

/* Bounds that keep a replay's memory and output finite. */
#define TRACE_MAX_UNIT ((1u << 24) - 1)          /* unit ids 0..2^24-1 */
#define TRACE_MAX_STEP (UINT64_C(1) << 53)
#define TRACE_MAX_SPAN UINT64_C(100000000)        /* last - first + 1 */
/* unit-steps a trace may ask to replay: (span) x (largest unit id + 1) at
 * most TRACE_MAX_WORK + TRACE_WORK_PER_ROW per row (trace.c) */
#define TRACE_MAX_WORK (UINT64_C(1) << 28)
#define TRACE_WORK_PER_ROW UINT64_C(1024)

typedef struct trace_row {
  uint64_t step;
  double norm;  /* >= 0, NaN, +Inf or -Inf */
  double measure; /* >= 0 or +Inf; NaN: none */
  uint32_t unit;
  uint32_t line;
} trace_row;

typedef struct trace {
  trace_row *rows;      /* sorted by (step, unit); owned, trace_clear() */
  size_t n_rows;
  uint64_t first_step;  /* 0 when the trace has no rows */
  uint64_t last_step;
  uint32_t n_units;     /* largest unit id + 1 (0 when no rows) */
  int measured;         /* the header has the measure column */
} trace;

typedef struct trace_error {
  size_t line;     /* 1-based line of the problem, 0 when not line-bound */
  char msg[200];
} trace_error;

/* Parses len bytes of buf. On success fills *out (free with trace_clear) and
 * returns 0. On failure returns GNMR_E_PARSE (or GNMR_E_NOMEM), leaves *out
 * empty and describes the first problem in *err. */
int trace_parse(const char *buf, size_t len, trace *out, trace_error *err);

void trace_clear(trace *t);

/* Reads a whole file ("-" = standard input) into a new buffer (free()).
 * Returns 0, GNMR_E_IO (errno kept) or GNMR_E_NOMEM. */
int trace_read_file(const char *path, char **buf, size_t *len);

#endif /* GNMR_TRACE_H */
