/* SPDX-License-Identifier: MIT */
/* bench/norm_cuda — the CUDA backend on a GPU (built where nvcc exists,
 * runs where a device exists; says "skipped" otherwise).
 *
 * For LLM-like gradient lists (fp32, bf16; small and large):
 *   - effective bandwidth of one report (bytes of gradient read per second
 *     of kernel time, CUDA events) against the device's own copy bandwidth
 *     measured in the same run (cudaMemcpy device to device: 2 bytes moved
 *     per byte copied); target >= 85% (fp32 and bf16);
 *   - launches per report (the backend's counter; target 1);
 *   - host enqueue time per gnmr_cuda_report (target: microseconds);
 *   - torch._foreach_norm over the same tensors, when $GNMR_PYTHON (default:
 *     python3 on PATH; the GPU machine's torch is not /usr/bin/python3's)
 *     has torch with CUDA. */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"
#include "gnmr/agent_cuda.h"

#define REPS 50

#define CK(x)                                                              \
  do {                                                                     \
    cudaError_t e_ = (x);                                                  \
    if (e_ != cudaSuccess) {                                               \
      fprintf(stderr, "norm_cuda: %s: %s\n", #x, cudaGetErrorString(e_));  \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

static void sink(void *ctx, uint64_t step, const double *s, const uint64_t *n,
                 const uint8_t *seen, uint32_t units) {
  (void)ctx, (void)step, (void)s, (void)n, (void)seen, (void)units;
}

/* device copy bandwidth (bytes moved per second) over a buffer of bytes */
static double copy_limit(size_t bytes) {
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float best = 1e30f;
  for (int i = 0; i < 20; i++) {
    float ms;
    CK(cudaEventRecord(e0, NULL));
    CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, NULL));
    CK(cudaEventRecord(e1, NULL));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (ms < best)
      best = ms;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * (double)bytes / (best * 1e-3);
}

typedef struct set {
  const char *name;
  uint32_t dtype;
  int layers;
  uint64_t d, vocab;
  int misaligned; /* tensors one element off 16-byte alignment */
} set;

static size_t elem_size(uint32_t dtype) {
  return dtype == GNMR_DTYPE_F64   ? 8
         : dtype == GNMR_DTYPE_F32 ? 4
         : dtype <= GNMR_DTYPE_BF16 ? 2
                                   : 1;
}

/* torch's name of a dtype, or NULL (no _foreach_norm over FP8) */
static const char *torch_dtype(uint32_t dtype) {
  switch (dtype) {
  case GNMR_DTYPE_F64: return "float64";
  case GNMR_DTYPE_F32: return "float32";
  case GNMR_DTYPE_F16: return "float16";
  case GNMR_DTYPE_BF16: return "bfloat16";
  default: return NULL;
  }
}

static void torch_compare(const set *s, size_t n, const uint64_t *sizes,
                          double gnmr_ms) {
  if (torch_dtype(s->dtype) == NULL) {
    printf("norm_cuda %-10s torch._foreach_norm: no such dtype in torch\n",
           s->name);
    return;
  }
  const char *py = getenv("GNMR_PYTHON");
  if (py == NULL || *py == '\0' || strpbrk(py, "'\"$`\\;&|<> \t\n") != NULL)
    py = "python3"; /* a plain path only: it goes into a shell command */
  char probe[512];
  snprintf(probe, sizeof probe, "%s -c 'import torch; assert "
           "torch.cuda.is_available()' >/dev/null 2>&1", py);
  if (strlen(py) > 400 || system(probe) != 0) {
    printf("norm_cuda %-10s torch._foreach_norm: skipped (no torch with "
           "CUDA for %s)\n", s->name, py);
    return;
  }
  size_t cap = 64 + n * 24 + strlen(py);
  char *cmd = malloc(cap + 1024);
  int k = snprintf(cmd, cap + 1024, "%s -c 'import torch\nsizes=[", py);
  for (size_t i = 0; i < n; i++)
    k += snprintf(cmd + k, cap + 1024 - (size_t)k, "%llu,",
                  (unsigned long long)sizes[i]);
  snprintf(cmd + k, cap + 1024 - (size_t)k,
           "]\nts=[torch.randn(int(x),device=\"cuda\").to(torch.%s) for x in "
           "sizes]\n"
           "for _ in range(5): torch._foreach_norm(ts)\n"
           "a,b=torch.cuda.Event(enable_timing=True),"
           "torch.cuda.Event(enable_timing=True)\nbest=1e9\n"
           "for _ in range(%d):\n"
           "  a.record(); torch._foreach_norm(ts); b.record(); "
           "torch.cuda.synchronize(); best=min(best,a.elapsed_time(b))\n"
           "print(best)'",
           torch_dtype(s->dtype), REPS);
  FILE *p = popen(cmd, "r");
  double t = 0;
  if (p == NULL || fscanf(p, "%lf", &t) != 1 || t <= 0)
    printf("norm_cuda %-10s torch._foreach_norm: failed to run\n", s->name);
  else
    printf("norm_cuda %-10s torch._foreach_norm %.3f ms; gnmr (per-unit, "
           "with NaN/Inf counts) %.2fx its speed\n",
           s->name, t, t / gnmr_ms);
  if (p)
    pclose(p);
  free(cmd);
}

static void run(const set *s, double limit) {
  /* per layer: qkv, proj, fc1, fc2 weights and biases; plus embeddings */
  size_t n = (size_t)s->layers * 8 + 2;
  uint64_t *sizes = malloc(n * sizeof *sizes);
  gnmr_tensor *t = malloc(n * sizeof *t);
  size_t es = elem_size(s->dtype), k = 0;
  uint64_t total = 0;
  uint32_t units = (uint32_t)s->layers * 4 + 1;
  for (int l = 0; l < s->layers; l++) {
    uint64_t d = s->d, sz[8] = {3 * d * d, 3 * d, d * d, d,
                                4 * d * d, 4 * d, 4 * d * d, d};
    for (int j = 0; j < 8; j++)
      sizes[k] = sz[j], t[k].unit = (uint32_t)(l * 4 + j / 2), k++;
  }
  sizes[k] = s->vocab * s->d, t[k].unit = units - 1, k++;
  sizes[k] = s->d * 1024, t[k].unit = units - 1, k++;
  for (size_t i = 0; i < n; i++)
    total += sizes[i];
  char *mem;
  CK(cudaMalloc((void **)&mem, total * es + 256 * n));
  CK(cudaMemset(mem, 0x3c, total * es + 256 * n));
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    t[i].data = mem + off + (s->misaligned ? es : 0);
    t[i].numel = sizes[i];
    t[i].dtype = s->dtype;
    t[i].scale = 0;
    off += (sizes[i] * es + 255) / 256 * 256;
  }
  gnmr_cuda_config cfg = {.device = 0, .n_units = units, .ring_slots = 64,
                          .on_result = sink};
  gnmr_cuda *c;
  if (gnmr_cuda_open(NULL, &cfg, &c) != GNMR_OK) {
    fprintf(stderr, "norm_cuda: gnmr_cuda_open failed\n");
    exit(1);
  }
  if (gnmr_cuda_register(c, t, n) != GNMR_OK) {
    fprintf(stderr, "norm_cuda: register: %s\n", gnmr_cuda_last_error(c));
    exit(1);
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 5; i++)
    gnmr_cuda_reduce_async(c, NULL);
  float best = 1e30f;
  for (int i = 0; i < REPS; i++) {
    float ms;
    CK(cudaEventRecord(e0, NULL));
    gnmr_cuda_reduce_async(c, NULL);
    CK(cudaEventRecord(e1, NULL));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (ms < best)
      best = ms;
  }
  double bw = (double)total * (double)es / (best * 1e-3);
  gnmr_cuda_stats st0, st1;
  gnmr_cuda_stats_get(c, &st0);
  /* host enqueue time of report (launch + copy + event), ring never full */
  double enq = 0;
  for (uint64_t step = 1; step <= 40; step++) {
    double a = bu_now();
    gnmr_cuda_report(c, step, NULL);
    enq += bu_now() - a;
    gnmr_cuda_flush(c, 10000);
  }
  gnmr_cuda_stats_get(c, &st1);
  double launches = (double)(st1.launches - st0.launches) /
                    (double)(st1.reports - st0.reports);
  printf("norm_cuda %-10s %zu tensors, %u units, %.1f M elements: %.3f ms, "
         "%.0f GB/s = %.2f of device copy bandwidth (%.0f GB/s; target "
         ">= 0.85)\n",
         s->name, n, units, total / 1e6, best, bw / 1e9, bw / limit,
         limit / 1e9);
  printf("norm_cuda %-10s launches per report %.2f (target 1); host enqueue "
         "per report %.1f us; grid %u blocks, %u chunks\n",
         s->name, launches, enq / 40 * 1e6, st1.grid, st1.chunks);
  torch_compare(s, n, sizes, best);
  gnmr_cuda_close(&c);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(mem);
  free(sizes);
  free(t);
}

int main(void) {
  if (gnmr_cuda_device_count() == 0) {
    printf("norm_cuda: skipped: no CUDA device (or no driver) here\n");
    return 0;
  }
  struct cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  double limit = copy_limit((size_t)1 << 30);
  printf("norm_cuda: %s, %d SMs; device copy %.0f GB/s (the limit)\n", p.name,
         p.multiProcessorCount, limit / 1e9);
  static const set sets[] = {
      {"124M fp32", GNMR_DTYPE_F32, 12, 768, 50257, 0},
      {"124M bf16", GNMR_DTYPE_BF16, 12, 768, 50257, 0},
      {"124M f16", GNMR_DTYPE_F16, 12, 768, 50257, 0},
      {"124M e4m3", GNMR_DTYPE_F8E4M3, 12, 768, 50257, 0},
      {"124M fp64", GNMR_DTYPE_F64, 12, 768, 50257, 0},
      {"124M bf16/", GNMR_DTYPE_BF16, 12, 768, 50257, 1}, /* misaligned */
      {"1.3B bf16", GNMR_DTYPE_BF16, 24, 2048, 50257, 0},
  };
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
    run(&sets[i], limit);
  return 0;
}
