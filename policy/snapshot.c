/* SPDX-License-Identifier: MIT */
/* snapshot.c — the engine's whole state as a versioned, checksummed byte
 * string (policy_export / policy_import, policy.h): what gnmrd stores to
 * resume a job. Import never trusts its input: every count and value is
 * checked before use. */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "policy_priv.h"

/* Layout (little-endian): "GNMRPOL1", u32 format version, u32 n_units,
 * f64 alpha, beta, early_alpha, early_beta, u32 window, max_active,
 * lock_steps, u64 warmup_steps, early_steps, last_step, from version 3
 * on u64 mean_horizon, u32 job_relative (versions 1 and 2 read as 0),
 * from version 4 on u32 confirm_steps (earlier ones read as 0), from
 * version 5 on f64 measure_alpha, measure_beta, u32 same_step (earlier:
 * 0, the measured rule and the same-step mode off), u32 measured (1: the
 * units' measure state follows; an engine makes it at its first measure);
 * then per unit u64 cnt, f64 sum, u64 promotions, u32 lock, u8
 * active, u32 win_len, win_len x f64 (oldest first), from version 4 on u64
 * xend, u32 xlen (its run of exceedances), and, when measured is 1, u64
 * mcnt, f64 msum, u32 mwin_len, mwin_len x f64 (the measure's statistics
 * and window); then a u64 checksum of everything before:
 * version 1, FNV-1a over bytes; from version 2 on, FNV-1a over 64-bit
 * words in four interleaved lanes, folded (sum64 below). Version 5 is
 * written; import reads all five. */
#define SNAP_MAGIC "GNMRPOL1"
#define SNAP_VERSION 5u
#define SNAP_HEAD2 (8 + 4 + 4 + 4 * 8 + 3 * 4 + 3 * 8)
#define SNAP_HEAD3 (SNAP_HEAD2 + 8 + 4)
#define SNAP_HEAD4 (SNAP_HEAD3 + 4)
#define SNAP_HEAD (SNAP_HEAD4 + 2 * 8 + 4 + 4)
#define SNAP_UNIT3 (8 + 8 + 8 + 4 + 1 + 4)
#define SNAP_UNIT (SNAP_UNIT3 + 8 + 4)
#define SNAP_MUNIT (8 + 8 + 4) /* the measure's, before its window */

typedef struct wbuf {
  uint8_t *p;
  size_t len;
} wbuf;

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SNAP_HOST_LE 1
#else
#define SNAP_HOST_LE 0
#endif

static void put_u64(wbuf *w, uint64_t v) {
  if (SNAP_HOST_LE) {
    memcpy(w->p + w->len, &v, 8);
    w->len += 8;
    return;
  }
  for (int i = 0; i < 8; i++)
    w->p[w->len++] = (uint8_t)(v >> (8 * i));
}
static void put_u32(wbuf *w, uint32_t v) {
  if (SNAP_HOST_LE) {
    memcpy(w->p + w->len, &v, 4);
    w->len += 4;
    return;
  }
  for (int i = 0; i < 4; i++)
    w->p[w->len++] = (uint8_t)(v >> (8 * i));
}
static void put_f64(wbuf *w, double v) {
  uint64_t u;
  memcpy(&u, &v, sizeof u);
  put_u64(w, u);
}

typedef struct rbuf {
  const uint8_t *p;
  size_t len, off;
  int bad;
} rbuf;

static uint64_t get_n(rbuf *r, int bytes) {
  uint64_t v = 0;
  if (r->bad || r->len - r->off < (size_t)bytes) {
    r->bad = 1;
    return 0;
  }
  for (int i = 0; i < bytes; i++)
    v |= (uint64_t)r->p[r->off++] << (8 * i);
  return v;
}
static uint64_t get_u64(rbuf *r) { return get_n(r, 8); }
static uint32_t get_u32(rbuf *r) { return (uint32_t)get_n(r, 4); }
static double get_f64(rbuf *r) {
  uint64_t u = get_u64(r);
  double v;
  memcpy(&v, &u, sizeof v);
  return v;
}

#define FNV_OFFSET 1469598103934665603ull
#define FNV_PRIME 1099511628211ull

static uint64_t fnv1a(const uint8_t *p, size_t n) {
  uint64_t h = FNV_OFFSET;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= FNV_PRIME;
  }
  return h;
}

static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  if (SNAP_HOST_LE) {
    memcpy(&v, p, 8);
    return v;
  }
  for (int i = 0; i < 8; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Version 2's checksum: word k of the input (little-endian, the tail
 * zero-padded) goes to lane k % 4 as FNV-1a over words; the four lanes
 * and the length are then folded by FNV-1a over words. Four independent
 * multiply chains instead of one per byte: about 30x faster. */
static uint64_t sum64(const uint8_t *p, size_t n) {
  uint64_t h[4] = {FNV_OFFSET, FNV_OFFSET ^ 1, FNV_OFFSET ^ 2,
                   FNV_OFFSET ^ 3};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 4; l++)
      h[l] = (h[l] ^ le64(p + i + 8 * l)) * FNV_PRIME;
  for (int l = 0; i < n; i += 8, l++) {
    uint8_t tail[8] = {0};
    memcpy(tail, p + i, n - i < 8 ? n - i : 8);
    h[l] = (h[l] ^ le64(tail)) * FNV_PRIME;
  }
  uint64_t f = FNV_OFFSET;
  for (int l = 0; l < 4; l++)
    f = (f ^ h[l]) * FNV_PRIME;
  return (f ^ (uint64_t)n) * FNV_PRIME;
}

size_t policy_export_size(const policy *p) {
  size_t n = SNAP_HEAD + (size_t)p->n * SNAP_UNIT + 8;
  for (uint32_t u = 0; u < p->n; u++)
    n += (size_t)p->win_len[u] * 8;
  if (p->mcnt != NULL) {
    n += (size_t)p->n * SNAP_MUNIT;
    for (uint32_t u = 0; u < p->n; u++)
      n += (size_t)p->mwin_len[u] * 8;
  }
  return n;
}

size_t policy__export_units_max(const policy *p) {
  return SNAP_UNIT + 8 * (size_t)p->prm.window +
         (p->mcnt != NULL ? SNAP_MUNIT + 8 * (size_t)p->prm.window : 0);
}

size_t policy__export_head(const policy *p, uint8_t *out) {
  if (out == NULL)
    return SNAP_HEAD;
  wbuf w = {out, 0};
  const policy_params *prm = &p->prm;
  memcpy(w.p, SNAP_MAGIC, 8);
  w.len = 8;
  put_u32(&w, SNAP_VERSION);
  put_u32(&w, p->n);
  put_f64(&w, prm->alpha);
  put_f64(&w, prm->beta);
  put_f64(&w, prm->early_alpha);
  put_f64(&w, prm->early_beta);
  put_u32(&w, prm->window);
  put_u32(&w, prm->max_active);
  put_u32(&w, prm->lock_steps);
  put_u64(&w, prm->warmup_steps);
  put_u64(&w, prm->early_steps);
  put_u64(&w, p->last_step);
  put_u64(&w, prm->mean_horizon);
  put_u32(&w, prm->job_relative);
  put_u32(&w, prm->confirm_steps);
  put_f64(&w, prm->measure_alpha);
  put_f64(&w, prm->measure_beta);
  put_u32(&w, prm->same_step);
  put_u32(&w, p->mcnt != NULL);
  assert(w.len == SNAP_HEAD);
  return w.len;
}

size_t policy__export_units(const policy *p, uint32_t u0, uint32_t u1,
                            uint8_t *out) {
  wbuf w = {out, 0};
  for (uint32_t u = u0; u < u1; u++) {
    uint32_t wl = p->win_len[u];
    put_u64(&w, p->cnt[u]);
    put_f64(&w, p->sum[u]);
    put_u64(&w, p->promotions[u]);
    put_u32(&w, p->lock[u]);
    w.p[w.len++] = p->active[u];
    put_u32(&w, wl);
    for (uint32_t k = 0; k < wl; k++)
      put_f64(&w, *win_at(p, k, u));
    put_u64(&w, p->xend[u]);
    put_u32(&w, p->xlen[u]);
    if (p->mcnt == NULL)
      continue;
    wl = p->mwin_len[u];
    put_u64(&w, p->mcnt[u]);
    put_f64(&w, p->msum[u]);
    put_u32(&w, wl);
    for (uint32_t k = 0; k < wl; k++)
      put_f64(&w, p->mwin[(size_t)k * p->n + u]);
  }
  return w.len;
}

void policy__export_seal(uint8_t *buf, size_t len) {
  wbuf w = {buf, len - 8};
  put_u64(&w, sum64(buf, len - 8));
}

int policy_export(const policy *p, void *buf, size_t cap, size_t *len) {
  if (p == NULL || buf == NULL)
    return GNMR_E_INVAL;
  size_t need = policy_export_size(p);
  if (cap < need)
    return GNMR_E_RANGE;
  uint8_t *out = buf;
  size_t off = policy__export_head(p, out);
  off += policy__export_units(p, 0, p->n, out + off);
  assert(off + 8 == need);
  policy__export_seal(out, need);
  if (len != NULL)
    *len = need;
  return GNMR_OK;
}

/* Unit u's measured-signal state from r; whether it holds together. */
static int import_measure(policy *p, rbuf *r, uint32_t u) {
  p->mcnt[u] = get_u64(r);
  p->msum[u] = get_f64(r);
  uint32_t wl = get_u32(r);
  if (r->bad || wl > p->prm.window || !(p->msum[u] >= 0) ||
      (p->mcnt[u] == 0 && p->msum[u] != 0))
    return 0;
  for (uint32_t k = 0; k < wl; k++) {
    double v = get_f64(r);
    if (!(v >= 0))
      return 0;
    p->mwin[(size_t)k * p->n + u] = v;
  }
  p->mwin_len[u] = wl;
  return !r->bad;
}

int policy_import(const void *buf, size_t len, policy **out) {
  int rv;
  policy_params prm;
  policy *p = NULL;
  memset(&prm, 0, sizeof prm); /* every field is read below */
  if (out == NULL)
    return GNMR_E_INVAL;
  *out = NULL;
  if (buf == NULL || len < SNAP_HEAD2 + 8 ||
      memcmp(buf, SNAP_MAGIC, 8) != 0)
    return GNMR_E_PARSE;
  uint64_t sum;
  rbuf tail = {(const uint8_t *)buf, len, len - 8, 0};
  sum = get_u64(&tail);
  rbuf r = {(const uint8_t *)buf, len - 8, 8, 0};
  uint32_t version = get_u32(&r);
  if (version < 1 || version > SNAP_VERSION)
    return sum == sum64(buf, len - 8) || sum == fnv1a(buf, len - 8)
               ? GNMR_E_VERSION
               : GNMR_E_PARSE;
  if (sum != (version == 1 ? fnv1a(buf, len - 8) : sum64(buf, len - 8)))
    return GNMR_E_PARSE;
  uint32_t n = get_u32(&r);
  prm.alpha = get_f64(&r);
  prm.beta = get_f64(&r);
  prm.early_alpha = get_f64(&r);
  prm.early_beta = get_f64(&r);
  prm.window = get_u32(&r);
  prm.max_active = get_u32(&r);
  prm.lock_steps = get_u32(&r);
  prm.warmup_steps = get_u64(&r);
  prm.early_steps = get_u64(&r);
  uint64_t last = get_u64(&r);
  prm.mean_horizon = version >= 3 ? get_u64(&r) : 0;
  prm.job_relative = version >= 3 ? get_u32(&r) : 0;
  prm.confirm_steps = version >= 4 ? get_u32(&r) : 0;
  prm.measure_alpha = version >= 5 ? get_f64(&r) : 0;
  prm.measure_beta = version >= 5 ? get_f64(&r) : 0;
  prm.same_step = version >= 5 ? get_u32(&r) : 0;
  uint32_t measured = version >= 5 ? get_u32(&r) : 0;
  size_t unit_min = version >= 4 ? SNAP_UNIT : SNAP_UNIT3;
  if (measured > 1 || (measured && !policy_params_measured(&prm)))
    return GNMR_E_PARSE; /* a measure's state without its rule */
  if (measured)
    unit_min += SNAP_MUNIT;
  if (r.bad || n > POLICY_MAX_UNITS ||
      (r.len - r.off) / unit_min < n)
    return GNMR_E_PARSE;
  if ((rv = policy_create(&prm, n, &p)) != GNMR_OK)
    return rv;
  if (measured && (rv = policy__measure_on(p)) != GNMR_OK) {
    policy_destroy(&p);
    return rv;
  }
  p->last_step = last;
  for (uint32_t u = 0; u < n && !r.bad; u++) {
    p->cnt[u] = get_u64(&r);
    p->sum[u] = get_f64(&r);
    p->promotions[u] = get_u64(&r);
    p->lock[u] = get_u32(&r);
    p->active[u] = (uint8_t)get_n(&r, 1);
    uint32_t wl = get_u32(&r);
    if (wl > prm.window || p->active[u] > 1 || p->lock[u] > prm.lock_steps ||
        !(p->sum[u] >= 0) || (p->cnt[u] == 0 && p->sum[u] != 0)) {
      r.bad = 1;
      break;
    }
    for (uint32_t k = 0; k < wl; k++) {
      double v = get_f64(&r);
      if (!(v >= 0)) /* GNMR values are positive; NaN fails too */
        r.bad = 1;
      *win_at(p, k, u) = v;
    }
    p->win_len[u] = wl;
    if (version >= 4) {
      p->xend[u] = get_u64(&r);
      p->xlen[u] = get_u32(&r);
      /* a run ends at a decided step, and is as long as the steps to it */
      if (p->xend[u] > last || (p->xend[u] == 0) != (p->xlen[u] == 0) ||
          p->xlen[u] > p->xend[u])
        r.bad = 1;
    }
    if (p->mcnt != NULL && !r.bad)
      r.bad = !import_measure(p, &r, u);
  }
  if (r.bad || r.off != r.len) {
    policy_destroy(&p);
    return GNMR_E_PARSE;
  }
  policy__rebuild_act(p);
  *out = p;
  return GNMR_OK;
}

/* ---- the unit id table after an export ----------------------------------- */

#define IDS_MAGIC "GNMRSID1"

size_t policy_ids_size(uint32_t n) { return (size_t)n * 4 + 4 + 8; }

void policy_ids_write(void *out, const uint32_t *ids, uint32_t n) {
  uint8_t *o = out;
  for (uint32_t i = 0; i <= n; i++) {
    uint32_t v = i < n ? ids[i] : n;
    for (int k = 0; k < 4; k++)
      *o++ = (uint8_t)(v >> (8 * k));
  }
  memcpy(o, IDS_MAGIC, 8);
}

int policy_ids_split(const void *blob, size_t len, size_t *pol_len,
                     uint32_t **ids, uint32_t *n_ids) {
  const uint8_t *b = blob;
  *ids = NULL;
  *n_ids = 0;
  *pol_len = len;
  if (len < 12 || memcmp(b + len - 8, IDS_MAGIC, 8) != 0)
    return GNMR_OK;
  uint32_t n = 0;
  for (int k = 0; k < 4; k++)
    n |= (uint32_t)b[len - 12 + k] << (8 * k);
  if ((uint64_t)n * 4 + 12 > len)
    return GNMR_E_PARSE;
  size_t at = len - 12 - (size_t)n * 4;
  uint32_t *v = malloc((n ? n : 1) * sizeof *v);
  if (v == NULL)
    return GNMR_E_NOMEM;
  for (uint32_t i = 0; i < n; i++) {
    v[i] = 0;
    for (int k = 0; k < 4; k++)
      v[i] |= (uint32_t)b[at + 4 * (size_t)i + k] << (8 * k);
    if (v[i] == UINT32_MAX || (i > 0 && v[i] <= v[i - 1])) {
      free(v);
      return GNMR_E_PARSE; /* ids are ascending and below UINT32_MAX */
    }
  }
  *ids = v;
  *n_ids = n;
  *pol_len = at;
  return GNMR_OK;
}
