/* SPDX-License-Identifier: MIT */
/* test_agent.c — libgnmr-agent: the CPU reduction against a long double
 * reference for every dtype (ragged sizes, block boundaries, NaN/Inf at
 * chunk edges, empty tensors), configuration checks, and the failure
 * semantics: no daemon, daemon killed mid-run, daemon restarted. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <zmq.h>

#include "agent_priv.h"
#include "agentutil.h"
#include "gnmr/agent.h"
#include "owner.h"
#include "reduce_cpu.h"
#include "wire.h"

static uint16_t to_bf16(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return (uint16_t)(b >> 16); /* truncation: exactly representable below */
}

static float from_bf16(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

START_TEST(fp32_sum_of_squares_matches_long_double_reference) {
  gnmr__reduce_set_simd(_i); /* 0 portable, 1 AVX2, 2 AVX-512 (as the CPU has) */
  static const uint64_t sizes[] = {0, 1, 7, 8, 9, 4095, 4096, 4097, 100003};
  unsigned seed = 3;
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    uint64_t n = sizes[k];
    float *x = malloc((n ? n : 1) * sizeof *x);
    long double ref = 0;
    for (uint64_t i = 0; i < n; i++) {
      x[i] = (float)((rand_r(&seed) % 20001) - 10000) * 1e-3f;
      ref += (long double)x[i] * x[i];
    }
    gnmr_tensor t = {x, n, GNMR_DTYPE_F32, 0, 0};
    double s = 0;
    uint64_t nf = 0;
    uint8_t seen = 0;
    ck_assert_int_eq(gnmr_reduce_cpu(&t, 1, 1, &s, &nf, &seen), GNMR_OK);
    ck_assert_uint_eq(nf, 0);
    ck_assert_int_eq(seen, 1);
    ck_assert_msg(fabsl(s - ref) <= 1e-12L * (ref + 1), "n=%llu: %g vs %Lg",
                  (unsigned long long)n, s, ref);
    free(x);
  }
}
END_TEST

START_TEST(fp8_values_decode_to_the_ocp_formats_and_scale_applies) {
  /* every byte of both formats, against values computed from the OCP
   * definitions here (not from the decoder under test) */
  uint8_t all[256];
  long double ref4 = 0, ref5 = 0;
  for (int i = 0; i < 256; i++) {
    all[i] = (uint8_t)i;
    int sgn = i >> 7, e4 = (i >> 3) & 15, m3 = i & 7;
    if (!(e4 == 15 && m3 == 7)) { /* E4M3: only S.1111.111 is NaN */
      long double v = e4 ? ldexpl(1 + m3 / 8.0L, e4 - 7) : ldexpl(m3, -9);
      ref4 += v * v;
    }
    int e5 = (i >> 2) & 31, m2 = i & 3;
    if (e5 != 31) {
      long double v = e5 ? ldexpl(1 + m2 / 4.0L, e5 - 15) : ldexpl(m2, -16);
      ref5 += v * v;
    }
    (void)sgn;
  }
  gnmr_tensor t[3] = {{all, 256, GNMR_DTYPE_F8E4M3, 0, 0},
                      {all, 256, GNMR_DTYPE_F8E5M2, 1, 0},
                      {all, 256, GNMR_DTYPE_F8E4M3, 2, 0.5}};
  double s[3] = {0};
  uint64_t nf[3] = {0};
  ck_assert_int_eq(gnmr_reduce_cpu(t, 3, 3, s, nf, NULL), GNMR_OK);
  ck_assert_uint_eq(nf[0], 2); /* 0x7f, 0xff */
  ck_assert_uint_eq(nf[1], 8); /* 0x7c..0x7f, 0xfc..0xff */
  ck_assert_uint_eq(nf[2], 2);
  ck_assert_msg(fabsl(s[0] - ref4) <= 1e-12L * ref4, "%g vs %Lg", s[0], ref4);
  ck_assert_msg(fabsl(s[1] - ref5) <= 1e-12L * ref5, "%g vs %Lg", s[1], ref5);
  ck_assert(s[2] == s[0] * 0.25); /* scale 0.5: sum times 0.25 */
  /* the largest finite values */
  uint8_t big[2] = {0x7e, 0x7b};
  gnmr_tensor b[2] = {{big, 1, GNMR_DTYPE_F8E4M3, 0, 0},
                      {big + 1, 1, GNMR_DTYPE_F8E5M2, 1, 0}};
  double bs[2] = {0};
  uint64_t bn[2] = {0};
  ck_assert_int_eq(gnmr_reduce_cpu(b, 2, 2, bs, bn, NULL), GNMR_OK);
  ck_assert(bs[0] == 448.0 * 448.0);
  ck_assert(bs[1] == 57344.0 * 57344.0);
  /* a bad scale is refused */
  gnmr_tensor neg = {all, 4, GNMR_DTYPE_F8E4M3, 0, -2.0};
  ck_assert_int_eq(gnmr_reduce_cpu(&neg, 1, 1, s, nf, NULL), GNMR_E_INVAL);
  neg.scale = NAN;
  ck_assert_int_eq(gnmr_reduce_cpu(&neg, 1, 1, s, nf, NULL), GNMR_E_INVAL);
}
END_TEST

START_TEST(half_precision_dtypes_are_widened_exactly) {
  gnmr__reduce_set_simd(_i); /* 0 portable, 1 AVX2, 2 AVX-512 (as the CPU has) */
  /* bf16 of f is f's top 16 bits; fp16 values chosen exactly */
  enum { N = 5000 };
  uint16_t bf[N], hf[N];
  long double ref_bf = 0, ref_hf = 0;
  for (int i = 0; i < N; i++) {
    float f = (float)(i % 97) * 0.25f - 12.0f;
    bf[i] = to_bf16(f);
    ref_bf += (long double)from_bf16(bf[i]) * from_bf16(bf[i]);
  }
  /* fp16: 1.0 = 0x3c00, -2.0 = 0xc000, 0.5 = 0x3800, 65504 = 0x7bff,
   * smallest subnormal 2^-24 = 0x0001 */
  static const uint16_t hv[] = {0x3c00, 0xc000, 0x3800, 0x7bff, 0x0001};
  static const double hval[] = {1.0, -2.0, 0.5, 65504.0, 0x1p-24};
  for (int i = 0; i < N; i++) {
    hf[i] = hv[i % 5];
    ref_hf += (long double)hval[i % 5] * hval[i % 5];
  }
  gnmr_tensor t[2] = {{bf, N, GNMR_DTYPE_BF16, 0, 0}, {hf, N, GNMR_DTYPE_F16, 1, 0}};
  double s[2] = {0, 0};
  uint64_t nf[2] = {0, 0};
  ck_assert_int_eq(gnmr_reduce_cpu(t, 2, 2, s, nf, NULL), GNMR_OK);
  ck_assert_msg(fabsl(s[0] - ref_bf) <= 1e-12L * ref_bf, "bf16 %g vs %Lg",
                s[0], ref_bf);
  ck_assert_msg(fabsl(s[1] - ref_hf) <= 1e-12L * ref_hf, "fp16 %g vs %Lg",
                s[1], ref_hf);
  ck_assert_uint_eq(nf[0] + nf[1], 0);
}
END_TEST

START_TEST(nonfinite_elements_are_counted_exactly_and_excluded) {
  gnmr__reduce_set_simd(_i); /* 0 portable, 1 AVX2, 2 AVX-512 (as the CPU has) */
  enum { N = 3 * 4096 + 5 };
  float *x = calloc(N, sizeof *x);
  for (int i = 0; i < N; i++)
    x[i] = 1.0f;
  /* at block edges and inside */
  int bad[] = {0, 4095, 4096, 8191, 8192, N - 1, 100};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    x[bad[i]] = (i % 3 == 0) ? NAN : (i % 3 == 1 ? INFINITY : -INFINITY);
  gnmr_tensor t = {x, N, GNMR_DTYPE_F32, 0, 0};
  double s = 0;
  uint64_t nf = 0;
  ck_assert_int_eq(gnmr_reduce_cpu(&t, 1, 1, &s, &nf, NULL), GNMR_OK);
  ck_assert_uint_eq(nf, 7);
  ck_assert_double_eq(s, N - 7);
  free(x);
  /* fp16 Inf/NaN and f64 */
  uint16_t h[4] = {0x7c00, 0x7e00, 0x3c00, 0xfc00}; /* inf, nan, 1, -inf */
  double dd[3] = {3, NAN, 4};
  gnmr_tensor t2[2] = {{h, 4, GNMR_DTYPE_F16, 0, 0}, {dd, 3, GNMR_DTYPE_F64, 1, 0}};
  double s2[2] = {0, 0};
  uint64_t nf2[2] = {0, 0};
  ck_assert_int_eq(gnmr_reduce_cpu(t2, 2, 2, s2, nf2, NULL), GNMR_OK);
  ck_assert_uint_eq(nf2[0], 3);
  ck_assert_double_eq(s2[0], 1);
  ck_assert_uint_eq(nf2[1], 1);
  ck_assert_double_eq(s2[1], 25);
}
END_TEST

START_TEST(several_tensors_of_one_unit_add_up_and_bad_input_is_refused) {
  gnmr__reduce_set_simd(_i); /* 0 portable, 1 AVX2, 2 AVX-512 (as the CPU has) */
  float a[3] = {1, 2, 3}, b[2] = {4, 0};
  gnmr_tensor t[3] = {{a, 3, GNMR_DTYPE_F32, 1, 0},
                      {b, 2, GNMR_DTYPE_F32, 1, 0},
                      {NULL, 0, GNMR_DTYPE_F32, 0, 0}}; /* empty tensor */
  double s[2] = {0, 0};
  uint64_t nf[2] = {0, 0};
  uint8_t seen[2] = {0, 0};
  ck_assert_int_eq(gnmr_reduce_cpu(t, 3, 2, s, nf, seen), GNMR_OK);
  ck_assert_double_eq(s[1], 30);
  ck_assert_double_eq(s[0], 0);
  ck_assert_int_eq(seen[0], 1); /* an empty tensor still reports its unit */
  gnmr_tensor bad_unit = {a, 3, GNMR_DTYPE_F32, 2, 0};
  ck_assert_int_eq(gnmr_reduce_cpu(&bad_unit, 1, 2, s, nf, NULL),
                   GNMR_E_INVAL);
  gnmr_tensor bad_dtype = {a, 3, 99, 0, 0};
  ck_assert_int_eq(gnmr_reduce_cpu(&bad_dtype, 1, 2, s, nf, NULL),
                   GNMR_E_INVAL);
  gnmr_tensor null_data = {NULL, 3, GNMR_DTYPE_F32, 0, 0};
  ck_assert_int_eq(gnmr_reduce_cpu(&null_data, 1, 2, s, nf, NULL),
                   GNMR_E_INVAL);
  ck_assert_int_eq(gnmr_reduce_cpu(t, 1, 2, NULL, nf, NULL), GNMR_E_INVAL);
}
END_TEST

/* Random tensors of every dtype, ragged sizes around the 4096-element
 * blocks and 16-block items, NaN/Inf here and there, scales, units shared
 * by several tensors, empty tensors. */
typedef struct mt_case {
  gnmr_tensor t[40];
  void *mem[40];
  size_t n;
} mt_case;

static void mt_case_make(mt_case *c, unsigned seed, uint32_t n_units) {
  static const uint64_t sizes[] = {0, 1, 4095, 4096, 4097, 65535, 65536,
                                   65537, 262144, 300001, 16 * 4096 * 3 + 7};
  static const uint32_t dtypes[] = {GNMR_DTYPE_F32, GNMR_DTYPE_F16,
                                    GNMR_DTYPE_BF16, GNMR_DTYPE_F64,
                                    GNMR_DTYPE_F8E4M3, GNMR_DTYPE_F8E5M2};
  c->n = 40;
  for (size_t i = 0; i < c->n; i++) {
    uint64_t n = sizes[rand_r(&seed) % (sizeof sizes / sizeof sizes[0])];
    uint32_t dt = dtypes[rand_r(&seed) % 6];
    size_t es = dt == GNMR_DTYPE_F64 ? 8 : dt == GNMR_DTYPE_F32 ? 4
                : dt >= GNMR_DTYPE_F8E4M3                       ? 1 : 2;
    uint8_t *m = malloc(n * es + 1);
    for (uint64_t j = 0; j < n * es; j++)
      m[j] = (uint8_t)rand_r(&seed);
    /* mostly finite values: random bytes in the low half of each element
     * and a small exponent in the high byte */
    for (uint64_t j = 0; j < n; j++) {
      uint8_t *hi = m + j * es + es - 1;
      if (es > 1)
        *hi = (uint8_t)(0x3c + (rand_r(&seed) % 3)) |
              (uint8_t)(rand_r(&seed) & 0x80);
      if (rand_r(&seed) % 50000 == 0)
        memset(m + j * es, 0xff, es); /* NaN in every format */
    }
    c->mem[i] = m;
    c->t[i] = (gnmr_tensor){m, n, dt, (uint32_t)rand_r(&seed) % n_units,
                            rand_r(&seed) % 4 == 0 ? 0.37 : 0};
  }
}

static void mt_case_free(mt_case *c) {
  for (size_t i = 0; i < c->n; i++)
    free(c->mem[i]);
}

START_TEST(threaded_reduction_equals_the_serial_one_bit_for_bit) {
  gnmr__reduce_set_simd(_i); /* 0 portable, 1 AVX2, 2 AVX-512 (as the CPU has) */
  enum { U = 7 };
  static const unsigned threads[] = {0, 1, 2, 3, 5, 8, 1000};
  for (unsigned seed = 1; seed <= 3; seed++) {
    mt_case c;
    mt_case_make(&c, seed, U);
    double want[U] = {0};
    uint64_t want_nf[U] = {0};
    uint8_t want_seen[U] = {0};
    ck_assert_int_eq(gnmr_reduce_cpu(c.t, c.n, U, want, want_nf, want_seen),
                     GNMR_OK);
    uint64_t nf_total = 0;
    for (int u = 0; u < U; u++)
      nf_total += want_nf[u];
    ck_assert_uint_gt(nf_total, 0); /* the case has NaN/Inf to count */
    for (size_t k = 0; k < sizeof threads / sizeof threads[0]; k++) {
      double got[U];
      uint64_t got_nf[U];
      uint8_t got_seen[U] = {0};
      for (int u = 0; u < U; u++)
        got[u] = 1.5, got_nf[u] = 2; /* added to, not cleared */
      ck_assert_int_eq(gnmr_reduce_cpu_threads(c.t, c.n, U, got, got_nf,
                                               got_seen, threads[k]),
                       GNMR_OK);
      for (int u = 0; u < U; u++) {
        double w = 1.5 + want[u];
        ck_assert_msg(memcmp(&got[u], &w, sizeof w) == 0,
                      "seed %u threads %u unit %d: %.17g vs %.17g", seed,
                      threads[k], u, got[u], w);
        ck_assert_uint_eq(got_nf[u], want_nf[u] + 2);
        ck_assert_int_eq(got_seen[u], want_seen[u]);
      }
    }
    mt_case_free(&c);
  }
  /* it did run on helpers (this machine may have one CPU: threads given) */
  ck_assert_uint_ge(gnmr__reduce_helpers(), 1);
}
END_TEST

START_TEST(threaded_reduction_refuses_bad_input_and_leaves_sums) {
  float *x = calloc(1 << 20, sizeof *x);
  gnmr_tensor good = {x, 1 << 20, GNMR_DTYPE_F32, 0, 0};
  gnmr_tensor bad[] = {{x, 1 << 20, GNMR_DTYPE_F32, 2, 0},    /* unit */
                       {x, 1 << 20, 99, 0, 0},                /* dtype */
                       {NULL, 1 << 20, GNMR_DTYPE_F32, 0, 0}, /* data */
                       {x, 1 << 20, GNMR_DTYPE_F32, 0, -1},   /* scale */
                       {x, 1 << 20, GNMR_DTYPE_F32, 0, NAN}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    gnmr_tensor two[2] = {good, bad[i]};
    double s[2] = {7, 7};
    uint64_t nf[2] = {3, 3};
    ck_assert_int_eq(gnmr_reduce_cpu_threads(two, 2, 2, s, nf, NULL, 4),
                     GNMR_E_INVAL);
    ck_assert_double_eq(s[0], 7); /* nothing added before the refusal */
    ck_assert_uint_eq(nf[0], 3);
  }
  double s = 0;
  uint64_t nf = 0;
  ck_assert_int_eq(gnmr_reduce_cpu_threads(&good, 1, 1, NULL, &nf, NULL, 2),
                   GNMR_E_INVAL);
  ck_assert_int_eq(gnmr_reduce_cpu_threads(&good, 1, 1, &s, NULL, NULL, 2),
                   GNMR_E_INVAL);
  ck_assert_int_eq(gnmr_reduce_cpu_threads(NULL, 1, 1, &s, &nf, NULL, 2),
                   GNMR_E_INVAL);
  ck_assert_int_eq(gnmr_reduce_cpu_threads(NULL, 0, 1, &s, &nf, NULL, 2),
                   GNMR_OK);
  free(x);
}
END_TEST

typedef struct mt_caller {
  mt_case *c;
  double sums[5];
  uint64_t nf[5];
  int rv;
} mt_caller;

static void *mt_call(void *arg) {
  mt_caller *m = arg;
  for (int r = 0; r < 20 && m->rv == GNMR_OK; r++) {
    memset(m->sums, 0, sizeof m->sums);
    memset(m->nf, 0, sizeof m->nf);
    m->rv = gnmr_reduce_cpu_threads(m->c->t, m->c->n, 5, m->sums, m->nf,
                                    NULL, 3);
  }
  return NULL;
}

START_TEST(threaded_reductions_from_several_threads_and_after_fork) {
  mt_case c;
  mt_case_make(&c, 11, 5);
  double want[5] = {0};
  uint64_t want_nf[5] = {0};
  ck_assert_int_eq(gnmr_reduce_cpu(c.t, c.n, 5, want, want_nf, NULL), GNMR_OK);
  /* four callers at once: one has the helpers, the others reduce alone */
  pthread_t th[4];
  mt_caller m[4];
  for (int i = 0; i < 4; i++) {
    m[i] = (mt_caller){.c = &c, .rv = GNMR_OK};
    ck_assert_int_eq(pthread_create(&th[i], NULL, mt_call, &m[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    ck_assert_int_eq(m[i].rv, GNMR_OK);
    ck_assert_mem_eq(m[i].sums, want, sizeof want);
    ck_assert_mem_eq(m[i].nf, want_nf, sizeof want_nf);
  }
  ck_assert_uint_ge(gnmr__reduce_helpers(), 1);
  /* a fork's child has none of the parent's helpers: it starts its own */
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) { /* exit(), not _exit(): the destructor stops the helpers */
    int ok = gnmr__reduce_helpers() == 0;
    double s[5] = {0};
    uint64_t nf[5] = {0};
    /* helpers start with their starter's name: they must take their own */
    pthread_setname_np(pthread_self(), "gnmr-test-call");
    ok = ok && gnmr_reduce_cpu_threads(c.t, c.n, 5, s, nf, NULL, 3) == GNMR_OK;
    ok = ok && memcmp(s, want, sizeof s) == 0 &&
         memcmp(nf, want_nf, sizeof nf) == 0 && gnmr__reduce_helpers() >= 1;
    ok = ok && tu_named_threads(0, "gnmr-test-call") == 1 &&
         tu_named_threads(0, "gnmr-reduce") == (int)gnmr__reduce_helpers();
    mt_case_free(&c);
    exit(ok ? 0 : 1);
  }
  int st = 0;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                "the fork's child reduced wrongly or hung (status %d)", st);
  mt_case_free(&c);
}
END_TEST

/* Writes text to dir/rel, making the directories on the way. */
static void put_file(const char *dir, const char *rel, const char *text) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, rel);
  for (char *p = path + strlen(dir) + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      mkdir(path, 0700);
      *p = '/';
    }
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

START_TEST(cgroup_cpu_quota_is_the_tightest_on_the_way_up) {
  /* How many CPUs a container may use, for the wait's spinning: cgroup v2
   * cpu.max and v1 cfs_quota_us, the tightest from the process's cgroup
   * up to the mount; "max" and -1 are no limit; anything unreadable or
   * malformed is no limit, never a crash. */
  const char *root = tu_tmpdir();
  ck_assert_uint_eq(gnmr__cgroup_cpus(root, "0::/\n"), 0);
  put_file(root, "a/b/cpu.max", "max 100000\n");
  put_file(root, "a/cpu.max", "250000 100000\n");
  ck_assert_uint_eq(gnmr__cgroup_cpus(root, "0::/a/b\n"), 2);
  put_file(root, "a/b/cpu.max", "50000 100000\n"); /* half a CPU: 1 */
  ck_assert_uint_eq(gnmr__cgroup_cpus(root, "0::/a/b\n"), 1);
  /* a container: its mount is its cgroup, its path the host's name */
  put_file(root, "cpu.max", "300000 100000");
  ck_assert_uint_eq(gnmr__cgroup_cpus(root, "0::/host/name/of/it\n"), 3);
  /* v1, under ROOT/cpu; only a list naming "cpu" itself counts */
  put_file(root, "cpu/x/cpu.cfs_quota_us", "-1\n");
  put_file(root, "cpu/x/cpu.cfs_period_us", "100000\n");
  put_file(root, "cpu/cpu.cfs_quota_us", "400000\n");
  put_file(root, "cpu/cpu.cfs_period_us", "100000\n");
  ck_assert_uint_eq(gnmr__cgroup_cpus(root, "4:cpuset:/x\n1:cpu,cpuacct:/x\n"),
                    4);
  ck_assert_uint_eq(gnmr__cgroup_cpus(root, "4:cpuset:/x\n2:cpuacct:/x\n"), 0);
  /* both: the tighter */
  ck_assert_uint_eq(gnmr__cgroup_cpus(root, "1:cpu:/x\n0::/a/b\n"), 1);
  /* malformed text and files: no limit */
  static const char *texts[] = {"", "garbage", "1:cpu", "0::relative",
                                "0:/a/b", "::::", "0::/a/b/../../..",
                                "\n\n\n"};
  put_file(root, "a/b/cpu.max", "abc def\n");
  put_file(root, "a/cpu.max", "100000 0\n");
  put_file(root, "cpu.max", "max\n");
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
    ck_assert_uint_eq(gnmr__cgroup_cpus(root, texts[i]), 0);
  ck_assert_uint_eq(gnmr__cgroup_cpus(root, "0::/a/b\n"), 0);
  ck_assert_uint_eq(gnmr__cgroup_cpus(NULL, "0::/\n"), 0);
  char longpath[5000];
  memset(longpath, 'x', sizeof longpath);
  memcpy(longpath, "0::/", 4);
  longpath[sizeof longpath - 1] = '\0';
  ck_assert_uint_eq(gnmr__cgroup_cpus(root, longpath), 0);
  /* this process's own: whatever it is, it is read without trouble */
  (void)gnmr__process_cgroup_cpus();
  tu_rmrf(root);
}
END_TEST

START_TEST(reduce_threads_come_from_the_environment_or_the_cpus) {
  cpu_set_t set;
  ck_assert_int_eq(sched_getaffinity(0, sizeof set, &set), 0);
  unsigned cpus = (unsigned)CPU_COUNT(&set);
  unsigned dflt = cpus > 8 ? 8 : cpus;
  unsetenv("GNMR_REDUCE_THREADS");
  ck_assert_uint_eq(gnmr__reduce_default_threads(), dflt);
  static const struct { const char *v; unsigned want; } cases[] = {
      {"3", 3}, {"1", 1}, {"8", 8}, {"100", 8}, {"0", 0}, {"-2", 0},
      {"3x", 0}, {"", 0}, {"99999999999999999999", 0}, {" 2", 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    setenv("GNMR_REDUCE_THREADS", cases[i].v, 1);
    unsigned want = cases[i].want ? cases[i].want : dflt;
    ck_assert_msg(gnmr__reduce_default_threads() == want,
                  "GNMR_REDUCE_THREADS='%s': %u, want %u", cases[i].v,
                  gnmr__reduce_default_threads(), want);
  }
  unsetenv("GNMR_REDUCE_THREADS");
}
END_TEST

static const char *names3[] = {"a", "b", "c"};

static gnmr_agent_config config(const char *endpoint) {
  gnmr_agent_config c = tu_agent_config(endpoint, "agent-test", names3, 3);
  c.params.warmup_steps = 0;
  c.barrier_ms = 2000 * (uint32_t)tu_slow(); /* no test here waits it out */
  return c;
}

/* gnmr_agent_report_sums' check at every SIMD level: a negative or NaN
 * sum at every position of a run that is not a multiple of the lanes is
 * found, unless that unit is marked not reported; -0 and +inf pass. */
START_TEST(reported_sums_are_checked_at_every_position) {
  gnmr__reduce_set_simd(_i);
  enum { N = 37 };
  double x[N];
  uint8_t skip[N];
  for (int pos = 0; pos < N; pos++) {
    for (int i = 0; i < N; i++) {
      x[i] = 0.5 * i;
      skip[i] = 0;
    }
    ck_assert_int_eq(gnmr__sums_invalid(x, NULL, N), 0);
    x[pos] = -0.0;
    ck_assert_int_eq(gnmr__sums_invalid(x, NULL, N), 0);
    x[pos] = INFINITY;
    ck_assert_int_eq(gnmr__sums_invalid(x, NULL, N), 0);
    const double bad[] = {-1e-300, -INFINITY, NAN, -NAN};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
      x[pos] = bad[b];
      ck_assert_msg(gnmr__sums_invalid(x, NULL, N) == 1,
                    "level %d: %a at %d passed", _i, bad[b], pos);
      ck_assert_int_eq(gnmr__sums_invalid(x, skip, N), 1);
      skip[pos] = 7; /* not reported: its value is not read */
      ck_assert_msg(gnmr__sums_invalid(x, skip, N) == 0,
                    "level %d: a unit not reported at %d was checked", _i,
                    pos);
      skip[pos] = 0;
    }
  }
  gnmr__reduce_set_simd(-1);
}
END_TEST

/* The Report the agent packs by hand around the caller's sums is, byte
 * for byte, what protobuf-c packs: every size around the varint limits,
 * with and without the optional arrays, rank 0 and large ones, long job
 * names; and the check made on the way finds what gnmr__sums_invalid
 * finds. */
START_TEST(hand_packed_reports_equal_protobuf_c) {
  gnmr__reduce_set_simd(_i);
  static const uint32_t sizes[] = {0, 1, 7, 8, 9, 15, 16, 17, 100, 1000, 2047,
                                   2048, 16383, 16384, 70000};
  uint64_t rng = 12345 + (uint64_t)_i;
  char job[300];
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    uint32_t n = sizes[si];
    double *x = malloc((n ? n : 1) * sizeof *x);
    uint64_t *nf = malloc((n ? n : 1) * sizeof *nf);
    protobuf_c_boolean *nr = malloc((n ? n : 1) * sizeof *nr);
    uint8_t *skip = malloc(n ? n : 1);
    for (int variant = 0; variant < 4; variant++) {
      for (uint32_t i = 0; i < n; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (double)(rng >> 11) * 0x1p-40;
        nf[i] = (variant & 1) && i % 5 == 0 ? rng >> 50 : 0;
        nr[i] = (variant & 2) && i % 7 == 3;
        skip[i] = (uint8_t)nr[i];
      }
      size_t jl = (size_t)(variant * 70 + si) % 290 + 1;
      memset(job, 'j', jl);
      job[jl] = '\0';
      Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
      Gnmr__Report r = GNMR__REPORT__INIT;
      r.job = job;
      r.rank = variant == 0 ? 0 : (uint32_t)(rng >> 33);
      r.step = variant == 3 ? UINT64_MAX : (uint64_t)si + 1;
      r.n_sumsq = n;
      r.sumsq = x;
      r.n_nonfinite = (variant & 1) ? n : 0;
      r.nonfinite = nf;
      r.n_not_reported = (variant & 2) ? n : 0;
      r.not_reported = nr;
      env.body_case = GNMR__ENVELOPE__BODY_REPORT;
      env.report = &r;
      size_t want_len = gnmr__wire_packed_size(&env);
      uint8_t *want = malloc(want_len), *got = malloc(want_len + 16);
      ck_assert_uint_eq(gnmr__wire_pack(&env, want), want_len);
      gnmr__report_layout pl;
      gnmr__report_plan(&pl, &r);
      ck_assert_uint_eq(pl.len, want_len);
      ck_assert_int_eq(gnmr__report_pack(&pl, skip, 1, got), 0);
      ck_assert_msg(memcmp(got, want, want_len) == 0,
                    "level %d, %u units, variant %d: bytes differ", _i, n,
                    variant);
      if (n > 0) { /* a bad sum where reported is found, and only there */
        uint32_t at = n / 2;
        x[at] = -1.0;
        ck_assert_int_eq(gnmr__report_pack(&pl, skip, 1, got),
                         skip[at] ? 0 : 1);
        ck_assert_int_eq(gnmr__report_pack(&pl, skip, 0, got), 0);
        x[at] = NAN;
        ck_assert_int_eq(gnmr__report_pack(&pl, NULL, 1, got), 1);
      }
      free(want);
      free(got);
    }
    free(x);
    free(nf);
    free(nr);
    free(skip);
  }
  gnmr__reduce_set_simd(-1);
}
END_TEST

/* Endpoints as users mistype them: each refused with the forms named,
 * before anything is opened; good ones (lists too) pass. */
START_TEST(endpoints_are_checked_with_the_accepted_forms_named) {
  static const struct {
    const char *ep, *part; /* part: NULL = accepted */
  } cases[] = {
      {"ipc:///run/gnmr/agents.sock", NULL},
      {"ipc://@gnmr-agents", NULL},
      {"tcp://127.0.0.1:5555", NULL},
      {"tcp://[::1]:1", NULL},
      {"tcp://head-node:65535", NULL},
      {"ipc:///a.sock,tcp://b:2,tcp://c:3", NULL},
      {"localhost:5555", "is not an endpoint: use ipc:///path/to/socket"},
      {"", "no endpoint given"},
      {"ipc://", "is not an endpoint"},
      {"udp://h:1", "is not an endpoint"},
      {"tcp://h", "has no HOST:PORT"},
      {"tcp://:5555", "has no HOST:PORT"},
      {"tcp://h:", "has no HOST:PORT"},
      {"tcp://h:99999", "from 1 to 65535"},
      {"tcp://h:0", "from 1 to 65535"},
      {"tcp://h:18446744073709551617", "from 1 to 65535"},
      {"tcp://h:55x", "from 1 to 65535"},
      {"tcp://h:*", "from 1 to 65535"}, /* binding only */
      {"ipc:///a.sock,", "an empty endpoint in the list"},
      {",ipc:///a.sock", "an empty endpoint in the list"},
      {"ipc:///a.sock,,tcp://b:2", "an empty endpoint in the list"},
      {"ipc:///a.sock,localhost:1", "'localhost:1' is not an endpoint"},
      {"\x1b[31mred\x7f", "'?[31mred?' is not"},
  };
  char why[512];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rv = gnmr_endpoint_check(cases[i].ep, why, sizeof why);
    if (cases[i].part == NULL) {
      ck_assert_msg(rv == GNMR_OK && why[0] == '\0', "%s refused: %s",
                    cases[i].ep, why);
      continue;
    }
    ck_assert_msg(rv == GNMR_E_INVAL, "%s accepted", cases[i].ep);
    ck_assert_msg(strstr(why, cases[i].part) != NULL, "%s: '%s' lacks '%s'",
                  cases[i].ep, why, cases[i].part);
  }
  char longp[300];
  snprintf(longp, sizeof longp, "ipc:///%0200d", 0);
  ck_assert_int_eq(gnmr_endpoint_check(longp, why, sizeof why), GNMR_E_INVAL);
  ck_assert_ptr_nonnull(strstr(why, "at most 107 bytes, this one is 201"));
  ck_assert_int_eq(gnmr_endpoint_check(NULL, NULL, 0), GNMR_E_INVAL);
  /* and gnmr_agent_open refuses what the check refuses */
  static const char *names[] = {"u"};
  gnmr_agent_config c = {0};
  c.endpoint = "localhost:5555";
  c.job = "j";
  c.reporters = 1;
  c.unit_names = names;
  c.n_units = 1;
  gnmr_params_default(&c.params);
  gnmr_agent *a = NULL;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_E_INVAL);
  ck_assert_ptr_null(a);
}
END_TEST

START_TEST(bad_configuration_is_refused) {
  gnmr_agent *a = (gnmr_agent *)1;
  gnmr_agent_config c = config("tcp://127.0.0.1:1");
  c.rank = 1;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_E_INVAL);
  ck_assert_ptr_null(a);
  c = config("tcp://127.0.0.1:1");
  c.job = "";
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_E_INVAL);
  c = config("tcp://127.0.0.1:1");
  c.params.alpha = 0;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_E_INVAL);
  c = config("tcp://127.0.0.1:1");
  c.n_units = 0;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_E_INVAL);
  c = config("tcp://127.0.0.1:1");
  const char *bad_names[] = {"a", "", "c"};
  c.unit_names = bad_names;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_E_INVAL);
  c = config("tcp://127.0.0.1:1");
  c.fallback_route = 5;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_E_INVAL);
  c = config("tcp://127.0.0.1:1");
  c.start = GNMR_START_RESUME + 1;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_E_INVAL);
  c = config("not-an-endpoint"); /* refused before anything is opened */
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_E_INVAL);
  ck_assert_int_eq(gnmr_agent_open(NULL, &a), GNMR_E_INVAL);
  ck_assert_int_eq(gnmr_agent_open(&c, NULL), GNMR_E_INVAL);
  gnmr_agent_close(NULL);
}
END_TEST

/* Closing an agent and opening another at once, many times (a training
 * script that makes a Controller per epoch or per elastic restart) while
 * another agent keeps the process's ZeroMQ context alive: the new agent is
 * often allocated where the old one was, and ZeroMQ unbinds an inproc
 * endpoint of a closed socket only later, on its own thread, so no
 * endpoint name of an agent may repeat. */
START_TEST(agents_reopened_at_once_in_one_process_always_open) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  gnmr_agent_config c = config(d.agents);
  c.job = "kept-open";
  gnmr_agent *kept; /* the shared ZeroMQ context lives on meanwhile */
  ck_assert_int_eq(gnmr_agent_open(&c, &kept), GNMR_OK);
  for (int i = 0; i < 100; i++) {
    char job[32];
    snprintf(job, sizeof job, "reopened-%d", i);
    c.job = job;
    gnmr_agent *a;
    int rv = gnmr_agent_open(&c, &a);
    ck_assert_msg(rv == GNMR_OK, "open %d: %s", i, gnmr_strerror(rv));
    int slow = getenv("GNMR_VALGRIND") != NULL ? 30 : 1;
    for (int w = 0; w < 2500 * slow && !gnmr_agent_joined(a); w++)
      tu_sleep_ms(2);
    ck_assert_msg(gnmr_agent_joined(a), "agent %d did not join", i);
    gnmr_agent_close(&a);
    ck_assert_ptr_null(a);
  }
  gnmr_agent_close(&kept);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* A process that forks after opening an agent (os.fork, a data loader's
 * workers): the child has none of the agent's threads and shares the
 * parent's ZeroMQ descriptors. Every call there that would use them is
 * refused at once (CLOSED, saying why), closing the child's copy frees it
 * without touching them, an agent the child opens works, and the parent's
 * agent goes on deciding. */
START_TEST(a_forked_child_cannot_use_or_break_the_parents_agent) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  gnmr_agent_config c = config(d.agents);
  c.job = "forked";
  c.n_units = 1;
  gnmr_agent *a;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  double s[1] = {1};
  ck_assert_int_eq(gnmr_agent_report_sums(a, 1, s, NULL, NULL), GNMR_OK);
  ck_assert_int_eq(gnmr_agent_wait(a, 1, 5000 * tu_slow()), GNMR_OK);
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    alarm(20); /* a hang is a failure, not a stuck test */
    close(fds[0]);
    char why[256];
    int bad = 0;
    bad |= gnmr_agent_report_sums(a, 2, s, NULL, NULL) != GNMR_E_CLOSED;
    bad |= gnmr_agent_last_error(a, why, sizeof why) != GNMR_E_CLOSED ||
           strstr(why, "forked") == NULL;
    float g[1] = {1};
    gnmr_tensor t = {g, 1, GNMR_DTYPE_F32, 0, 0};
    bad |= gnmr_agent_report(a, 2, &t, 1) != GNMR_E_CLOSED;
    bad |= gnmr_agent_wait(a, 2, 10000) != GNMR_E_CLOSED; /* at once */
    bad |= gnmr_agent_route(a, 0) < 0; /* the parent's last routes */
    gnmr_agent_close(&a);
    bad |= a != NULL;
    /* an agent opened in the child gets a context of its own, and works */
    gnmr_agent_config cc = c;
    cc.job = "forked-child";
    gnmr_agent *b;
    bad |= gnmr_agent_open(&cc, &b) != GNMR_OK;
    if (b != NULL) {
      for (int w = 0; w < 2500 && !gnmr_agent_joined(b); w++)
        usleep(2000);
      bad |= gnmr_agent_report_sums(b, 1, s, NULL, NULL) != GNMR_OK;
      bad |= gnmr_agent_wait(b, 1, 5000) != GNMR_OK;
      gnmr_agent_close(&b);
    }
    /* the verdict goes through the pipe; then the child ends by exec,
     * without exit-time checks (valgrind's would count what it must leave:
     * the parent's context, the parent's threads' buffers) */
    char v = bad ? 'x' : 'y';
    if (write(fds[1], &v, 1) != 1)
      _exit(3);
    execl("/bin/true", "true", (char *)NULL);
    _exit(0);
  }
  close(fds[1]);
  char v = 0;
  ck_assert_int_eq(read(fds[0], &v, 1), 1);
  close(fds[0]);
  int st = 0;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(v == 'y', "child: verdict %c, status %d", v, st);
  for (uint64_t t = 2; t <= 4; t++) {
    ck_assert_int_eq(gnmr_agent_report_sums(a, t, s, NULL, NULL), GNMR_OK);
    ck_assert_int_eq(gnmr_agent_wait(a, t, 5000 * tu_slow()), GNMR_OK);
  }
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* gnmr_agent_routes() equals gnmr_agent_route() unit by unit across the
 * 64-unit words of the route bitmap, and gives the fallback before any
 * decision. */
START_TEST(every_route_at_once_equals_each_route) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  enum { N = 130 };
  static char names_buf[N][16];
  static const char *nm[N];
  for (int i = 0; i < N; i++) {
    snprintf(names_buf[i], sizeof names_buf[i], "u%d", i);
    nm[i] = names_buf[i];
  }
  gnmr_agent_config c = tu_agent_config(d.agents, "routes-at-once", nm, N);
  c.params.warmup_steps = 0;
  c.params.max_active = 3;
  c.params.lock_steps = 100;
  c.fallback_route = GNMR_ROUTE_HIGH;
  gnmr_agent *a;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  uint8_t out[N];
  ck_assert_uint_eq(gnmr_agent_routes(a, out, N), N);
  for (int u = 0; u < N; u++) /* nothing decided yet: the fallback */
    ck_assert_int_eq(out[u], GNMR_ROUTE_HIGH);
  double s[N];
  for (uint64_t t = 1; t <= 6; t++) {
    for (int u = 0; u < N; u++)
      s[u] = t == 6 && (u == 63 || u == 64 || u == 129) ? 900 : 1;
    ck_assert_int_eq(gnmr_agent_report_sums(a, t, s, NULL, NULL), GNMR_OK);
    ck_assert_int_eq(gnmr_agent_wait(a, t, 5000 * tu_slow()), GNMR_OK);
  }
  ck_assert_uint_eq(gnmr_agent_routes(a, out, N), N);
  for (int u = 0; u < N; u++) {
    ck_assert_int_eq(out[u], gnmr_agent_route(a, (uint32_t)u));
    ck_assert_int_eq(out[u], u == 63 || u == 64 || u == 129
                                 ? GNMR_ROUTE_HIGH
                                 : GNMR_ROUTE_LOW);
  }
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

static double thread_cpu_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static double mono_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* One wait for a decision that never comes: its result, the caller's CPU
 * time and the time it took, in ms. */
static int timed_wait(const char *spin, const char *ep, int timeout_ms,
                      double *cpu, double *took, int *spun) {
  if (spin != NULL)
    setenv("GNMR_WAIT_SPIN_US", spin, 1);
  else
    unsetenv("GNMR_WAIT_SPIN_US");
  gnmr_agent_config c = config(ep);
  gnmr_agent *a;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  uint64_t s0 = gnmr__agent_waits_spun();
  double c0 = thread_cpu_ms(), t0 = mono_ms();
  int rv = gnmr_agent_wait(a, 1, timeout_ms);
  *cpu = thread_cpu_ms() - c0;
  *took = mono_ms() - t0;
  *spun = gnmr__agent_waits_spun() > s0;
  gnmr_agent_close(&a);
  return rv;
}

static void *spin_in_wait(void *arg) {
  (void)gnmr_agent_wait(arg, 1, 500 * (int)tu_slow());
  return NULL;
}

START_TEST(waits_spin_before_sleeping_within_their_bounds) {
  /* gnmr_agent_wait spins (yielding) for up to GNMR_WAIT_SPIN_US of its
   * timeout before it sleeps, never past the timeout, and only where a CPU
   * of the caller's stays free for the round trip's threads. A bad value
   * is refused where the environment is read. */
  const char *dir = tu_tmpdir();
  char ep[160];
  snprintf(ep, sizeof ep, "ipc://%s/nobody.sock", dir);
  static const char *bad[] = {"abc", "-1", "1000001", "12x", "1e3", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("GNMR_WAIT_SPIN_US", bad[i], 1);
    gnmr_agent_config c = config(ep);
    const char *var = NULL;
    ck_assert_int_eq(gnmr_agent_config_from_env(&c, &var), GNMR_E_INVAL);
    ck_assert_str_eq(var, "GNMR_WAIT_SPIN_US");
  }
  static const char *good[] = {"0", "2000", "1000000"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    setenv("GNMR_WAIT_SPIN_US", good[i], 1);
    gnmr_agent_config c = config(ep);
    ck_assert_int_eq(gnmr_agent_config_from_env(&c, NULL), GNMR_OK);
  }
  cpu_set_t all;
  ck_assert_int_eq(sched_getaffinity(0, sizeof all, &all), 0);
  int cpus = CPU_COUNT(&all);
  double cpu, took;
  int spun;
  /* 20 ms of spinning, then asleep to the 80 ms deadline; CPU time is
   * checked only from above (under valgrind, whose threads take turns, or
   * on a loaded machine a spinning thread gets little of it) */
  ck_assert_int_eq(timed_wait("20000", ep, 80, &cpu, &took, &spun),
                   GNMR_E_TIMEDOUT);
  ck_assert_msg(took >= 75, "a wait of 80 ms returned after %.1f ms", took);
  ck_assert_int_eq(spun, cpus > 1);
  if (tu_slow() == 1)
    ck_assert_msg(cpu < 50, "spun %.1f ms of CPU past its 20", cpu);
  /* the default spins up to 2 ms; 0 turns it off */
  ck_assert_int_eq(timed_wait(NULL, ep, 60, &cpu, &took, &spun),
                   GNMR_E_TIMEDOUT);
  ck_assert_int_eq(spun, cpus > 1);
  if (tu_slow() == 1)
    ck_assert_msg(cpu < 15, "the default spun %.1f ms of CPU", cpu);
  ck_assert_int_eq(timed_wait("0", ep, 60, &cpu, &took, &spun),
                   GNMR_E_TIMEDOUT);
  ck_assert_int_eq(spun, 0);
  ck_assert_msg(cpu < 5, "GNMR_WAIT_SPIN_US=0 spun %.1f ms of CPU", cpu);
  /* a spin longer than the timeout ends at the timeout */
  ck_assert_int_eq(timed_wait("1000000", ep, 10, &cpu, &took, &spun),
                   GNMR_E_TIMEDOUT);
  ck_assert_msg(took < 800, "a wait of 10 ms spun %.1f ms", took);
  /* a fork while another thread spins: the child's waits spin all the
   * same (the parent's spinning thread is not in the child) */
  if (cpus > 1) {
    setenv("GNMR_WAIT_SPIN_US", "400000", 1);
    gnmr_agent_config c = config(ep);
    gnmr_agent *busy;
    ck_assert_int_eq(gnmr_agent_open(&c, &busy), GNMR_OK);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, spin_in_wait, busy), 0);
    tu_sleep_ms(100 * tu_slow()); /* it spins now, for 400 ms */
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      double ccpu, ctook;
      int cspun;
      int crv = timed_wait("20000", ep, 80, &ccpu, &ctook, &cspun);
      /* the verdict through the pipe, then exec: no exit-time checks
       * (valgrind's would count the parent's threads' buffers as lost) */
      char v = crv == GNMR_E_TIMEDOUT && cspun ? 'y' : 'n';
      if (write(fds[1], &v, 1) != 1)
        _exit(3);
      execl("/bin/true", "true", (char *)NULL);
      _exit(0);
    }
    close(fds[1]);
    char v = 0;
    ck_assert_int_eq(read(fds[0], &v, 1), 1);
    close(fds[0]);
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    pthread_join(th, NULL);
    gnmr_agent_close(&busy);
    ck_assert_msg(v == 'y', "a forked child's wait did not spin (%c)", v);
  }
  /* on one CPU nothing spins: the round trip needs that CPU */
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &all)) {
      CPU_SET(c, &one);
      break;
    }
  ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
  int rv = timed_wait("20000", ep, 60, &cpu, &took, &spun);
  pthread_setaffinity_np(pthread_self(), sizeof all, &all);
  unsetenv("GNMR_WAIT_SPIN_US");
  ck_assert_int_eq(rv, GNMR_E_TIMEDOUT);
  ck_assert_int_eq(spun, 0);
  ck_assert_msg(cpu < 5, "spun %.1f ms of CPU on one CPU", cpu);
  tu_rmrf(dir);
}
END_TEST

START_TEST(agent_without_daemon_keeps_stepping_within_its_deadline) {
  const char *dir = tu_tmpdir();
  char ep[160];
  snprintf(ep, sizeof ep, "ipc://%s/nobody.sock", dir);
  gnmr_agent_config c = config(ep);
  c.fallback_route = GNMR_ROUTE_HIGH;
  gnmr_agent *a;
  int before = tu_named_threads(0, "gnmr-agent-io");
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  /* its I/O thread is named (top -H, /proc show what it costs); the
   * thread names itself once it runs */
  for (int i = 0; i < 1000 * tu_slow() &&
                  tu_named_threads(0, "gnmr-agent-io") == before;
       i++)
    tu_sleep_ms(2);
  ck_assert_int_eq(tu_named_threads(0, "gnmr-agent-io"), before + 1);
  float g[4] = {1, 2, 3, 4};
  gnmr_tensor t = {g, 4, GNMR_DTYPE_F32, 0, 0};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (uint64_t step = 1; step <= 20; step++) {
    ck_assert_int_eq(gnmr_agent_report(a, step, &t, 1), GNMR_OK);
    ck_assert_int_eq(gnmr_agent_wait(a, step, 10), GNMR_E_TIMEDOUT);
    ck_assert_int_eq(gnmr_agent_route(a, 0), GNMR_ROUTE_HIGH); /* fallback */
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) +
                (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  /* 20 deadlines of 10 ms: never blocked far beyond them */
  ck_assert_msg(secs < 2.0 * tu_slow(), "20 steps took %.2f s", secs);
  gnmr_agent_stats st;
  gnmr_agent_stats_get(a, &st);
  ck_assert_uint_eq(st.late_decisions, 20);
  ck_assert_uint_eq(st.decisions, 0);
  ck_assert_int_eq(gnmr_agent_joined(a), 0);
  uint64_t run = 77, last = 77; /* not joined: nothing said, nothing written */
  ck_assert_int_eq(gnmr_agent_run(a, &run, &last), 0);
  ck_assert(run == 77 && last == 77);
  ck_assert_int_eq(gnmr_agent_run(NULL, &run, &last), 0);
  /* steps must increase */
  ck_assert_int_eq(gnmr_agent_report(a, 20, &t, 1), GNMR_E_INVAL);
  ck_assert_int_eq(gnmr_agent_report(a, 0, &t, 1), GNMR_E_INVAL);
  double neg[3] = {-1, 0, 0};
  ck_assert_int_eq(gnmr_agent_report_sums(a, 21, neg, NULL, NULL),
                   GNMR_E_INVAL);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  gnmr_agent_close(&a);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  ck_assert_ptr_null(a);
  ck_assert(t1.tv_sec - t0.tv_sec < 2 * tu_slow()); /* close does not hang */
  ck_assert_int_eq(tu_named_threads(0, "gnmr-agent-io"), before); /* joined */
  tu_rmrf(dir);
}
END_TEST

/* Steps until a decision for `step` arrives (or gives up). */
static int step_once(gnmr_agent *a, uint64_t step, double scale, int wait) {
  double s[3] = {1 * scale, 4 * scale, 9 * scale};
  ck_assert_int_eq(gnmr_agent_report_sums(a, step, s, NULL, NULL), GNMR_OK);
  return gnmr_agent_wait(a, step, wait);
}

START_TEST(daemon_killed_mid_run_then_restarted_agent_rejoins) {
  tu_daemon d = {0};
  char ep[160];
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  tu_daemon_start_in(&d, ep, NULL, d.dir, NULL);
  gnmr_agent_config c = config(ep);
  c.fallback_after = 2;
  c.params.max_active = 1;
  c.params.lock_steps = 100;
  gnmr_agent *a;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  uint64_t step = 0;
  for (int i = 0; i < 5; i++)
    ck_assert_int_eq(step_once(a, ++step, 1, 5000), GNMR_OK);
  /* unit 1 spikes: it goes HIGH and its lock keeps it there */
  ck_assert_int_eq(step_once(a, ++step, 0, 5000), GNMR_OK);
  double sp[3] = {1, 400, 9};
  ck_assert_int_eq(gnmr_agent_report_sums(a, ++step, sp, NULL, NULL),
                   GNMR_OK);
  ck_assert_int_eq(gnmr_agent_wait(a, step, 5000 * tu_slow()), GNMR_OK);
  ck_assert_int_eq(gnmr_agent_route(a, 1), GNMR_ROUTE_HIGH);
  ck_assert_int_eq(gnmr_agent_route(a, 0), GNMR_ROUTE_LOW);
  uint8_t all[8];
  ck_assert_uint_eq(gnmr_agent_routes(a, all, 8), 3); /* clamped */
  ck_assert(all[0] == GNMR_ROUTE_LOW && all[1] == GNMR_ROUTE_HIGH &&
            all[2] == GNMR_ROUTE_LOW);
  ck_assert_uint_eq(gnmr_agent_routes(a, NULL, 3), 0);
  ck_assert_uint_eq(gnmr_agent_routes(NULL, all, 3), 0);
  ck_assert(gnmr_agent_joined(a));
  uint64_t run = 0, last = 99; /* a new run: nothing decided before it */
  ck_assert_int_eq(gnmr_agent_run(a, &run, &last), 1);
  ck_assert(run >= 1 && last == 0);
  ck_assert_int_eq(gnmr_agent_run(a, NULL, NULL), 1);

  /* kill -9: the agent keeps stepping within its deadline */
  tu_daemon_stop(&d, SIGKILL);
  ck_assert_int_eq(step_once(a, ++step, 1, 50), GNMR_E_TIMEDOUT);
  /* the last decision is still used for fallback_after steps ... */
  ck_assert_int_eq(gnmr_agent_route(a, 1), GNMR_ROUTE_HIGH);
  ck_assert_int_eq(step_once(a, ++step, 1, 50), GNMR_E_TIMEDOUT);
  ck_assert_int_eq(step_once(a, ++step, 1, 50), GNMR_E_TIMEDOUT);
  /* ... then the fallback route, for every unit at once too */
  ck_assert_int_eq(gnmr_agent_route(a, 1), GNMR_ROUTE_LOW);
  memset(all, 7, sizeof all);
  ck_assert_uint_eq(gnmr_agent_routes(a, all, 3), 3);
  ck_assert(all[0] == GNMR_ROUTE_LOW && all[1] == GNMR_ROUTE_LOW &&
            all[2] == GNMR_ROUTE_LOW && all[3] == 7);
  gnmr_agent_stats st;
  gnmr_agent_stats_get(a, &st);
  ck_assert_uint_eq(st.late_decisions, 3);
  uint64_t hellos_before = st.hellos;

  /* restart on the same endpoint: the agent re-joins by itself */
  tu_daemon_start_in(&d, ep, NULL, d.dir, NULL);
  int ok = 0;
  for (int i = 0; i < 100 && !ok; i++)
    ok = step_once(a, ++step, 1, 200) == GNMR_OK;
  ck_assert_msg(ok, "no decision after the daemon restarted");
  gnmr_agent_stats_get(a, &st);
  ck_assert_uint_gt(st.hellos, hellos_before);
  ck_assert(gnmr_agent_joined(a));
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(step_once(a, ++step, 1, 5000), GNMR_OK);
  ck_assert_int_eq(gnmr_agent_route(a, 0), GNMR_ROUTE_LOW);
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(mismatched_agent_is_refused_and_counts_the_error) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  gnmr_agent_config c = config(d.agents);
  c.reporters = 2;
  gnmr_agent *a, *b;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  for (int i = 0; i < 200 && !gnmr_agent_joined(a); i++)
    tu_sleep_ms(10);
  ck_assert(gnmr_agent_joined(a));
  c.rank = 1;
  c.params.alpha = 3; /* disagrees with the job */
  ck_assert_int_eq(gnmr_agent_open(&c, &b), GNMR_OK);
  gnmr_agent_stats st = {0};
  for (int i = 0; i < 200 && st.errors == 0; i++) {
    tu_sleep_ms(10);
    gnmr_agent_stats_get(b, &st);
  }
  ck_assert_uint_ge(st.errors, 1);
  ck_assert_int_eq(st.last_error, GNMR_E_MISMATCH);
  ck_assert(!gnmr_agent_joined(b));
  gnmr_agent_close(&a);
  gnmr_agent_close(&b);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(observers_receive_every_decision_without_reporting) {
  /* 2 model-parallel shards report; 2 data-parallel replicas observe */
  tu_daemon d = {0};
  tu_daemon_start(&d);
  static const char *names[] = {"attn", "mlp", "emb"};
  gnmr_agent *ag[4];
  for (int i = 0; i < 4; i++) {
    gnmr_agent_config c = config(d.agents);
    c.job = "dp-job";
    c.reporters = 2;
    c.rank = (uint32_t)(i % 2);
    c.unit_names = names;
    c.observer = i >= 2;
    ck_assert_int_eq(gnmr_agent_open(&c, &ag[i]), GNMR_OK);
  }
  /* an observer sees the decisions made after it joined */
  for (int i = 0; i < 4; i++) {
    for (int k = 0; k < 250 && !gnmr_agent_joined(ag[i]); k++)
      tu_sleep_ms(20);
    ck_assert_msg(gnmr_agent_joined(ag[i]), "agent %d never joined", i);
  }
  for (uint64_t t = 1; t <= 12; t++) {
    double s[3] = {1, 4, 9};
    if (t == 10)
      s[1] = 4000; /* mlp spikes */
    for (int i = 0; i < 4; i++) /* every replica calls report alike */
      ck_assert_int_eq(gnmr_agent_report_sums(ag[i], t, s, NULL, NULL),
                       GNMR_OK);
    for (int i = 0; i < 4; i++)
      ck_assert_msg(gnmr_agent_wait(ag[i], t, 5000 * tu_slow()) == GNMR_OK,
                    "agent %d: no decision for step %llu", i,
                    (unsigned long long)t);
    for (uint32_t u = 0; u < 3; u++) {
      int want = gnmr_agent_route(ag[0], u);
      for (int i = 1; i < 4; i++)
        ck_assert_int_eq(gnmr_agent_route(ag[i], u), want);
    }
    if (t == 10) {
      ck_assert_int_eq(gnmr_agent_route(ag[2], 1), GNMR_ROUTE_HIGH);
      /* why: mlp exceeded, with its GNMR, Delta-GNMR and score, for a
       * reporter and an observer alike */
      for (int i = 0; i < 4; i += 2) {
        uint32_t units[3], n = 99;
        double g[3], dd[3], sc[3];
        ck_assert_uint_eq(gnmr_agent_risky(ag[i], units, g, dd, sc, 3, &n),
                          10);
        ck_assert_uint_eq(n, 1);
        ck_assert_uint_eq(units[0], 1);
        ck_assert_msg(g[0] > 2 && dd[0] > 1 && sc[0] > 0,
                      "g %g d %g s %g", g[0], dd[0], sc[0]);
        ck_assert_uint_eq(gnmr_agent_risky(ag[i], NULL, NULL, NULL, NULL, 0,
                                           &n),
                          10);
        ck_assert_uint_eq(n, 1);
      }
    } else if (t < 10) {
      uint32_t n = 99;
      ck_assert_uint_eq(gnmr_agent_risky(ag[0], NULL, NULL, NULL, NULL, 0,
                                         &n),
                        t);
      ck_assert_uint_eq(n, 0);
    }
  }
  /* observers never held a step back, and sent nothing */
  ck_assert_int_eq(tu_counter(&d, "deadline_decisions"), 0);
  ck_assert_int_eq(tu_counter(&d, "reports"), 24);
  gnmr_agent_stats st;
  gnmr_agent_stats_get(ag[3], &st);
  ck_assert_uint_eq(st.reports_sent, 0);
  ck_assert_uint_eq(st.decisions, 12);
  /* an observer leaving does not end the job */
  gnmr_agent_close(&ag[2]);
  gnmr_agent_close(&ag[3]);
  tu_sleep_ms(100);
  ck_assert_int_eq(tu_counter(&d, "jobs_finished"), 0);
  gnmr_agent_close(&ag[0]);
  gnmr_agent_close(&ag[1]);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(lagging_rank_is_decided_missing_at_the_barrier_deadline) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  static const char *n0[] = {"r0.a", "shared"}, *n1[] = {"r1.a", "shared"};
  gnmr_agent *ag[2];
  for (int r = 0; r < 2; r++) {
    gnmr_agent_config c = config(d.agents);
    c.job = "lag-job";
    c.reporters = 2;
    c.rank = (uint32_t)r;
    c.unit_names = r ? n1 : n0;
    c.n_units = 2;
    /* under valgrind (and a loaded CI machine) two ranks reporting at
     * once can land more than 300 ms apart: the deadline scales */
    c.barrier_ms = 300 * (uint32_t)tu_slow();
    ck_assert_int_eq(gnmr_agent_open(&c, &ag[r]), GNMR_OK);
  }
  double s[2] = {1, 1};
  for (uint64_t t = 1; t <= 4; t++) {
    for (int r = 0; r < 2; r++)
      ck_assert_int_eq(gnmr_agent_report_sums(ag[r], t, s, NULL, NULL),
                       GNMR_OK);
    for (int r = 0; r < 2; r++)
      ck_assert_int_eq(gnmr_agent_wait(ag[r], t, 5000 * tu_slow()), GNMR_OK);
  }
  ck_assert_int_eq(tu_counter(&d, "deadline_decisions"), 0);
  /* step 5: rank 1 lags; the step is decided when the deadline passes */
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ck_assert_int_eq(gnmr_agent_report_sums(ag[0], 5, s, NULL, NULL), GNMR_OK);
  ck_assert_int_eq(gnmr_agent_wait(ag[0], 5, 5000 * tu_slow()), GNMR_OK);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double waited = (double)(t1.tv_sec - t0.tv_sec) +
                  (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  ck_assert_msg(waited >= 0.25 * tu_slow() && waited < 3.0 * tu_slow(),
                "decided after %.3f s", waited);
  ck_assert_int_eq(tu_counter(&d, "deadline_decisions"), 1);
  /* rank 1's unit and the shared unit (one shard short) were missing */
  ck_assert_int_eq(tu_counter(&d, "missing_units"), 2);
  /* its report for step 5 comes too late: dropped and counted */
  ck_assert_int_eq(gnmr_agent_report_sums(ag[1], 5, s, NULL, NULL), GNMR_OK);
  for (int i = 0; i < 100 && tu_counter(&d, "late_reports") < 1; i++)
    tu_sleep_ms(20);
  ck_assert_int_eq(tu_counter(&d, "late_reports"), 1);
  /* step 6 goes normally for both */
  for (int r = 0; r < 2; r++)
    ck_assert_int_eq(gnmr_agent_report_sums(ag[r], 6, s, NULL, NULL),
                     GNMR_OK);
  for (int r = 0; r < 2; r++)
    ck_assert_int_eq(gnmr_agent_wait(ag[r], 6, 5000 * tu_slow()), GNMR_OK);
  ck_assert_int_eq(tu_counter(&d, "deadline_decisions"), 1);
  /* the history says which units were missing */
  char admin[300];
  snprintf(admin, sizeof admin, "--admin=%s", d.admin);
  char *argv[] = {"gnmrctl", admin, "history", "lag-job", "--kind",
                  "missing", "--csv", NULL};
  int found = 0;
  for (int i = 0; i < 100 && !found; i++) {
    run_result r = tu_run("gnmrctl", argv, NULL);
    /* unit ids depend on which Hello came first: match the names */
    int r1 = 0, shared = 0;
    for (char *line = r.out; line && *line; line = strchr(line, '\n')) {
      if (*line == '\n')
        line++;
      if (strncmp(line, "1,5,missing,", 12) == 0) {
        const char *name = strchr(line + 12, ',') + 1;
        r1 |= strncmp(name, "r1.a,", 5) == 0;
        shared |= strncmp(name, "shared,", 7) == 0;
      }
    }
    found = r1 && shared;
    tu_run_free(&r);
    if (!found)
      tu_sleep_ms(20);
  }
  ck_assert_msg(found, "no missing events for step 5 in the history");
  for (int r = 0; r < 2; r++)
    gnmr_agent_close(&ag[r]);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* ---- a stand-in daemon: a ROUTER the test drives by hand ------------------ */

typedef struct fake_daemon {
  void *ctx, *router;
  char ident[256];
  size_t ident_len;
} fake_daemon;

static void fake_bind(fake_daemon *f, const char *endpoint) {
  int zero = 0;
  f->router = zmq_socket(f->ctx, ZMQ_ROUTER);
  zmq_setsockopt(f->router, ZMQ_LINGER, &zero, sizeof zero);
  ck_assert_int_eq(zmq_bind(f->router, endpoint), 0);
}

/* Receives one envelope from the agent (NULL when none within ms). */
static Gnmr__Envelope *fake_recv(fake_daemon *f, int ms) {
  zmq_setsockopt(f->router, ZMQ_RCVTIMEO, &ms, sizeof ms);
  int n = zmq_recv(f->router, f->ident, sizeof f->ident, 0);
  if (n < 0)
    return NULL;
  f->ident_len = (size_t)n;
  zmq_msg_t m;
  zmq_msg_init(&m);
  ck_assert_int_ge(zmq_msg_recv(&m, f->router, 0), 0);
  Gnmr__Envelope *env = NULL;
  ck_assert_int_eq(gnmr__wire_decode(zmq_msg_data(&m), zmq_msg_size(&m), &env,
                                     NULL, 0),
                   GNMR_OK);
  zmq_msg_close(&m);
  return env;
}

/* Waits for the agent's Hello and welcomes it with last_step. */
static void fake_welcome(fake_daemon *f, uint64_t last_step) {
  Gnmr__Envelope *env;
  while ((env = fake_recv(f, 5000)) != NULL &&
         env->body_case != GNMR__ENVELOPE__BODY_HELLO)
    gnmr__wire_free(&env);
  ck_assert_msg(env != NULL, "no Hello from the agent");
  uint32_t ids[2] = {0, 1};
  Gnmr__Envelope out = GNMR__ENVELOPE__INIT;
  Gnmr__Welcome w = GNMR__WELCOME__INIT;
  w.job = env->hello->job;
  w.rank = 0;
  w.n_unit_ids = 2;
  w.unit_ids = ids;
  w.last_step = last_step;
  out.body_case = GNMR__ENVELOPE__BODY_WELCOME;
  out.welcome = &w;
  uint8_t *buf;
  size_t len;
  ck_assert_int_eq(gnmr__wire_encode(&out, &buf, &len), GNMR_OK);
  zmq_send(f->router, f->ident, f->ident_len, ZMQ_SNDMORE);
  zmq_send(f->router, buf, len, 0);
  free(buf);
  gnmr__wire_free(&env);
}

/* The steps of the Reports that arrive within ms, in order. */
static int fake_steps(fake_daemon *f, uint64_t *steps, int cap, int ms) {
  int n = 0;
  Gnmr__Envelope *env;
  while ((env = fake_recv(f, ms)) != NULL) {
    if (env->body_case == GNMR__ENVELOPE__BODY_REPORT && n < cap)
      steps[n++] = env->report->step;
    gnmr__wire_free(&env);
  }
  return n;
}

static void wait_joined(gnmr_agent *a, int want) {
  for (int i = 0; i < 500 && gnmr_agent_joined(a) != want; i++)
    tu_sleep_ms(10);
  ck_assert_int_eq(gnmr_agent_joined(a), want);
}

/* Sends the agent env (encoded here). */
static void fake_send(fake_daemon *f, Gnmr__Envelope *env) {
  uint8_t *buf;
  size_t len;
  ck_assert_int_eq(gnmr__wire_encode(env, &buf, &len), GNMR_OK);
  zmq_send(f->router, f->ident, f->ident_len, ZMQ_SNDMORE);
  zmq_send(f->router, buf, len, 0);
  free(buf);
}

/* Sends the agent a Decision of job for step, of leadership term term,
 * with the n unit ids of active. */
static void fake_decide_term(fake_daemon *f, const char *job, uint64_t step,
                             uint64_t term, uint32_t *active, size_t n) {
  Gnmr__Envelope out = GNMR__ENVELOPE__INIT;
  Gnmr__Decision d = GNMR__DECISION__INIT;
  d.job = (char *)job;
  d.step = step;
  d.term = term;
  d.n_active = n;
  d.active = active;
  out.body_case = GNMR__ENVELOPE__BODY_DECISION;
  out.decision = &d;
  fake_send(f, &out);
}

/* Sends the agent a Decision for step (no active unit). */
static void fake_decide(fake_daemon *f, uint64_t step) {
  fake_decide_term(f, "inflight-job", step, 0, NULL, 0);
}

/* A stand-in daemon bound in dir and an agent of job (2 units, 1
 * reporter) opened on it, not yet welcomed. */
static gnmr_agent *fake_and_agent(fake_daemon *f, const char *dir,
                                  const char *job) {
  static char ep[300];
  snprintf(ep, sizeof ep, "ipc://%s/fake.sock", dir);
  f->ctx = zmq_ctx_new();
  fake_bind(f, ep);
  static const char *names[] = {"a", "b"};
  gnmr_agent_config cfg = {0};
  cfg.endpoint = ep;
  cfg.job = job;
  cfg.unit_names = names;
  cfg.n_units = 2;
  cfg.reporters = 1;
  gnmr_params_default(&cfg.params);
  gnmr_agent *a = NULL;
  ck_assert_int_eq(gnmr_agent_open(&cfg, &a), GNMR_OK);
  return a;
}

/* Closes the agent, then the stand-in daemon, and removes dir. */
static void fake_done(fake_daemon *f, gnmr_agent **a, const char *dir) {
  gnmr_agent_close(a);
  zmq_close(f->router);
  zmq_ctx_term(f->ctx);
  tu_rmrf(dir);
}

START_TEST(a_report_the_daemon_died_with_goes_to_the_next_one) {
  /* Step 3's report reached a daemon that died before deciding it (or a
   * standby took over): the agent sends it again on its re-join, so the
   * step is decided all the same. Steps already decided are not resent. */
  const char *dir = tu_tmpdir();
  char ep[300];
  snprintf(ep, sizeof ep, "ipc://%s/fake.sock", dir);
  fake_daemon f = {0};
  f.ctx = zmq_ctx_new();
  fake_bind(&f, ep);
  static const char *names[] = {"a", "b"};
  gnmr_agent_config cfg = {0};
  cfg.endpoint = ep;
  cfg.job = "inflight-job";
  cfg.unit_names = names;
  cfg.n_units = 2;
  cfg.reporters = 1;
  gnmr_params_default(&cfg.params);
  gnmr_agent *a = NULL;
  ck_assert_int_eq(gnmr_agent_open(&cfg, &a), GNMR_OK);
  fake_welcome(&f, 0);
  wait_joined(a, 1);
  double s[2] = {1, 2};
  uint64_t got[16];
  for (uint64_t t = 1; t <= 2; t++) {
    ck_assert_int_eq(gnmr_agent_report_sums(a, t, s, NULL, NULL), GNMR_OK);
    ck_assert_int_eq(fake_steps(&f, got, 16, 200), 1);
    fake_decide(&f, t);
    ck_assert_int_eq(gnmr_agent_wait(a, t, 2000 * tu_slow()), GNMR_OK);
  }
  ck_assert_int_eq(gnmr_agent_report_sums(a, 3, s, NULL, NULL), GNMR_OK);
  ck_assert_int_eq(fake_steps(&f, got, 16, 200), 1); /* received... */
  zmq_close(f.router);                               /* ...and gone */
  wait_joined(a, 0);
  fake_bind(&f, ep);
  fake_welcome(&f, 2);
  int n = fake_steps(&f, got, 16, 300);
  ck_assert_int_eq(n, 1);
  ck_assert_uint_eq(got[0], 3);
  fake_decide(&f, 3);
  ck_assert_int_eq(gnmr_agent_wait(a, 3, 2000 * tu_slow()), GNMR_OK);
  gnmr_agent_stats st;
  ck_assert_int_eq(gnmr_agent_stats_get(a, &st), GNMR_OK);
  ck_assert_uint_eq(st.reports_stale, 0);
  ck_assert_uint_eq(st.reports_dropped, 0);
  fake_done(&f, &a, dir);
}
END_TEST

/* Sends the agent an Error "unknown agent" (NOJOB) for a report of step,
 * as gnmrd answers a Report on a connection it has seen no Hello on. */
static void fake_unknown(fake_daemon *f, uint64_t step) {
  Gnmr__Envelope out = GNMR__ENVELOPE__INIT;
  Gnmr__Error e = GNMR__ERROR__INIT;
  e.code = GNMR_E_NOJOB;
  e.ref = "hello";
  e.message = "unknown agent: send Hello first";
  e.step = step;
  out.body_case = GNMR__ENVELOPE__BODY_ERROR;
  out.error = &e;
  fake_send(f, &out);
}

START_TEST(a_report_refused_as_unknown_is_sent_again_after_the_rejoin) {
  /* 1,024 ranks joining one gnmrd at once: a rank's connection came back
   * under a new identity and gnmrd refused its first report ("unknown
   * agent"). The agent joined again but the report was gone, and a job
   * decides nothing before every rank has reported once: the job hung
   * at step 1. The refused report goes again after the re-join, whether
   * it was sent joined (step 1) or held before the Welcome (step 2). */
  const char *dir = tu_tmpdir();
  fake_daemon f = {0};
  gnmr_agent *a = fake_and_agent(&f, dir, "unknown-job");
  fake_welcome(&f, 0);
  wait_joined(a, 1);
  double s[2] = {1, 2};
  uint64_t got[16];
  ck_assert_int_eq(gnmr_agent_report_sums(a, 1, s, NULL, NULL), GNMR_OK);
  ck_assert_int_eq(fake_steps(&f, got, 16, 200), 1);
  fake_unknown(&f, 1);
  fake_welcome(&f, 0); /* the agent's Hello comes first */
  ck_assert_int_eq(fake_steps(&f, got, 16, 300), 1);
  ck_assert_uint_eq(got[0], 1);
  fake_decide_term(&f, "unknown-job", 1, 0, NULL, 0);
  ck_assert_int_eq(gnmr_agent_wait(a, 1, 2000 * tu_slow()), GNMR_OK);
  /* a report held before the Welcome, then flushed and refused */
  fake_unknown(&f, 0);
  wait_joined(a, 0);
  ck_assert_int_eq(gnmr_agent_report_sums(a, 2, s, NULL, NULL), GNMR_OK);
  fake_welcome(&f, 1);
  ck_assert_int_eq(fake_steps(&f, got, 16, 300), 1);
  ck_assert_uint_eq(got[0], 2);
  fake_unknown(&f, 2);
  fake_welcome(&f, 1);
  ck_assert_int_eq(fake_steps(&f, got, 16, 300), 1);
  ck_assert_uint_eq(got[0], 2);
  fake_decide_term(&f, "unknown-job", 2, 0, NULL, 0);
  ck_assert_int_eq(gnmr_agent_wait(a, 2, 2000 * tu_slow()), GNMR_OK);
  /* a decided step is not sent again */
  fake_unknown(&f, 2);
  fake_welcome(&f, 2);
  ck_assert_int_eq(fake_steps(&f, got, 16, 300), 0);
  gnmr_agent_stats st;
  ck_assert_int_eq(gnmr_agent_stats_get(a, &st), GNMR_OK);
  ck_assert_uint_eq(st.reports_dropped, 0);
  fake_done(&f, &a, dir);
}
END_TEST

/* Issue 47: a hostile gnmrd's Error text reached the Python Controller's
 * warning with raw escape sequences. The agent keeps a peer's text
 * escaped (\xHH for control and format characters), so no caller prints
 * it raw. */
START_TEST(a_peers_error_text_is_kept_escaped) {
  const char *dir = tu_tmpdir();
  fake_daemon f = {0};
  gnmr_agent *a = fake_and_agent(&f, dir, "escaped-job");
  Gnmr__Envelope *env;
  while ((env = fake_recv(&f, 5000)) != NULL &&
         env->body_case != GNMR__ENVELOPE__BODY_HELLO)
    gnmr__wire_free(&env);
  ck_assert_ptr_nonnull(env);
  gnmr__wire_free(&env);
  Gnmr__Envelope out = GNMR__ENVELOPE__INIT;
  Gnmr__Error e = GNMR__ERROR__INIT;
  e.code = GNMR_E_BUSY;
  e.message = "busy \x1b]0;owned\x07\x1b[2J\xe2\x80\xae now";
  out.body_case = GNMR__ENVELOPE__BODY_ERROR;
  out.error = &e;
  fake_send(&f, &out);
  char text[256] = "";
  for (int i = 0; i < 500 && gnmr_agent_last_error(a, text, sizeof text) !=
                                 GNMR_E_BUSY; i++)
    tu_sleep_ms(10);
  ck_assert_int_eq(gnmr_agent_last_error(a, text, sizeof text), GNMR_E_BUSY);
  ck_assert_msg(strchr(text, 0x1b) == NULL && strchr(text, 0x07) == NULL &&
                strstr(text, "\xe2\x80\xae") == NULL,
                "raw control or format characters kept: %s", text);
  ck_assert_str_eq(text, "busy \\x1b]0;owned\\x07\\x1b[2J"
                         "\\xe2\\x80\\xae now");
  fake_done(&f, &a, dir);
}
END_TEST

/* Issue 47: a deposed leader kept deciding for 0.2 s while the standby
 * served. Each gnmrd stamps its decisions with its leadership term; an
 * agent acts only on the newest term it has seen and drops (counts) a
 * decision of an older one, whichever arrives last. */
START_TEST(decisions_of_an_older_leadership_term_are_dropped) {
  const char *dir = tu_tmpdir();
  fake_daemon f = {0};
  gnmr_agent *a = fake_and_agent(&f, dir, "term-job");
  fake_welcome(&f, 0); /* a Welcome without a term: 0 */
  wait_joined(a, 1);
  uint32_t unit0[] = {0}, unit1[] = {1};
  fake_decide_term(&f, "term-job", 1, 7, unit0, 1); /* the new leader's */
  ck_assert_int_eq(gnmr_agent_wait(a, 1, 2000 * tu_slow()), GNMR_OK);
  ck_assert_int_eq(gnmr_agent_route(a, 0), GNMR_ROUTE_HIGH);
  /* the old leader's decisions, arriving after: never acted on, even for
   * a newer step */
  fake_decide_term(&f, "term-job", 2, 6, unit1, 1);
  fake_decide_term(&f, "term-job", 3, 0, unit1, 1);
  tu_sleep_ms(200);
  ck_assert_int_eq(gnmr_agent_route(a, 1), GNMR_ROUTE_LOW);
  ck_assert_int_eq(gnmr_agent_wait(a, 2, 100), GNMR_E_TIMEDOUT);
  gnmr_agent_stats st;
  ck_assert_int_eq(gnmr_agent_stats_get(a, &st), GNMR_OK);
  ck_assert_uint_eq(st.decisions_fenced, 2);
  ck_assert_uint_eq(st.decisions, 1);
  /* the same term or a newer one is acted on */
  fake_decide_term(&f, "term-job", 2, 7, unit1, 1);
  ck_assert_int_eq(gnmr_agent_wait(a, 2, 2000 * tu_slow()), GNMR_OK);
  ck_assert_int_eq(gnmr_agent_route(a, 1), GNMR_ROUTE_HIGH);
  fake_decide_term(&f, "term-job", 3, 8, NULL, 0);
  ck_assert_int_eq(gnmr_agent_wait(a, 3, 2000 * tu_slow()), GNMR_OK);
  ck_assert_int_eq(gnmr_agent_route(a, 1), GNMR_ROUTE_LOW);
  fake_decide_term(&f, "term-job", 4, 7, unit1, 1);
  tu_sleep_ms(200);
  ck_assert_int_eq(gnmr_agent_wait(a, 4, 100), GNMR_E_TIMEDOUT);
  ck_assert_int_eq(gnmr_agent_stats_get(a, &st), GNMR_OK);
  ck_assert_uint_eq(st.decisions_fenced, 3);
  fake_done(&f, &a, dir);
}
END_TEST

START_TEST(rejoining_agent_drops_reports_the_job_decided_without_it) {
  /* A link that goes down for longer than the job waits: the reports made
   * meanwhile are held; at the re-join, those at or below the Welcome's
   * last_step are stale (the job decided those steps without this rank)
   * and are dropped and counted, never sent, so they cannot pass for a
   * restart from a checkpoint. */
  const char *dir = tu_tmpdir();
  char ep[300];
  snprintf(ep, sizeof ep, "ipc://%s/fake.sock", dir);
  fake_daemon f = {0};
  f.ctx = zmq_ctx_new();
  fake_bind(&f, ep);
  static const char *names[] = {"a", "b"};
  gnmr_agent_config cfg = {0};
  cfg.endpoint = ep;
  cfg.job = "stale-job";
  cfg.unit_names = names;
  cfg.n_units = 2;
  cfg.reporters = 1;
  gnmr_params_default(&cfg.params);
  gnmr_agent *a = NULL;
  ck_assert_int_eq(gnmr_agent_open(&cfg, &a), GNMR_OK);
  fake_welcome(&f, 0);
  wait_joined(a, 1);
  double s[2] = {1, 2};
  uint64_t got[16];
  for (uint64_t t = 1; t <= 3; t++)
    ck_assert_int_eq(gnmr_agent_report_sums(a, t, s, NULL, NULL), GNMR_OK);
  ck_assert_int_eq(fake_steps(&f, got, 16, 300), 3);

  zmq_close(f.router); /* the link goes */
  wait_joined(a, 0);
  for (uint64_t t = 4; t <= 8; t++)
    ck_assert_int_eq(gnmr_agent_report_sums(a, t, s, NULL, NULL), GNMR_OK);
  tu_sleep_ms(100);
  fake_bind(&f, ep); /* back: the job decided up to step 6 meanwhile */
  fake_welcome(&f, 6);
  int n = fake_steps(&f, got, 16, 300);
  ck_assert_int_eq(n, 2);
  ck_assert_uint_eq(got[0], 7);
  ck_assert_uint_eq(got[1], 8);
  gnmr_agent_stats st;
  ck_assert_int_eq(gnmr_agent_stats_get(a, &st), GNMR_OK);
  /* 4, 5, 6, and 3: sent, never decided (this fake decides nothing), so
   * held again when the link went, in case the daemon died with it */
  ck_assert_uint_eq(st.reports_stale, 4);

  /* training restarts from a checkpoint at step 5: a new agent, whose
   * first Welcome drops nothing (gnmrd starts a new pass) */
  gnmr_agent_close(&a);
  ck_assert_int_eq(fake_steps(&f, got, 16, 200), 0); /* its Bye only */
  ck_assert_int_eq(gnmr_agent_open(&cfg, &a), GNMR_OK);
  for (uint64_t t = 5; t <= 6; t++)
    ck_assert_int_eq(gnmr_agent_report_sums(a, t, s, NULL, NULL), GNMR_OK);
  tu_sleep_ms(100); /* held: not welcomed yet */
  fake_welcome(&f, 8);
  n = fake_steps(&f, got, 16, 300);
  ck_assert_int_eq(n, 2);
  ck_assert_uint_eq(got[0], 5);
  ck_assert_uint_eq(got[1], 6);
  ck_assert_int_eq(gnmr_agent_stats_get(a, &st), GNMR_OK);
  ck_assert_uint_eq(st.reports_stale, 0);
  fake_done(&f, &a, dir);
}
END_TEST

/* owner.h: a site owned by one thread passes on it (and while nobody has
 * claimed it), and aborts on another thread, naming the site. The agent's
 * decision publication and the CUDA backend's delivery are such sites. */
static void *touch_owned(void *arg) {
  GNMR_OWNED((gnmr_owner *)arg, "a test's owned site");
  return NULL;
}

START_TEST(an_owned_site_aborts_on_another_thread) {
  gnmr_owner o = {0};
  char log[] = "/tmp/gnmr-owner-XXXXXX";
  int fd = mkstemp(log);
  ck_assert_int_ge(fd, 0);
  pid_t pid = fork(); /* first: the child inherits no thread's stack */
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    dup2(fd, 2);
    /* owned by a thread other than this one */
    atomic_store(&o.tid, ~(unsigned long)pthread_self());
    touch_owned(&o);
    _exit(0);
  }
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  char text[512] = "";
  ssize_t n = pread(fd, text, sizeof text - 1, 0);
  close(fd);
  unlink(log);
  ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT,
                "another thread passed an owned site (status %#x)", st);
  ck_assert_int_gt(n, 0);
  ck_assert_ptr_nonnull(strstr(text, "a test's owned site runs on thread"));
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, touch_owned, &o), 0);
  pthread_join(t, NULL); /* unclaimed: anyone */
  gnmr_owner_claim(&o);
  touch_owned(&o); /* its owner */
  gnmr_owner_drop(&o);
  ck_assert_int_eq(pthread_create(&t, NULL, touch_owned, &o), 0);
  pthread_join(t, NULL); /* dropped: anyone again */
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("agent");
  TCase *tc = tcase_create("reduce");
  tcase_add_loop_test(tc, fp32_sum_of_squares_matches_long_double_reference, 0, 3);
  tcase_add_loop_test(tc, half_precision_dtypes_are_widened_exactly, 0, 3);
  tcase_add_test(tc, fp8_values_decode_to_the_ocp_formats_and_scale_applies);
  tcase_add_test(tc, an_owned_site_aborts_on_another_thread);
  tcase_add_loop_test(tc, nonfinite_elements_are_counted_exactly_and_excluded, 0, 3);
  tcase_add_loop_test(tc, several_tensors_of_one_unit_add_up_and_bad_input_is_refused, 0, 3);
  tcase_add_loop_test(tc, threaded_reduction_equals_the_serial_one_bit_for_bit, 0, 3);
  tcase_add_test(tc, threaded_reduction_refuses_bad_input_and_leaves_sums);
  tcase_add_test(tc, threaded_reductions_from_several_threads_and_after_fork);
  tcase_add_test(tc, reduce_threads_come_from_the_environment_or_the_cpus);
  tcase_add_test(tc, cgroup_cpu_quota_is_the_tightest_on_the_way_up);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  tc = tcase_create("live");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, reported_sums_are_checked_at_every_position, 0, 3);
  tcase_add_loop_test(tc, hand_packed_reports_equal_protobuf_c, 0, 3);
  tcase_add_test(tc, bad_configuration_is_refused);
  tcase_add_test(tc, endpoints_are_checked_with_the_accepted_forms_named);
  tcase_add_test(tc, agent_without_daemon_keeps_stepping_within_its_deadline);
  tcase_add_test(tc, waits_spin_before_sleeping_within_their_bounds);
  tcase_add_test(tc, agents_reopened_at_once_in_one_process_always_open);
  tcase_add_test(tc, a_forked_child_cannot_use_or_break_the_parents_agent);
  tcase_add_test(tc, every_route_at_once_equals_each_route);
  tcase_add_test(tc, daemon_killed_mid_run_then_restarted_agent_rejoins);
  tcase_add_test(tc, mismatched_agent_is_refused_and_counts_the_error);
  tcase_add_test(tc, observers_receive_every_decision_without_reporting);
  tcase_add_test(tc, a_peers_error_text_is_kept_escaped);
  tcase_add_test(tc, decisions_of_an_older_leadership_term_are_dropped);
  tcase_add_test(tc, lagging_rank_is_decided_missing_at_the_barrier_deadline);
  tcase_add_test(tc, rejoining_agent_drops_reports_the_job_decided_without_it);
  tcase_add_test(tc, a_report_the_daemon_died_with_goes_to_the_next_one);
  tcase_add_test(tc, a_report_refused_as_unknown_is_sent_again_after_the_rejoin);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
