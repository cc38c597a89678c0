/* SPDX-License-Identifier: MIT */
/* dtype.h — element decoders shared by the CPU backend (C), the CUDA kernel
 * and its host model (CUDA C++). Pure bit manipulation, so that host and
 * device decode every value identically, NaN and Inf included. */
#ifndef GNMR_DTYPE_H
#define GNMR_DTYPE_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define GNMR_HD __host__ __device__ __forceinline__
#else
#define GNMR_HD static inline
#endif

GNMR_HD float gnmr__bits_f32(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

/* IEEE binary16: Inf and NaN widen to Inf and NaN, subnormals exactly. */
GNMR_HD float gnmr__f16_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1fu,
           man = h & 0x3ffu;
  if (exp == 0x1f)
    return gnmr__bits_f32(sign | 0x7f800000u | (man << 13));
  if (exp != 0)
    return gnmr__bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
  /* zero or subnormal: man * 2^-24, exact in fp32 */
  float f = (float)man * 5.9604644775390625e-8f;
  return sign ? -f : f;
}

GNMR_HD float gnmr__bf16_f32(uint16_t b) {
  return gnmr__bits_f32((uint32_t)b << 16);
}

/* OCP FP8 E4M3 (bias 7): no infinities; S.1111.111 is NaN; the largest
 * finite value is 448. */
GNMR_HD float gnmr__e4m3_f32(uint8_t v) {
  uint32_t sign = (uint32_t)(v >> 7) << 31, exp = (v >> 3) & 0xfu,
           man = v & 0x7u;
  if (exp == 0xf && man == 0x7)
    return gnmr__bits_f32(sign | 0x7fc00000u);
  if (exp != 0)
    return gnmr__bits_f32(sign | ((exp + 120u) << 23) | (man << 20));
  float f = (float)man * 0.001953125f; /* man * 2^-9 */
  return sign ? -f : f;
}

/* OCP FP8 E5M2 (bias 15): the upper byte of an IEEE binary16. */
GNMR_HD float gnmr__e5m2_f32(uint8_t v) {
  return gnmr__f16_f32((uint16_t)((uint16_t)v << 8));
}

/* Non-finite test on the fp32 bit pattern (no reliance on isfinite() under
 * fast-math flags). */
GNMR_HD int gnmr__f32_nonfinite(float f) {
  uint32_t bits;
#ifdef __CUDA_ARCH__
  bits = __float_as_uint(f);
#else
  memcpy(&bits, &f, sizeof bits);
#endif
  return (bits & 0x7f800000u) == 0x7f800000u;
}

#endif /* GNMR_DTYPE_H */
