/* SPDX-License-Identifier: MIT */
/* snapshot_async.c — a snapshot taken off the engine's thread (policy.h,
 * policy_snap_*). policy_snap_begin() marks the engine's state as of now
 * as owed: it writes the header and allocates room for every window full,
 * in O(1) (the buffer's pages are touched by whoever writes them), without
 * serializing a unit. The units go in pieces of SNAP_PIECE, each at its
 * own offset in that room and claimed by whichever
 * thread asks first: the consumer (gnmrd's store writer) in
 * policy_snap_take(), or the engine's own thread at its next change
 * (step, resize, new parameters, destroy), which must not change a unit
 * before its bytes exist. So when the next change comes early, both
 * threads serialize the rest together and the owner waits at most for
 * the other's last piece. The consumer then closes the gaps that short
 * windows left between pieces and adds the checksum. The engine is only
 * read here: the owner's own
 * reads (status views) need no lock. The buffer stays the handle's until
 * its last reference goes, then waits as a spare for the next snapshot
 * (large ones; see policy.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gnmr/error.h"
#include "policy_priv.h"

#define SNAP_PIECE 8192u /* units: about 0.3 ms of work */

struct policy_snap {
  atomic_int refs;       /* the engine (until settled) and the consumer */
  const policy *p;       /* valid while a piece is unclaimed */
  uint64_t step;         /* the engine's last step at begin */
  uint8_t *buf;          /* buf_cap bytes, of which cap are the export's
                            room and `room` the id table's after it */
  size_t cap, room, buf_cap;
  uint32_t *ids, n_ids;  /* the units' ids (a copy), or NULL: 0..n-1 */
  size_t *len;           /* n_pieces: the bytes each piece wrote */
  size_t head, unit_max;  /* header bytes; a unit's with its window full */
  uint32_t n, n_pieces;
  atomic_uint next;      /* the next piece to claim */
  atomic_uint done;      /* pieces written */
  pthread_mutex_t mu;    /* with cv: waiting for the last piece */
  pthread_cond_t cv;
  int taken;
};

static atomic_ullong n_snaps, n_helped;

/* ---- buffers ---------------------------------------------------------
 * Under SPARE_MIN: malloc (the allocator keeps such sizes in its heap).
 * From SPARE_MIN: an anonymous mapping in whole huge pages, advised to
 * use them where the kernel does (transparent huge pages on madvise, as
 * Debian sets it), kept after use in spare[] for the next snapshot that
 * fits, smallest fit first. A spare that is too small for a snapshot
 * that found none is unmapped (its job grew, or ended); a returned
 * buffer with no free slot replaces a smaller spare, else is unmapped. */
#define SPARE_MIN ((size_t)2 << 20)

static pthread_mutex_t spare_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  uint8_t *buf;
  size_t cap;
} spare[POLICY_SNAP_SPARES];
static uint32_t n_spare;
static uint64_t spare_bytes;
static atomic_ullong n_reused;

static void unmap(uint8_t *b, size_t cap) {
  if (b != NULL)
    munmap(b, cap);
}

static void spare_take(uint32_t i, uint8_t **b, size_t *cap) {
  *b = spare[i].buf;
  *cap = spare[i].cap;
  spare_bytes -= spare[i].cap;
  spare[i] = spare[--n_spare];
}

/* Room for need bytes; *cap gets what the buffer holds. */
static uint8_t *buf_get(size_t need, size_t *cap) {
  if (need < SPARE_MIN) {
    *cap = need;
    return malloc(need);
  }
  uint8_t *b = NULL, *drop = NULL;
  size_t drop_cap = 0;
  pthread_mutex_lock(&spare_mu);
  uint32_t fit = n_spare, small = n_spare;
  for (uint32_t i = 0; i < n_spare; i++) {
    if (spare[i].cap >= need) {
      if (fit == n_spare || spare[i].cap < spare[fit].cap)
        fit = i;
    } else if (small == n_spare || spare[i].cap > spare[small].cap) {
      small = i;
    }
  }
  if (fit < n_spare)
    spare_take(fit, &b, cap);
  else if (small < n_spare)
    spare_take(small, &drop, &drop_cap);
  pthread_mutex_unlock(&spare_mu);
  unmap(drop, drop_cap);
  if (b != NULL) {
    atomic_fetch_add(&n_reused, 1);
    return b;
  }
  size_t len = (need + SPARE_MIN - 1) / SPARE_MIN * SPARE_MIN;
  void *m = mmap(NULL, len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return NULL;
#ifdef MADV_HUGEPAGE
  (void)madvise(m, len, MADV_HUGEPAGE); /* advice: fewer faults, or none */
#endif
  *cap = len;
  return m;
}

static void buf_put(uint8_t *b, size_t cap) {
  if (b == NULL)
    return;
  if (cap < SPARE_MIN) {
    free(b);
    return;
  }
  pthread_mutex_lock(&spare_mu);
  if (n_spare < POLICY_SNAP_SPARES) {
    spare[n_spare].buf = b;
    spare[n_spare++].cap = cap;
    spare_bytes += cap;
    b = NULL;
  } else {
    uint32_t small = 0;
    for (uint32_t i = 1; i < n_spare; i++)
      if (spare[i].cap < spare[small].cap)
        small = i;
    if (spare[small].cap < cap) { /* keep the larger */
      uint8_t *old = spare[small].buf;
      size_t old_cap = spare[small].cap;
      spare_bytes += cap - old_cap;
      spare[small].buf = b;
      spare[small].cap = cap;
      b = old;
      cap = old_cap;
    }
  }
  pthread_mutex_unlock(&spare_mu);
  unmap(b, cap);
}

void policy_snap_spares(uint32_t *buffers, uint64_t *bytes,
                        uint64_t *reused) {
  pthread_mutex_lock(&spare_mu);
  if (buffers != NULL)
    *buffers = n_spare;
  if (bytes != NULL)
    *bytes = spare_bytes;
  pthread_mutex_unlock(&spare_mu);
  if (reused != NULL)
    *reused = atomic_load(&n_reused);
}

uint64_t policy_snap_spares_drop(void) {
  struct {
    uint8_t *buf;
    size_t cap;
  } drop[POLICY_SNAP_SPARES];
  pthread_mutex_lock(&spare_mu);
  uint32_t n = n_spare;
  uint64_t bytes = spare_bytes;
  for (uint32_t i = 0; i < n; i++) {
    drop[i].buf = spare[i].buf;
    drop[i].cap = spare[i].cap;
  }
  n_spare = 0;
  spare_bytes = 0;
  pthread_mutex_unlock(&spare_mu);
  for (uint32_t i = 0; i < n; i++) /* outside the lock: munmap is slow */
    unmap(drop[i].buf, drop[i].cap);
  return bytes;
}

/* Where piece k goes: after the header and k pieces of full windows. */
static size_t piece_off(const policy_snap *s, uint32_t k) {
  return s->head + (size_t)k * SNAP_PIECE * s->unit_max;
}

/* Claims and writes pieces until none is left. Returns how many this
 * thread wrote. */
static uint32_t claim(policy_snap *s) {
  uint32_t mine = 0;
  for (;;) {
    unsigned k = atomic_fetch_add(&s->next, 1);
    if (k >= s->n_pieces)
      break;
    uint32_t u0 = k * SNAP_PIECE;
    uint32_t u1 = s->n - u0 < SNAP_PIECE ? s->n : u0 + SNAP_PIECE;
    s->len[k] = policy__export_units(s->p, u0, u1, s->buf + piece_off(s, k));
    mine++;
    if (atomic_fetch_add(&s->done, 1) + 1 == s->n_pieces) {
      pthread_mutex_lock(&s->mu);
      pthread_cond_broadcast(&s->cv);
      pthread_mutex_unlock(&s->mu);
    }
  }
  return mine;
}

/* claim(), then waits until every piece is written. */
static uint32_t work(policy_snap *s) {
  uint32_t mine = claim(s);
  pthread_mutex_lock(&s->mu);
  while (atomic_load(&s->done) < s->n_pieces)
    pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return mine;
}

static void unref(policy_snap *s) {
  if (atomic_fetch_sub(&s->refs, 1) != 1)
    return;
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  buf_put(s->buf, s->buf_cap);
  free(s->len);
  free(s->ids);
  free(s);
}

void policy__settle(policy *p) {
  policy_snap *s = p->pending;
  if (s == NULL)
    return;
  if (work(s) > 0)
    atomic_fetch_add(&n_helped, 1);
  s->p = NULL; /* every piece is claimed and written: p may change */
  p->pending = NULL;
  unref(s);
}

policy_snap *policy_snap_begin(policy *p) {
  return policy_snap_begin_ids(p, NULL, 0);
}

policy_snap *policy_snap_begin_ids(policy *p, const uint32_t *ids,
                                   uint32_t n_ids) {
  if (p == NULL || (ids != NULL && n_ids != p->n))
    return NULL;
  policy__settle(p); /* one owed snapshot at a time */
  policy_snap *s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;
  size_t room = 0;
  if (ids != NULL) {
    if ((s->ids = malloc((size_t)(n_ids ? n_ids : 1) * sizeof *ids)) == NULL) {
      free(s);
      return NULL;
    }
    memcpy(s->ids, ids, (size_t)n_ids * sizeof *ids);
    s->n_ids = n_ids;
    room = policy_ids_size(n_ids);
  }
  s->n = p->n;
  s->n_pieces = (p->n + SNAP_PIECE - 1) / SNAP_PIECE;
  s->head = policy__export_head(p, NULL);
  s->unit_max = policy__export_units_max(p);
  /* the pieces sit at fixed offsets, every one but the last whole: the
   * last ends at the n-th unit's place (not at a whole piece's, which for
   * a job of a few units was about 0.8 MB a snapshot, and what the store
   * counted for it) */
  s->cap = s->head + (size_t)s->n * s->unit_max + 8;
  s->room = room;
  s->len = calloc((size_t)s->n_pieces + 1, sizeof *s->len);
  if (s->len == NULL || s->cap > SIZE_MAX - room ||
      (s->buf = buf_get(s->cap + room, &s->buf_cap)) == NULL) {
    free(s->len);
    free(s->ids);
    free(s);
    return NULL;
  }
  if (pthread_mutex_init(&s->mu, NULL) != 0) {
    buf_put(s->buf, s->buf_cap);
    free(s->len);
    free(s->ids);
    free(s);
    return NULL;
  }
  if (pthread_cond_init(&s->cv, NULL) != 0) {
    pthread_mutex_destroy(&s->mu);
    buf_put(s->buf, s->buf_cap);
    free(s->len);
    free(s->ids);
    free(s);
    return NULL;
  }
  policy__export_head(p, s->buf);
  atomic_init(&s->refs, 2);
  atomic_init(&s->next, 0);
  atomic_init(&s->done, 0);
  s->p = p;
  s->step = p->last_step;
  p->pending = s;
  p->settle = policy__settle;
  atomic_fetch_add(&n_snaps, 1);
  return s;
}

policy_snap *policy_snap_ref(policy_snap *s) {
  if (s != NULL)
    atomic_fetch_add(&s->refs, 1);
  return s;
}

int policy_snap_unshared(const policy_snap *s) {
  return s != NULL && atomic_load(&((policy_snap *)s)->refs) == 1;
}

void policy_snap_fill(policy_snap *s) {
  if (s != NULL)
    claim(s);
}

uint64_t policy_snap_step(const policy_snap *s) { return s->step; }
size_t policy_snap_size(const policy_snap *s) { return s->cap + s->room; }

int policy_snap_take(policy_snap *s, void **buf, size_t *len) {
  if (s == NULL || buf == NULL || len == NULL)
    return GNMR_E_INVAL;
  *buf = NULL;
  *len = 0;
  if (s->taken)
    return GNMR_E_INVAL;
  work(s);
  size_t at = s->head; /* close the gaps, in order */
  for (uint32_t k = 0; k < s->n_pieces; k++) {
    if (at != piece_off(s, k))
      memmove(s->buf + at, s->buf + piece_off(s, k), s->len[k]);
    at += s->len[k];
  }
  policy__export_seal(s->buf, at + 8);
  if (s->ids != NULL) /* the table after the sealed bytes */
    policy_ids_write(s->buf + at + 8, s->ids, s->n_ids);
  s->taken = 1;
  *buf = s->buf; /* still the handle's: returned at the last unref */
  *len = at + 8 + s->room;
  return GNMR_OK;
}

void policy_snap_free(policy_snap **ps) {
  if (ps == NULL || *ps == NULL)
    return;
  unref(*ps);
  *ps = NULL;
}

void policy_snap_counts(uint64_t *snapshots, uint64_t *owner_helped) {
  if (snapshots != NULL)
    *snapshots = atomic_load(&n_snaps);
  if (owner_helped != NULL)
    *owner_helped = atomic_load(&n_helped);
}
