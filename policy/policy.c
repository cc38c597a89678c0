/* SPDX-License-Identifier: MIT */
/* policy.c — the GNMR engine, exactly as docs/policy.md specifies.
 * State is kept as arrays indexed by unit id, all sized outside the step;
 * policy_step() touches every unit once (O(U * window) for the window means,
 * computed in order oldest->newest as the spec reads) and selects the top
 * max_active of the pool with a bounded heap, O(|pool| log max_active). */
#include "policy.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "policy_priv.h"

/* The buffers of an engine for n units under params prm, allocated as one
 * set so that a change either fully happens or leaves the engine intact. */
typedef struct bufs {
  uint64_t *cnt, *promotions, *xend;
  double *sum, *win, *g, *d, *s, *med;
  uint32_t *win_len, *lock, *pool, *heap, *act, *prev_act, *xlen;
  uint32_t n; /* units: the stride of win */
  uint8_t *active, *chosen;
  policy_event *ev;
  /* the measured signal's, NULL while its rule is off */
  uint64_t *mcnt;
  double *msum, *mwin, *gm, *dm, *sm, *sn;
  uint32_t *mwin_len;
} bufs;

static void bufs_free_measure(bufs *b) {
  free(b->mcnt);
  free(b->msum);
  free(b->mwin);
  free(b->mwin_len);
  free(b->gm);
  free(b->dm);
  free(b->sm);
  free(b->sn);
}

static void bufs_free(bufs *b) {
  bufs_free_measure(b);
  free(b->cnt);
  free(b->promotions);
  free(b->xend);
  free(b->xlen);
  free(b->sum);
  free(b->win);
  free(b->g);
  free(b->d);
  free(b->s);
  free(b->med);
  free(b->win_len);
  free(b->lock);
  free(b->pool);
  free(b->heap);
  free(b->act);
  free(b->prev_act);
  free(b->active);
  free(b->chosen);
  free(b->ev);
  memset(b, 0, sizeof *b);
}

static uint32_t heap_cap(uint32_t max_active, uint32_t n) {
  return max_active < n ? max_active : n;
}

/* calloc with at least one element so that n == 0 still gives a pointer. */
static void *zalloc(size_t n, size_t size) { return calloc(n ? n : 1, size); }

/* meas: with the measured signal's state (policy__measure_on). */
static int bufs_alloc(bufs *b, uint32_t n, const policy_params *prm,
                      int meas) {
  memset(b, 0, sizeof *b);
  size_t wn = (size_t)n * prm->window;
  b->cnt = zalloc(n, sizeof *b->cnt);
  b->promotions = zalloc(n, sizeof *b->promotions);
  b->xend = zalloc(n, sizeof *b->xend);
  b->xlen = zalloc(n, sizeof *b->xlen);
  b->sum = zalloc(n, sizeof *b->sum);
  b->win = zalloc(wn, sizeof *b->win);
  b->g = zalloc(n, sizeof *b->g);
  b->d = zalloc(n, sizeof *b->d);
  b->s = zalloc(n, sizeof *b->s);
  b->med = zalloc(n, sizeof *b->med);
  b->win_len = zalloc(n, sizeof *b->win_len);
  b->n = n;
  b->lock = zalloc(n, sizeof *b->lock);
  b->pool = zalloc(n, sizeof *b->pool);
  b->heap = zalloc(heap_cap(prm->max_active, n), sizeof *b->heap);
  b->act = zalloc(n, sizeof *b->act);
  b->prev_act = zalloc(n, sizeof *b->prev_act);
  b->active = zalloc(n, sizeof *b->active);
  b->chosen = zalloc(n, sizeof *b->chosen);
  b->ev = zalloc(3 * (size_t)n + 1, sizeof *b->ev);
  int mok = 1;
  if (meas) {
    b->mcnt = zalloc(n, sizeof *b->mcnt);
    b->msum = zalloc(n, sizeof *b->msum);
    b->mwin = zalloc(wn, sizeof *b->mwin);
    b->mwin_len = zalloc(n, sizeof *b->mwin_len);
    b->gm = zalloc(n, sizeof *b->gm);
    b->dm = zalloc(n, sizeof *b->dm);
    b->sm = zalloc(n, sizeof *b->sm);
    b->sn = zalloc(n, sizeof *b->sn);
    mok = b->mcnt && b->msum && b->mwin && b->mwin_len && b->gm && b->dm &&
          b->sm && b->sn;
  }
  if (!b->cnt || !b->promotions || !b->xend || !b->xlen || !b->sum || !b->win || !b->g || !b->d ||
      !b->s || !b->med || !b->win_len || !b->lock || !b->pool ||
      !b->heap || !b->act || !b->prev_act || !b->active || !b->chosen ||
      !b->ev || !mok) {
    bufs_free(b);
    return GNMR_E_NOMEM;
  }
  for (uint32_t u = 0; u < n; u++)
    b->g[u] = b->d[u] = NAN;
  for (uint32_t u = 0; meas && u < n; u++)
    b->gm[u] = b->dm[u] = NAN;
  return GNMR_OK;
}

static void bufs_take(policy *p, bufs *b) {
  p->cnt = b->cnt;
  p->promotions = b->promotions;
  p->xend = b->xend;
  p->xlen = b->xlen;
  p->sum = b->sum;
  p->win = b->win;
  p->g = b->g;
  p->d = b->d;
  p->s = b->s;
  p->med = b->med;
  p->win_len = b->win_len;
  p->lock = b->lock;
  p->pool = b->pool;
  p->heap = b->heap;
  p->act = b->act;
  p->prev_act = b->prev_act;
  p->active = b->active;
  p->chosen = b->chosen;
  p->ev = b->ev;
  p->mcnt = b->mcnt;
  p->msum = b->msum;
  p->mwin = b->mwin;
  p->mwin_len = b->mwin_len;
  p->gm = b->gm;
  p->dm = b->dm;
  p->sm = b->sm;
  p->sn = b->sn;
}

static bufs bufs_of(policy *p) {
  bufs b = {0};
  b.cnt = p->cnt;
  b.promotions = p->promotions;
  b.xend = p->xend;
  b.sum = p->sum;
  b.win = p->win;
  b.g = p->g;
  b.d = p->d;
  b.s = p->s;
  b.med = p->med;
  b.win_len = p->win_len;
  b.lock = p->lock;
  b.pool = p->pool;
  b.heap = p->heap;
  b.act = p->act;
  b.prev_act = p->prev_act;
  b.xlen = p->xlen;
  b.n = p->n;
  b.active = p->active;
  b.chosen = p->chosen;
  b.ev = p->ev;
  b.mcnt = p->mcnt;
  b.msum = p->msum;
  b.mwin = p->mwin;
  b.mwin_len = p->mwin_len;
  b.gm = p->gm;
  b.dm = p->dm;
  b.sm = p->sm;
  b.sn = p->sn;
  return b;
}

/* Moves old unit u of p into new unit v of b (sized under prm), keeping
 * its ring's newest min(len, prm->window) values. */
static void copy_unit(bufs *b, uint32_t v, const policy *p, uint32_t u,
                      const policy_params *prm) {
  uint32_t ow = p->prm.window, nw = prm->window;
  b->cnt[v] = p->cnt[u];
  b->sum[v] = p->sum[u];
  b->promotions[v] = p->promotions[u];
  b->xend[v] = p->xend[u];
  b->xlen[v] = p->xlen[u];
  b->lock[v] = p->lock[u] > prm->lock_steps ? prm->lock_steps : p->lock[u];
  b->active[v] = p->active[u];
  b->g[v] = p->g[u];
  b->d[v] = p->d[u];
  b->s[v] = p->s[u];
  uint32_t len = p->win_len[u] < nw ? p->win_len[u] : nw;
  uint32_t from = p->win_len[u] - len; /* the newest len, oldest first */
  (void)ow;
  for (uint32_t i = 0; i < len; i++)
    b->win[(size_t)i * b->n + v] = *win_at(p, from + i, u);
  b->win_len[v] = len;
  if (b->mcnt == NULL || p->mcnt == NULL)
    return; /* the rule turned on starts with no history; off drops it */
  b->mcnt[v] = p->mcnt[u];
  b->msum[v] = p->msum[u];
  b->gm[v] = p->gm[u];
  b->dm[v] = p->dm[u];
  b->sm[v] = p->sm[u];
  b->sn[v] = p->sn[u];
  len = p->mwin_len[u] < nw ? p->mwin_len[u] : nw;
  from = p->mwin_len[u] - len;
  for (uint32_t i = 0; i < len; i++)
    b->mwin[(size_t)i * b->n + v] = p->mwin[(size_t)(from + i) * p->n + u];
  b->mwin_len[v] = len;
}

/* Moves the state of p's first min(p->n, n) units into b (sized for n units
 * under prm). */
static void bufs_copy_state(bufs *b, const policy *p, const policy_params *prm,
                            uint32_t n) {
  uint32_t keep = p->n < n ? p->n : n;
  for (uint32_t u = 0; u < keep; u++)
    copy_unit(b, u, p, u, prm);
}

/* Rebuilds the last active set (p->act, ascending) from the flags; between
 * steps p->act holds A_{t-1}, which the next step swaps into prev_act. */
void policy__rebuild_act(policy *p) {
  p->n_act = 0;
  for (uint32_t u = 0; u < p->n; u++)
    if (p->active[u])
      p->act[p->n_act++] = u;
}

int policy_create(const policy_params *params, uint32_t n_units,
                  policy **out) {
  int rv;
  policy *p = NULL;
  bufs b;
  if (out == NULL)
    return GNMR_E_INVAL;
  *out = NULL;
  if ((rv = policy_params_validate(params, NULL)) != GNMR_OK)
    return rv;
  if (n_units > POLICY_MAX_UNITS)
    return GNMR_E_RANGE;
  if ((p = calloc(1, sizeof *p)) == NULL)
    return GNMR_E_NOMEM;
  if ((rv = bufs_alloc(&b, n_units, params, 0)) != GNMR_OK) {
    free(p);
    return rv;
  }
  bufs_take(p, &b);
  p->prm = *params;
  p->n = n_units;
  *out = p;
  return GNMR_OK;
}

void policy_destroy(policy **pp) {
  if (pp == NULL || *pp == NULL)
    return;
  policy__settle_owed(*pp);
  bufs b = bufs_of(*pp);
  bufs_free(&b);
  free(*pp);
  *pp = NULL;
}

static int reshape(policy *p, const policy_params *prm, uint32_t n) {
  bufs nb, ob;
  policy__settle_owed(p);
  /* the measure's state goes with its rule; a rule turned on starts
   * with none, made at its first measure */
  int rv = bufs_alloc(&nb, n, prm,
                      p->sm != NULL && policy_params_measured(prm));
  if (rv != GNMR_OK)
    return rv;
  bufs_copy_state(&nb, p, prm, n);
  ob = bufs_of(p);
  bufs_free(&ob);
  bufs_take(p, &nb);
  p->prm = *prm;
  p->n = n;
  policy__rebuild_act(p);
  return GNMR_OK;
}

int policy_set_params(policy *p, const policy_params *params) {
  int rv;
  if (p == NULL)
    return GNMR_E_INVAL;
  if ((rv = policy_params_validate(params, NULL)) != GNMR_OK)
    return rv;
  return reshape(p, params, p->n);
}

int policy_resize(policy *p, uint32_t n_units) {
  if (p == NULL || n_units < p->n)
    return GNMR_E_INVAL;
  if (n_units > POLICY_MAX_UNITS)
    return GNMR_E_RANGE;
  if (n_units == p->n)
    return GNMR_OK;
  return reshape(p, &p->prm, n_units);
}

int policy_remap(policy *p, uint32_t n_units, const uint32_t *to) {
  if (p == NULL || (to == NULL && p->n > 0))
    return GNMR_E_INVAL;
  if (n_units > POLICY_MAX_UNITS)
    return GNMR_E_RANGE;
  uint8_t *taken = zalloc(n_units, 1);
  if (taken == NULL)
    return GNMR_E_NOMEM;
  for (uint32_t u = 0; u < p->n; u++) {
    if (to[u] == UINT32_MAX)
      continue;
    if (to[u] >= n_units || taken[to[u]]) {
      free(taken);
      return GNMR_E_INVAL;
    }
    taken[to[u]] = 1;
  }
  free(taken);
  policy__settle_owed(p);
  bufs nb, ob;
  int rv = bufs_alloc(&nb, n_units, &p->prm, p->sm != NULL);
  if (rv != GNMR_OK)
    return rv;
  for (uint32_t u = 0; u < p->n; u++)
    if (to[u] != UINT32_MAX)
      copy_unit(&nb, to[u], p, u, &p->prm);
  ob = bufs_of(p);
  bufs_free(&ob);
  bufs_take(p, &nb);
  p->n = n_units;
  policy__rebuild_act(p);
  return GNMR_OK;
}

const policy_params *policy_get_params(const policy *p) { return &p->prm; }
uint32_t policy_units(const policy *p) { return p->n; }
uint64_t policy_last_step(const policy *p) { return p->last_step; }

int policy_unit(const policy *p, uint32_t u, policy_unit_info *info) {
  if (p == NULL || info == NULL)
    return GNMR_E_INVAL;
  if (u >= p->n)
    return GNMR_E_NOUNIT;
  info->cnt = p->cnt[u];
  info->mean = p->cnt[u] ? p->sum[u] / (double)p->cnt[u] : NAN;
  info->last_g = p->g[u];
  info->last_d = p->d[u];
  info->last_s = p->s[u];
  info->lock = p->lock[u];
  info->active = p->active[u];
  info->promotions = p->promotions[u];
  info->mcnt = p->mcnt ? p->mcnt[u] : 0;
  info->mmean = info->mcnt ? p->msum[u] / (double)info->mcnt : NAN;
  info->last_gm = p->gm ? p->gm[u] : NAN;
  info->last_dm = p->dm ? p->dm[u] : NAN;
  info->last_sm = p->sm ? p->sm[u] : 0;
  return GNMR_OK;
}

/* Ranking of the spec: higher score first, ties to the smaller unit id.
 * +inf compares above every finite score; scores are never NaN. */
static int ranks_above(const double *s, uint32_t a, uint32_t b) {
  return s[a] > s[b] || (s[a] == s[b] && a < b);
}

/* Min-heap on rank: heap[0] is the lowest-ranked of the kept units. */
static void heap_sift_down(uint32_t *h, uint32_t n, uint32_t i,
                           const double *s) {
  for (;;) {
    uint32_t l = 2 * i + 1, r = l + 1, lo = i;
    if (l < n && ranks_above(s, h[lo], h[l]))
      lo = l;
    if (r < n && ranks_above(s, h[lo], h[r]))
      lo = r;
    if (lo == i)
      return;
    uint32_t t = h[i];
    h[i] = h[lo];
    h[lo] = t;
    i = lo;
  }
}

/* 1 / len for len a power of two (exact). */
static inline double inv_pow2(uint32_t len) {
  uint64_t bits = (uint64_t)(1023 - __builtin_ctz(len)) << 52;
  double v;
  memcpy(&v, &bits, sizeof v);
  return v;
}

double policy__exact_recip(double x) {
  uint64_t bits;
  memcpy(&bits, &x, sizeof bits);
  uint64_t e = bits >> 52; /* sign and exponent */
  if ((bits & ((1ull << 52) - 1)) != 0 || e < 1 || e > 2045)
    return 0; /* not +2^k, or 2^-k not normal (e = 0: subnormal or 0) */
  bits = (2046 - e) << 52;
  double r;
  memcpy(&r, &bits, sizeof r);
  return r;
}

/* g over the mean of unit u's len window values (stored by age at c + u,
 * stride n), summed oldest to newest: the spec's Delta ratio. */
static double delta_of(double g, const double *c, uint32_t len, uint32_t n) {
  if (len == 0)
    return 1;
  double acc = 0;
  for (uint32_t k = 0; k < len; k++)
    acc += c[(size_t)k * n];
  /* x / 2^k and x * 2^-k round the same exact value: identical bits
   * (subnormals too), without a division */
  return g / ((len & (len - 1)) == 0 ? acc * inv_pow2(len) : acc / len);
}

/* Adds a finite value x > 0 to a mean of *cnt values summing to *sum, as
 * the mean horizon says (docs/policy.md). */
static void mean_add(uint64_t *cnt, double *sum, double x, uint64_t h) {
  if (h != 0 && *cnt >= h) {
    /* the mean's weight stays at cnt: the newest value replaces 1/cnt of
     * the sum (docs/policy.md, mean_horizon) */
    *sum = (*sum - *sum / (double)*cnt) + x;
  } else {
    *sum += x;
    *cnt += 1;
  }
}

/* Scores unit u for step t with thresholds (a, b); updates its statistics
 * as steps 1-3 of the spec say. Returns the score. */
static double score_unit(policy *p, uint32_t u, double n, double a,
                         double b) {
  p->g[u] = p->d[u] = NAN;
  if (n == 0)
    return 0; /* idle unit: no update */
  if (!isfinite(n))
    return INFINITY; /* non-finite: no update */
  double s = 0;
  if (p->cnt[u] > 0) {
    double m = p->sum[u] / (double)p->cnt[u];
    double g = n / m, d = delta_of(g, p->win + u, p->win_len[u], p->n);
    /* fmax: a NaN d (only from inf/inf after float overflow) yields g/a. */
    s = fmax(g / a, d / b);
    win_push(p, u, g);
    p->g[u] = g;
    p->d[u] = d;
  }
  mean_add(&p->cnt[u], &p->sum[u], n, p->prm.mean_horizon);
  return s;
}

/* The measured signal's score of ratios gm, dm under thresholds a, b, a
 * zero threshold leaving its term out; a NaN dm yields gm's term. */
static double measure_terms(double gm, double dm, double a, double b) {
  return fmax(a > 0 ? gm / a : 0, b > 0 ? dm / b : 0);
}

/* Scores unit u's measure x at step t (docs/policy.md, "Measured signal")
 * and updates its statistics; the measure's state is as the norm's. */
static double score_measure(policy *p, uint32_t u, double x) {
  p->gm[u] = p->dm[u] = NAN;
  if (isnan(x) || x == 0)
    return 0; /* not measured, or exact: no update */
  if (isinf(x))
    return INFINITY;
  double s = 0;
  if (p->mcnt[u] > 0) {
    double g = x / (p->msum[u] / (double)p->mcnt[u]);
    double d = delta_of(g, p->mwin + u, p->mwin_len[u], p->n);
    s = measure_terms(g, d, p->prm.measure_alpha, p->prm.measure_beta);
    ring_push(p, p->mwin, p->mwin_len, u, g);
    p->gm[u] = g;
    p->dm[u] = d;
  }
  mean_add(&p->mcnt[u], &p->msum[u], x, p->prm.mean_horizon);
  return s;
}

int policy__measure_on(policy *p) {
  if (p->sm != NULL)
    return GNMR_OK;
  bufs nb, ob;
  policy__settle_owed(p);
  int rv = bufs_alloc(&nb, p->n, &p->prm, 1);
  if (rv != GNMR_OK)
    return rv;
  bufs_copy_state(&nb, p, &p->prm, p->n); /* the norms' state; no measure */
  ob = bufs_of(p);
  bufs_free(&ob);
  bufs_take(p, &nb);
  for (uint32_t u = 0; u < p->n; u++)
    p->sn[u] = p->s[u];
  policy__rebuild_act(p);
  return GNMR_OK;
}

double policy_measure_bound(const policy *p, uint32_t u) {
  if (p == NULL || u >= p->n || p->mcnt == NULL || p->mcnt[u] == 0)
    return INFINITY;
  double m = p->msum[u] / (double)p->mcnt[u], am = p->prm.measure_alpha,
         bm = p->prm.measure_beta, ba = am > 0 ? m * am : INFINITY;
  uint32_t len = p->mwin_len[u];
  if (bm > 0) { /* d = (x / m) / mean(win) > bm */
    double mw = len ? 1 / delta_of(1, p->mwin + u, len, p->n) : 1;
    double bb = m * mw * bm;
    if (bb < ba)
      ba = bb;
  }
  return ba;
}

/* Whether an exceedance of u needs no confirmation: a non-finite score,
 * or the measured signal's score above 1 (docs/policy.md). */
static int at_once(const policy *p, uint32_t u, double s) {
  return isinf(s) || (p->sm != NULL && p->sm[u] > 1);
}

/* Unit u's final score s at step t (prev: the step decided before it, 0
 * before the first): an exceedance (s > 1) extends its run of steps in a
 * row that exceeded; returns whether u is risky: s > 1 and, unless it
 * needs no confirmation (at_once), the run has lasted confirm_steps steps
 * (docs/policy.md; 0 and 1: at once, the plain rule). Once per unit and
 * step. */
static int exceed(policy *p, uint32_t u, uint64_t prev, uint64_t t,
                  double s) {
  if (!(s > 1))
    return 0;
  uint32_t len = p->xend[u] == prev && prev != 0 ? p->xlen[u] : 0;
  p->xlen[u] = len < UINT32_MAX ? len + 1 : len;
  p->xend[u] = t;
  return at_once(p, u, s) || p->xlen[u] >= p->prm.confirm_steps;
}

/* Whether u is risky at step t, after exceed() took its score. */
static int risky_at(const policy *p, uint32_t u, uint64_t t) {
  double s = p->s[u];
  return s > 1 && p->xend[u] == t &&
         (at_once(p, u, s) || p->xlen[u] >= p->prm.confirm_steps);
}

static void emit(policy *p, policy_result *res, uint8_t kind, uint32_t unit,
                 uint8_t outcome, uint32_t count) {
  policy_event *e = &p->ev[res->n_events++];
  e->unit = unit;
  e->kind = kind;
  e->outcome = outcome;
  e->signal = 0;
  e->count = count;
}

/* An EXCEED event of unit u, with the signal(s) whose final score is
 * above 1 (the norm's alone while the measured rule is off). */
static void emit_exceed(policy *p, policy_result *res, uint32_t u,
                        uint8_t outcome) {
  emit(p, res, POLICY_EV_EXCEED, u, outcome, 0);
  p->ev[res->n_events - 1].signal =
      p->sm == NULL ? POLICY_SIGNAL_NORM
                    : (uint8_t)((p->sn[u] > 1 ? POLICY_SIGNAL_NORM : 0) |
                                (p->sm[u] > 1 ? POLICY_SIGNAL_MEASURE : 0));
}

const char *policy_signal_name(int signal) {
  switch (signal) {
  case POLICY_SIGNAL_NORM:
    return "norm";
  case POLICY_SIGNAL_MEASURE:
    return "measure";
  case POLICY_SIGNAL_NORM | POLICY_SIGNAL_MEASURE:
    return "norm+measure";
  default:
    return "";
  }
}

/* The job-relative rule (docs/policy.md): every unit's step is scored, its
 * g and d in p->g, p->d (NaN where none) and the candidates (s > 1 by the
 * plain thresholds, or locked) in p->pool[0..n_cand). Finds the lower
 * medians Mg, Md of the step's g and (non-NaN) d, rescores the candidates
 * when either is above 1, and keeps those still risky or locked; returns
 * the pool's size. No candidate, or both medians at or below 1: the
 * scores are the plain rule's. */
/* max(1, the lower median) of a step's ratios g (NaN: none) and of the
 * non-NaN d beside them, into *mg and *md (docs/policy.md, J = 1).
 * max(1, lower median) is 1 exactly when at least k + 1 of the values
 * (k = (count - 1) / 2, the median's 0-based rank) are <= 1: one counting
 * pass, and a selection only on a step where the job rose. */
static void step_medians(policy *p, const double *gv, const double *dv,
                         double *mg, double *md) {
  size_t c[4];
  policy__median_counts(gv, dv, p->n, c);
  size_t ng = c[0], lg = c[1], nd = c[2], ld = c[3];
  /* one value is its own median: a job of one unit keeps the plain rule.
   * A median above 1 is the (k - below)-th smallest of the values above
   * 1 (k its rank among all, below of them at or below 1): only those are
   * gathered and selected among, about half a step's values. */
  *mg = *md = 1;
  if (ng > 1 && lg < (ng - 1) / 2 + 1) {
    size_t m = policy__above_one(gv, gv, p->n, p->med);
    *mg = policy__kth(p->med, m, (ng - 1) / 2 - lg); /* > 1 here */
  }
  if (nd > 1 && ld < (nd - 1) / 2 + 1) {
    size_t m = policy__above_one(dv, gv, p->n, p->med);
    *md = policy__kth(p->med, m, (nd - 1) / 2 - ld);
  }
}

static uint32_t relative_pool(policy *p, policy_result *res, double a,
                              double b, int warm, uint32_t n_cand,
                              uint32_t *n_risky, uint64_t prev, uint64_t t) {
  if (n_cand == 0)
    return 0; /* nothing the medians could change */
  double mg, md, mgm = 1, mdm = 1;
  step_medians(p, p->g, p->d, &mg, &md);
  if (p->sm != NULL)
    step_medians(p, p->gm, p->dm, &mgm, &mdm);
  if (mg > 1 || md > 1 || mgm > 1 || mdm > 1) {
    double ta = a * mg, tb = b * md;
    double tam = p->prm.measure_alpha * mgm, tbm = p->prm.measure_beta * mdm;
    for (uint32_t i = 0; i < n_cand; i++) {
      uint32_t u = p->pool[i];
      if (p->sm == NULL) {
        if (!isnan(p->g[u]))
          p->s[u] = fmax(p->g[u] / ta, p->d[u] / tb);
        continue;
      }
      if (!isnan(p->g[u]))
        p->sn[u] = fmax(p->g[u] / ta, p->d[u] / tb);
      if (!isnan(p->gm[u]))
        p->sm[u] = measure_terms(p->gm[u], p->dm[u], tam, tbm);
      p->s[u] = fmax(p->sn[u], p->sm[u]);
    }
  }
  uint32_t n_pool = 0;
  for (uint32_t i = 0; i < n_cand; i++) {
    uint32_t u = p->pool[i];
    int risky = exceed(p, u, prev, t, p->s[u]);
    *n_risky += risky;
    if (warm) {
      if (risky)
        emit_exceed(p, res, u, POLICY_OUT_WARMUP);
    } else if (risky || p->lock[u] > 0) {
      p->pool[n_pool++] = u;
    }
  }
  return n_pool;
}

/* Event bound: per unit at most one of MISSING, or NONFINITE + EXCEED, or
 * EXCEED (2 per unit); promote + demote together at most one per unit;
 * one BUDGET_SATURATED: 3n + 1 in all, the size of p->ev. */
/* Selection: the whole pool when it fits, else the top K by a bounded
 * min-heap over the pool (already in ascending id order); the chosen
 * units are marked in p->chosen. */
static void select_top(policy *p, uint32_t n_pool) {
  uint32_t k = heap_cap(p->prm.max_active, n_pool);
  if (k == n_pool) {
    for (uint32_t i = 0; i < n_pool; i++)
      p->chosen[p->pool[i]] = 1;
  } else if (k > 0) {
    memcpy(p->heap, p->pool, k * sizeof *p->heap);
    for (uint32_t i = k / 2; i-- > 0;)
      heap_sift_down(p->heap, k, i, p->s);
    for (uint32_t i = k; i < n_pool; i++) {
      if (ranks_above(p->s, p->pool[i], p->heap[0])) {
        p->heap[0] = p->pool[i];
        heap_sift_down(p->heap, k, 0, p->s);
      }
    }
    for (uint32_t i = 0; i < k; i++)
      p->chosen[p->heap[i]] = 1;
  }
}

/* A_t in ascending order, exceed outcomes, and the lock rule. Every unit
 * the lock rule can change (in A_t, or lock > 0) is in the pool. */
static void apply_locks(policy *p, policy_result *res, uint32_t n_pool,
                        uint64_t t, int warm) {
  uint32_t *prev = p->act; /* A_t is written into the old prev buffer */
  p->act = p->prev_act;
  p->prev_act = prev;
  p->n_prev = p->n_act;
  p->n_act = 0;
  for (uint32_t i = 0; i < n_pool; i++) {
    uint32_t u = p->pool[i];
    int risky = risky_at(p, u, t), in_a = p->chosen[u];
    if (in_a)
      p->act[p->n_act++] = u;
    if (risky)
      emit_exceed(p, res, u, in_a ? POLICY_OUT_SELECTED : POLICY_OUT_DROPPED);
    if (in_a && risky)
      p->lock[u] = p->prm.lock_steps;
    else if (p->lock[u] > 0 && !risky)
      p->lock[u]--;
    p->chosen[u] = 0;
  }
  if (!warm && n_pool > p->prm.max_active)
    emit(p, res, POLICY_EV_BUDGET_SATURATED, UINT32_MAX, POLICY_OUT_NONE,
         n_pool);
}

/* Promote/demote by merging the sorted A_{t-1} and A_t. */
static void promote_demote(policy *p, policy_result *res) {
  uint32_t i = 0, j = 0;
  while (i < p->n_prev || j < p->n_act) {
    uint32_t pu = i < p->n_prev ? p->prev_act[i] : UINT32_MAX;
    uint32_t au = j < p->n_act ? p->act[j] : UINT32_MAX;
    if (pu == au) {
      i++;
      j++;
    } else if (pu < au) {
      emit(p, res, POLICY_EV_DEMOTE, pu, POLICY_OUT_NONE, 0);
      p->active[pu] = 0;
      i++;
    } else {
      emit(p, res, POLICY_EV_PROMOTE, au, POLICY_OUT_NONE, 0);
      p->active[au] = 1;
      p->promotions[au]++;
      j++;
    }
  }
}

int policy_step(policy *p, uint64_t t, const double *norm,
                const uint8_t *input, policy_result *res) {
  return policy_step_measured(p, t, norm, input, NULL, res);
}

/* The step's input checked (a negative norm or measure, an unknown input
 * kind: GNMR_E_INVAL) and, at the measured rule's first measure, its state
 * made; *measure NULL while the rule is off. */
static int step_input(policy *p, const double *norm, const uint8_t *input,
                      const double **measure) {
  /* a negative finite norm, or an unknown input kind (several units at a
   * time, policy_simd.c) */
  int bad = policy__bad_norms(norm, input, p->n);
  for (uint32_t u = 0; *measure != NULL && !bad && u < p->n; u++)
    bad = (*measure)[u] < 0;
  if (bad)
    return GNMR_E_INVAL;
  if (!policy_params_measured(&p->prm))
    *measure = NULL; /* the rule is off */
  else if (*measure != NULL && p->sm == NULL)
    /* the first measure: the rule's state is made now (an engine that is
     * never given one keeps the norms' cost, its SIMD path included) */
    return policy__measure_on(p);
  return GNMR_OK;
}

/* What one step shares between its phases. */
typedef struct step_ctx {
  uint64_t t, before; /* the step, and the step decided before it */
  double a, b;        /* the thresholds in force */
  int warm, rel;
  uint32_t n_pool, n_risky;
} step_ctx;

/* Every unit's score (steps 1-3 of the spec, the measure's beside) and,
 * but under the job-relative rule (decided after its medians), whether
 * it is risky and in the pool. */
static void score_all(policy *p, step_ctx *c, const double *norm,
                      const uint8_t *input, const double *measure,
                      policy_result *res) {
  uint32_t w = p->prm.window, simd_start = 0, simd_end = 0, simd_done = 0;
  /* policy_simd.c; its blocks know nothing of a measure: off with the
   * measured rule's state (docs/benchmarks.md has the cost) */
  int simd = policy_simd_get() != POLICY_SIMD_OFF && p->sm == NULL;
  policy__consts kc = {c->a, c->b, (w & (w - 1)) == 0 ? inv_pow2(w) : 0,
                       policy__exact_recip(c->a), policy__exact_recip(c->b)};
  for (uint32_t u = 0; u < p->n; u++) {
    double s = 0;
    if (u >= simd_end && simd) { /* steady units several at a time */
      /* quiet blocks (no score above 1, no lock: nothing to add) are
       * skipped whole; u comes back at the first other block, or the end */
      uint32_t k;
      u = policy__score_blocks(p, u, norm, input, &kc, &k, &simd_done);
      if (u >= p->n)
        break;
      simd_start = u;
      simd_end = u + k;
    }
    uint8_t in = input ? input[u] : POLICY_REPORTED;
    if (u < simd_end && (simd_done >> (u - simd_start) & 1)) {
      s = p->s[u];
      if (isinf(s))
        emit(p, res, POLICY_EV_NONFINITE, u, POLICY_OUT_NONE, 0);
    } else if (in != POLICY_REPORTED) {
      p->g[u] = p->d[u] = NAN;
      if (in == POLICY_MISSING)
        emit(p, res, POLICY_EV_MISSING, u, POLICY_OUT_NONE, 0);
    } else {
      s = score_unit(p, u, norm[u], c->a, c->b);
      if (isinf(s))
        emit(p, res, POLICY_EV_NONFINITE, u, POLICY_OUT_NONE, 0);
    }
    if (p->sm != NULL) { /* the measured signal: s the larger score */
      p->sn[u] = s;
      p->sm[u] = in == POLICY_REPORTED
                     ? score_measure(p, u, measure ? measure[u] : NAN)
                     : (p->gm[u] = p->dm[u] = NAN, 0);
      s = fmax(s, p->sm[u]);
    }
    p->s[u] = s;
    if (c->rel) { /* decided after the medians: s can only go down */
      if (s > 1 || p->lock[u] > 0)
        p->pool[c->n_pool++] = u;
      continue;
    }
    int risky = exceed(p, u, c->before, c->t, s);
    c->n_risky += risky;
    if (c->warm) {
      if (risky)
        emit_exceed(p, res, u, POLICY_OUT_WARMUP);
    } else if (risky || p->lock[u] > 0) {
      p->pool[c->n_pool++] = u;
    }
  }
}

int policy_step_measured(policy *p, uint64_t t, const double *norm,
                         const uint8_t *input, const double *measure,
                         policy_result *res) {
  if (p == NULL || res == NULL || t == 0 || (norm == NULL && p->n > 0))
    return GNMR_E_INVAL;
  int rv = step_input(p, norm, input, &measure);
  if (rv != GNMR_OK)
    return rv;
  policy__settle_owed(p); /* a snapshot still owed is of the state before t */
  const policy_params *prm = &p->prm;
  int early = t <= prm->early_steps;
  step_ctx c = {
      .t = t,
      .before = p->last_step,
      .a = early && !isnan(prm->early_alpha) ? prm->early_alpha : prm->alpha,
      .b = early && !isnan(prm->early_beta) ? prm->early_beta : prm->beta,
      .warm = t <= prm->warmup_steps,
      .rel = prm->job_relative != 0,
  };
  memset(res, 0, sizeof *res);
  res->step = t;
  score_all(p, &c, norm, input, measure, res);
  if (c.rel)
    c.n_pool = relative_pool(p, res, c.a, c.b, c.warm, c.n_pool,
                             &c.n_risky, c.before, t);

  select_top(p, c.n_pool);
  apply_locks(p, res, c.n_pool, t, c.warm);
  promote_demote(p, res);
  assert(res->n_events <= 3 * (size_t)p->n + 1);

  p->last_step = t;
  res->active = p->act;
  res->n_active = p->n_act;
  res->n_risky = c.n_risky;
  res->n_pool = c.n_pool;
  res->g = p->g;
  res->d = p->d;
  res->s = p->s;
  res->gm = p->gm;
  res->dm = p->dm;
  res->sm = p->sm;
  res->events = p->ev;
  return GNMR_OK;
}

const char *policy_event_name(int kind) {
  switch (kind) {
#define POLICY__EV_CASE(id, v, name)                                         \
  case POLICY_EV_##id:                                                       \
    return name;
    POLICY_EVENTS(POLICY__EV_CASE)
#undef POLICY__EV_CASE
  default:
    return "unknown";
  }
}

const char *policy_outcome_name(int outcome) {
  static const char *const names[] = {"", "selected", "dropped", "warmup"};
  if (outcome < 0 || outcome > POLICY_OUT_WARMUP)
    return "unknown";
  return names[outcome];
}
