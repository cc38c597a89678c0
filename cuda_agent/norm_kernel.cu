// SPDX-License-Identifier: MIT
// norm_kernel.cu — the CUDA backend's one kernel: per-unit sums of squares
// and non-finite counts of every registered gradient, in a single launch.
//
// Each block takes chunks in a grid-stride loop. In a chunk, thread t
// accumulates in fp32 (fmaf, in a fixed element order) the squares of the
// finite elements it owns and counts the others; the block adds its
// threads' partials in fp64 in a fixed tree. A chunk whose fp32 partials
// overflowed (values near FLT_MAX), or whose fp32 sum is below 2^-80
// (squares there fall into fp32's subnormals or to zero: a norm below
// about 1e-12 would lose digits, one below 2.6e-23 would read 0), is
// recomputed with fp64 accumulators: the decision depends only on the
// data, so it is as deterministic as the rest. (An all-zero chunk is read
// twice: its sum is 0. fp64 elements are summed in fp64 from the start,
// once.) Each chunk's sum (times its tensor's scale^2) and count go to the
// chunk's own slot. The block that completes a unit's last chunk (a per-unit
// integer atomic counter) adds the unit's slots in a fixed order in fp64 —
// thread t the slots t, t+NT, ..., then a fixed tree. The counter wraps
// to 0 by itself on the last chunk (atomicInc with the chunk count less
// one), ready for the next launch or graph replay with no reset store
// that could race another launch's increments.
// Which block finishes a unit does not change the order, so results do not
// depend on the grid or on scheduling; units finish in parallel.
//
// The same per-thread and per-block code runs on the host in
// gnmr__cuda_model(), the reference the GPU tests compare with bit for bit.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "cuda_plan.h"
#include "dtype.h"

#define NT GNMR_CUDA_THREADS

namespace {

// 16 bytes as four little-endian words.
struct Vec16 {
  uint32_t w[4];
};

__host__ __device__ __forceinline__ Vec16 load16(const unsigned char *p) {
  Vec16 v;
#ifdef __CUDA_ARCH__
  uint4 u = __ldg(reinterpret_cast<const uint4 *>(p));
  v.w[0] = u.x;
  v.w[1] = u.y;
  v.w[2] = u.z;
  v.w[3] = u.w;
#else
  memcpy(v.w, p, 16);
#endif
  return v;
}

template <int DT> struct Dt;
template <> struct Dt<GNMR_DTYPE_F32> { enum { size = 4 }; };
template <> struct Dt<GNMR_DTYPE_F16> { enum { size = 2 }; };
template <> struct Dt<GNMR_DTYPE_BF16> { enum { size = 2 }; };
template <> struct Dt<GNMR_DTYPE_F64> { enum { size = 8 }; };
template <> struct Dt<GNMR_DTYPE_F8E4M3> { enum { size = 1 }; };
template <> struct Dt<GNMR_DTYPE_F8E5M2> { enum { size = 1 }; };

// Decodes a raw element (the low bits of `raw`) of a 1-, 2- or 4-byte type.
// On the device fp16 and FP8 go through the hardware's conversions (one
// instruction for fp16, and for FP8 on sm_89 and newer), which are exact,
// as dtype.h's bit-level decoders are: the same float for every pattern,
// so the host model stays the reference bit for bit (the GPU test's table
// covers every fp16 pattern and every FP8 byte). The bit-level decoders'
// data-dependent branches made fp16 and FP8 compute-bound (an H200: fp16
// at 0.44 and E4M3 at 0.19 of copy bandwidth, bf16 at 0.82).
template <int DT> __host__ __device__ __forceinline__ float decode(uint32_t raw) {
#ifdef __CUDA_ARCH__
  if constexpr (DT == GNMR_DTYPE_F16)
    return __half2float(__ushort_as_half((unsigned short)raw));
  else if constexpr (DT == GNMR_DTYPE_F8E5M2)
    return __half2float(__ushort_as_half((unsigned short)(raw << 8)));
  else if constexpr (DT == GNMR_DTYPE_F8E4M3)
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(
        (__nv_fp8_storage_t)raw, __NV_E4M3)));
#endif
  if constexpr (DT == GNMR_DTYPE_F32)
    return gnmr__bits_f32(raw);
  else if constexpr (DT == GNMR_DTYPE_F16)
    return gnmr__f16_f32((uint16_t)raw);
  else if constexpr (DT == GNMR_DTYPE_BF16)
    return gnmr__bf16_f32((uint16_t)raw);
  else if constexpr (DT == GNMR_DTYPE_F8E4M3)
    return gnmr__e4m3_f32((uint8_t)raw);
  else
    return gnmr__e5m2_f32((uint8_t)raw);
}

template <int DT>
__host__ __device__ __forceinline__ uint32_t load_raw(const unsigned char *p,
                                                      uint32_t i) {
  const int es = Dt<DT>::size;
#ifdef __CUDA_ARCH__
  if constexpr (es == 4)
    return __ldg(reinterpret_cast<const uint32_t *>(p) + i);
  else if constexpr (es == 2)
    return __ldg(reinterpret_cast<const unsigned short *>(p) + i);
  else
    return __ldg(p + i);
#else
  uint32_t r = 0;
  memcpy(&r, p + (size_t)i * es, es); // little-endian hosts only
  return r;
#endif
}

__host__ __device__ __forceinline__ void acc_one(float x, float *acc,
                                                 uint32_t *nf) {
  if (gnmr__f32_nonfinite(x))
    (*nf)++;
  else
    *acc = fmaf(x, x, *acc);
}

__host__ __device__ __forceinline__ void acc_one(float x, double *acc,
                                                 uint32_t *nf) {
  if (gnmr__f32_nonfinite(x))
    (*nf)++;
  else
    *acc = fma((double)x, (double)x, *acc);
}

// Whether a chunk's fp32 sum must be computed again in fp64: it
// overflowed, or it is so small that squares fell into fp32's subnormals
// (their loss, at most FLT_MIN each, stays below 2^-126 * 32768 = 2^-111,
// a relative 2^-31 of any sum above 2^-80).
__host__ __device__ __forceinline__ bool redo_in_fp64(double sum) {
  return isinf(sum) || sum < 0x1p-80;
}

template <int DT, typename Acc>
__host__ __device__ __forceinline__ void acc_vec(const Vec16 &v, Acc *acc,
                                                 uint32_t *nf) {
  const int es = Dt<DT>::size, lanes = 16 / es;

  for (int j = 0; j < lanes; j++) {
    uint32_t w = v.w[(j * es) / 4];
    uint32_t raw = es == 4 ? w : (w >> (8 * ((j * es) % 4))) &
                                     ((1u << (8 * es)) - 1u);
    acc_one(decode<DT>(raw), acc, nf);
  }
}

// Thread t's share of one chunk of a 1/2/4-byte type: whole 16-byte
// vectors t, t+NT, ... (aligned segments), then the tail elements one per
// thread; misaligned segments go element by element, t, t+NT, ...
template <int DT, typename Acc>
__host__ __device__ void thread_part(const unsigned char *p, uint32_t len,
                                     int aligned, uint32_t t, Acc *acc_out,
                                     uint32_t *nf_out) {
  const uint32_t lanes = 16 / Dt<DT>::size;
  Acc acc = 0;
  uint32_t nf = 0;
  uint32_t nvec = aligned ? len / lanes : 0, v = t;
  // four loads in flight per thread, consumed in the same order as below
  for (; v + 3 * NT < nvec; v += 4 * NT) {
    Vec16 a = load16(p + (size_t)v * 16);
    Vec16 b = load16(p + (size_t)(v + NT) * 16);
    Vec16 c = load16(p + (size_t)(v + 2 * NT) * 16);
    Vec16 d = load16(p + (size_t)(v + 3 * NT) * 16);
    acc_vec<DT>(a, &acc, &nf);
    acc_vec<DT>(b, &acc, &nf);
    acc_vec<DT>(c, &acc, &nf);
    acc_vec<DT>(d, &acc, &nf);
  }
  for (; v < nvec; v += NT)
    acc_vec<DT>(load16(p + (size_t)v * 16), &acc, &nf);
  // element by element (a misaligned segment, or the tail): four loads in
  // flight, added in the same order as one at a time
  uint32_t i = nvec * lanes + t;
  for (; i + 3 * NT < len; i += 4 * NT) {
    uint32_t r0 = load_raw<DT>(p, i), r1 = load_raw<DT>(p, i + NT),
             r2 = load_raw<DT>(p, i + 2 * NT), r3 = load_raw<DT>(p, i + 3 * NT);
    acc_one(decode<DT>(r0), &acc, &nf);
    acc_one(decode<DT>(r1), &acc, &nf);
    acc_one(decode<DT>(r2), &acc, &nf);
    acc_one(decode<DT>(r3), &acc, &nf);
  }
  for (; i < len; i += NT)
    acc_one(decode<DT>(load_raw<DT>(p, i)), &acc, &nf);
  *acc_out = acc;
  *nf_out = nf;
}

__host__ __device__ __forceinline__ uint64_t load_f64_bits(
    const unsigned char *p, uint32_t i) {
#ifdef __CUDA_ARCH__
  return (uint64_t)__double_as_longlong(
      __ldg(reinterpret_cast<const double *>(p) + i));
#else
  uint64_t bits;
  memcpy(&bits, p + (size_t)i * 8, 8);
  return bits;
#endif
}

__host__ __device__ __forceinline__ void acc_f64(uint64_t bits, double *acc,
                                                 uint32_t *nf) {
  if ((bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull) {
    (*nf)++;
  } else {
    double x;
#ifdef __CUDA_ARCH__
    x = __longlong_as_double((long long)bits);
#else
    memcpy(&x, &bits, 8);
#endif
    *acc = fma(x, x, *acc);
  }
}

// fp64 elements: fp64 accumulators, element by element, four loads in
// flight (one at a time left fp64 at 0.53 of copy bandwidth on an H200),
// added in the same order as one at a time.
__host__ __device__ void thread_part_f64(const unsigned char *p, uint32_t len,
                                         uint32_t t, double *acc_out,
                                         uint32_t *nf_out) {
  double acc = 0;
  uint32_t nf = 0;
  uint32_t i = t;
  for (; i + 3 * NT < len; i += 4 * NT) {
    uint64_t b0 = load_f64_bits(p, i), b1 = load_f64_bits(p, i + NT),
             b2 = load_f64_bits(p, i + 2 * NT), b3 = load_f64_bits(p, i + 3 * NT);
    acc_f64(b0, &acc, &nf);
    acc_f64(b1, &acc, &nf);
    acc_f64(b2, &acc, &nf);
    acc_f64(b3, &acc, &nf);
  }
  for (; i < len; i += NT)
    acc_f64(load_f64_bits(p, i), &acc, &nf);
  *acc_out = acc;
  *nf_out = nf;
}

__host__ __device__ inline const unsigned char *chunk_base(const gnmr__seg &s,
                                                           const gnmr__chunk &c) {
  uint64_t es = s.dtype == GNMR_DTYPE_F32   ? 4
                : s.dtype == GNMR_DTYPE_F64 ? 8
                : s.dtype <= GNMR_DTYPE_BF16 ? 2
                                             : 1;
  return reinterpret_cast<const unsigned char *>(s.addr) + c.start * es;
}

// Thread t's share with accumulator type Acc (float first, double for a
// chunk whose float partials overflowed).
template <typename Acc>
__host__ __device__ void thread_any(const gnmr__seg &s, const gnmr__chunk &c,
                                    uint32_t t, double *sum, uint32_t *nf) {
  const unsigned char *p = chunk_base(s, c);
  int al = (s.flags & GNMR_SEG_ALIGNED) != 0;
  Acc acc = 0;
  switch (s.dtype) {
  case GNMR_DTYPE_F32:
    thread_part<GNMR_DTYPE_F32>(p, c.len, al, t, &acc, nf);
    break;
  case GNMR_DTYPE_F16:
    thread_part<GNMR_DTYPE_F16>(p, c.len, al, t, &acc, nf);
    break;
  case GNMR_DTYPE_BF16:
    thread_part<GNMR_DTYPE_BF16>(p, c.len, al, t, &acc, nf);
    break;
  case GNMR_DTYPE_F8E4M3:
    thread_part<GNMR_DTYPE_F8E4M3>(p, c.len, al, t, &acc, nf);
    break;
  case GNMR_DTYPE_F8E5M2:
    thread_part<GNMR_DTYPE_F8E5M2>(p, c.len, al, t, &acc, nf);
    break;
  default: { // GNMR_DTYPE_F64
    double d;
    thread_part_f64(p, c.len, t, &d, nf);
    *sum = d;
    return;
  }
  }
  *sum = (double)acc;
}

// (left out of the host-only build of the model, -DGNMR_MODEL_ONLY, which
// tests link against a stand-in for the CUDA runtime)
#ifndef GNMR_MODEL_ONLY

struct Tables {
  const gnmr__dev_header *h;
  const gnmr__seg *segs;
  const gnmr__chunk *chunks;
  const uint32_t *unit_begin;
  const uint8_t *seen;
};

__host__ __device__ inline Tables tables_of(const void *base) {
  const char *b = static_cast<const char *>(base);
  const gnmr__dev_header *h = reinterpret_cast<const gnmr__dev_header *>(b);
  Tables t;
  t.h = h;
  t.segs = reinterpret_cast<const gnmr__seg *>(b + h->segs_off);
  t.chunks = reinterpret_cast<const gnmr__chunk *>(b + h->chunks_off);
  t.unit_begin = reinterpret_cast<const uint32_t *>(b + h->unit_begin_off);
  t.seen = reinterpret_cast<const uint8_t *>(b + h->seen_off);
  return t;
}

// --- device -----------------------------------------------------------------

__device__ void block_sum(double *sh, uint32_t *shn, uint32_t t) {
  __syncthreads();
  for (uint32_t s = NT / 2; s > 0; s >>= 1) {
    if (t < s) {
      sh[t] += sh[t + s];
      shn[t] += shn[t + s];
    }
    __syncthreads();
  }
}

struct Result {
  double *sumsq;
  unsigned long long *nonfinite;
  uint8_t *seen;
};

__device__ inline Result result_of(unsigned char *r, uint32_t n_units) {
  Result o;
  o.sumsq = reinterpret_cast<double *>(r);
  o.nonfinite = reinterpret_cast<unsigned long long *>(
      r + GNMR_RESULT_NONFINITE_OFF(n_units));
  o.seen = r + GNMR_RESULT_SEEN_OFF(n_units);
  return o;
}

// Unit u's total from its chunk slots [b, e): thread t adds slots b+t,
// b+t+NT, ... in order, then the block's fixed fp64 tree (the host model
// does the same). Counts are integers: any order.
__device__ void finish_unit(const double *partial, const uint32_t *pcount,
                            uint32_t b, uint32_t e, uint32_t t, double *sh,
                            unsigned long long *shc, double *sum,
                            unsigned long long *cnt) {
  double s = 0;
  unsigned long long n = 0;
  for (uint32_t c = b + t; c < e; c += NT) {
    s += __ldcg(&partial[c]);
    n += __ldcg(&pcount[c]);
  }
  sh[t] = s;
  shc[t] = n;
  __syncthreads();
  for (uint32_t k = NT / 2; k > 0; k >>= 1) {
    if (t < k) {
      sh[t] += sh[t + k];
      shc[t] += shc[t + k];
    }
    __syncthreads();
  }
  *sum = sh[0];
  *cnt = shc[0];
  __syncthreads();
}

__global__ void __launch_bounds__(NT)
    norm_kernel(const void *tables, double *partial, uint32_t *pcount,
                unsigned int *unit_done, unsigned char *result) {
  __shared__ double sh[NT];
  __shared__ uint32_t shn[NT];
  __shared__ unsigned long long shc[NT];
  __shared__ int finisher;
  const uint32_t t = threadIdx.x;
  Tables tb = tables_of(tables);
  const uint32_t n_chunks = tb.h->n_chunks, n_units = tb.h->n_units;
  Result out = result_of(result, n_units);
  if (blockIdx.x == 0) // units without chunks: 0, and whether registered
    for (uint32_t u = t; u < n_units; u += NT)
      if (tb.unit_begin[u] == tb.unit_begin[u + 1]) {
        out.sumsq[u] = 0;
        out.nonfinite[u] = 0;
        out.seen[u] = tb.seen[u];
      }
  for (uint32_t c = blockIdx.x; c < n_chunks; c += gridDim.x) {
    const gnmr__chunk ch = tb.chunks[c];
    const gnmr__seg sg = tb.segs[ch.seg];
    uint32_t nf;
    thread_any<float>(sg, ch, t, &sh[t], &nf);
    shn[t] = nf;
    block_sum(sh, shn, t);
    double sum = sh[0];
    uint32_t cnt = shn[0];
    __syncthreads();
    // fp32 overflowed or underflowed: in fp64 (fp64 elements were summed
    // in fp64 already: a second pass would give the same sum; it read
    // small fp64 gradients twice, at 0.53 of copy bandwidth on an H200)
    if (sg.dtype != GNMR_DTYPE_F64 && redo_in_fp64(sum)) {
      thread_any<double>(sg, ch, t, &sh[t], &nf);
      shn[t] = nf;
      block_sum(sh, shn, t);
      sum = sh[0];
      __syncthreads();
    }
    // the block that completes a unit's last chunk finishes the unit
    if (t == 0) {
      partial[c] = sum * sg.scale2;
      pcount[c] = cnt;
      __threadfence();
      uint32_t u = sg.unit;
      uint32_t k = tb.unit_begin[u + 1] - tb.unit_begin[u];
      // counts 0..k-1 and wraps to 0 by itself on the unit's last chunk:
      // no reset store that could race another launch's increments
      finisher = atomicInc(&unit_done[u], k - 1) == k - 1 ? (int)u : -1;
    }
    __syncthreads();
    if (finisher >= 0) {
      uint32_t u = (uint32_t)finisher;
      __threadfence();
      double us;
      unsigned long long un;
      finish_unit(partial, pcount, tb.unit_begin[u], tb.unit_begin[u + 1], t,
                  sh, shc, &us, &un);
      if (t == 0) {
        out.sumsq[u] = us;
        out.nonfinite[u] = un;
        out.seen[u] = 1;
      }
    }
    __syncthreads();
  }
}

#endif // GNMR_MODEL_ONLY

} // namespace

// --- host entry points (C ABI) ------------------------------------------------

#ifndef GNMR_MODEL_ONLY
extern "C" int gnmr__cuda_launch(const gnmr__launch *l, void *stream) {
  norm_kernel<<<l->grid, NT, 0, static_cast<cudaStream_t>(stream)>>>(
      l->tables, l->partial, l->pcount, l->unit_done, l->result);
  return (int)cudaGetLastError();
}

extern "C" int gnmr__cuda_kernel_attrs(int *regs, size_t *local_bytes,
                                       int *ptx, int *binary) {
  cudaFuncAttributes fa;
  cudaError_t e = cudaFuncGetAttributes(&fa, norm_kernel);
  if (e != cudaSuccess)
    return (int)e;
  *regs = fa.numRegs;
  *local_bytes = fa.localSizeBytes;
  *ptx = fa.ptxVersion;
  *binary = fa.binaryVersion;
  return 0;
}

extern "C" int gnmr__cuda_grid_max(int device, uint32_t *grid) {
  int sms = 0, per_sm = 0;
  cudaError_t e =
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess)
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, norm_kernel,
                                                      NT, 0);
  if (e != cudaSuccess)
    return (int)e;
  *grid = (uint32_t)(sms * (per_sm > 0 ? per_sm : 1));
  return 0;
}

#endif

extern "C" int gnmr__cuda_model(const gnmr__plan *p, double *sumsq,
                                 uint64_t *nonfinite) {
  double sh[NT];
  uint32_t shn[NT];
  size_t n = p->n_chunks ? p->n_chunks : 1;
  double *partial = static_cast<double *>(malloc(n * sizeof(double)));
  uint32_t *pcount = static_cast<uint32_t *>(malloc(n * sizeof(uint32_t)));
  if (partial == NULL || pcount == NULL) {
    free(partial);
    free(pcount);
    return GNMR_E_NOMEM;
  }
  for (uint32_t c = 0; c < p->n_chunks; c++) {
    const gnmr__chunk &ch = p->chunks[c];
    const gnmr__seg &sg = p->segs[ch.seg];
    for (int pass = 0; pass < 2; pass++) {
      for (uint32_t t = 0; t < NT; t++) {
        if (pass == 0)
          thread_any<float>(sg, ch, t, &sh[t], &shn[t]);
        else
          thread_any<double>(sg, ch, t, &sh[t], &shn[t]);
      }
      for (uint32_t s = NT / 2; s > 0; s >>= 1)
        for (uint32_t t = 0; t < s; t++) {
          sh[t] += sh[t + s];
          shn[t] += shn[t + s];
        }
      if (pass == 0)
        pcount[c] = shn[0];
      if (sg.dtype == GNMR_DTYPE_F64 || !redo_in_fp64(sh[0]))
        break;
    }
    partial[c] = sh[0] * sg.scale2;
  }
  for (uint32_t u = 0; u < p->n_units; u++) {
    uint32_t b = p->unit_begin[u], e = p->unit_begin[u + 1];
    uint64_t n = 0;
    for (uint32_t t = 0; t < NT; t++) {
      double acc = 0;
      for (uint32_t c = b + t; c < e; c += NT) {
        acc += partial[c];
        n += pcount[c];
      }
      sh[t] = acc;
    }
    for (uint32_t k = NT / 2; k > 0; k >>= 1)
      for (uint32_t t = 0; t < k; t++)
        sh[t] += sh[t + k];
    sumsq[u] = b == e ? 0 : sh[0];
    nonfinite[u] = n;
  }
  free(partial);
  free(pcount);
  return GNMR_OK;
}
