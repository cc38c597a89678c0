/* SPDX-License-Identifier: MIT */
/* replay.h — runs the policy over a parsed trace, writing the decisions CSV
 * of docs/policy.md and, optionally, the per-step scores CSV. Shared by
 * `gnmrctl replay` and the tests. */
#ifndef GNMR_REPLAY_H
#define GNMR_REPLAY_H

#include <stdio.h>

#include "policy.h"
#include "trace.h"

/* Header of the scores CSV: one row per step for every risky unit
 * (outcome selected, dropped or warmup) and every unit kept in the active
 * set by its lock alone (outcome held). */
#define GNMR_SCORES_HEADER "step,unit,norm,g,d,s,outcome"
/* the columns a measured trace adds: the unit's measure, its ratio and
 * Delta ratio, and which signal made it risky (docs/policy.md) */
#define GNMR_SCORES_MEASURED ",measure,gm,dm,signal"

/* Parameter changes during a replay: from step `step` on, `prm` (as
 * `gnmrctl set` made them live: a change recorded with from_step S
 * applies before step S is decided). Steps ascending. */
typedef struct gnmr_schedule_entry {
  uint64_t step;
  policy_params prm;
} gnmr_schedule_entry;

typedef struct gnmr_schedule {
  gnmr_schedule_entry *e;
  size_t n;
} gnmr_schedule;

/* Replays t under prm, switching parameters where sched says (sched may
 * be NULL). decisions receives the decisions CSV; scores (may be NULL) the
 * scores CSV. Returns 0, a policy error, or GNMR_E_IO when a write fails.
 * Does not close either stream. */
int gnmr__replay(const trace *t, const policy_params *prm,
                 const gnmr_schedule *sched, FILE *decisions, FILE *scores);

/* Writes an active set as the decisions CSV's "step,ids" row. */
void gnmr__write_decision_row(FILE *f, uint64_t step, const uint32_t *ids,
                              uint32_t n);

#endif /* GNMR_REPLAY_H */
