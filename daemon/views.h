/* SPDX-License-Identifier: MIT */
/* views.h — read-only views of a live job: the JSON that the admin
 * service answers (status, units, top) and the gauges of /metrics. Loop
 * thread only. */
#ifndef GNMRD_VIEWS_H
#define GNMRD_VIEWS_H

#include <jansson.h>
#include <stdint.h>

#include "core.h"

/* The parameters in force, every one by its table name; an unset
 * threshold reads as the one it inherits. */
json_t *views_params(const policy_params *p);
json_t *views_status(const core_job *c);
/* Every unit in id order (top 0), or the top units by score. kept: a
 * job read back from its last snapshot (finished, retired, or read with
 * gnmrctl --store), which holds no step's G, D or score: they are null,
 * and the top units are those promoted most (ties to the smaller id). */
json_t *views_units(const core_job *c, uint32_t top, int kept);

typedef struct view_gauges {
  uint64_t step;
  uint32_t active, units;
} view_gauges;
void views_gauges(const core_job *c, view_gauges *g);

#endif /* GNMRD_VIEWS_H */
