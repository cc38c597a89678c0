/* SPDX-License-Identifier: MIT */
/* core.c — gnmrd's decision core (see core.h). Invariants: steps are
 * decided in increasing order; partial sums are added in rank order at
 * decision time, never in arrival order, so a decision does not depend on
 * network timing; a pass publishes each step at most once. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "core_priv.h"
#include "gnmr/error.h"

/* ---- registry ----------------------------------------------------------------- */

core_job *core_find(const core_registry *reg, const char *name) {
  uint64_t v;
  return hmap_get(&reg->jobs, name, strlen(name), &v) ? (core_job *)(uintptr_t)v
                                                       : NULL;
}

core_job *core_next_job(const core_registry *reg, size_t *pos) {
  uint64_t v;
  return hmap_next(&reg->jobs, pos, NULL, NULL, &v) ? (core_job *)(uintptr_t)v
                                                     : NULL;
}

size_t core_count(const core_registry *reg) { return reg->jobs.live; }

core_job *core_job_new(core_registry *reg, const char *name,
                       const policy_params *prm, uint32_t reporters,
                       uint32_t barrier_ms, void (*release)(void *owner)) {
  assert(reporters > 0 && core_find(reg, name) == NULL);
  core_job *j = calloc(1, sizeof *j);
  if (j == NULL)
    return NULL;
  j->pass = 1;
  /* the map's keys are the names in unit_names: one copy of each, kept
   * for the job's life (units are never removed from a job) */
  j->unit_ids.borrowed = 1;
  j->unit_ids.keyed = 1; /* names a peer chose */
  j->hello_params = *prm;
  j->params = *prm;
  j->reporters = reporters;
  j->barrier_ms = barrier_ms;
  j->max_units = POLICY_MAX_UNITS;
  j->release = release;
  j->name = strdup(name);
  j->ranks = calloc(reporters, sizeof *j->ranks);
  if (j->name == NULL || j->ranks == NULL ||
      policy_create(prm, 0, &j->pol) != GNMR_OK ||
      hmap_put(&reg->jobs, name, strlen(name), (uintptr_t)j) != GNMR_OK) {
    policy_destroy(&j->pol);
    free(j->name);
    free(j->ranks);
    free(j);
    return NULL;
  }
  return j;
}

void core__pending_clear(core_job *j, core_pending *p) {
  for (uint32_t r = 0; p->by_rank != NULL && r < j->reporters; r++)
    if (p->by_rank[r].owner != NULL && j->release != NULL)
      j->release(p->by_rank[r].owner);
  free(p->by_rank);
  memset(p, 0, sizeof *p);
}

static void rank_free(core_rank *rr) {
  free(rr->conn);
  free(rr->ids);
  free(rr->slots);
  free(rr->user);
  free(rr->instance);
  memset(rr, 0, sizeof *rr);
}

void core_job_free(core_registry *reg, core_job **jp) {
  core_job *j = *jp;
  if (j == NULL)
    return;
  *jp = NULL;
  if (reg != NULL) {
    uint64_t v;
    if (hmap_get(&reg->jobs, j->name, strlen(j->name), &v) &&
        (core_job *)(uintptr_t)v == j)
      hmap_del(&reg->jobs, j->name, strlen(j->name));
  }
  for (uint32_t r = 0; r < j->reporters; r++)
    rank_free(&j->ranks[r]);
  for (uint32_t o = 0; o < j->n_observers; o++)
    rank_free(&j->observers[o]);
  for (uint32_t i = 0; i < j->n_pend; i++)
    core__pending_clear(j, &j->pend[i]);
  for (uint32_t u = 0; u < j->n_units; u++)
    free(j->unit_names[u]);
  free(j->observers);
  free(j->unit_names);
  free(j->unit_id);
  free(j->act_ids);
  free(j->shards);
  free(j->ranks);
  free(j->norm);
  free(j->acc);
  free(j->input);
  free(j->got);
  free(j->nrc);
  free(j->nfc);
  free(j->shd);
  free(j->mis);
  free(j->part);
  free(j->tch);
  free(j->meas);
  hmap_clear(&j->unit_ids);
  policy_destroy(&j->pol);
  free(j->name);
  free(j->owner);
  free(j);
}

void core_registry_clear(core_registry *reg) {
  size_t pos = 0;
  core_job *j;
  /* core_job_free() deletes from the map: collect first */
  size_t n = reg->jobs.live, k = 0;
  core_job **all = malloc((n ? n : 1) * sizeof *all);
  while (all != NULL && (j = core_next_job(reg, &pos)) != NULL)
    all[k++] = j;
  for (size_t i = 0; i < k; i++)
    core_job_free(NULL, &all[i]);
  free(all);
  hmap_clear(&reg->jobs);
}

/* ---- units -------------------------------------------------------------------- */

/* Grows the per-unit arrays to hold n units. */
static int reserve_units(core_job *j, uint32_t n) {
  if (n <= j->cap_units)
    return GNMR_OK;
  uint32_t cap = j->cap_units ? j->cap_units : 64;
  while (cap < n)
    cap *= 2;
#define GROW(field)                                                   \
  do {                                                                \
    void *p = realloc(j->field, (size_t)cap * sizeof *j->field);      \
    if (p == NULL)                                                    \
      return GNMR_E_NOMEM;                                            \
    j->field = p;                                                     \
  } while (0)
  GROW(unit_id);
  GROW(unit_names);
  GROW(shards);
  GROW(act_ids);
  GROW(norm);
  GROW(acc);
  GROW(input);
  GROW(got);
  GROW(nrc);
  GROW(nfc);
  GROW(shd);
  GROW(mis);
  GROW(part);
  GROW(tch);
  GROW(meas);
#undef GROW
  j->cap_units = cap;
  return GNMR_OK;
}

uint32_t core_slot(const core_job *j, uint32_t id) {
  if (id < j->n_units && j->unit_id[id] == id)
    return id; /* ids 0..n-1 in order: the usual job */
  uint32_t lo = 0, hi = j->n_units;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (j->unit_id[mid] < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < j->n_units && j->unit_id[lo] == id ? lo : UINT32_MAX;
}

int core_dense(const core_job *j) {
  return j->n_units == 0 || j->unit_id[j->n_units - 1] == j->n_units - 1;
}

/* A unit to add: its id, its name (a copy), where it came in the call. */

int core__by_id(const void *a, const void *b) {
  uint32_t x = ((const new_unit *)a)->id, y = ((const new_unit *)b)->id;
  return x < y ? -1 : x > y;
}

/* Adds units (sorted by id, none known) to j's slots, all or nothing:
 * merges them into the ascending id order, moving the engine's units
 * (policy_remap) only when one falls between existing ids. Every
 * registration's slots follow. The names are taken over on success. */
int core__add_units(core_job *j, new_unit *add, uint32_t n_add) {
  uint32_t old_n = j->n_units, total = old_n + n_add;
  int append = old_n == 0 || n_add == 0 || add[0].id > j->unit_id[old_n - 1];
  uint32_t *to = NULL, *nid = NULL, *nsh = NULL;
  char **nnames = NULL;
  if (reserve_units(j, total) != GNMR_OK)
    return GNMR_E_NOMEM;
  if (!append &&
      ((to = malloc((old_n ? old_n : 1) * sizeof *to)) == NULL ||
       (nid = malloc((size_t)j->cap_units * sizeof *nid)) == NULL ||
       (nsh = malloc((size_t)j->cap_units * sizeof *nsh)) == NULL ||
       (nnames = malloc((size_t)j->cap_units * sizeof *nnames)) == NULL))
    goto nomem;
  if (hmap_reserve(&j->unit_ids, n_add) != GNMR_OK)
    goto nomem;
  for (uint32_t i = 0; i < n_add; i++)
    if (hmap_add(&j->unit_ids, add[i].name, strlen(add[i].name), add[i].id) !=
        GNMR_OK) {
      for (uint32_t k = 0; k < i; k++)
        hmap_del(&j->unit_ids, add[k].name, strlen(add[k].name));
      goto nomem;
    }
  if (append) {
    if (policy_resize(j->pol, total) != GNMR_OK)
      goto unput;
    for (uint32_t i = 0; i < n_add; i++) {
      j->unit_id[old_n + i] = add[i].id;
      j->unit_names[old_n + i] = add[i].name;
      j->shards[old_n + i] = 0;
    }
    j->n_units = total;
    return GNMR_OK;
  }
  /* merge the two ascending lists */
  uint32_t a = 0, b = 0;
  for (uint32_t k = 0; k < total; k++) {
    if (b == n_add || (a < old_n && j->unit_id[a] < add[b].id)) {
      to[a] = k;
      nid[k] = j->unit_id[a];
      nnames[k] = j->unit_names[a];
      nsh[k] = j->shards[a];
      a++;
    } else {
      nid[k] = add[b].id;
      nnames[k] = add[b].name;
      nsh[k] = 0;
      b++;
    }
  }
  if (policy_remap(j->pol, total, to) != GNMR_OK)
    goto unput;
  free(j->unit_id);
  free(j->unit_names);
  free(j->shards);
  j->unit_id = nid;
  j->unit_names = nnames;
  j->shards = nsh;
  j->n_units = total;
  for (uint32_t r = 0; r < j->reporters + j->n_observers; r++) {
    core_rank *rr = r < j->reporters ? &j->ranks[r]
                                     : &j->observers[r - j->reporters];
    for (uint32_t i = 0; rr->slots != NULL && i < rr->n_units; i++)
      rr->slots[i] = to[rr->slots[i]];
  }
  free(to);
  return GNMR_OK;
unput:
  for (uint32_t k = 0; k < n_add; k++)
    hmap_del(&j->unit_ids, add[k].name, strlen(add[k].name));
nomem:
  free(to);
  free(nid);
  free(nsh);
  free(nnames);
  return GNMR_E_NOMEM;
}

/* Pass 1 and 2 of a registration: each name's id (the job's, the one
 * asked for, or the next free one after every requested id), known[i]
 * when the job has the name, changing nothing in the job. *n_add: the
 * new names. GNMR_OK, or the error with why. */
static int decide_ids(const core_job *j, const char *const *names, size_t n,
                      const uint32_t *req_ids, uint32_t *ids,
                      unsigned char *known, uint32_t *n_add, char *why,
                      size_t whylen) {
  /* names in one call are distinct (validate_hello checks it); requested
   * ids are checked against each other once sorted */
  uint32_t n_auto = 0;
  uint64_t next = j->n_units ? (uint64_t)j->unit_id[j->n_units - 1] + 1 : 0;
  *n_add = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t v;
    const char *nm = names[i];
    uint32_t req = req_ids ? req_ids[i] : 0;
    if (hmap_get(&j->unit_ids, nm, strlen(nm), &v)) {
      if (req_ids && req != v) {
        snprintf(why, whylen, "unit '%.64s' has id %u in this job, not %u",
                 nm, (uint32_t)v, req);
        return GNMR_E_MISMATCH;
      }
      ids[i] = (uint32_t)v;
      known[i] = 1;
      continue;
    }
    if (req_ids) {
      if (req == UINT32_MAX) {
        snprintf(why, whylen, "unit id %u is reserved", req);
        return GNMR_E_RANGE;
      }
      if (core_slot(j, req) != UINT32_MAX) {
        snprintf(why, whylen, "unit id %u is already taken (asked for "
                              "'%.64s')", req, nm);
        return GNMR_E_MISMATCH;
      }
      ids[i] = req;
      if ((uint64_t)req + 1 > next)
        next = (uint64_t)req + 1;
    } else {
      ids[i] = UINT32_MAX; /* numbered after every requested id */
      n_auto++;
    }
    (*n_add)++;
  }
  if ((uint64_t)j->n_units + *n_add > j->max_units) {
    snprintf(why, whylen, "a job has at most %u units", j->max_units);
    return GNMR_E_RANGE;
  }
  if (next + n_auto > UINT32_MAX) {
    snprintf(why, whylen, "no unit ids left after %llu",
             (unsigned long long)next - 1);
    return GNMR_E_RANGE;
  }
  for (size_t i = 0; i < n; i++) /* pass 2: the new units, numbered */
    if (!known[i] && ids[i] == UINT32_MAX)
      ids[i] = (uint32_t)next++;
  return GNMR_OK;
}

/* The new units (names copied) in ascending id order in add[0..*n_add);
 * two new names asking for one id are refused. On an error nothing is
 * left allocated. */
static int new_units(const char *const *names, size_t n, const uint32_t *ids,
                     const unsigned char *known, new_unit *add, uint32_t *n_add,
                     char *why, size_t whylen) {
  uint32_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (known[i])
      continue;
    if ((add[k].name = strdup(names[i])) == NULL) {
      while (k > 0)
        free(add[--k].name);
      return GNMR_E_NOMEM;
    }
    add[k++].id = ids[i];
  }
  *n_add = k;
  int sorted = 1; /* numbered in order, as a first Hello's units are */
  for (uint32_t m = 1; m < k && sorted; m++)
    sorted = add[m - 1].id < add[m].id;
  if (!sorted)
    qsort(add, k, sizeof *add, core__by_id);
  for (uint32_t m = 1; m < k; m++)
    if (add[m].id == add[m - 1].id) { /* two new names asked for one id */
      snprintf(why, whylen,
               "unit id %u is already taken (asked for "
               "'%.64s')",
               add[m].id, add[m].name);
      for (uint32_t q = 0; q < k; q++)
        free(add[q].name);
      return GNMR_E_MISMATCH;
    }
  return GNMR_OK;
}

int core_register_units(core_job *j, core_rank *rr, const char *const *names,
                        size_t n, const uint32_t *req_ids, int shards,
                        char *why, size_t whylen) {
  uint32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  uint32_t *slots = malloc((n ? n : 1) * sizeof *slots);
  new_unit *add = malloc((n ? n : 1) * sizeof *add);
  unsigned char *known = calloc(n ? n : 1, 1); /* the job has the name */
  uint32_t n_add = 0;
  int rv = GNMR_E_NOMEM;
  assert(rr->ids == NULL);
  snprintf(why, whylen, "out of memory");
  if (ids == NULL || slots == NULL || add == NULL || known == NULL)
    goto out;
  if ((rv = decide_ids(j, names, n, req_ids, ids, known, &n_add, why,
                       whylen)) != GNMR_OK ||
      (rv = new_units(names, n, ids, known, add, &n_add, why, whylen)) !=
          GNMR_OK) {
    if (rv == GNMR_E_NOMEM)
      snprintf(why, whylen, "out of memory");
    goto out;
  }
  if (core__add_units(j, add, n_add) != GNMR_OK) {
    for (uint32_t k = 0; k < n_add; k++)
      free(add[k].name);
    rv = GNMR_E_NOMEM;
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    slots[i] = core_slot(j, ids[i]);
    assert(slots[i] != UINT32_MAX);
    if (shards)
      j->shards[slots[i]]++;
  }
  rr->ids = ids;
  rr->slots = slots;
  rr->n_units = (uint32_t)n;
  rr->ever = 1;
  ids = slots = NULL;
  rv = GNMR_OK;
  why[0] = '\0';
out:
  free(ids);
  free(slots);
  free(add);
  free(known);
  return rv;
}

int core_prepare_units(const char *const *names, size_t n,
                       core_prepared **out) {
  core_prepared *p = calloc(1, sizeof *p);
  *out = NULL;
  if (p == NULL || n > POLICY_MAX_UNITS ||
      (p->names = calloc(n ? n : 1, sizeof *p->names)) == NULL)
    goto nomem;
  p->map.borrowed = 1;
  p->map.keyed = 1; /* names a peer chose */
  if (hmap_reserve(&p->map, n) != GNMR_OK)
    goto nomem;
  for (size_t i = 0; i < n; i++) {
    if ((p->names[i] = strdup(names[i])) == NULL)
      goto nomem;
    p->n = (uint32_t)i + 1; /* what core_prepared_free frees */
    if (hmap_add(&p->map, p->names[i], strlen(p->names[i]), i) != GNMR_OK)
      goto nomem;
  }
  *out = p;
  return GNMR_OK;
nomem:
  core_prepared_free(&p);
  return GNMR_E_NOMEM;
}

void core_prepared_free(core_prepared **pp) {
  core_prepared *p = *pp;
  if (p == NULL)
    return;
  hmap_clear(&p->map);
  for (uint32_t i = 0; p->names != NULL && i < p->n; i++)
    free(p->names[i]);
  free(p->names);
  free(p);
  *pp = NULL;
}

int core_register_prepared(core_job *j, core_rank *rr, core_prepared **pp,
                           int shards, char *why, size_t whylen) {
  core_prepared *p = *pp;
  if (p == NULL || j->n_units != 0 || rr->ids != NULL)
    return 1;
  if (p->n > j->max_units) {
    snprintf(why, whylen, "a job has at most %u units", j->max_units);
    return GNMR_E_RANGE;
  }
  uint32_t n = p->n;
  uint32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  uint32_t *slots = malloc((n ? n : 1) * sizeof *slots);
  if (ids == NULL || slots == NULL || reserve_units(j, n) != GNMR_OK ||
      policy_resize(j->pol, n) != GNMR_OK) {
    free(ids);
    free(slots);
    snprintf(why, whylen, "out of memory");
    return GNMR_E_NOMEM;
  }
  for (uint32_t i = 0; i < n; i++) {
    j->unit_id[i] = i;
    j->unit_names[i] = p->names[i];
    j->shards[i] = shards ? 1 : 0;
    ids[i] = slots[i] = i;
  }
  hmap_clear(&j->unit_ids); /* empty: the job had no units */
  j->unit_ids = p->map;    /* its keys are the names just taken */
  j->n_units = n;
  rr->ids = ids;
  rr->slots = slots;
  rr->n_units = n;
  rr->ever = 1;
  free(p->names);
  free(p);
  *pp = NULL;
  why[0] = '\0';
  return GNMR_OK;
}

int core_same_units(const core_job *j, const core_rank *rr,
                    const char *const *names, size_t n, const uint32_t *ids) {
  if (n != rr->n_units)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (strcmp(j->unit_names[rr->slots[i]], names[i]) != 0 ||
        (ids != NULL && ids[i] != rr->ids[i]))
      return 0;
  return 1;
}

core_rank *core_observer_slot(core_job *j, uint32_t *slot, int *full) {
  uint32_t s = 0;
  *full = 0;
  while (s < j->n_observers && j->observers[s].joined)
    s++;
  if (s == j->n_observers) {
    if (j->n_observers == CORE_MAX_OBSERVERS) {
      *full = 1;
      return NULL;
    }
    if (j->n_observers == j->cap_observers) {
      uint32_t cap = j->cap_observers ? j->cap_observers * 2 : 8;
      core_rank *o = realloc(j->observers, cap * sizeof *o);
      if (o == NULL)
        return NULL;
      j->observers = o;
      j->cap_observers = cap;
    }
    memset(&j->observers[s], 0, sizeof j->observers[s]);
    j->n_observers++;
  }
  rank_free(&j->observers[s]);
  *slot = s;
  return &j->observers[s];
}

void core_disconnect(core_rank *rr, int observer) {
  free(rr->conn);
  rr->conn = NULL;
  rr->conn_len = 0;
  if (observer)
    rr->joined = 0;
}

/* ---- reports ------------------------------------------------------------------- */

static core_pending *find_or_add_pending(core_job *j, uint64_t step,
                                         core_clock now) {
  uint32_t i = 0;
  while (i < j->n_pend && j->pend[i].step < step)
    i++;
  if (i < j->n_pend && j->pend[i].step == step)
    return &j->pend[i];
  if (j->n_pend == CORE_MAX_PENDING)
    return NULL;
  core_report *by_rank = calloc(j->reporters, sizeof *by_rank);
  if (by_rank == NULL)
    return NULL;
  memmove(&j->pend[i + 1], &j->pend[i], (j->n_pend - i) * sizeof j->pend[0]);
  j->n_pend++;
  core_pending *p = &j->pend[i];
  p->step = step;
  p->got = 0;
  p->by_rank = by_rank;
  p->first_ms = now.ms;
  p->first_ns = now.ns;
  p->deadline = now.ms + j->barrier_ms;
  return p;
}

int core_report_step(core_job *j, uint32_t rank, uint64_t step,
                     const core_report *rep, core_clock now, int *resumed,
                     char *detail, size_t detail_len) {
  assert(rank < j->reporters && step > 0 && rep->owner != NULL);
  core_rank *rr = &j->ranks[rank];
  *resumed = 0;
  if (step <= j->last_decided && rr->rejoined && step <= rr->last_step) {
    /* Training restarted from a checkpoint: the rank went back below its
     * own last accepted step. A new pass over these steps, with the
     * statistics kept; undecided steps of the old pass go. A report that
     * is only late (a rank back from a partition flushing what it held:
     * above its own last step, at or below the job's) is no restart. */
    snprintf(detail, detail_len, "pass %u: training restarted at step %llu "
             "after step %llu", j->pass + 1, (unsigned long long)step,
             (unsigned long long)j->last_decided);
    for (uint32_t i = 0; i < j->n_pend; i++)
      core__pending_clear(j, &j->pend[i]);
    j->n_pend = 0;
    j->pass++;
    j->last_decided = step - 1;
    for (uint32_t k = 0; k < j->reporters; k++)
      j->ranks[k].last_step = j->last_decided;
    *resumed = 1;
  }
  if (step <= j->last_decided)
    return CORE_LATE;
  rr->rejoined = 0;
  if (step > j->last_decided + CORE_MAX_AHEAD && j->last_decided > 0)
    return CORE_TOO_FAR;
  if (j->last_decided == 0) {
    /* before the first decision the job is where its ranks are: a step
     * far past every other rank's is refused, so that one rank cannot
     * make the first decision a step the others never reach (a job
     * frozen with every later report late) */
    uint64_t others = 0;
    for (uint32_t k = 0; k < j->reporters; k++)
      if (k != rank && j->ranks[k].last_step != UINT64_MAX &&
          j->ranks[k].last_step > others)
        others = j->ranks[k].last_step;
    if (others > 0 && step > others + CORE_MAX_AHEAD)
      return CORE_TOO_FAR;
  }
  core_pending *p = find_or_add_pending(j, step, now);
  if (p == NULL)
    return j->n_pend == CORE_MAX_PENDING ? CORE_FULL : CORE_NOMEM;
  core_report *h = &p->by_rank[rank];
  if (h->owner != NULL)
    return CORE_DUPLICATE;
  *h = *rep;
  if (rr->last_step == UINT64_MAX || step > rr->last_step)
    rr->last_step = step;
  p->got++;
  return CORE_ACCEPTED;
}

/* ---- deciding ------------------------------------------------------------------ */

static uint32_t expected(const core_job *j) {
  uint32_t e = j->reporters - j->byes;
  return e ? e : 1;
}

/* One rank's shards of p into the scratch arrays: their sums into sum
 * (acc, or the node's part), the counts, flags and largest measure. */
static void add_rank(core_job *j, const core_report *h, const core_rank *rr,
                     double *sum, int node) {
  for (uint32_t i = 0; i < rr->n_units; i++) {
    uint32_t id = rr->slots[i]; /* a slot */
    j->got[id]++;
    if (h->missing && h->missing[i])
      j->mis[id] = 1;
    if (h->not_reported && h->not_reported[i]) {
      j->nrc[id]++;
      continue;
    }
    sum[id] += h->sumsq[i];
    j->tch[id] |= (uint8_t)node;
    if (h->nonfinite)
      j->nfc[id] += h->nonfinite[i];
    if (h->shadowed && h->shadowed[i])
      j->shd[id] = 1;
    /* a sharded unit's measure: its largest shard's (docs/policy.md) */
    if (h->measure && !isnan(h->measure[i]) &&
        !(h->measure[i] <= j->meas[id])) {
      j->meas[id] = h->measure[i];
      j->measured = 1;
    }
  }
}

/* Sums p's shards into the scratch arrays and classifies each unit;
 * returns the number of units with a missing shard. The sum goes node by
 * node (docs/policy.md, "Norm"): each node's shards in rank order into
 * part, then each node's part into acc in node order; with one rank a
 * node, 0 + x is x and this is the plain sum in rank order. */
static uint32_t sum_shards(core_job *j, const core_pending *p) {
  uint32_t n = j->n_units;
  memset(j->acc, 0, n * sizeof *j->acc);
  memset(j->got, 0, n * sizeof *j->got);
  memset(j->nrc, 0, n * sizeof *j->nrc);
  memset(j->nfc, 0, n * sizeof *j->nfc);
  memset(j->shd, 0, n * sizeof *j->shd);
  memset(j->mis, 0, n * sizeof *j->mis);
  memset(j->tch, 0, n * sizeof *j->tch);
  for (uint32_t u = 0; u < n; u++)
    j->meas[u] = NAN;
  j->measured = 0;
  uint32_t per = j->node_ranks > 1 ? j->node_ranks : 1;
  if (per > 1)
    memset(j->part, 0, n * sizeof *j->part);
  for (uint32_t first = 0; first < j->reporters; first += per) {
    uint32_t end = j->reporters - first < per ? j->reporters : first + per;
    for (uint32_t r = first; r < end; r++) /* rank order */
      if (p->by_rank[r].owner != NULL)
        add_rank(j, &p->by_rank[r], &j->ranks[r], per > 1 ? j->part : j->acc,
                 per > 1);
    if (per == 1)
      continue;
    /* the node's parts into acc, each unit once */
    for (uint32_t r = first; r < end; r++) {
      const core_rank *rr = &j->ranks[r];
      if (p->by_rank[r].owner == NULL)
        continue;
      for (uint32_t i = 0; i < rr->n_units; i++) {
        uint32_t id = rr->slots[i];
        if (j->tch[id]) {
          j->acc[id] += j->part[id];
          j->part[id] = 0;
          j->tch[id] = 0;
        }
      }
    }
  }
  /* The job's layout is known once every rank has said Hello: before
   * that, a unit may have shards on a rank not yet seen, and the sum of
   * the shards that came would pass for the whole unit's norm. Every unit
   * is then missing (its statistics wait), never a smaller norm. */
  int layout_known = 1;
  for (uint32_t r = 0; r < j->reporters && layout_known; r++)
    layout_known = j->ranks[r].ever;
  uint32_t missing = 0;
  for (uint32_t u = 0; u < n; u++) {
    j->norm[u] = 0;
    if (!layout_known || j->got[u] < j->shards[u] || j->mis[u] ||
        (j->nrc[u] > 0 && j->nrc[u] < j->got[u])) {
      j->input[u] = POLICY_MISSING;
      j->shd[u] = 0;
      j->meas[u] = NAN;
      missing++;
    } else if (j->nrc[u] == j->got[u]) {
      j->input[u] = POLICY_NOT_REPORTED;
      j->shd[u] = 0;
      j->meas[u] = NAN;
    } else {
      j->input[u] = POLICY_REPORTED;
      j->norm[u] = j->nfc[u] > 0 || j->shd[u] ? NAN : sqrt(j->acc[u]);
      j->shd[u] = j->shd[u] && j->nfc[u] == 0; /* a real NaN is one */
    }
  }
  return missing;
}

/* Whether a step may be decided by its deadline, without every rank's
 * report. Before the job's first decision, only once every reporter has
 * said where it is (a report in this pass): a deadline then would take
 * one rank's step for the job's, and a first report at step 2^53 + 1
 * from one rank, decided alone, left every other rank's report late for
 * good. Ranks of one job step together, so this waits out only a rank
 * slower to start; a rank that never reports leaves the job undecided
 * (its agents on their fallback route, as with no gnmrd). */
static int deadline_decides(const core_job *j) {
  if (j->last_decided > 0)
    return 1;
  for (uint32_t r = 0; r < j->reporters; r++)
    if (j->ranks[r].last_step == 0)
      return 0;
  return 1;
}

int core_decide_begin(core_job *j, uint64_t now_ms, core_decision *dd) {
  int ready = 0, by_deadline = deadline_decides(j);
  for (uint32_t i = 0; i < j->n_pend && !ready; i++)
    ready = j->pend[i].got >= expected(j) ||
            (by_deadline && j->pend[i].deadline <= now_ms);
  if (!ready)
    return 0;
  /* the oldest step goes first, ready or not: steps are decided in order */
  memset(dd, 0, sizeof *dd);
  dd->p = j->pend[0];
  dd->pass = j->pass;
  /* the invariant every rank relies on: one decision per step per pass */
  dd->republish = j->pub_pass == j->pass && dd->p.step <= j->pub_step;
  dd->by_deadline = dd->p.got < expected(j);
  uint64_t work = j->n_units;
  for (uint32_t r = 0; r < j->reporters; r++)
    if (dd->p.by_rank[r].owner != NULL)
      work += j->ranks[r].n_units;
  dd->work = work;
  j->last_decided = dd->p.step;
  memmove(&j->pend[0], &j->pend[1], (j->n_pend - 1) * sizeof j->pend[0]);
  j->n_pend--;
  memset(&j->pend[j->n_pend], 0, sizeof j->pend[0]);
  /* steps taken before the first decision that are now too far past it
   * (a report now would be refused) go: deciding one would leave every
   * rank's next report late */
  while (j->n_pend > 0 &&
         j->pend[j->n_pend - 1].step > j->last_decided + CORE_MAX_AHEAD) {
    j->far_dropped += j->pend[j->n_pend - 1].got;
    core__pending_clear(j, &j->pend[--j->n_pend]);
  }
  return 1;
}

void core_decide_run(core_job *j, const core_decision *dd,
                     core_outcome *out) {
  const core_pending *p = &dd->p;
  memset(out, 0, sizeof *out);
  out->step = p->step;
  out->by_deadline = dd->by_deadline;
  out->reports = p->got;
  out->first_ms = p->first_ms;
  out->first_ns = p->first_ns;
  out->missing = sum_shards(j, p);
  out->norm = j->norm;
  out->input = j->input;
  out->unit_id = j->unit_id;
  out->active_ids = j->act_ids;
  out->shadowed = j->shd;
  /* no measure at all: none given (the engine makes the measure's state
   * at its first one only) */
  out->measure = j->measured ? j->meas : NULL;
  out->republish = dd->republish;
  out->rv = out->republish
                ? GNMR_OK
                : policy_step_measured(j->pol, p->step, j->norm, j->input,
                                       out->measure, &out->res);
  if (!out->republish && out->rv == GNMR_OK)
    for (uint32_t i = 0; i < out->res.n_active; i++)
      j->act_ids[i] = j->unit_id[out->res.active[i]];
}

void core_decide_end(core_job *j, core_decision *dd, const core_outcome *out) {
  if (!out->republish && out->rv == GNMR_OK) {
    j->pub_pass = dd->pass;
    j->pub_step = dd->p.step;
    int nonfinite = 0, shadowed = 0;
    for (uint32_t i = 0; i < out->res.n_events; i++) {
      const policy_event *e = &out->res.events[i];
      j->promotions += e->kind == POLICY_EV_PROMOTE;
      if (e->kind == POLICY_EV_NONFINITE) {
        int sh = out->shadowed[e->unit];
        shadowed |= sh;
        nonfinite |= !sh;
      }
    }
    j->nonfinite_steps += (uint64_t)nonfinite;
    j->shadowed_steps += (uint64_t)shadowed;
  }
  core__pending_clear(j, &dd->p);
}

int core_decide_next(core_job *j, uint64_t now_ms, core_outcome *out) {
  core_decision dd;
  if (!core_decide_begin(j, now_ms, &dd))
    return 0;
  core_decide_run(j, &dd, out);
  core_decide_end(j, &dd, out);
  return 1;
}

int core_is_pending(const core_job *j, uint64_t step) {
  for (uint32_t i = 0; i < j->n_pend; i++)
    if (j->pend[i].step == step)
      return 1;
  return 0;
}

uint64_t core_next_deadline(const core_job *j) {
  uint64_t first = UINT64_MAX;
  if (!deadline_decides(j))
    return first; /* a report makes the next move */
  for (uint32_t i = 0; i < j->n_pend; i++)
    if (j->pend[i].deadline < first)
      first = j->pend[i].deadline;
  return first;
}

int core_bye(core_job *j, uint32_t rank) {
  assert(rank < j->reporters);
  core_rank *rr = &j->ranks[rank];
  core_disconnect(rr, 0);
  if (rr->joined) {
    rr->joined = 0;
    j->byes++;
  }
  return j->byes >= j->reporters;
}

void core_join(core_job *j, uint32_t rank, int returning) {
  assert(rank < j->reporters);
  core_rank *rr = &j->ranks[rank];
  if (returning && j->byes > 0)
    j->byes--; /* a rank that said Bye came back */
  if (j->last_decided > 0)
    rr->rejoined = 1;
  rr->joined = 1;
}
