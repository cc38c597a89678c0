/* SPDX-License-Identifier: MIT */
/* test_cuda.c — the CUDA backend, everything that runs without a GPU: the
 * segment/chunk tables (ordering, boundaries, alignment, scale, malformed
 * tensors, change detection, the device image), the kernel's arithmetic run
 * on the host (gnmr__cuda_model) against the CPU backend for every dtype,
 * NaN/Inf at chunk edges, values near overflow, misaligned and empty
 * tensors; and the API's errors when there is no device or no CUDA build.
 * The GPU itself is tested by `make test-gpu` (tests/gpu/). */
#include <float.h>
#include <math.h>

#include "cuda_backend.h"
#include "cuda_plan.h"
#include "gnmr/agent_cuda.h"
#include "testutil.h"

#define CH GNMR_CUDA_CHUNK

START_TEST(plan_orders_chunks_by_unit_then_registration) {
  static float a[10], b[3];
  static uint16_t c[2 * CH + 5];
  gnmr_tensor t[] = {
      {c, 2 * CH + 5, GNMR_DTYPE_BF16, 2, 0}, /* 3 chunks, unit 2 */
      {a, 10, GNMR_DTYPE_F32, 0, 0},
      {b, 0, GNMR_DTYPE_F32, 1, 0},            /* empty: seen, no chunk */
      {b, 3, GNMR_DTYPE_F32, 0, 2.0},
  };
  gnmr__plan p;
  ck_assert_int_eq(gnmr__plan_build(&p, t, 4, 4), GNMR_OK);
  ck_assert_uint_eq(p.n_segs, 3);
  ck_assert_uint_eq(p.n_chunks, 5);
  /* unit 0: a then b (registration order), unit 1 none, unit 2: c x 3 */
  ck_assert_uint_eq(p.unit_begin[0], 0);
  ck_assert_uint_eq(p.unit_begin[1], 2);
  ck_assert_uint_eq(p.unit_begin[2], 2);
  ck_assert_uint_eq(p.unit_begin[3], 5);
  ck_assert_uint_eq(p.unit_begin[4], 5);
  ck_assert_ptr_eq((void *)(uintptr_t)p.segs[p.chunks[0].seg].addr, a);
  ck_assert_ptr_eq((void *)(uintptr_t)p.segs[p.chunks[1].seg].addr, b);
  ck_assert(p.segs[p.chunks[1].seg].scale2 == 4.0);
  ck_assert(p.segs[p.chunks[0].seg].scale2 == 1.0);
  ck_assert_uint_eq(p.chunks[2].start, 0);
  ck_assert_uint_eq(p.chunks[2].len, CH);
  ck_assert_uint_eq(p.chunks[3].start, CH);
  ck_assert_uint_eq(p.chunks[4].start, 2 * CH);
  ck_assert_uint_eq(p.chunks[4].len, 5);
  ck_assert_int_eq(p.seen[0], 1);
  ck_assert_int_eq(p.seen[1], 1); /* an empty tensor still reports 0 */
  ck_assert_int_eq(p.seen[2], 1);
  ck_assert_int_eq(p.seen[3], 0); /* no tensor: not reported */
  gnmr__plan_clear(&p);
}
END_TEST

START_TEST(plan_marks_misaligned_segments) {
  static _Alignas(16) unsigned char buf[64];
  gnmr_tensor t[] = {{buf, 8, GNMR_DTYPE_F16, 0, 0},
                     {buf + 2, 8, GNMR_DTYPE_F16, 0, 0},
                     {buf + 16, 3, GNMR_DTYPE_F8E4M3, 0, 0}};
  gnmr__plan p;
  ck_assert_int_eq(gnmr__plan_build(&p, t, 3, 1), GNMR_OK);
  ck_assert_uint_eq(p.segs[0].flags & GNMR_SEG_ALIGNED, GNMR_SEG_ALIGNED);
  ck_assert_uint_eq(p.segs[1].flags & GNMR_SEG_ALIGNED, 0);
  ck_assert_uint_eq(p.segs[2].flags & GNMR_SEG_ALIGNED, GNMR_SEG_ALIGNED);
  gnmr__plan_clear(&p);
}
END_TEST

START_TEST(plan_rejects_malformed_tensors_and_stays_empty) {
  static float x[4];
  gnmr_tensor bad[] = {
      {x, 4, GNMR_DTYPE_F32, 3, 0},             /* unit out of range */
      {x, 4, 6, 0, 0},                          /* unknown dtype */
      {NULL, 4, GNMR_DTYPE_F32, 0, 0},          /* NULL data */
      {x, 4, GNMR_DTYPE_F8E4M3, 0, -1.0},       /* negative scale */
      {x, 4, GNMR_DTYPE_F8E5M2, 0, NAN},        /* NaN scale */
      {x, 4, GNMR_DTYPE_F8E5M2, 0, INFINITY},   /* infinite scale */
      {(char *)x + 1, 2, GNMR_DTYPE_F16, 0, 0}, /* element misaligned */
      {(char *)x + 2, 1, GNMR_DTYPE_F32, 0, 0},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    gnmr__plan p;
    ck_assert_int_eq(gnmr__plan_build(&p, &bad[i], 1, 3), GNMR_E_INVAL);
    ck_assert_ptr_null(p.segs);
    ck_assert_uint_eq(p.n_chunks, 0);
  }
  gnmr__plan p;
  ck_assert_int_eq(gnmr__plan_build(&p, NULL, 1, 3), GNMR_E_INVAL);
  ck_assert_int_eq(gnmr__plan_build(&p, bad, 1, 0), GNMR_E_INVAL);
  /* NULL data is fine for an empty tensor, and so is no tensor at all */
  gnmr_tensor empty = {NULL, 0, GNMR_DTYPE_F32, 0, 0};
  ck_assert_int_eq(gnmr__plan_build(&p, &empty, 1, 1), GNMR_OK);
  ck_assert_uint_eq(p.n_chunks, 0);
  ck_assert_int_eq(p.seen[0], 1);
  gnmr__plan_clear(&p);
  ck_assert_int_eq(gnmr__plan_build(&p, NULL, 0, 2), GNMR_OK);
  ck_assert_int_eq(p.seen[0] | p.seen[1], 0);
  gnmr__plan_clear(&p);
}
END_TEST

START_TEST(plan_refuses_more_chunks_than_32_bits_count) {
  /* (2^32 - 1) chunks of CH elements: never allocated, refused first */
  static float x[1];
  gnmr_tensor t[2] = {{x, (uint64_t)CH << 31, GNMR_DTYPE_F32, 0, 0},
                      {x, (uint64_t)CH << 31, GNMR_DTYPE_F32, 0, 0}};
  gnmr__plan p;
  ck_assert_int_eq(gnmr__plan_build(&p, t, 2, 1), GNMR_E_TOOBIG);
  ck_assert_ptr_null(p.chunks);
}
END_TEST

START_TEST(plan_equality_follows_every_field_the_kernel_reads) {
  static float x[100], y[100];
  gnmr_tensor t[2] = {{x, 100, GNMR_DTYPE_F32, 0, 0},
                      {y, 50, GNMR_DTYPE_F16, 1, 0}};
  gnmr__plan a, b;
  ck_assert_int_eq(gnmr__plan_build(&a, t, 2, 2), GNMR_OK);
  ck_assert_int_eq(gnmr__plan_build(&b, t, 2, 2), GNMR_OK);
  ck_assert(gnmr__plan_equal(&a, &b));
  gnmr__plan_clear(&b);
  gnmr_tensor v[5][2];
  for (int i = 0; i < 5; i++)
    memcpy(v[i], t, sizeof t);
  v[0][1].data = x + 1;           /* pointer */
  v[1][1].numel = 51;             /* size */
  v[2][1].dtype = GNMR_DTYPE_BF16; /* dtype */
  v[3][1].unit = 0;               /* unit */
  v[4][1].scale = 3;              /* scale */
  for (int i = 0; i < 5; i++) {
    ck_assert_int_eq(gnmr__plan_build(&b, v[i], 2, 2), GNMR_OK);
    ck_assert_msg(!gnmr__plan_equal(&a, &b), "change %d not seen", i);
    gnmr__plan_clear(&b);
  }
  gnmr__plan_clear(&a);
}
END_TEST

START_TEST(device_image_holds_the_tables_at_their_offsets) {
  static float x[CH + 1];
  gnmr_tensor t[2] = {{x, CH + 1, GNMR_DTYPE_F32, 1, 0},
                      {x, 7, GNMR_DTYPE_F64, 0, 0.5}};
  gnmr__plan p;
  ck_assert_int_eq(gnmr__plan_build(&p, t, 2, 3), GNMR_OK);
  gnmr__dev_header h;
  size_t size = gnmr__plan_tables_size(&p, &h);
  ck_assert_uint_eq(size % 16, 0);
  ck_assert_uint_eq(h.n_chunks, 3);
  ck_assert_uint_eq(h.n_units, 3);
  char *img = malloc(size);
  gnmr__plan_tables_write(&p, img);
  gnmr__dev_header h2;
  memcpy(&h2, img, sizeof h2);
  ck_assert_mem_eq(&h, &h2, sizeof h);
  ck_assert_uint_eq(h.segs_off % 16 | h.chunks_off % 16 |
                        h.unit_begin_off % 16 | h.seen_off % 16,
                    0);
  ck_assert_mem_eq(img + h.segs_off, p.segs, 2 * sizeof(gnmr__seg));
  ck_assert_mem_eq(img + h.chunks_off, p.chunks, 3 * sizeof(gnmr__chunk));
  ck_assert_mem_eq(img + h.unit_begin_off, p.unit_begin, 4 * sizeof(uint32_t));
  ck_assert_mem_eq(img + h.seen_off, p.seen, 3);
  ck_assert_uint_le(h.seen_off + 3, size);
  free(img);
  gnmr__plan_clear(&p);
  ck_assert_uint_eq(gnmr__result_size(3), 64); /* 51 rounded up */
}
END_TEST

START_TEST(api_errors_without_a_device_or_a_cuda_build) {
  gnmr_cuda *c = (gnmr_cuda *)1;
  gnmr_cuda_config cfg = {.device = 0};
  int ndev = gnmr_cuda_device_count();
  ck_assert_int_ge(ndev, 0);
#if GNMR_HAVE_CUDA
  /* no agent: n_units and on_result are required */
  ck_assert_int_eq(gnmr_cuda_open(NULL, &cfg, &c), GNMR_E_INVAL);
  ck_assert_ptr_null(c);
  ck_assert_int_eq(gnmr_cuda_open(NULL, NULL, &c), GNMR_E_INVAL);
  cfg.ring_slots = 1000;
  cfg.n_units = 1;
  ck_assert_int_eq(gnmr_cuda_open(NULL, &cfg, &c), GNMR_E_INVAL);
  if (ndev == 0) {
    printf("test_cuda: no CUDA device here (%d): open must fail cleanly\n",
           ndev);
    cfg.ring_slots = 0;
    cfg.on_result = (gnmr_cuda_result_fn)1; /* never called */
    ck_assert_int_eq(gnmr_cuda_open(NULL, &cfg, &c), GNMR_E_CUDA);
    ck_assert_ptr_null(c);
  }
  cfg.device = 1 << 20; /* no such device anywhere */
  cfg.ring_slots = 0;
  cfg.on_result = (gnmr_cuda_result_fn)1;
  ck_assert_int_eq(gnmr_cuda_open(NULL, &cfg, &c), GNMR_E_CUDA);
#else
  ck_assert_int_eq(ndev, 0);
  ck_assert_int_eq(gnmr_cuda_open(NULL, &cfg, &c), GNMR_E_UNSUPPORTED);
  ck_assert_ptr_null(c);
  ck_assert_int_eq(gnmr_cuda_register(NULL, NULL, 0), GNMR_E_UNSUPPORTED);
  ck_assert_int_eq(gnmr_cuda_report(NULL, 1, NULL), GNMR_E_UNSUPPORTED);
  ck_assert_str_eq(gnmr_cuda_last_error(NULL),
                   "GNMR was built without CUDA (no nvcc)");
#endif
  /* NULL everywhere is an error, never a crash */
  ck_assert_int_ne(gnmr_cuda_register(NULL, NULL, 0), GNMR_OK);
  ck_assert_int_ne(gnmr_cuda_report(NULL, 1, NULL), GNMR_OK);
  ck_assert_int_ne(gnmr_cuda_reduce_async(NULL, NULL), GNMR_OK);
  ck_assert_int_ne(gnmr_cuda_submit(NULL, 1, NULL), GNMR_OK);
  ck_assert_int_ne(gnmr_cuda_read(NULL, NULL, NULL, NULL, NULL), GNMR_OK);
  ck_assert_int_ne(gnmr_cuda_flush(NULL, 0), GNMR_OK);
  ck_assert_int_ne(gnmr_cuda_stats_get(NULL, NULL), GNMR_OK);
  ck_assert_ptr_null(gnmr_cuda_done_event(NULL));
  gnmr_cuda *none = NULL;
  gnmr_cuda_close(&none);
  gnmr_cuda_close(NULL);
}
END_TEST

#if GNMR_HAVE_CUDA
/* The kernel's arithmetic on the host against the CPU backend. */
static void model_vs_cpu(const gnmr_tensor *t, size_t n, uint32_t units,
                         double rel) {
  gnmr__plan p;
  ck_assert_int_eq(gnmr__plan_build(&p, t, n, units), GNMR_OK);
  double *ms = calloc(units, sizeof *ms), *cs = calloc(units, sizeof *cs);
  uint64_t *mn = calloc(units, sizeof *mn), *cn = calloc(units, sizeof *cn);
  ck_assert_int_eq(gnmr__cuda_model(&p, ms, mn), GNMR_OK);
  ck_assert_int_eq(gnmr_reduce_cpu(t, n, units, cs, cn, NULL), GNMR_OK);
  for (uint32_t u = 0; u < units; u++) {
    ck_assert_msg(mn[u] == cn[u], "unit %u: %llu vs %llu non-finite", u,
                  (unsigned long long)mn[u], (unsigned long long)cn[u]);
    ck_assert_msg(isfinite(ms[u]), "unit %u: %g", u, ms[u]);
    ck_assert_msg(fabs(ms[u] - cs[u]) <= rel * cs[u] + 1e-300,
                  "unit %u: model %.17g cpu %.17g", u, ms[u], cs[u]);
  }
  free(ms);
  free(cs);
  free(mn);
  free(cn);
  gnmr__plan_clear(&p);
}

static float frand(unsigned *seed) {
  return (float)((rand_r(seed) % 2000001) - 1000000) * 1e-6f;
}

START_TEST(model_equals_cpu_on_ragged_mixed_dtype_units) {
  unsigned seed = 11;
  static const uint64_t sizes[] = {1, 3, 15, 16, 17, 1000, CH - 1, CH,
                                   CH + 1, 3 * CH + 7, 100003};
  enum { NS = sizeof sizes / sizeof sizes[0] };
  gnmr_tensor t[4 * NS];
  void *mem[4 * NS];
  size_t k = 0;
  for (size_t i = 0; i < NS; i++) {
    uint64_t n = sizes[i];
    float *f = malloc(n * 4);
    uint16_t *h = malloc(n * 2), *b = malloc(n * 2);
    uint8_t *e = malloc(n);
    for (uint64_t j = 0; j < n; j++) {
      f[j] = frand(&seed) * 3;
      h[j] = (uint16_t)(rand_r(&seed) & 0x7bff); /* finite fp16 */
      b[j] = (uint16_t)(rand_r(&seed) & 0x3fff); /* finite bf16 < 2 */
      e[j] = (uint8_t)(rand_r(&seed) & 0x77);    /* finite e4m3 */
    }
    mem[k] = f, t[k] = (gnmr_tensor){f, n, GNMR_DTYPE_F32, (uint32_t)(i % 5), 0}, k++;
    mem[k] = h, t[k] = (gnmr_tensor){h, n, GNMR_DTYPE_F16, (uint32_t)(i % 3), 0}, k++;
    mem[k] = b, t[k] = (gnmr_tensor){b, n, GNMR_DTYPE_BF16, (uint32_t)(i % 7), 0}, k++;
    mem[k] = e, t[k] = (gnmr_tensor){e, n, GNMR_DTYPE_F8E4M3, 6, 0.125}, k++;
  }
  model_vs_cpu(t, k, 8, 1e-5);
  for (size_t i = 0; i < k; i++)
    free(mem[i]);
}
END_TEST

START_TEST(model_counts_nonfinite_exactly_at_chunk_edges) {
  uint64_t n = 3 * CH + 9;
  float *x = malloc(n * 4);
  uint8_t *e5 = malloc(n);
  unsigned seed = 5;
  for (uint64_t j = 0; j < n; j++) {
    x[j] = frand(&seed);
    e5[j] = (uint8_t)(rand_r(&seed) % 0x7b); /* finite e5m2 */
  }
  uint64_t at[] = {0, CH - 1, CH, 2 * CH - 1, 2 * CH, 3 * CH, n - 1};
  for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
    x[at[i]] = i % 2 ? INFINITY : NAN;
    e5[at[i]] = i % 2 ? 0x7c : 0xff; /* +Inf, NaN */
  }
  gnmr_tensor t[3] = {{x, n, GNMR_DTYPE_F32, 0, 0},
                      {e5, n, GNMR_DTYPE_F8E5M2, 1, 4.0},
                      {x + 1, n - 1, GNMR_DTYPE_F32, 2, 0}}; /* misaligned */
  model_vs_cpu(t, 3, 3, 2e-6);
  gnmr__plan p;
  uint64_t nf[3];
  double s[3];
  gnmr__plan_build(&p, t, 3, 3);
  gnmr__cuda_model(&p, s, nf);
  ck_assert_uint_eq(nf[0], 7);
  ck_assert_uint_eq(nf[1], 7);
  ck_assert_uint_eq(nf[2], 6);
  gnmr__plan_clear(&p);
  free(x);
  free(e5);
}
END_TEST

START_TEST(model_survives_values_near_overflow) {
  /* squares of these overflow fp32: the chunk is redone in fp64 */
  uint64_t n = CH + 100;
  float *x = malloc(n * 4);
  uint16_t *b = malloc(n * 2);
  for (uint64_t j = 0; j < n; j++) {
    x[j] = (j % 3 ? 1.0f : -1.0f) * FLT_MAX / (float)(1 + j % 5);
    b[j] = 0x7f7f; /* bf16 ~3.39e38 */
  }
  x[5] = NAN;
  gnmr_tensor t[2] = {{x, n, GNMR_DTYPE_F32, 0, 0},
                      {b, n, GNMR_DTYPE_BF16, 1, 0}};
  model_vs_cpu(t, 2, 2, 1e-12); /* fp64 all the way: agrees closely */
  free(x);
  free(b);
}
END_TEST

START_TEST(model_keeps_the_digits_of_tiny_gradients) {
  /* squares below fp32's normal range: the chunk is redone in fp64, so a
   * unit's sum keeps its digits (1e-20) or exists at all (1e-24, whose
   * fp32 square is 0) as the CPU backend's fp64 has them */
  uint64_t n = CH + 100;
  float *x = malloc(n * 4), *y = malloc(n * 4), *z = calloc(n, 4);
  uint16_t *b = malloc(n * 2);
  for (uint64_t j = 0; j < n; j++) {
    x[j] = (j % 2 ? 1e-20f : -3e-20f) * (float)(1 + j % 7);
    y[j] = 1e-24f * (float)(1 + j % 3);
    b[j] = 0x0080; /* bf16 ~1.2e-38: its square is 0 in fp32 */
  }
  gnmr_tensor t[4] = {{x, n, GNMR_DTYPE_F32, 0, 0},
                      {y, n, GNMR_DTYPE_F32, 1, 0},
                      {b, n, GNMR_DTYPE_BF16, 2, 0},
                      {z, n, GNMR_DTYPE_F32, 3, 0}}; /* zeros stay 0 */
  model_vs_cpu(t, 4, 4, 1e-12);
  gnmr__plan p;
  uint64_t nf[4];
  double s[4];
  gnmr__plan_build(&p, t, 4, 4);
  gnmr__cuda_model(&p, s, nf);
  ck_assert(s[1] > 0 && s[2] > 0);
  ck_assert(s[3] == 0);
  gnmr__plan_clear(&p);
  free(x);
  free(y);
  free(z);
  free(b);
}
END_TEST

START_TEST(model_decodes_every_fp8_value_like_the_cpu) {
  uint8_t all[256 * 3];
  for (int i = 0; i < 256 * 3; i++)
    all[i] = (uint8_t)i;
  gnmr_tensor t[4] = {{all, 256 * 3, GNMR_DTYPE_F8E4M3, 0, 0},
                      {all, 256 * 3, GNMR_DTYPE_F8E5M2, 1, 0},
                      {all + 1, 255, GNMR_DTYPE_F8E4M3, 2, 0},
                      {all + 3, 250, GNMR_DTYPE_F8E5M2, 3, 0}};
  model_vs_cpu(t, 4, 4, 2e-6);
}
END_TEST

START_TEST(model_takes_fp64_and_many_tiny_tensors) {
  enum { N = 3000 };
  static double d[N];
  static float f[N];
  gnmr_tensor *t = malloc((N + 1) * sizeof *t);
  unsigned seed = 9;
  for (int i = 0; i < N; i++) {
    d[i] = frand(&seed) * 1e100;
    f[i] = frand(&seed);
    t[i] = (gnmr_tensor){&f[i], 1, GNMR_DTYPE_F32, (uint32_t)(i % 13), 0};
  }
  d[17] = INFINITY;
  t[N] = (gnmr_tensor){d, N, GNMR_DTYPE_F64, 0, 0};
  model_vs_cpu(t, N, 13, 1e-6);        /* fp32 squares round in fp32 */
  model_vs_cpu(t + N, 1, 1, 1e-12);    /* fp64 stays fp64 */
  free(t);
}
END_TEST
#endif

static Suite *suite(void) {
  Suite *s = suite_create("cuda");
  TCase *tc = tcase_create("cuda");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, plan_orders_chunks_by_unit_then_registration);
  tcase_add_test(tc, plan_marks_misaligned_segments);
  tcase_add_test(tc, plan_rejects_malformed_tensors_and_stays_empty);
  tcase_add_test(tc, plan_refuses_more_chunks_than_32_bits_count);
  tcase_add_test(tc, plan_equality_follows_every_field_the_kernel_reads);
  tcase_add_test(tc, device_image_holds_the_tables_at_their_offsets);
  tcase_add_test(tc, api_errors_without_a_device_or_a_cuda_build);
#if GNMR_HAVE_CUDA
  tcase_add_test(tc, model_equals_cpu_on_ragged_mixed_dtype_units);
  tcase_add_test(tc, model_counts_nonfinite_exactly_at_chunk_edges);
  tcase_add_test(tc, model_survives_values_near_overflow);
  tcase_add_test(tc, model_keeps_the_digits_of_tiny_gradients);
  tcase_add_test(tc, model_decodes_every_fp8_value_like_the_cpu);
  tcase_add_test(tc, model_takes_fp64_and_many_tiny_tensors);
#else
  printf("test_cuda: built without nvcc: the kernel's host model is not "
         "built, its tests are skipped\n");
#endif
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
