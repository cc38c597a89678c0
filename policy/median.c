/* SPDX-License-Identifier: MIT */
/* median.c — the lower median of a step's values (the job-relative rule of
 * docs/policy.md): the ceil(n/2)-th smallest, found in place in O(n)
 * expected time. The values come from peers, so an order that defeats the
 * pivots cannot make it quadratic: past 2 log2(n) + 8 rounds of
 * partitioning, the range left is sorted instead (O(n log n) at worst).
 * The answer is one of the inputs, so every way of finding it gives the
 * same bits. */
#include <math.h>
#include <stdlib.h>

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

double policy__lower_median(double *v, size_t n) {
  return n == 0 ? (double)NAN : select_kth(v, n, (n - 1) / 2);
}
