/* SPDX-License-Identifier: MIT */
/* reduce_pool.c — gnmr_reduce_cpu_threads: the CPU reduction spread over
 * the caller and helper threads, bit for bit the serial one.
 *
 * Host gradients that backward has just written are read back from memory
 * (one core streams about 10 GB/s here, two about 20), so a synchronous
 * step spends most of its time in this pass. The tensors are cut into
 * items of CHUNK blocks; the caller and the helpers take items from an
 * atomic counter and store each block's sum in its own slot; the caller
 * then adds every tensor's block sums in block order, exactly as
 * gnmr_reduce_cpu does, so the result does not depend on the thread count
 * or on which thread reduced what. NaN/Inf counts are integers, per item.
 *
 * The helpers are started on first use (at most MAX_THREADS - 1, once per
 * process) and sleep on a condition variable between reductions. One
 * reduction uses them at a time; a caller that finds them busy (another
 * agent's thread) reduces alone. After fork() the child has no helpers and
 * starts its own. A library destructor stops them at exit. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/agent.h"
#include "reduce_cpu.h"

#define MAX_THREADS 8
#define CHUNK 16                   /* blocks per item: 64k elements */
#define MT_MIN_ELEMENTS (1u << 18) /* below: the caller alone (~1 MiB fp32) */

typedef struct item {
  uint32_t tensor;
  uint32_t nblocks;
  uint64_t block0; /* first block within the tensor */
  uint64_t slot;   /* index of its first block sum in sums[] */
} item;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  pthread_t th[MAX_THREADS];
  unsigned started; /* helpers running */
  int atfork;       /* the fork handler is registered */
  int stop;
  uint64_t gen;     /* bumped when a reduction opens */
  int open;         /* helpers may join the current reduction */
  unsigned active;  /* helpers inside it */
  /* the current reduction, written by the caller before it opens */
  const gnmr_tensor *tensors;
  const item *items;
  size_t n_items;
  double *sums;
  uint64_t *bad; /* per item */
  int simd;
  atomic_size_t next;
  /* scratch kept between reductions (grow-only) */
  item *item_buf;
  size_t item_cap;
  double *sum_buf;
  size_t sum_cap;
  uint64_t *bad_buf;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER,
          .go = PTHREAD_COND_INITIALIZER,
          .done = PTHREAD_COND_INITIALIZER};

/* One caller at a time uses the helpers and the scratch. */
static pthread_mutex_t pool_user = PTHREAD_MUTEX_INITIALIZER;

static void run_items(void) {
  for (;;) {
    size_t i = atomic_fetch_add_explicit(&pool.next, 1, memory_order_relaxed);
    if (i >= pool.n_items)
      return;
    const item *it = &pool.items[i];
    const gnmr_tensor *t = &pool.tensors[it->tensor];
    uint64_t bad = 0;
    for (uint32_t b = 0; b < it->nblocks; b++) {
      uint64_t off = (it->block0 + b) * GNMR_REDUCE_BLOCK;
      size_t n = (size_t)(t->numel - off < GNMR_REDUCE_BLOCK
                              ? t->numel - off
                              : GNMR_REDUCE_BLOCK);
      pool.sums[it->slot + b] = gnmr__reduce_block(t, off, n, &bad, pool.simd);
    }
    pool.bad[i] = bad;
  }
}

static void *helper(void *arg) {
  (void)arg;
  /* else it keeps the name of the thread that started it */
  pthread_setname_np(pthread_self(), "gnmr-reduce");
  uint64_t seen = 0;
  pthread_mutex_lock(&pool.mu);
  for (;;) {
    while (!pool.stop && (!pool.open || pool.gen == seen))
      pthread_cond_wait(&pool.go, &pool.mu);
    if (pool.stop)
      break;
    seen = pool.gen;
    pool.active++;
    pthread_mutex_unlock(&pool.mu);
    run_items();
    pthread_mutex_lock(&pool.mu);
    if (--pool.active == 0 && !pool.open)
      pthread_cond_signal(&pool.done);
  }
  pthread_mutex_unlock(&pool.mu);
  return NULL;
}

/* The child of a fork has none of the parent's helpers, and the locks may
 * have been held by a thread that does not exist there. */
static void pool_after_fork(void) {
  pthread_mutex_init(&pool.mu, NULL);
  pthread_cond_init(&pool.go, NULL);
  pthread_cond_init(&pool.done, NULL);
  pthread_mutex_init(&pool_user, NULL);
  pool.started = 0;
  pool.stop = pool.open = 0;
  pool.active = 0;
}

__attribute__((destructor)) static void pool_stop(void) {
  pthread_mutex_lock(&pool.mu);
  unsigned n = pool.started;
  pool.stop = 1;
  pthread_cond_broadcast(&pool.go);
  pthread_mutex_unlock(&pool.mu);
  for (unsigned i = 0; i < n; i++)
    pthread_join(pool.th[i], NULL);
  pool.started = 0;
  free(pool.item_buf);
  free(pool.sum_buf);
  free(pool.bad_buf);
  pool.item_buf = NULL, pool.sum_buf = NULL, pool.bad_buf = NULL;
  pool.item_cap = pool.sum_cap = 0;
}

/* Starts helpers up to want - 1; returns how many run. Caller holds
 * pool_user. */
static unsigned pool_grow(unsigned want) {
  if (!pool.atfork) {
    if (pthread_atfork(NULL, NULL, pool_after_fork) != 0)
      return 0;
    pool.atfork = 1;
  }
  while (pool.started + 1 < want && pool.started < MAX_THREADS - 1) {
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 << 10); /* a block's fp32 staging */
    int rv = pthread_create(&pool.th[pool.started], &at, helper, NULL);
    pthread_attr_destroy(&at);
    if (rv != 0)
      break;
    /* named here as well as by itself: counted as started, it is named
     * even before it first runs (top -H, tests that count names) */
    pthread_setname_np(pool.th[pool.started], "gnmr-reduce");
    pool.started++;
  }
  return pool.started;
}

unsigned gnmr__reduce_helpers(void) {
  pthread_mutex_lock(&pool.mu);
  unsigned n = pool.started;
  pthread_mutex_unlock(&pool.mu);
  return n;
}

unsigned gnmr__reduce_default_threads(void) {
  const char *env = getenv("GNMR_REDUCE_THREADS");
  if (env != NULL && *env != '\0') {
    char *end;
    errno = 0;
    long v = strtol(env, &end, 10);
    if (errno == 0 && *end == '\0' && v >= 1)
      return v > MAX_THREADS ? MAX_THREADS : (unsigned)v;
  }
  cpu_set_t set;
  unsigned n = 1;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    n = (unsigned)CPU_COUNT(&set);
  return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
}

/* Grow-only scratch for n_items items and n_sums block sums. */
static int scratch(size_t n_items, size_t n_sums) {
  if (n_items > pool.item_cap) {
    item *it = realloc(pool.item_buf, n_items * sizeof *it);
    if (it == NULL)
      return -1;
    pool.item_buf = it;
    uint64_t *b = realloc(pool.bad_buf, n_items * sizeof *b);
    if (b == NULL)
      return -1;
    pool.bad_buf = b;
    pool.item_cap = n_items;
  }
  if (n_sums > pool.sum_cap) {
    double *s = realloc(pool.sum_buf, n_sums * sizeof *s);
    if (s == NULL)
      return -1;
    pool.sum_buf = s;
    pool.sum_cap = n_sums;
  }
  return 0;
}

int gnmr_reduce_cpu_threads(const gnmr_tensor *tensors, size_t n,
                            uint32_t n_units, double *sumsq,
                            uint64_t *nonfinite, uint8_t *seen,
                            unsigned threads) {
  if (sumsq == NULL || nonfinite == NULL ||
      gnmr__reduce_check(tensors, n, n_units) != GNMR_OK)
    return GNMR_E_INVAL;
  if (threads == 0)
    threads = gnmr__reduce_default_threads();
  if (threads > MAX_THREADS)
    threads = MAX_THREADS;
  size_t n_items = 0, n_sums = 0;
  uint64_t elements = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t blocks = (tensors[i].numel + GNMR_REDUCE_BLOCK - 1) /
                      GNMR_REDUCE_BLOCK;
    n_items += (size_t)((blocks + CHUNK - 1) / CHUNK);
    n_sums += (size_t)blocks;
    elements += tensors[i].numel;
  }
  if (threads < 2 || elements < MT_MIN_ELEMENTS || n_items < 2 ||
      n > UINT32_MAX || pthread_mutex_trylock(&pool_user) != 0)
    return gnmr_reduce_cpu(tensors, n, n_units, sumsq, nonfinite, seen);
  if (scratch(n_items, n_sums) != 0 || pool_grow(threads) == 0) {
    pthread_mutex_unlock(&pool_user);
    return gnmr_reduce_cpu(tensors, n, n_units, sumsq, nonfinite, seen);
  }
  size_t k = 0, slot = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t blocks = (tensors[i].numel + GNMR_REDUCE_BLOCK - 1) /
                      GNMR_REDUCE_BLOCK;
    for (uint64_t b = 0; b < blocks; b += CHUNK) {
      item *it = &pool.item_buf[k++];
      it->tensor = (uint32_t)i;
      it->block0 = b;
      it->nblocks = (uint32_t)(blocks - b < CHUNK ? blocks - b : CHUNK);
      it->slot = slot;
      slot += it->nblocks;
    }
  }
  pthread_mutex_lock(&pool.mu);
  pool.tensors = tensors;
  pool.items = pool.item_buf;
  pool.n_items = n_items;
  pool.sums = pool.sum_buf;
  pool.bad = pool.bad_buf;
  pool.simd = gnmr__reduce_simd_level();
  atomic_store_explicit(&pool.next, 0, memory_order_relaxed);
  pool.gen++;
  pool.open = 1;
  if (pool.started + 1 >= threads)
    pthread_cond_broadcast(&pool.go);
  else
    for (unsigned i = 0; i + 1 < threads; i++)
      pthread_cond_signal(&pool.go);
  pthread_mutex_unlock(&pool.mu);
  run_items();
  /* every item is taken; wait for the helpers still reducing theirs */
  pthread_mutex_lock(&pool.mu);
  pool.open = 0;
  while (pool.active > 0)
    pthread_cond_wait(&pool.done, &pool.mu);
  pthread_mutex_unlock(&pool.mu);
  /* the serial order: each tensor's block sums in block order */
  k = 0;
  for (size_t i = 0; i < n; i++) {
    const gnmr_tensor *t = &tensors[i];
    uint64_t blocks = (t->numel + GNMR_REDUCE_BLOCK - 1) / GNMR_REDUCE_BLOCK;
    double total = 0;
    uint64_t bad = 0;
    for (uint64_t b = 0; b < blocks; b += CHUNK, k++) {
      const item *it = &pool.item_buf[k];
      for (uint32_t j = 0; j < it->nblocks; j++)
        total += pool.sum_buf[it->slot + j];
      bad += pool.bad_buf[k];
    }
    sumsq[t->unit] += gnmr__reduce_scale(t, total);
    nonfinite[t->unit] += bad;
    if (seen != NULL)
      seen[t->unit] = 1;
  }
  pthread_mutex_unlock(&pool_user);
  return GNMR_OK;
}
