/* SPDX-License-Identifier: MIT */
/* reduce_cpu.c — the agent's CPU backend: per-unit sums of squares of host
 * tensors in fp64, with exact NaN/Inf counts. Every element is widened to
 * double and squared exactly (a float's square fits a double), summed in
 * explicit vector lanes; a block whose sum is not finite is recounted
 * element by element, so the fast path carries no per-element checks. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "gnmr/agent.h"

#define BLOCK 4096 /* elements per block: 16 KiB of fp32 staging */

typedef float v2f __attribute__((vector_size(8)));
typedef double v2d __attribute__((vector_size(16)));

/* Sum of squares of n floats in fp64 (8 elements per iteration, four
 * independent 2-wide accumulators). */
static double ss_f32(const float *x, size_t n) {
  v2d a0 = {0, 0}, a1 = {0, 0}, a2 = {0, 0}, a3 = {0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v2f f0, f1, f2, f3;
    memcpy(&f0, x + i, sizeof f0);
    memcpy(&f1, x + i + 2, sizeof f1);
    memcpy(&f2, x + i + 4, sizeof f2);
    memcpy(&f3, x + i + 6, sizeof f3);
    v2d d0 = __builtin_convertvector(f0, v2d);
    v2d d1 = __builtin_convertvector(f1, v2d);
    v2d d2 = __builtin_convertvector(f2, v2d);
    v2d d3 = __builtin_convertvector(f3, v2d);
    a0 += d0 * d0;
    a1 += d1 * d1;
    a2 += d2 * d2;
    a3 += d3 * d3;
  }
  v2d a = (a0 + a1) + (a2 + a3);
  double s = a[0] + a[1];
  for (; i < n; i++)
    s += (double)x[i] * (double)x[i];
  return s;
}

static double ss_f64(const double *x, size_t n) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a0 += x[i] * x[i];
    a1 += x[i + 1] * x[i + 1];
    a2 += x[i + 2] * x[i + 2];
    a3 += x[i + 3] * x[i + 3];
  }
  double s = (a0 + a1) + (a2 + a3);
  for (; i < n; i++)
    s += x[i] * x[i];
  return s;
}

/* Slow path of a block: finite elements' squares, and the count of the
 * others. */
static double recount_f32(const float *x, size_t n, uint64_t *bad) {
  double s = 0;
  for (size_t i = 0; i < n; i++) {
    if (isfinite(x[i]))
      s += (double)x[i] * (double)x[i];
    else
      (*bad)++;
  }
  return s;
}

static double recount_f64(const double *x, size_t n, uint64_t *bad) {
  double s = 0;
  for (size_t i = 0; i < n; i++) {
    if (isfinite(x[i]))
      s += x[i] * x[i];
    else
      (*bad)++;
  }
  return s;
}

/* fp16 -> fp32 through a table of all 65536 values, built once. */
static float f16_table[65536];
static pthread_once_t f16_once = PTHREAD_ONCE_INIT;

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f,
           man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13); /* Inf / NaN */
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else { /* subnormal: value = man * 2^-24 */
    float f = (float)man * 0x1p-24f;
    memcpy(&bits, &f, sizeof bits);
    bits |= sign;
  }
  float out;
  memcpy(&out, &bits, sizeof out);
  return out;
}

static void f16_init(void) {
  for (uint32_t i = 0; i < 65536; i++)
    f16_table[i] = f16_to_f32((uint16_t)i);
}

/* Widens a block of 16-bit values to fp32 in tmp. */
static void widen(const uint16_t *src, size_t n, uint32_t dtype, float *tmp) {
  if (dtype == GNMR_DTYPE_BF16) {
    for (size_t i = 0; i < n; i++) {
      uint32_t bits = (uint32_t)src[i] << 16;
      memcpy(&tmp[i], &bits, sizeof bits);
    }
  } else {
    for (size_t i = 0; i < n; i++)
      tmp[i] = f16_table[src[i]];
  }
}

/* One tensor: sum of squares of its finite elements, count of others. */
static double reduce_tensor(const gnmr_tensor *t, uint64_t *bad) {
  double total = 0;
  float tmp[BLOCK];
  for (uint64_t off = 0; off < t->numel; off += BLOCK) {
    size_t n = (size_t)(t->numel - off < BLOCK ? t->numel - off : BLOCK);
    double s;
    switch (t->dtype) {
    case GNMR_DTYPE_F32: {
      const float *x = (const float *)t->data + off;
      s = ss_f32(x, n);
      if (!isfinite(s))
        s = recount_f32(x, n, bad);
      break;
    }
    case GNMR_DTYPE_F64: {
      const double *x = (const double *)t->data + off;
      s = ss_f64(x, n);
      if (!isfinite(s))
        s = recount_f64(x, n, bad);
      break;
    }
    default: {
      widen((const uint16_t *)t->data + off, n, t->dtype, tmp);
      s = ss_f32(tmp, n);
      if (!isfinite(s))
        s = recount_f32(tmp, n, bad);
      break;
    }
    }
    total += s;
  }
  return total;
}

int gnmr_reduce_cpu(const gnmr_tensor *tensors, size_t n, uint32_t n_units,
                    double *sumsq, uint64_t *nonfinite, uint8_t *seen) {
  if ((tensors == NULL && n > 0) || sumsq == NULL || nonfinite == NULL)
    return GNMR_E_INVAL;
  for (size_t i = 0; i < n; i++) {
    const gnmr_tensor *t = &tensors[i];
    if (t->unit >= n_units || t->dtype > GNMR_DTYPE_F64 ||
        (t->data == NULL && t->numel > 0))
      return GNMR_E_INVAL;
  }
  pthread_once(&f16_once, f16_init);
  for (size_t i = 0; i < n; i++) {
    const gnmr_tensor *t = &tensors[i];
    sumsq[t->unit] += reduce_tensor(t, &nonfinite[t->unit]);
    if (seen != NULL)
      seen[t->unit] = 1;
  }
  return GNMR_OK;
}
