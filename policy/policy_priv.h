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
  double *win;         /* n * prm.window, ring per unit */
  uint32_t *win_len;
  uint32_t *win_head;  /* next write position in the unit's ring */
  uint32_t *lock;
  uint8_t *active;     /* in the last step's active set */
  uint64_t *promotions;

  /* per-step outputs and scratch */
  double *g, *d, *s;
  uint32_t *pool;      /* n: P_t in ascending unit order */
  uint32_t *heap;      /* min(max_active, n) */
  uint8_t *chosen;     /* n: scratch flag, all zero between steps */
  uint32_t *act;       /* n: A_t ascending */
  uint32_t *prev_act;  /* n: A_{t-1} ascending */
  uint32_t n_act, n_prev;
  policy_event *ev;    /* 3n + 1, see policy_step() */
  policy_snap *pending;/* a snapshot owed (snapshot_async.c), or NULL */
};

/* The oldest slot of a ring of w slots holding len values, next write at
 * head. */
static inline uint32_t ring_oldest(uint32_t head, uint32_t len, uint32_t w) {
  return head >= len ? head - len : head + w - len; /* (head + w - len) % w */
}

/* Before any change of p's state: serializes a snapshot still owed. */
void policy__settle(policy *p);
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

/* 1/x when x is a power of two with a normal reciprocal, else 0. */
double policy__exact_recip(double x);

/* Scores the steady units of the block at u (policy_simd.c) with k:
 * returns the block's length (0: no SIMD in use, or the block runs past
 * the last unit) and in *done the lanes it scored (bit i: unit u + i; its
 * statistics updated, its score in p->s). The other lanes are untouched:
 * the caller scores them the scalar way, in unit order as always. *quiet:
 * every lane done, none scored above 1 and none locked, so nothing else to
 * do for the block. */
uint32_t policy__score_block(policy *p, uint32_t u, const double *norm,
                             const uint8_t *input, const policy__consts *k,
                             uint32_t *done, int *quiet);

/* Rebuilds the last active set (p->act, ascending) from the flags. */
void policy__rebuild_act(policy *p);

#endif /* GNMR_POLICY_PRIV_H */
