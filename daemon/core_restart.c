/* SPDX-License-Identifier: MIT */
/* core_restart.c — a job coming back after gnmrd restarted (see core.h):
 * its units, ranks and engine from the store, and the steps decided
 * before the restart, which stay decided. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "core_priv.h"
#include "gnmr/error.h"

int core_restart_adopt_decided(core_job *j, uint64_t step) {
  if (step <= j->last_decided)
    return 0;
  uint32_t k = 0;
  while (k < j->n_pend && j->pend[k].step <= step)
    core__pending_clear(j, &j->pend[k++]); /* their reports are late now */
  memmove(&j->pend[0], &j->pend[k], (j->n_pend - k) * sizeof j->pend[0]);
  memset(&j->pend[j->n_pend - k], 0, k * sizeof j->pend[0]);
  j->n_pend -= k;
  j->last_decided = step;
  return 1;
}

int core_restart_restore(core_job *j, policy *pol, const uint32_t *pol_ids,
                         uint32_t n_units, const uint32_t *unit_ids,
                         char *const *unit_names, uint32_t n_ranks,
                         const uint32_t *rank_n, uint32_t *const *rank_ids) {
  assert(j->n_units == 0 && n_ranks <= j->reporters);
  new_unit *add = malloc((n_units ? n_units : 1) * sizeof *add);
  uint32_t n_add = 0;
  if (add == NULL) {
    policy_destroy(&pol);
    return GNMR_E_NOMEM;
  }
  for (uint32_t i = 0; i < n_units; i++) {
    if (unit_ids[i] == UINT32_MAX || unit_names[i] == NULL ||
        hmap_get(&j->unit_ids, unit_names[i], strlen(unit_names[i]), NULL))
      continue;
    add[n_add].id = unit_ids[i];
    if ((add[n_add].name = strdup(unit_names[i])) == NULL)
      break;
    n_add++;
  }
  qsort(add, n_add, sizeof *add, core__by_id);
  uint32_t keep = 0; /* drop repeated ids */
  for (uint32_t i = 0; i < n_add; i++) {
    if (keep > 0 && add[keep - 1].id == add[i].id) {
      free(add[i].name);
      continue;
    }
    add[keep++] = add[i];
  }
  int rv = core__add_units(j, add, keep);
  if (rv != GNMR_OK) {
    for (uint32_t i = 0; i < keep; i++)
      free(add[i].name);
    free(add);
    policy_destroy(&pol);
    return rv;
  }
  free(add);
  if (pol != NULL) { /* the snapshot's units to their slots */
    uint32_t pn = policy_units(pol);
    uint32_t *to = malloc((pn ? pn : 1) * sizeof *to);
    if (to == NULL) {
      policy_destroy(&pol);
      return GNMR_E_NOMEM;
    }
    for (uint32_t u = 0; u < pn; u++)
      to[u] = core_slot(j, pol_ids ? pol_ids[u] : u);
    rv = policy_remap(pol, j->n_units, to);
    free(to);
    if (rv != GNMR_OK) {
      policy_destroy(&pol);
      return rv;
    }
    policy_destroy(&j->pol);
    j->pol = pol;
    j->params = *policy_get_params(pol);
  } else if (policy_resize(j->pol, j->n_units) != GNMR_OK) {
    return GNMR_E_NOMEM;
  }
  j->last_decided = policy_last_step(j->pol);
  for (uint32_t r = 0; r < j->reporters; r++)
    j->ranks[r].last_step = UINT64_MAX; /* a rejoining rank's lower step
                                           restarts training */
  for (uint32_t r = 0; r < n_ranks; r++) {
    core_rank *rr = &j->ranks[r];
    uint32_t n = rank_n[r];
    if (n == 0 || (rr->ids = malloc(n * sizeof *rr->ids)) == NULL ||
        (rr->slots = malloc(n * sizeof *rr->slots)) == NULL) {
      free(rr->ids);
      rr->ids = NULL;
      continue;
    }
    int bad = 0;
    for (uint32_t i = 0; i < n && !bad; i++) {
      rr->ids[i] = rank_ids[r][i];
      rr->slots[i] = core_slot(j, rank_ids[r][i]);
      bad = rr->slots[i] == UINT32_MAX;
    }
    if (bad) { /* a unit the store does not have: not registered */
      free(rr->ids);
      free(rr->slots);
      rr->ids = rr->slots = NULL;
      continue;
    }
    rr->n_units = n;
    rr->ever = 1;
    for (uint32_t i = 0; i < n; i++)
      j->shards[rr->slots[i]]++;
  }
  return GNMR_OK;
}
