/* SPDX-License-Identifier: MIT */
/* views.c — read-only JSON views and gauges of live jobs (views.h). */
#include <math.h>
#include <stdlib.h>

#include "gnmr/error.h"
#include "views.h"

/* A JSON number; null for NaN, the string "inf"/"-inf" for infinities. */
static json_t *jnum(double v) {
  if (isnan(v))
    return json_null();
  if (isinf(v))
    return json_string(v > 0 ? "inf" : "-inf");
  return json_real(v);
}

json_t *views_params(const policy_params *p) {
  json_t *o = json_object();
  for (int i = 0; o != NULL && i < GNMR_NPARAMS; i++)
    json_object_set_new(o, policy_param_table[i].name,
                        policy_param_is_f64(i)
                            ? jnum(policy_param_value(p, i))
                            : json_integer((json_int_t)policy_param_u64(p, i)));
  return o;
}

json_t *views_status(const core_job *c) {
  uint32_t joined = 0;
  for (uint32_t r = 0; r < c->reporters; r++)
    joined += c->ranks[r].joined != 0;
  json_t *active = json_array();
  for (uint32_t u = 0; u < c->n_units; u++) {
    policy_unit_info info;
    if (policy_unit(c->pol, u, &info) == GNMR_OK && info.active)
      json_array_append_new(
          active, json_pack("{s:I,s:s}", "id", (json_int_t)c->unit_id[u],
                            "name",
                            c->unit_names[u] ? c->unit_names[u] : ""));
  }
  return json_pack("{s:s,s:I,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:o}",
                   "job", c->name, "run", (json_int_t)c->run, "state",
                   "running", "pass", (json_int_t)c->pass,
                   "step", (json_int_t)c->last_decided, "reporters",
                   (json_int_t)c->reporters, "joined", (json_int_t)joined,
                   "units", (json_int_t)c->n_units, "pending_steps",
                   (json_int_t)c->n_pend, "barrier_ms",
                   (json_int_t)c->barrier_ms, "params",
                   views_params(&c->params), "active", active);
}

typedef struct ranked {
  double s;
  uint32_t u;
} ranked;

/* Ties to the smaller id: slots are in id order. */
static int by_score_desc(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->s != y->s)
    return x->s > y->s ? -1 : 1;
  return x->u < y->u ? -1 : 1;
}

json_t *views_units(const core_job *c, uint32_t top, int kept) {
  uint32_t n = c->n_units;
  ranked *order = malloc((n ? n : 1) * sizeof *order);
  json_t *arr = json_array();
  if (order == NULL)
    return arr;
  for (uint32_t u = 0; u < n; u++) {
    policy_unit_info info;
    int ok = policy_unit(c->pol, u, &info) == GNMR_OK;
    order[u].u = u;
    if (kept) /* no last step: the units promoted most */
      order[u].s = ok ? (double)info.promotions : 0;
    else
      order[u].s = ok && !isnan(info.last_s) ? info.last_s : 0;
  }
  if (top > 0) {
    qsort(order, n, sizeof *order, by_score_desc);
    if (top < n)
      n = top;
  }
  for (uint32_t k = 0; k < n; k++) {
    uint32_t u = order[k].u;
    policy_unit_info info;
    if (policy_unit(c->pol, u, &info) != GNMR_OK)
      continue;
    if (kept) /* a snapshot keeps no step's G, D or score */
      info.last_g = info.last_d = info.last_s = NAN;
    json_array_append_new(
        arr, json_pack("{s:I,s:s,s:I,s:I,s:o,s:o,s:o,s:o,s:I,s:b,s:I}", "id",
                       (json_int_t)c->unit_id[u], "name",
                       c->unit_names[u] ? c->unit_names[u] : "", "shards",
                       (json_int_t)c->shards[u], "reports",
                       (json_int_t)info.cnt, "mean", jnum(info.mean), "g",
                       jnum(info.last_g), "d", jnum(info.last_d), "s",
                       jnum(info.last_s), "lock", (json_int_t)info.lock,
                       "active", info.active, "promotions",
                       (json_int_t)info.promotions));
  }
  free(order);
  return arr;
}

void views_gauges(const core_job *c, view_gauges *g) {
  g->step = c->last_decided;
  g->units = c->n_units;
  g->active = 0;
  for (uint32_t u = 0; u < c->n_units; u++) {
    policy_unit_info info;
    if (policy_unit(c->pol, u, &info) == GNMR_OK && info.active)
      g->active++;
  }
}
