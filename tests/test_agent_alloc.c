/* SPDX-License-Identifier: MIT */
/* test_agent_alloc.c — the agent's resources: many agents fit in one
 * process (a simulator's ranks), and the per-report path allocates
 * nothing once warm: malloc, calloc and realloc of the agent's own objects are wrapped
 * at link time (-Wl,--wrap, see the Makefile) and counted on the calling
 * thread only, so the I/O thread and libzmq (a shared library, whose copy
 * of each message is its own) are not counted. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "check_main.h"
#include "gnmr/agent.h"
#include "gnmr/error.h"

/* volatile: the compiler assumes malloc reads no user variable */
static __thread volatile int counting;
static __thread volatile long allocs;

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);

static __thread void *where;
void *__wrap_malloc(size_t n) {
  if (counting && where == NULL)
    where = __builtin_return_address(0);
  allocs += counting;
  return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t m) {
  if (counting && where == NULL)
    where = __builtin_return_address(0);
  allocs += counting;
  return __real_calloc(n, m);
}
void *__wrap_realloc(void *p, size_t n) {
  if (counting && where == NULL)
    where = __builtin_return_address(0);
  allocs += counting;
  return __real_realloc(p, n);
}

START_TEST(the_wrap_counts) {
  void *volatile p;
  counting = 1;
  p = malloc(16);
  counting = 0;
  free(p);
  ck_assert_int_eq((long)allocs, 1); /* else the test below proves nothing */
  allocs = 0;
}
END_TEST

START_TEST(reports_allocate_nothing_once_warm) {
  enum { U = 1000 };
  static const char *names[U];
  static char buf[U][16];
  static float w[U * 64];
  static double sumsq[U];
  gnmr_tensor t[U];
  for (int i = 0; i < U; i++) {
    snprintf(buf[i], sizeof buf[i], "u%d", i);
    names[i] = buf[i];
    sumsq[i] = i;
    t[i] = (gnmr_tensor){&w[i * 64], 64, GNMR_DTYPE_F32, (uint32_t)i, 1.0};
  }
  for (int i = 0; i < U * 64; i++)
    w[i] = (float)(i % 7) - 3;
  gnmr_agent_config c = {0};
  c.endpoint = "tcp://127.0.0.1:1"; /* nobody: reports are queued, held */
  c.job = "alloc";
  c.reporters = 1;
  c.unit_names = names;
  c.n_units = U;
  gnmr_params_default(&c.params);
  gnmr_agent *a = NULL;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  /* warm: each of the few pool buffers takes its size once */
  for (uint64_t s = 1; s <= 8; s += 2) {
    ck_assert_int_eq(gnmr_agent_report(a, s, t, U), GNMR_OK);
    ck_assert_int_eq(gnmr_agent_report_sums(a, s + 1, sumsq, NULL, NULL),
                     GNMR_OK);
  }
  allocs = 0;
  where = NULL;
  counting = 1;
  for (uint64_t s = 9; s < 209; s += 2) {
    int r1 = gnmr_agent_report(a, s, t, U);
    int r2 = gnmr_agent_report_sums(a, s + 1, sumsq, NULL, NULL);
    if (r1 != GNMR_OK || r2 != GNMR_OK) {
      counting = 0;
      ck_abort_msg("report of step %llu failed", (unsigned long long)s);
    }
  }
  counting = 0;
  ck_assert_msg(allocs == 0, "%ld allocations, the first from %p",
                (long)allocs, where);
  gnmr_agent_stats st;
  ck_assert_int_eq(gnmr_agent_stats_get(a, &st), GNMR_OK);
  ck_assert_uint_eq(st.reports_sent, 208); /* all went into the pipe */
  gnmr_agent_close(&a);
}
END_TEST

START_TEST(hundreds_of_agents_fit_in_one_process) {
  /* 5 sockets each on one shared context: ZeroMQ's default of 1023
   * sockets would stop at about 200 */
  enum { N = 300 };
  static gnmr_agent *a[N];
  const char *names[] = {"u"};
  gnmr_agent_config c = {0};
  c.endpoint = "tcp://127.0.0.1:1";
  c.job = "many";
  c.reporters = N;
  c.unit_names = names;
  c.n_units = 1;
  gnmr_params_default(&c.params);
  for (uint32_t r = 0; r < N; r++) {
    c.rank = r;
    ck_assert_msg(gnmr_agent_open(&c, &a[r]) == GNMR_OK, "agent %u", r);
  }
  for (uint32_t r = 0; r < N; r++)
    gnmr_agent_close(&a[r]);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("agent_alloc");
  TCase *tc = tcase_create("alloc");
  tcase_add_test(tc, the_wrap_counts);
  tcase_add_test(tc, reports_allocate_nothing_once_warm);
  tcase_add_test(tc, hundreds_of_agents_fit_in_one_process);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
