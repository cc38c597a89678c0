/* SPDX-License-Identifier: MIT */
/* decision.h — a decided step's Decision message: its active set, the
 * run's durable mark, this gnmrd's term, the seal an agent hands back
 * after a restart, and the risky units with their scores (decision.c).
 * jobs.c sends the bytes to every rank and observer. Loop thread only. */
#ifndef GNMRD_DECISION_H
#define GNMRD_DECISION_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "jobs_priv.h"

/* The step's Decision, encoded (*buf malloc'd). GNMR_E_NOMEM. */
int decision_encode(job *j, const core_outcome *o, uint8_t **buf, size_t *len);
/* A decision an agent held across a restart (sealed by this store's key,
 * checked), sent again to the ranks still waiting for its step: with the
 * mark and term of now. */
int decision_encode_held(job *j, const Gnmr__Decision *kept, uint8_t **buf,
                         size_t *len);

#endif /* GNMRD_DECISION_H */
