/* SPDX-License-Identifier: MIT */
/* policy_priv.h — the engine's state, shared by its step (policy.c) and
 * its snapshot format (snapshot.c). */
#ifndef GNMR_POLICY_PRIV_H
#define GNMR_POLICY_PRIV_H

#include "policy.h"

struct policy {
  policy_params prm;
  uint32_t n;          /* units */
  uint64_t last_step;  /* 0 before the first step */

  /* per-unit statistics */
  uint64_t *cnt;
  double *sum;
  /* Each unit's window, oldest first, stored by age: the k-th oldest
   * value of unit u is win[k * n + u] (win_at), so the k-th oldest of
   * consecutive units are consecutive and a block of units reads and
   * shifts its windows with plain vector loads and stores. */
  double *win;         /* prm.window * n */
  uint32_t *win_len;   /* values held, <= prm.window */
  uint32_t *lock;
  uint8_t *active;     /* in the last step's active set */
  uint64_t *promotions;
  /* confirm_steps (docs/policy.md): the step of each unit's newest
   * exceedance (0: none), and how many steps in a row, up to it, it
   * exceeded (a run that ended shows as xend below the last step) */
  uint64_t *xend;
  uint32_t *xlen;
  /* the measured signal (docs/policy.md): made at the first measure the
   * engine is given while its rule is on (policy_params_measured), NULL
   * before and while the rule is off. Its statistics and window as the
   * norm's (mwin by age, as win); sn holds the norm's part of s. */
  uint64_t *mcnt;
  double *msum, *mwin;
  uint32_t *mwin_len;
  double *gm, *dm, *sm, *sn;

  /* per-step outputs and scratch */
  double *g, *d, *s;
  double *med;         /* n: the job-relative rule's scratch */
  uint32_t *pool;      /* n: P_t in ascending unit order */
  uint32_t *heap;      /* min(max_active, n) */
  uint8_t *chosen;     /* n: scratch flag, all zero between steps */
  uint32_t *act;       /* n: A_t ascending */
  uint32_t *prev_act;  /* n: A_{t-1} ascending */
  uint32_t n_act, n_prev;
  policy_event *ev;    /* 3n + 1, see policy_step() */
  policy_snap *pending;/* a snapshot owed (snapshot_async.c), or NULL */
  /* what serializes it (set with pending, by snapshot_async.c): the
   * engine calls it through here, so policy.c does not call up into the
   * snapshot code that calls it */
  void (*settle)(struct policy *);
};

/* The k-th oldest value of unit u's window (k < win_len[u]). */
static inline double *win_at(const policy *p, uint32_t k, uint32_t u) {
  return p->win + (size_t)k * p->n + u;
}

/* Appends g as unit u's newest value of a window stored by age (win, its
 * lengths win_len); a full window drops its oldest. */
static inline void ring_push(policy *p, double *win, uint32_t *win_len,
                             uint32_t u, double g) {
  uint32_t len = win_len[u], w = p->prm.window;
  size_t st = p->n;
  double *c = win + u;
  if (len < w) {
    c[len * st] = g;
    win_len[u] = len + 1;
    return;
  }
  for (uint32_t k = 0; k + 1 < w; k++)
    c[k * st] = c[(k + 1) * st];
  c[(w - 1) * st] = g;
}

static inline void win_push(policy *p, uint32_t u, double g) {
  ring_push(p, p->win, p->win_len, u, g);
}

/* Before any change of p's state: serializes a snapshot still owed. */
void policy__settle(policy *p);
/* The same from the engine (policy.c), through the hook. */
static inline void policy__settle_owed(policy *p) {
  if (p->pending != NULL)
    p->settle(p);
}
/* policy_export() in pieces (snapshot.c), for snapshot_async.c: the
 * header (out NULL: only its size), units [u0, u1) (at most
 * policy__export_units_max() bytes each), then the checksum over
 * everything before the last 8 of len bytes. */
size_t policy__export_head(const policy *p, uint8_t *out);
size_t policy__export_units_max(const policy *p);
size_t policy__export_units(const policy *p, uint32_t u0, uint32_t u1,
                            uint8_t *out);
void policy__export_seal(uint8_t *buf, size_t len);

/* A step's constants for the steady blocks: thresholds a, b; inv =
 * 1/window, ia = 1/a, ib = 1/b where that divisor is a power of two whose
 * reciprocal is normal (then x / 2^k and x * 2^-k round the same exact
 * value: identical bits, subnormals included), else 0 (divide). */
typedef struct policy__consts {
  double a, b, inv, ia, ib;
} policy__consts;

/* policy_step's check of its input: whether any x[i] is below 0 and
 * above -inf where in[i] is POLICY_REPORTED (every i when in is NULL), or
 * any in[i] is not an input kind (policy_simd.c: as many at a time as the
 * SIMD level allows). */
int policy__bad_norms(const double *x, const uint8_t *in, uint32_t n);

/* The job-relative rule's counts over a step's g[0..n) and d[0..n)
 * (NaN: none): c[0] the g that are not NaN, c[1] of them those <= 1,
 * c[2] the d not NaN where g is not either, c[3] of them those <= 1
 * (policy_simd.c: 8 at a time with AVX-512). */
void policy__median_counts(const double *g, const double *d, uint32_t n,
                           size_t c[4]);
/* Copies into out (n places) the v[i] > 1 whose g[i] is not NaN, in
 * order; returns how many. */
size_t policy__above_one(const double *v, const double *g, uint32_t n,
                         double *out);

/* The ceil(n/2)-th smallest of v[0..n) (n > 0, no NaN; v is reordered):
 * median.c. */
double policy__lower_median(double *v, size_t n);
/* The k-th smallest (0-based) of v[0..n) (NaN when k >= n); v is
 * reordered. No NaN in v. */
double policy__kth(double *v, size_t n, size_t k);

/* 1/x when x is a power of two with a normal reciprocal, else 0. */
double policy__exact_recip(double x);

/* Scores blocks of steady units from u on (policy_simd.c: 8 units with
 * AVX-512, 4 with AVX2), as long as each is quiet (every lane steady, no
 * score above 1, no lock: nothing else to do for it). Returns the first
 * unit not in a quiet block (p->n at the end), with that block's length
 * in *len (0: no SIMD block there; score the unit the scalar way) and in
 * *done the lanes it scored (bit i: unit + i; statistics updated, score
 * in p->s); the caller scores the others the scalar way, in unit order. */
uint32_t policy__score_blocks(policy *p, uint32_t u, const double *norm,
                              const uint8_t *input, const policy__consts *k,
                              uint32_t *len, uint32_t *done);

/* Makes the measured signal's state (no history; policy.c) if it has
 * none: at an engine's first measure, or an import that has some. Nothing
 * changes on error (GNMR_E_NOMEM). */
int policy__measure_on(policy *p);

/* Rebuilds the last active set (p->act, ascending) from the flags. */
void policy__rebuild_act(policy *p);

#endif /* GNMR_POLICY_PRIV_H */
