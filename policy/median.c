/* SPDX-License-Identifier: MIT */
/* median.c — the lower median of a step's values (the job-relative rule of
 * docs/policy.md): the ceil(n/2)-th smallest, found in place. The values
 * are GNMR and delta-GNMR values, never negative nor NaN, so their bit
 * patterns as unsigned integers are in their order: a radix selection by
 * 11 bits at a time (a histogram, then the bucket holding the rank kept)
 * narrows a large set in a few sequential passes whatever the values are,
 * and the few left are selected by quickselect. The values come from
 * peers, so an order that defeats quickselect's pivots cannot make it
 * quadratic: past 2 log2(n) + 8 rounds of partitioning, the range left is
 * sorted instead. The answer is one of the inputs, so every way of
 * finding it gives the same bits. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "policy_priv.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void swap(double *v, size_t i, size_t j) {
  double t = v[i];
  v[i] = v[j];
  v[j] = t;
}

/* The k-th smallest (0-based) of v[0..n), n > k; v is reordered. No NaN. */
static double select_kth(double *v, size_t n, size_t k) {
  size_t lo = 0, hi = n - 1; /* the answer is in v[lo..hi] */
  int budget = 8;
  for (size_t m = n; m > 1; m >>= 1)
    budget += 2;
  while (lo < hi) {
    if (budget-- == 0) {
      qsort(v + lo, hi - lo + 1, sizeof *v, cmp_double);
      return v[k];
    }
    /* median of three as the pivot, moved to hi */
    size_t mid = lo + (hi - lo) / 2;
    if (v[mid] < v[lo])
      swap(v, mid, lo);
    if (v[hi] < v[lo])
      swap(v, hi, lo);
    if (v[mid] < v[hi])
      swap(v, mid, hi);
    double pivot = v[hi];
    /* three-way: [lo, lt) < pivot, [lt, i) == pivot, (gt, hi] > pivot */
    size_t lt = lo, i = lo, gt = hi;
    while (i <= gt) {
      if (v[i] < pivot)
        swap(v, lt++, i++);
      else if (v[i] > pivot)
        swap(v, i, gt--);
      else
        i++;
    }
    if (k < lt)
      hi = lt - 1;
    else if (k > gt)
      lo = gt + 1;
    else
      return pivot;
  }
  return v[k];
}

/* Sets below this go straight to quickselect. */
#define RADIX_MIN 2048

/* Keeps, in v[0..*n), the values whose bits >> shift & 0x7ff is the
 * bucket holding rank *k, and makes *k the rank among them. */
static void radix_narrow(double *v, size_t *n, size_t *k, int shift) {
  uint32_t count[2048];
  memset(count, 0, sizeof count);
  for (size_t i = 0; i < *n; i++) {
    uint64_t b;
    memcpy(&b, &v[i], sizeof b);
    count[(b >> shift) & 0x7ff]++;
  }
  uint32_t bucket = 0;
  size_t below = 0;
  while (below + count[bucket] <= *k)
    below += count[bucket++];
  size_t m = 0;
  for (size_t i = 0; i < *n; i++) {
    uint64_t b;
    memcpy(&b, &v[i], sizeof b);
    if (((b >> shift) & 0x7ff) == bucket)
      v[m++] = v[i];
  }
  *n = m;
  *k -= below;
}

double policy__kth(double *v, size_t n, size_t k) {
  if (k >= n)
    return (double)NAN;
  /* sign and exponent, then the mantissa's top 11 bits, then the next */
  for (int shift = 52; shift >= 30 && n >= RADIX_MIN; shift -= 11)
    radix_narrow(v, &n, &k, shift);
  return select_kth(v, n, k);
}

double policy__lower_median(double *v, size_t n) {
  return n == 0 ? (double)NAN : policy__kth(v, n, (n - 1) / 2);
}
