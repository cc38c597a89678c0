/* SPDX-License-Identifier: MIT */
/* decision.c — a decided step's Decision message (see decision.h). Loop
 * thread only. */
#include <math.h>
#include <stdlib.h>

#include "decision.h"
#include "gnmr/error.h"
#include "seal.h"
#include "wire.h"

/* What a decided step's Decision carries besides the active set: the
 * risky units (their exceed events) with their g, d and s, in one
 * allocation (*mem, freed by the caller after encoding). */
static void decision_risky(const core_outcome *o, Gnmr__Decision *dec,
                           void **mem) {
  uint32_t n_risky = 0;
  *mem = NULL;
  for (uint32_t i = 0; i < o->res.n_events; i++)
    n_risky += o->res.events[i].kind == POLICY_EV_EXCEED &&
               o->res.events[i].unit != UINT32_MAX;
  if (n_risky == 0)
    return;
  double *gds = malloc(n_risky * (3 * sizeof *gds + sizeof(uint32_t)));
  if (gds == NULL)
    return; /* the Decision goes without them */
  uint32_t *risky = (uint32_t *)(gds + 3 * (size_t)n_risky);
  uint32_t k = 0;
  for (uint32_t i = 0; i < o->res.n_events; i++) {
    const policy_event *e = &o->res.events[i];
    if (e->kind != POLICY_EV_EXCEED || e->unit == UINT32_MAX)
      continue;
    risky[k] = o->unit_id[e->unit]; /* e->unit is a slot */
    gds[k] = o->res.g[e->unit];
    gds[n_risky + k] = o->res.d[e->unit];
    gds[2 * n_risky + k] = o->res.s[e->unit];
    k++;
  }
  dec->n_risky = dec->n_g = dec->n_d = dec->n_s = n_risky;
  dec->risky = risky;
  dec->g = gds;
  dec->d = gds + n_risky;
  dec->s = gds + 2 * (size_t)n_risky;
  *mem = gds;
}

/* The same-step mode's bound for every job-wide id up to the largest
 * (+inf where no unit has that id) and the budget left, when the job
 * asks for them (docs/policy.md, "Same-step mode"); *mem freed by the
 * caller after encoding. No memory: the Decision goes without them. */
static void decision_bounds(const core_job *c, const core_outcome *o,
                            Gnmr__Decision *dec, float **mem) {
  *mem = NULL;
  if (!c->params.same_step || c->n_units == 0)
    return;
  size_t n = (size_t)c->unit_id[c->n_units - 1] + 1; /* ids ascend */
  float *b = malloc(n * sizeof *b);
  if (b == NULL)
    return;
  for (size_t i = 0; i < n; i++)
    b[i] = INFINITY;
  for (uint32_t u = 0; u < c->n_units; u++)
    b[c->unit_id[u]] = (float)policy_measure_bound(c->pol, u);
  dec->n_bound = n;
  dec->bound = b;
  uint32_t k = c->params.max_active;
  dec->spare = o->res.n_active < k ? k - o->res.n_active : 0;
  *mem = b;
}

int decision_encode(job *j, const core_outcome *o, uint8_t **buf, size_t *len) {
  core_job *c = j->core;
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Decision dec = GNMR__DECISION__INIT;
  void *mem;
  dec.job = c->name;
  dec.step = o->step;
  dec.run = c->run;
  dec.pass = c->pass;
  store_mark_get(j->mark, &dec.durable_pass, &dec.durable_step);
  dec.term = j->d->term;
  dec.n_active = o->res.n_active;
  dec.active = (uint32_t *)o->active_ids;
  uint8_t tag[SEAL_TAG_BYTES];
  if (j->d->st != NULL) { /* so that a held copy can be proven ours */
    seal_make(store_seal_key(j->d->st), c->name, dec.run, dec.pass, dec.step,
              dec.active, dec.n_active, tag);
    dec.tag.data = tag;
    dec.tag.len = sizeof tag;
  }
  decision_risky(o, &dec, &mem);
  float *bounds;
  decision_bounds(c, o, &dec, &bounds);
  env.body_case = GNMR__ENVELOPE__BODY_DECISION;
  env.decision = &dec;
  int rv = gnmr__wire_encode(&env, buf, len);
  free(mem);
  free(bounds);
  return rv;
}

int decision_encode_held(job *j, const Gnmr__Decision *kept, uint8_t **buf,
                         size_t *len) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Decision dec = GNMR__DECISION__INIT;
  /* what the seal covers (job, run, pass, step, active) and the seal,
   * nothing else of the agent's copy: its other fields (risky, g, d, s,
   * bound, spare) are not sealed, and whatever a forger put in them is
   * not passed on to the other ranks (issue 62) */
  dec.job = kept->job;
  dec.run = kept->run;
  dec.pass = kept->pass;
  dec.step = kept->step;
  dec.n_active = kept->n_active;
  dec.active = kept->active;
  dec.tag = kept->tag;
  store_mark_get(j->mark, &dec.durable_pass, &dec.durable_step);
  /* this gnmrd's term: agents drop a decision of an older one, and the
   * seal does not cover the term */
  dec.term = j->d->term;
  env.body_case = GNMR__ENVELOPE__BODY_DECISION;
  env.decision = &dec;
  return gnmr__wire_encode(&env, buf, len);
}
