/* SPDX-License-Identifier: MIT */
/* test_gpu.c — the CUDA backend on a real GPU (make test-gpu).
 *
 * Results must equal the kernel's host model (gnmr__cuda_model) bit for bit
 * and the CPU backend within fp32 tolerance: a printed table per dtype x
 * start alignment x grid (every bf16/fp16 bit pattern, every FP8 byte,
 * fp32/fp64 specials), the unit counters back at 0 after 1000 graph
 * replays and alternating streams, ragged LLM-like tensor lists,
 * mixed dtypes in one unit, 10^4 tiny tensors, a tensor over 2^31
 * elements, values near overflow, NaN/Inf at chunk boundaries with exact
 * counts; bitwise-identical reruns for any grid size; a captured CUDA graph
 * replayed many times over changing data; the report path (ring, completion
 * thread, skipped steps, side stream and done event); and an agent that
 * reports through the GPU to a real gnmrd. Without a device it says so and
 * exits 0 (skipped). */
#include <cuda_runtime_api.h>
#include <float.h>
#include <math.h>
#include <stdatomic.h>

#include "cuda_backend.h"
#include "cuda_plan.h"
#include "agentutil.h"
#include "gnmr/agent_cuda.h"

#define CH GNMR_CUDA_CHUNK
#define CUDA_OK(x) ck_assert_msg((x) == cudaSuccess, "%s: %s", #x, \
                                 cudaGetErrorString(cudaGetLastError()))

/* A tensor in host memory and its device copy. */
typedef struct buf {
  void *h, *d;
  size_t bytes;
} buf;

static buf mkbuf(size_t bytes) {
  buf b = {malloc(bytes ? bytes : 1), NULL, bytes};
  ck_assert_ptr_nonnull(b.h);
  CUDA_OK(cudaMalloc(&b.d, bytes ? bytes : 1));
  return b;
}

static void upload(buf *b) {
  CUDA_OK(cudaMemcpy(b->d, b->h, b->bytes, cudaMemcpyHostToDevice));
}

static void freebuf(buf *b) {
  free(b->h);
  cudaFree(b->d);
}

static void no_result(void *ctx, uint64_t step, const double *s,
                      const uint64_t *n, const uint8_t *seen, uint32_t units) {
  (void)ctx, (void)step, (void)s, (void)n, (void)seen, (void)units;
}

static gnmr_cuda *open_bare(uint32_t units, uint32_t grid) {
  gnmr_cuda_config cfg = {.device = 0, .n_units = units, .grid_blocks = grid,
                          .on_result = no_result};
  gnmr_cuda *c = NULL;
  ck_assert_int_eq(gnmr_cuda_open(NULL, &cfg, &c), GNMR_OK);
  return c;
}

/* Registers dev (device addresses), reduces on the default stream and
 * checks: bitwise equal to the host model over host (same layout), close
 * to the CPU backend, exact non-finite counts. Returns the sums. */
static void check_tensors(gnmr_cuda *c, const gnmr_tensor *host,
                          const gnmr_tensor *dev, size_t n, uint32_t units,
                          double rel, double *out) {
  ck_assert_int_eq(gnmr_cuda_register(c, dev, n), GNMR_OK);
  ck_assert_int_eq(gnmr_cuda_reduce_async(c, NULL), GNMR_OK);
  double *gs = calloc(units, 8), *ms = calloc(units, 8), *cs = calloc(units, 8);
  uint64_t *gn = calloc(units, 8), *mn = calloc(units, 8), *cn = calloc(units, 8);
  uint8_t *seen = calloc(units, 1);
  ck_assert_int_eq(gnmr_cuda_read(c, NULL, gs, gn, seen), GNMR_OK);
  gnmr__plan p;
  ck_assert_int_eq(gnmr__plan_build(&p, host, n, units), GNMR_OK);
  /* the model reads host memory: same alignment classes as the device
   * copies only when both are 16-byte aligned or both are not */
  ck_assert_int_eq(gnmr__cuda_model(&p, ms, mn), GNMR_OK);
  ck_assert_int_eq(gnmr_reduce_cpu(host, n, units, cs, cn, NULL), GNMR_OK);
  for (uint32_t u = 0; u < units; u++) {
    ck_assert_msg(gn[u] == cn[u] && mn[u] == cn[u],
                  "unit %u non-finite: gpu %llu model %llu cpu %llu", u,
                  (unsigned long long)gn[u], (unsigned long long)mn[u],
                  (unsigned long long)cn[u]);
    ck_assert_msg(memcmp(&gs[u], &ms[u], 8) == 0,
                  "unit %u: gpu %.17g != model %.17g", u, gs[u], ms[u]);
    ck_assert_msg(fabs(gs[u] - cs[u]) <= rel * cs[u],
                  "unit %u: gpu %.17g cpu %.17g", u, gs[u], cs[u]);
    ck_assert_int_eq(seen[u], p.seen[u]);
  }
  if (out)
    memcpy(out, gs, units * 8);
  gnmr__plan_clear(&p);
  free(gs), free(ms), free(cs), free(gn), free(mn), free(cn), free(seen);
}

static float frand(unsigned *seed) {
  return (float)((rand_r(seed) % 2000001) - 1000000) * 1e-6f;
}

/* An LLM-like list: per layer qkv, proj, fc1, fc2 weights and biases, with
 * embeddings; dtypes mixed within units. */
enum { LAYERS = 4, D = 384 };
typedef struct model_set {
  size_t n;
  gnmr_tensor host[8 * LAYERS + 2], dev[8 * LAYERS + 2];
  buf b[8 * LAYERS + 2];
} model_set;

static void make_llm(model_set *m, unsigned seed) {
  static const uint64_t shapes[8] = {3 * D * D, 3 * D, D * D, D,
                                     4 * D * D, 4 * D, 4 * D * D, D};
  static const uint32_t dt[8] = {GNMR_DTYPE_BF16, GNMR_DTYPE_F32,
                                 GNMR_DTYPE_F32,  GNMR_DTYPE_F16,
                                 GNMR_DTYPE_BF16, GNMR_DTYPE_F32,
                                 GNMR_DTYPE_F8E4M3, GNMR_DTYPE_F32};
  m->n = 0;
  for (int l = 0; l < LAYERS + 1; l++) {
    int kn = l < LAYERS ? 8 : 2;
    for (int k = 0; k < kn; k++) {
      uint64_t n = l < LAYERS ? shapes[k] : (k ? 50257 : 50257 * D / 7);
      uint32_t dtype = l < LAYERS ? dt[k] : GNMR_DTYPE_F32;
      size_t es = dtype == GNMR_DTYPE_F32 ? 4 : dtype == GNMR_DTYPE_F8E4M3 ? 1 : 2;
      buf b = mkbuf(n * es);
      for (uint64_t i = 0; i < n; i++) {
        float f = frand(&seed) * 0.02f;
        if (es == 4)
          ((float *)b.h)[i] = f;
        else if (es == 1)
          ((uint8_t *)b.h)[i] = (uint8_t)(rand_r(&seed) & 0x77);
        else if (dtype == GNMR_DTYPE_BF16)
          ((uint16_t *)b.h)[i] = (uint16_t)(rand_r(&seed) & 0x3cff);
        else
          ((uint16_t *)b.h)[i] = (uint16_t)(rand_r(&seed) & 0x3bff);
      }
      upload(&b);
      uint32_t unit = l < LAYERS ? (uint32_t)(2 * l + (k >= 4)) : 2 * LAYERS;
      double scale = dtype == GNMR_DTYPE_F8E4M3 ? 0.01 : 0;
      m->b[m->n] = b;
      m->host[m->n] = (gnmr_tensor){b.h, n, dtype, unit, scale};
      m->dev[m->n] = (gnmr_tensor){b.d, n, dtype, unit, scale};
      m->n++;
    }
  }
}

static void free_llm(model_set *m) {
  for (size_t i = 0; i < m->n; i++)
    freebuf(&m->b[i]);
}

START_TEST(llm_like_units_equal_the_model_bitwise_for_any_grid) {
  model_set m;
  make_llm(&m, 7);
  uint32_t units = 2 * LAYERS + 1;
  double first[2 * LAYERS + 1], again[2 * LAYERS + 1];
  gnmr_cuda *c = open_bare(units, 0);
  check_tensors(c, m.host, m.dev, m.n, units, 1e-5, first);
  gnmr_cuda_stats st;
  gnmr_cuda_stats_get(c, &st);
  printf("test_gpu: %zu tensors, %u chunks, grid %u\n", m.n, st.chunks,
         st.grid);
  gnmr_cuda_close(&c);
  static const uint32_t grids[] = {1, 3, 64, 100000};
  for (size_t g = 0; g < 4; g++) {
    c = open_bare(units, grids[g]);
    for (int rep = 0; rep < 3; rep++) {
      check_tensors(c, m.host, m.dev, m.n, units, 1e-5, again);
      ck_assert_msg(memcmp(first, again, sizeof first) == 0,
                    "grid %u rerun %d differs", grids[g], rep);
    }
    gnmr_cuda_close(&c);
  }
  free_llm(&m);
}
END_TEST

START_TEST(ten_thousand_tiny_tensors_in_one_launch) {
  enum { N = 10000 };
  buf b = mkbuf(N * 16 * 4);
  unsigned seed = 3;
  for (size_t i = 0; i < N * 16; i++)
    ((float *)b.h)[i] = frand(&seed);
  upload(&b);
  gnmr_tensor *h = malloc(N * sizeof *h), *d = malloc(N * sizeof *d);
  for (int i = 0; i < N; i++) {
    /* sizes 1..16, some starting off a 16-byte boundary */
    uint64_t n = 1 + (uint64_t)(i % 16), off = (uint64_t)i * 16 + (i % 3);
    if (off + n > (uint64_t)N * 16)
      n = (uint64_t)N * 16 - off;
    h[i] = (gnmr_tensor){(float *)b.h + off, n, GNMR_DTYPE_F32, (uint32_t)(i % 97), 0};
    d[i] = (gnmr_tensor){(float *)b.d + off, n, GNMR_DTYPE_F32, (uint32_t)(i % 97), 0};
  }
  gnmr_cuda *c = open_bare(97, 0);
  check_tensors(c, h, d, N, 97, 1e-5, NULL);
  gnmr_cuda_stats st;
  gnmr_cuda_stats_get(c, &st);
  ck_assert_uint_eq(st.launches, 1); /* one launch whatever the count */
  gnmr_cuda_close(&c);
  free(h), free(d);
  freebuf(&b);
}
END_TEST

START_TEST(nonfinite_at_chunk_edges_and_values_near_overflow) {
  uint64_t n = 4 * CH + 3;
  buf x = mkbuf(n * 4), e5 = mkbuf(n), big = mkbuf(n * 4), bb = mkbuf(n * 2);
  unsigned seed = 1;
  for (uint64_t i = 0; i < n; i++) {
    ((float *)x.h)[i] = frand(&seed);
    ((uint8_t *)e5.h)[i] = (uint8_t)(rand_r(&seed) % 0x7b);
    ((float *)big.h)[i] = FLT_MAX / (float)(1 + i % 4);
    ((uint16_t *)bb.h)[i] = 0x7f7f;
  }
  uint64_t at[] = {0, CH - 1, CH, 2 * CH - 1, 2 * CH, 3 * CH + 1, n - 1};
  for (size_t i = 0; i < 7; i++) {
    ((float *)x.h)[at[i]] = i % 2 ? -INFINITY : NAN;
    ((uint8_t *)e5.h)[at[i]] = i % 2 ? 0xfc : 0x7e;
  }
  ((float *)big.h)[CH + 5] = INFINITY;
  upload(&x), upload(&e5), upload(&big), upload(&bb);
  gnmr_tensor h[5] = {{x.h, n, GNMR_DTYPE_F32, 0, 0},
                      {e5.h, n, GNMR_DTYPE_F8E5M2, 1, 2.0},
                      {big.h, n, GNMR_DTYPE_F32, 2, 0},
                      {bb.h, n, GNMR_DTYPE_BF16, 3, 0},
                      {(float *)x.h + 1, n - 1, GNMR_DTYPE_F32, 4, 0}};
  gnmr_tensor d[5] = {{x.d, n, GNMR_DTYPE_F32, 0, 0},
                      {e5.d, n, GNMR_DTYPE_F8E5M2, 1, 2.0},
                      {big.d, n, GNMR_DTYPE_F32, 2, 0},
                      {bb.d, n, GNMR_DTYPE_BF16, 3, 0},
                      {(float *)x.d + 1, n - 1, GNMR_DTYPE_F32, 4, 0}};
  gnmr_cuda *c = open_bare(5, 0);
  double s[5];
  check_tensors(c, h, d, 5, 5, 1e-5, s);
  ck_assert(isfinite(s[2]) && s[2] > 1e77); /* fp64 redo, no Inf */
  gnmr_cuda_close(&c);
  freebuf(&x), freebuf(&e5), freebuf(&big), freebuf(&bb);
}
END_TEST

START_TEST(a_tensor_over_two_to_the_31_elements) {
  uint64_t n = (1ull << 31) + 4099; /* fp8: 2 GiB */
  buf b = mkbuf(n);
  for (uint64_t i = 0; i < n; i++)
    ((uint8_t *)b.h)[i] = (uint8_t)((i * 2654435761u >> 7) & 0x77);
  ((uint8_t *)b.h)[n - 2] = 0x7f; /* NaN past 2^31 */
  ((uint8_t *)b.h)[(1ull << 31) + 1] = 0xff;
  upload(&b);
  gnmr_tensor h = {b.h, n, GNMR_DTYPE_F8E4M3, 0, 0};
  gnmr_tensor d = {b.d, n, GNMR_DTYPE_F8E4M3, 0, 0};
  gnmr_cuda *c = open_bare(1, 0);
  ck_assert_int_eq(gnmr_cuda_register(c, &d, 1), GNMR_OK);
  ck_assert_int_eq(gnmr_cuda_reduce_async(c, NULL), GNMR_OK);
  double gs, cs = 0;
  uint64_t gn, cn = 0;
  ck_assert_int_eq(gnmr_cuda_read(c, NULL, &gs, &gn, NULL), GNMR_OK);
  ck_assert_int_eq(gnmr_reduce_cpu(&h, 1, 1, &cs, &cn, NULL), GNMR_OK);
  ck_assert_uint_eq(gn, 2);
  ck_assert_uint_eq(cn, 2);
  ck_assert_msg(fabs(gs - cs) <= 1e-5 * cs, "gpu %.17g cpu %.17g", gs, cs);
  gnmr_cuda_close(&c);
  freebuf(&b);
}
END_TEST

START_TEST(captured_graph_replays_stay_correct) {
  model_set m;
  make_llm(&m, 11);
  uint32_t units = 2 * LAYERS + 1;
  gnmr_cuda *c = open_bare(units, 0);
  ck_assert_int_eq(gnmr_cuda_register(c, m.dev, m.n), GNMR_OK);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  ck_assert_int_eq(gnmr_cuda_reduce_async(c, s), GNMR_OK);
  CUDA_OK(cudaStreamEndCapture(s, &g));
  CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  unsigned seed = 99;
  double want[2 * LAYERS + 1], got[2 * LAYERS + 1];
  uint64_t wn[2 * LAYERS + 1], gn[2 * LAYERS + 1];
  for (int rep = 0; rep < 200; rep++) {
    if (rep % 20 == 0) { /* new gradient values, same buffers */
      float *f = m.b[1].h;
      for (uint64_t i = 0; i < m.host[1].numel; i++)
        f[i] = frand(&seed);
      if (rep == 40)
        f[3] = NAN;
      upload(&m.b[1]);
      gnmr__plan p;
      gnmr__plan_build(&p, m.host, m.n, units);
      gnmr__cuda_model(&p, want, wn);
      gnmr__plan_clear(&p);
    }
    CUDA_OK(cudaGraphLaunch(ge, s));
    ck_assert_int_eq(gnmr_cuda_read(c, s, got, gn, NULL), GNMR_OK);
    ck_assert_msg(memcmp(want, got, sizeof want) == 0, "replay %d", rep);
    ck_assert_msg(memcmp(wn, gn, sizeof wn) == 0, "replay %d counts", rep);
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  gnmr_cuda_close(&c);
  free_llm(&m);
}
END_TEST

/* The table the GPU check prints: per dtype x start alignment x grid, the
 * device's sums and non-finite counts against the host model, bit for
 * bit. The values cover every 16-bit pattern of bf16 and fp16 (fp16
 * subnormals, Inf, NaN), every FP8 byte, and fp32/fp64 subnormals, the
 * largest finite values, Inf and NaN, over 3 chunks and a partial one. */
static const char *dtype_name(uint32_t d) {
  static const char *const n[] = {"f32", "f16", "bf16", "f64", "e4m3", "e5m2"};
  return d < 6 ? n[d] : "?";
}

static size_t dtype_size(uint32_t d) {
  return d == GNMR_DTYPE_F64 ? 8 : d == GNMR_DTYPE_F32 ? 4
       : d >= GNMR_DTYPE_F8E4M3 ? 1 : 2;
}

static void fill_all_patterns(void *h, size_t n, uint32_t d, unsigned seed) {
  for (size_t i = 0; i < n; i++) {
    unsigned r = (unsigned)rand_r(&seed);
    switch (d) {
    case GNMR_DTYPE_F16:
    case GNMR_DTYPE_BF16:
      ((uint16_t *)h)[i] = (uint16_t)(i * 40503u); /* every pattern */
      break;
    case GNMR_DTYPE_F8E4M3:
    case GNMR_DTYPE_F8E5M2:
      ((uint8_t *)h)[i] = (uint8_t)(i * 167u); /* every byte */
      break;
    case GNMR_DTYPE_F32: {
      static const float sp[] = {1e-45f, 1.2e-38f, FLT_MAX, -FLT_MAX,
                                 INFINITY, NAN, 0.0f, -0.0f};
      ((float *)h)[i] = r % 97 == 0 ? sp[r % 8] : frand(&seed);
      break;
    }
    default: {
      static const double sp[] = {4.9e-324, 2.2e-308, DBL_MAX, -DBL_MAX,
                                  INFINITY, NAN, 1e150, -0.0};
      ((double *)h)[i] = r % 97 == 0 ? sp[r % 8] : (double)frand(&seed);
      break;
    }
    }
  }
}

START_TEST(bitwise_table_per_dtype_alignment_and_grid) {
  static const uint32_t dtypes[] = {GNMR_DTYPE_F32, GNMR_DTYPE_F64,
                                    GNMR_DTYPE_BF16, GNMR_DTYPE_F16,
                                    GNMR_DTYPE_F8E4M3, GNMR_DTYPE_F8E5M2};
  static const size_t offsets[] = {0, 1, 3, 5}; /* elements: alignments */
  static const uint32_t grids[] = {1, 3, 64, 0}; /* 0: the device's */
  int bad = 0;
  for (size_t di = 0; di < 6; di++) {
    uint32_t d = dtypes[di];
    size_t es = dtype_size(d), n = 3 * (size_t)CH + 12345;
    for (size_t oi = 0; oi < 4; oi++) {
      size_t off = offsets[oi];
      buf b = mkbuf((n + off) * es);
      fill_all_patterns(b.h, n + off, d, (unsigned)(di * 7 + oi));
      upload(&b);
      double scale = d >= GNMR_DTYPE_F8E4M3 ? 0.5 : 0;
      gnmr_tensor host = {(char *)b.h + off * es, n, d, 0, scale};
      gnmr_tensor dev = {(char *)b.d + off * es, n, d, 0, scale};
      gnmr__plan p;
      double want;
      uint64_t wn;
      ck_assert_int_eq(gnmr__plan_build(&p, &host, 1, 1), GNMR_OK);
      ck_assert_int_eq(gnmr__cuda_model(&p, &want, &wn), GNMR_OK);
      gnmr__plan_clear(&p);
      char line[256];
      int len = snprintf(line, sizeof line, "test_gpu: table %-4s +%zu:",
                         dtype_name(d), off);
      for (size_t gi = 0; gi < 4; gi++) {
        gnmr_cuda *c = open_bare(1, grids[gi]);
        double got;
        uint64_t gn;
        ck_assert_int_eq(gnmr_cuda_register(c, &dev, 1), GNMR_OK);
        ck_assert_int_eq(gnmr_cuda_reduce_async(c, NULL), GNMR_OK);
        ck_assert_int_eq(gnmr_cuda_read(c, NULL, &got, &gn, NULL), GNMR_OK);
        int same = memcmp(&got, &want, 8) == 0 && gn == wn;
        bad += !same;
        len += snprintf(line + len, sizeof line - (size_t)len, " grid %s%u %s",
                        grids[gi] ? "" : "auto/", grids[gi],
                        same ? "equal" : "DIFFERS");
        gnmr_cuda_close(&c);
      }
      printf("%s (sum %.17g, non-finite %llu)\n", line, want,
             (unsigned long long)wn);
      freebuf(&b);
    }
  }
  ck_assert_msg(bad == 0, "%d table entries differ from the host model", bad);
}
END_TEST

/* The unit counters wrap to 0 by themselves: after 1000 graph replays and
 * launches alternating between two streams, every counter is 0 and the
 * results are still the model's. */
START_TEST(counters_are_zero_after_replays_and_alternating_streams) {
  model_set m;
  make_llm(&m, 5);
  uint32_t units = 2 * LAYERS + 1;
  gnmr_cuda *c = open_bare(units, 0);
  ck_assert_int_eq(gnmr_cuda_register(c, m.dev, m.n), GNMR_OK);
  double want[2 * LAYERS + 1], got[2 * LAYERS + 1];
  uint64_t wn[2 * LAYERS + 1], gn[2 * LAYERS + 1];
  gnmr__plan p;
  gnmr__plan_build(&p, m.host, m.n, units);
  gnmr__cuda_model(&p, want, wn);
  gnmr__plan_clear(&p);
  cudaStream_t s[2];
  CUDA_OK(cudaStreamCreateWithFlags(&s[0], cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s[1], cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_OK(cudaStreamBeginCapture(s[0], cudaStreamCaptureModeThreadLocal));
  ck_assert_int_eq(gnmr_cuda_reduce_async(c, s[0]), GNMR_OK);
  CUDA_OK(cudaStreamEndCapture(s[0], &g));
  CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  for (int rep = 0; rep < 1000; rep++)
    CUDA_OK(cudaGraphLaunch(ge, s[0]));
  CUDA_OK(cudaStreamSynchronize(s[0]));
  for (int rep = 0; rep < 200; rep++)
    ck_assert_int_eq(gnmr_cuda_reduce_async(c, s[rep % 2]), GNMR_OK);
  unsigned int done[2 * LAYERS + 1];
  memset(done, 0xff, sizeof done);
  ck_assert_int_eq(gnmr__cuda_counters(c, s[1], done), GNMR_OK);
  for (uint32_t u = 0; u < units; u++)
    ck_assert_msg(done[u] == 0, "unit %u counter %u after the launches", u,
                  done[u]);
  ck_assert_int_eq(gnmr_cuda_read(c, s[1], got, gn, NULL), GNMR_OK);
  ck_assert(memcmp(want, got, sizeof want) == 0);
  ck_assert(memcmp(wn, gn, sizeof wn) == 0);
  printf("test_gpu: counters all 0 after 1000 graph replays and 200 "
         "launches on alternating streams\n");
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s[0]);
  cudaStreamDestroy(s[1]);
  gnmr_cuda_close(&c);
  free_llm(&m);
}
END_TEST

/* report path: every result delivered in order, with the right values */
typedef struct sink {
  atomic_int n;
  uint64_t steps[64];
  double first[64];
  int slow_ms;
} sink;

static void on_result(void *ctx, uint64_t step, const double *s,
                      const uint64_t *nf, const uint8_t *seen, uint32_t units) {
  sink *k = ctx;
  (void)nf, (void)seen, (void)units;
  if (k->slow_ms)
    tu_sleep_ms(k->slow_ms);
  int i = atomic_load(&k->n);
  if (i < 64) {
    k->steps[i] = step;
    k->first[i] = s[0];
  }
  atomic_store(&k->n, i + 1);
}

START_TEST(reports_flow_through_the_ring_in_order) {
  buf b = mkbuf(100000 * 4);
  for (int i = 0; i < 100000; i++)
    ((float *)b.h)[i] = 1.0f;
  upload(&b);
  gnmr_tensor d[2] = {{b.d, 100000, GNMR_DTYPE_F32, 0, 0},
                      {b.d, 0, GNMR_DTYPE_F32, 1, 0}};
  for (int side = 0; side < 2; side++) {
    sink k = {0};
    gnmr_cuda_config cfg = {.device = 0, .n_units = 3, .side_stream = (uint32_t)side,
                            .on_result = on_result, .on_result_ctx = &k};
    gnmr_cuda *c;
    ck_assert_int_eq(gnmr_cuda_open(NULL, &cfg, &c), GNMR_OK);
    ck_assert_int_eq(gnmr_cuda_report(c, 1, NULL), GNMR_E_INVAL); /* unregistered */
    ck_assert_int_eq(gnmr_cuda_register(c, d, 2), GNMR_OK);
    ck_assert_int_eq(gnmr_cuda_register(c, d, 2), GNMR_OK); /* unchanged */
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (uint64_t step = 1; step <= 20; step++) {
      ck_assert_int_eq(gnmr_cuda_report(c, step, s), GNMR_OK);
      CUDA_OK(cudaStreamWaitEvent(s, (cudaEvent_t)gnmr_cuda_done_event(c), 0));
      ck_assert_int_eq(gnmr_cuda_flush(c, 5000), GNMR_OK); /* keep up */
    }
    ck_assert_int_eq(gnmr_cuda_report(c, 20, s), GNMR_E_INVAL); /* not above */
    ck_assert_int_eq(atomic_load(&k.n), 20);
    for (int i = 0; i < 20; i++) {
      ck_assert_uint_eq(k.steps[i], (uint64_t)i + 1);
      ck_assert(k.first[i] == 100000.0);
    }
    gnmr_cuda_stats st;
    gnmr_cuda_stats_get(c, &st);
    ck_assert_uint_eq(st.uploads, 1);
    ck_assert_uint_eq(st.launches, 20);
    ck_assert_uint_eq(st.delivered, 20);
    ck_assert_uint_eq(st.skipped_steps, 0);
    cudaStreamDestroy(s);
    gnmr_cuda_close(&c);
  }
  freebuf(&b);
}
END_TEST

START_TEST(a_slow_host_skips_steps_instead_of_blocking) {
  buf b = mkbuf(4096 * 4);
  memset(b.h, 0, 4096 * 4);
  upload(&b);
  gnmr_tensor d = {b.d, 4096, GNMR_DTYPE_F32, 0, 0};
  sink k = {.slow_ms = 200};
  gnmr_cuda_config cfg = {.device = 0, .n_units = 1, .ring_slots = 2,
                          .on_result = on_result, .on_result_ctx = &k};
  gnmr_cuda *c;
  ck_assert_int_eq(gnmr_cuda_open(NULL, &cfg, &c), GNMR_OK);
  ck_assert_int_eq(gnmr_cuda_register(c, &d, 1), GNMR_OK);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (uint64_t step = 1; step <= 10; step++)
    ck_assert_int_eq(gnmr_cuda_report(c, step, NULL), GNMR_OK);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
  ck_assert_msg(ms < 150, "reports blocked for %.0f ms", ms);
  ck_assert_int_eq(gnmr_cuda_flush(c, 10000), GNMR_OK);
  gnmr_cuda_stats st;
  gnmr_cuda_stats_get(c, &st);
  ck_assert_uint_ge(st.skipped_steps, 7);
  ck_assert_uint_eq(st.delivered + st.skipped_steps, 10);
  ck_assert_uint_eq(st.launches, st.reports); /* skipped: no launch */
  gnmr_cuda_close(&c);
  freebuf(&b);
}
END_TEST

START_TEST(registration_uploads_only_on_change) {
  buf b = mkbuf(1 << 20);
  memset(b.h, 0, 1 << 20);
  upload(&b);
  gnmr_tensor d[2] = {{b.d, 1000, GNMR_DTYPE_F32, 0, 0},
                      {(char *)b.d + 8192, 100, GNMR_DTYPE_BF16, 1, 0}};
  gnmr_cuda *c = open_bare(2, 0);
  gnmr_cuda_stats st;
  for (int i = 0; i < 5; i++)
    ck_assert_int_eq(gnmr_cuda_register(c, d, 2), GNMR_OK);
  gnmr_cuda_stats_get(c, &st);
  ck_assert_uint_eq(st.uploads, 1);
  d[1].data = (char *)b.d + 16384; /* a moved gradient */
  ck_assert_int_eq(gnmr_cuda_register(c, d, 2), GNMR_OK);
  gnmr_cuda_stats_get(c, &st);
  ck_assert_uint_eq(st.uploads, 2);
  d[1].unit = 7; /* bad: the previous registration stays */
  ck_assert_int_eq(gnmr_cuda_register(c, d, 2), GNMR_E_INVAL);
  gnmr_cuda_stats_get(c, &st);
  ck_assert_uint_eq(st.uploads, 2);
  gnmr_cuda_close(&c);
  freebuf(&b);
}
END_TEST

static const char *names[] = {"attn", "mlp"};

START_TEST(an_agent_reports_gpu_norms_to_gnmrd) {
  tu_daemon dm = {0};
  tu_daemon_start(&dm);
  gnmr_agent_config ac = tu_agent_config(dm.agents, "gpu-test", names, 2);
  ac.params.warmup_steps = 2;
  ac.params.max_active = 1;
  ac.barrier_ms = 2000;
  gnmr_agent *a = tu_agent_open_joined(&ac);
  gnmr_cuda_config cfg = {.device = 0, .side_stream = 1};
  gnmr_cuda *c;
  ck_assert_int_eq(gnmr_cuda_open(a, &cfg, &c), GNMR_OK);
  buf b = mkbuf(2 * 4096 * 4);
  gnmr_tensor d[2] = {{b.d, 4096, GNMR_DTYPE_F32, 0, 0},
                      {(float *)b.d + 4096, 4096, GNMR_DTYPE_F32, 1, 0}};
  ck_assert_int_eq(gnmr_cuda_register(c, d, 2), GNMR_OK);
  /* steady norms, then a 50x spike in unit 1 at step 30 */
  for (uint64_t step = 1; step <= 40; step++) {
    for (int i = 0; i < 2 * 4096; i++)
      ((float *)b.h)[i] = i >= 4096 && step == 30 ? 50.0f : 1.0f;
    upload(&b);
    ck_assert_int_eq(gnmr_cuda_report(c, step, NULL), GNMR_OK);
    ck_assert_int_eq(gnmr_agent_wait(a, step, 3000), GNMR_OK);
    if (step == 30)
      ck_assert_int_eq(gnmr_agent_route(a, 1), GNMR_ROUTE_HIGH);
    if (step < 30)
      ck_assert_int_eq(gnmr_agent_route(a, 1), GNMR_ROUTE_LOW);
  }
  ck_assert_int_eq(gnmr_cuda_flush(c, 5000), GNMR_OK); /* counts final */
  gnmr_cuda_stats st;
  gnmr_cuda_stats_get(c, &st);
  ck_assert_uint_eq(st.delivered, 40);
  gnmr_cuda_close(&c);
  gnmr_agent_close(&a);
  freebuf(&b);
  ck_assert_int_eq(tu_daemon_stop(&dm, SIGTERM), 0);
  tu_rmrf(dm.dir);
}
END_TEST

/* Whether nvidia-smi lists a GPU: then a runtime that sees none is a
 * broken setup (a driver older than the runtime, a container without the
 * device), never a reason to skip. */
static int smi_sees_a_gpu(void) {
  FILE *p = popen("nvidia-smi -L 2>/dev/null", "r");
  char line[256];
  int yes = 0;
  while (p != NULL && fgets(line, sizeof line, p) != NULL)
    yes |= strncmp(line, "GPU ", 4) == 0;
  if (p != NULL)
    pclose(p);
  return yes;
}

int main(void) {
  int n = 0, drv = 0, rt = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  printf("test_gpu: CUDA driver %d.%d, runtime %d.%d, cudaGetDeviceCount: "
         "%s (%d devices)\n",
         drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10,
         cudaGetErrorName(e), e == cudaSuccess ? n : 0);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError(); /* the sticky "no driver" error */
    if (smi_sees_a_gpu()) {
      printf("test_gpu: FAILED: nvidia-smi lists a GPU but the CUDA runtime "
             "sees none (%s: %s); a driver older than runtime %d.%d, or a "
             "device not passed through\n",
             cudaGetErrorName(e), cudaGetErrorString(e), rt / 1000,
             rt % 1000 / 10);
      return 1;
    }
    printf("test_gpu: SKIPPED: no CUDA device on this machine (%s; "
           "nvidia-smi lists none)\n",
           cudaGetErrorName(e));
    return 0;
  }
  struct cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("test_gpu: device 0: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major,
         prop.minor, prop.multiProcessorCount);
  int regs = 0, ptx = 0, bin = 0;
  size_t local = 0;
  e = (cudaError_t)gnmr__cuda_kernel_attrs(&regs, &local, &ptx, &bin);
  printf("test_gpu: kernel: %s; %d registers, %zu bytes local memory, PTX "
         "%d, binary %d (%s)\n",
         cudaGetErrorName(e), regs, local, ptx, bin,
         bin == prop.major * 10 + prop.minor ? "real code for this device"
                                             : "JIT from PTX");
  Suite *s = suite_create("gpu");
  TCase *tc = tcase_create("gpu");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, bitwise_table_per_dtype_alignment_and_grid);
  tcase_add_test(tc, llm_like_units_equal_the_model_bitwise_for_any_grid);
  tcase_add_test(tc, counters_are_zero_after_replays_and_alternating_streams);
  tcase_add_test(tc, ten_thousand_tiny_tensors_in_one_launch);
  tcase_add_test(tc, nonfinite_at_chunk_edges_and_values_near_overflow);
  tcase_add_test(tc, captured_graph_replays_stay_correct);
  tcase_add_test(tc, reports_flow_through_the_ring_in_order);
  tcase_add_test(tc, a_slow_host_skips_steps_instead_of_blocking);
  tcase_add_test(tc, registration_uploads_only_on_change);
  tcase_add_test(tc, an_agent_reports_gpu_norms_to_gnmrd);
  tcase_add_test(tc, a_tensor_over_two_to_the_31_elements);
  suite_add_tcase(s, tc);
  /* no fork: a child cannot use CUDA once the parent has initialised it */
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
