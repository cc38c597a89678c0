/* SPDX-License-Identifier: MIT */
/* store_view.c — status, units and top of a job that gnmrd no longer
 * holds (finished or retired), read back from the store: the job's row,
 * its units and ranks and its newest snapshot, turned into the live views
 * (views.c) by a policy engine built from the snapshot. The admin service
 * sets it as the store query's view (store_query.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "gnmr/error.h"
#include "store.h"
#include "store_query.h"
#include "store_view.h"
#include "store_restore.h"
#include "views.h"

json_t *store_view_job(store_query *q, db_conn *db) {
  store_job sj = {0};
  char state[32] = "";
  json_t *out = NULL;
  if (!store_query_resolve(q, db))
    return NULL; /* q->err set */
  int rv = store_job_row(db, q->resolved, &sj, state, sizeof state);
  if (rv == GNMR_E_NOJOB) {
    store_query_fail(q, GNMR_E_NOJOB, "unknown job '%.128s'", q->job);
    return NULL;
  }
  if (rv != GNMR_OK) {
    store_query_fail(q, GNMR_E_STORE, "%s", db_errmsg(db));
    return NULL;
  }
  sj.name = strdup(q->job);
  core_registry reg = {0};
  core_job *c = NULL;
  policy *pol = NULL;
  uint32_t *pol_ids = NULL, n_pol_ids = 0;
  size_t pol_len = 0;
  if (sj.name == NULL || sj.reporters == 0 || sj.reporters > 4096 ||
      store__load_job(db, &sj) != GNMR_OK) {
    store_query_fail(q, GNMR_E_STORE, "job %.128s cannot be read back", q->job);
    goto out;
  }
  if (sj.snapshot != NULL &&
      (policy_ids_split(sj.snapshot, sj.snapshot_len, &pol_len, &pol_ids,
                            &n_pol_ids) != GNMR_OK ||
       policy_import(sj.snapshot, pol_len, &pol) != GNMR_OK ||
       (pol_ids != NULL && n_pol_ids != policy_units(pol))))
    policy_destroy(&pol); /* no statistics were kept */
  c = core_job_new(&reg, sj.name, pol ? policy_get_params(pol) : &sj.params,
                   sj.reporters, sj.barrier_ms, NULL);
  if (c == NULL) {
    store_query_fail(q, GNMR_E_NOMEM, "out of memory");
    goto out;
  }
  int rrv =
      core_restart_restore(c, pol, pol_ids, sj.n_units, sj.unit_ids,
                           sj.unit_names, sj.n_ranks, sj.rank_n, sj.rank_ids);
  pol = NULL; /* core_restart_restore took it */
  if (rrv != GNMR_OK) {
    store_query_fail(q, GNMR_E_NOMEM, "out of memory");
    goto out;
  }
  c->run = sj.run;
  c->pass = sj.pass;
  if (q->command == GNMR_CMD_STATUS) {
    out = views_status(c);
    json_object_set_new(out, "state", json_string(state));
  } else {
    out = views_units(
        c, q->command == GNMR_CMD_TOP ? (q->limit ? q->limit : 10) : 0, 1);
  }
out:
  core_registry_clear(&reg); /* c with it */
  policy_destroy(&pol);
  free(pol_ids);
  store__job_clear(&sj);
  return out;
}
