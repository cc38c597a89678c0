/* SPDX-License-Identifier: MIT */
/* core_priv.h — what core.c shares with core_restart.c. */
#ifndef GNMRD_CORE_PRIV_H
#define GNMRD_CORE_PRIV_H

#include "core.h"

/* A unit to register: its id and name (taken over on success). */
typedef struct new_unit {
  uint32_t id;
  char *name;
} new_unit;

/* qsort order of new_unit by id. */
int core__by_id(const void *a, const void *b);
/* Adds units (sorted by id, none known) to j's slots, all or nothing. */
int core__add_units(core_job *j, new_unit *add, uint32_t n_add);
/* Releases a pending step's held reports. */
void core__pending_clear(core_job *j, core_pending *p);

#endif /* GNMRD_CORE_PRIV_H */
