/* SPDX-License-Identifier: MIT */
/* test_trace.c — the trace parser and the strict number parsers: every kind
 * of malformed input gets a clear message naming its line, and good input
 * in any order, with comments, blanks and CRLF, parses exactly. */
#include <check.h>
#include <stdio.h>

#include "check_main.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "num.h"
#include "trace.h"

static int parse(const char *text, trace *t, trace_error *e) {
  return trace_parse(text, strlen(text), t, e);
}

/* Asserts that text fails on line `line` with a message containing `part`. */
static void expect_error(const char *text, size_t line, const char *part) {
  trace t;
  trace_error e;
  int rv = parse(text, &t, &e);
  ck_assert_msg(rv == GNMR_E_PARSE, "accepted: %s", text);
  ck_assert_uint_eq(e.line, line);
  ck_assert_msg(strstr(e.msg, part) != NULL, "message '%s' lacks '%s'",
                e.msg, part);
  ck_assert_ptr_null(t.rows);
}

START_TEST(rows_in_any_order_are_sorted_by_step_and_unit) {
  trace t;
  trace_error e;
  const char *text = "# a comment\n"
                     "step,unit,norm\n"
                     "3,1,0.5\n"
                     "\n"
                     "1,2,1e-3\n"
                     "  # indented comment\n"
                     "1,0, 2.5 \r\n"
                     "2,7,nan\n"
                     "3,0,inf\n"
                     "4,1,-inf\n"
                     "5,1,0\n";
  ck_assert_int_eq(parse(text, &t, &e), 0);
  ck_assert_uint_eq(t.n_rows, 7);
  ck_assert_uint_eq(t.first_step, 1);
  ck_assert_uint_eq(t.last_step, 5);
  ck_assert_uint_eq(t.n_units, 8);
  ck_assert_uint_eq(t.rows[0].step, 1);
  ck_assert_uint_eq(t.rows[0].unit, 0);
  ck_assert_double_eq(t.rows[0].norm, 2.5);
  ck_assert_uint_eq(t.rows[0].line, 7);
  ck_assert_uint_eq(t.rows[1].unit, 2);
  ck_assert(isnan(t.rows[2].norm));
  ck_assert_uint_eq(t.rows[3].step, 3);
  ck_assert_uint_eq(t.rows[3].unit, 0);
  ck_assert(isinf(t.rows[3].norm));
  ck_assert(isinf(t.rows[5].norm) && t.rows[5].norm < 0);
  ck_assert_double_eq(t.rows[6].norm, 0);
  trace_clear(&t);
}
END_TEST

START_TEST(header_only_trace_has_no_rows) {
  trace t;
  trace_error e;
  ck_assert_int_eq(parse("step,unit,norm\n", &t, &e), 0);
  ck_assert_uint_eq(t.n_rows, 0);
  ck_assert_uint_eq(t.n_units, 0);
  trace_clear(&t);
  ck_assert_int_eq(parse("step,unit,norm", &t, &e), 0); /* no newline */
  trace_clear(&t);
}
END_TEST

/* Issue 47: a 2-row "bomb" (steps and unit ids far apart) made gnmrctl
 * replay run for minutes: every unit at every step of the span. The work
 * a trace asks for is bounded by what it lists. */
START_TEST(a_trace_asks_no_more_work_than_its_rows_pay_for) {
  trace t;
  trace_error e;
  ck_assert_int_eq(parse("step,unit,norm\n1,0,1\n99999999,16777215,2\n",
                         &t, &e),
                   GNMR_E_PARSE);
  ck_assert_msg(strstr(e.msg, "unit-steps to replay, more than 1024 per "
                              "row") != NULL, "%s", e.msg);
  /* the limit itself: 2^28 unit-steps and 1024 per row */
  ck_assert_int_eq(parse("step,unit,norm\n1,0,1\n16,16777215,2\n", &t, &e),
                   0);
  trace_clear(&t);
  ck_assert_int_eq(parse("step,unit,norm\n1,0,1\n17,16777215,2\n", &t, &e),
                   GNMR_E_PARSE);
  /* 2.7e8 unit-steps (past 2^28) paid for by 300000 rows */
  size_t cap = 64 << 20, n = 0;
  char *big = malloc(cap);
  n += (size_t)snprintf(big + n, cap - n, "step,unit,norm\n");
  for (int st = 1; st <= 300000; st++)
    n += (size_t)snprintf(big + n, cap - n, "%d,%d,1\n", st * 300, st % 3);
  ck_assert_int_eq(parse(big, &t, &e), 0);
  trace_clear(&t);
  free(big);
}
END_TEST

START_TEST(negative_zero_is_zero) {
  trace t;
  trace_error e;
  ck_assert_int_eq(parse("step,unit,norm\n1,0,-0.0\n", &t, &e), 0);
  ck_assert_double_eq(t.rows[0].norm, 0);
  ck_assert(!signbit(t.rows[0].norm));
  trace_clear(&t);
}
END_TEST

START_TEST(wrong_or_missing_header_names_the_line) {
  expect_error("", 0, "empty trace");
  expect_error("# only comments\n\n", 0, "empty trace");
  expect_error("step,unit\n1,0\n", 1, "expected the header");
  expect_error("\n\nunit,step,norm\n", 3, "expected the header");
  expect_error("1,0,1.0\n", 1, "expected the header");
  expect_error("step,unit,norm,extra\n", 1, "expected the header");
}
END_TEST

START_TEST(wrong_column_count_names_the_line) {
  expect_error("step,unit,norm\n1,0,1\n1,1\n", 3, "expected 3 columns");
  expect_error("step,unit,norm\n1,0,1,5\n", 2, "got more");
  expect_error("step,unit,norm\n1\n", 2, "got 1");
  expect_error("step,unit,norm\n1,0,\n", 2, "norm '' is not a number");
}
END_TEST

/* A measured trace (docs/policy.md): four columns, the measure empty or
 * nan for none, >= 0 or inf; anything else names its line. */
START_TEST(a_measured_trace_has_a_fourth_column) {
  trace t;
  trace_error e;
  const char *text = "step,unit,norm,measure\n"
                     "1,0,1.5,0.25\n"
                     "1,1,2,\n"
                     "2,0,1, nan \n"
                     "2,1,1,inf\n"
                     "3,0,1,-0\n";
  ck_assert_int_eq(parse(text, &t, &e), 0);
  ck_assert_int_eq(t.measured, 1);
  ck_assert_uint_eq(t.n_rows, 5);
  ck_assert(t.rows[0].measure == 0.25 && isnan(t.rows[1].measure));
  ck_assert(isnan(t.rows[2].measure) && isinf(t.rows[3].measure));
  ck_assert(t.rows[4].measure == 0 && !signbit(t.rows[4].measure));
  trace_clear(&t);
  ck_assert_int_eq(parse("step,unit,norm\n1,0,1\n", &t, &e), 0);
  ck_assert(t.measured == 0 && isnan(t.rows[0].measure));
  trace_clear(&t);
  const char *h = "step,unit,norm,measure\n";
  char buf[128];
#define M(row, line, part)                                                  \
  do {                                                                      \
    snprintf(buf, sizeof buf, "%s%s", h, row);                              \
    expect_error(buf, line, part);                                          \
  } while (0)
  M("1,0,1\n", 2, "expected 4 columns (step,unit,norm,measure), got 3");
  M("1,0,1,2,3\n", 2, "got more");
  M("1,0,1,-0.5\n", 2, "measure -0.5 is negative");
  M("1,0,1,-inf\n", 2, "measure -inf is negative");
  M("1,0,1,abc\n", 2, "measure 'abc' is not a number");
  M("1,0,1,1e999\n", 2, "measure '1e999' overflows");
  M("1,0,1,\x1b[31m\n", 2, "measure '?[31m' is not a number");
#undef M
  expect_error("step,unit,norm,measure,x\n", 1, "expected the header");
}
END_TEST

START_TEST(bad_numbers_name_the_line) {
  expect_error("step,unit,norm\n1,0,abc\n", 2, "norm 'abc' is not a number");
  expect_error("step,unit,norm\n1,0,0x10\n", 2, "not a number");
  expect_error("step,unit,norm\n1,0,1.5.2\n", 2, "not a number");
  expect_error("step,unit,norm\n1,0,infinity\n", 2, "not a number");
  expect_error("step,unit,norm\n1,0,1e\n", 2, "not a number");
  expect_error("step,unit,norm\n1,0,1e999\n", 2, "overflows");
  expect_error("step,unit,norm\n1.5,0,1\n", 2, "step '1.5'");
  expect_error("step,unit,norm\n-1,0,1\n", 2, "step '-1'");
  expect_error("step,unit,norm\n1,x,1\n", 2, "unit 'x'");
  expect_error("step,unit,norm\n1,-2,1\n", 2, "unit '-2'");
  expect_error("step,unit,norm\n1,99999999999999999999999,1\n", 2,
               "larger than");
  expect_error("step,unit,norm\n1,16777216,1\n", 2, "larger than 16777215");
  expect_error("step,unit,norm\n0,0,1\n", 2, "steps start at 1");
  expect_error("step,unit,norm\n9007199254740993,0,1\n", 2, "larger than");
}
END_TEST

START_TEST(negative_norm_is_an_error) {
  expect_error("step,unit,norm\n1,0,1\n2,0,-0.5\n", 3, "negative");
}
END_TEST

START_TEST(duplicate_step_unit_names_both_lines) {
  expect_error("step,unit,norm\n1,0,1\n2,0,1\n1,0,3\n", 4,
               "duplicate (step 1, unit 0), first given on line 2");
}
END_TEST

START_TEST(binary_and_control_bytes_are_refused_and_not_echoed) {
  static const char nul[] = "step,unit,norm\n1,0,1\n\0\n";
  trace t;
  trace_error e;
  ck_assert_int_eq(trace_parse(nul, sizeof nul - 1, &t, &e), GNMR_E_PARSE);
  ck_assert_uint_eq(e.line, 3);
  ck_assert(strstr(e.msg, "NUL") != NULL);
  expect_error("step,unit,norm\n1,0,\033[2J\n", 2, "'?[2J'");
}
END_TEST

START_TEST(huge_step_span_is_refused) {
  expect_error("step,unit,norm\n1,0,1\n200000000,0,1\n", 0, "span more");
}
END_TEST

START_TEST(strict_number_parsers) {
  double d;
  uint64_t u;
  ck_assert_int_eq(gnmr__parse_double("1.5e-3", 0, &d), 0);
  ck_assert_double_eq(d, 1.5e-3);
  ck_assert_int_eq(gnmr__parse_double(".5", 0, &d), 0);
  ck_assert_int_eq(gnmr__parse_double("5.", 0, &d), 0);
  ck_assert_int_eq(gnmr__parse_double("+2", 0, &d), 0);
  ck_assert_int_eq(gnmr__parse_double("nan", 0, &d), GNMR_E_PARSE);
  ck_assert_int_eq(gnmr__parse_double("NaN", 1, &d), 0);
  ck_assert(isnan(d));
  ck_assert_int_eq(gnmr__parse_double("", 0, &d), GNMR_E_PARSE);
  ck_assert_int_eq(gnmr__parse_double(".", 0, &d), GNMR_E_PARSE);
  ck_assert_int_eq(gnmr__parse_double("1 ", 0, &d), GNMR_E_PARSE);
  ck_assert_int_eq(gnmr__parse_double("1e-400", 0, &d), 0); /* underflow */
  ck_assert_int_eq(gnmr__parse_double(NULL, 0, &d), GNMR_E_PARSE);
  ck_assert_int_eq(gnmr__parse_u64("18446744073709551615", UINT64_MAX, &u),
                   0);
  ck_assert_uint_eq(u, UINT64_MAX);
  ck_assert_int_eq(gnmr__parse_u64("18446744073709551616", UINT64_MAX, &u),
                   GNMR_E_RANGE);
  ck_assert_int_eq(gnmr__parse_u64("11", 10, &u), GNMR_E_RANGE);
  ck_assert_int_eq(gnmr__parse_u64("+1", 10, &u), GNMR_E_PARSE);
  ck_assert_int_eq(gnmr__parse_u64("", 10, &u), GNMR_E_PARSE);
}
END_TEST

START_TEST(random_garbage_never_crashes) {
  unsigned seed = 7;
  char buf[512];
  static const char alphabet[] = "step,unit,norm\n0123456789.e-+#naif \r\t";
  for (int i = 0; i < 20000; i++) {
    size_t n = (size_t)(rand_r(&seed) % (int)sizeof buf);
    size_t k = 0;
    if (rand_r(&seed) % 2) {
      memcpy(buf, "step,unit,norm\n", 15);
      k = 15;
    }
    for (; k < n; k++)
      buf[k] = rand_r(&seed) % 8 == 0
                   ? (char)(rand_r(&seed) % 256)
                   : alphabet[rand_r(&seed) % (int)(sizeof alphabet - 1)];
    trace t;
    trace_error e;
    int rv = trace_parse(buf, n, &t, &e);
    ck_assert(rv == 0 || rv == GNMR_E_PARSE);
    if (rv == 0)
      trace_clear(&t);
    else
      ck_assert(e.msg[0] != '\0');
  }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("trace");
  TCase *tc = tcase_create("parse");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, rows_in_any_order_are_sorted_by_step_and_unit);
  tcase_add_test(tc, header_only_trace_has_no_rows);
  tcase_add_test(tc, negative_zero_is_zero);
  tcase_add_test(tc, wrong_or_missing_header_names_the_line);
  tcase_add_test(tc, wrong_column_count_names_the_line);
  tcase_add_test(tc, bad_numbers_name_the_line);
  tcase_add_test(tc, a_measured_trace_has_a_fourth_column);
  tcase_add_test(tc, negative_norm_is_an_error);
  tcase_add_test(tc, duplicate_step_unit_names_both_lines);
  tcase_add_test(tc, binary_and_control_bytes_are_refused_and_not_echoed);
  tcase_add_test(tc, huge_step_span_is_refused);
  tcase_add_test(tc, strict_number_parsers);
  tcase_add_test(tc, random_garbage_never_crashes);
  tcase_add_test(tc, a_trace_asks_no_more_work_than_its_rows_pay_for);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
