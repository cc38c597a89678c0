/* SPDX-License-Identifier: MIT */
/* agent_internal.h — what the agent offers its CUDA backend. */
#ifndef GNMR_AGENT_INTERNAL_H
#define GNMR_AGENT_INTERNAL_H

#include <stdint.h>

#include "gnmr/agent.h"

uint32_t gnmr__agent_n_units(const gnmr_agent *a);
/* Whether a is the copy in the child of a fork (agent.c): its threads and
 * devices' streams are the parent's. */
int gnmr__agent_forked(const gnmr_agent *a);
/* The training thread starts step: GNMR_E_INVAL unless it is above the
 * last one; 1 for an observer (nothing to reduce), else GNMR_OK. */
int gnmr__agent_begin_step(gnmr_agent *a, uint64_t step);
/* Queues the result of step from any thread (seen[u] == 0: unit u not
 * reported). */
int gnmr__agent_queue_seen(gnmr_agent *a, uint64_t step, const double *sumsq,
                           const uint64_t *nonfinite, const uint8_t *seen);

#endif /* GNMR_AGENT_INTERNAL_H */
