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
#include "store_sql.h"
#include "views.h"

json_t *store_view_job(store_query *q, db_conn *db) {
  db_stmt *st;
  store_job sj = {0};
  char state[32] = "";
  json_t *out = NULL;
  if (!store_query_resolve(q, db))
    return NULL; /* q->err set */
  if (db_prepare(db, "SELECT reporters, barrier_ms, pass, state"
                         PARAM_COLS " FROM jobs WHERE run=?", &st) != GNMR_OK) {
    store_query_fail(q, GNMR_E_STORE, "%s", db_errmsg(db));
    return NULL;
  }
  db_bind_int64(st, 1, (int64_t)q->resolved);
  if (db_step(st) != DB_ROW) {
    db_finalize(st);
    store_query_fail(q, GNMR_E_NOJOB, "unknown job '%.128s'", q->job);
    return NULL;
  }
  sj.reporters = (uint32_t)db_column_int64(st, 0);
  sj.barrier_ms = (uint32_t)db_column_int64(st, 1);
  sj.pass = (uint32_t)db_column_int64(st, 2);
  snprintf(state, sizeof state, "%s",
           db_column_text(st, 3) ? (const char *)db_column_text(
                                            st, 3)
                                      : "");
  store__read_params(st, 4, &sj.hello_params);
  db_finalize(st);
  sj.name = strdup(q->job);
  sj.run = q->resolved;
  sj.n_ranks = sj.reporters;
  core_job c = {0};
  policy *pol = NULL;
  if (sj.name == NULL || sj.reporters == 0 || sj.reporters > 4096 ||
      store__load_job(db, &sj) != GNMR_OK) {
    store_query_fail(q, GNMR_E_STORE, "job %.128s cannot be read back", q->job);
    goto out;
  }
  if (sj.snapshot == NULL ||
      policy_import(sj.snapshot, sj.snapshot_len, &pol) != GNMR_OK)
    policy_create(&sj.params, 0, &pol); /* no statistics were kept */
  c.name = sj.name;
  c.run = sj.run;
  c.pass = sj.pass;
  c.reporters = sj.reporters;
  c.barrier_ms = sj.barrier_ms;
  c.params = pol ? *policy_get_params(pol) : sj.params;
  c.pol = pol;
  c.last_decided = pol ? policy_last_step(pol) : 0;
  c.n_units = sj.n_units;
  c.unit_names = sj.unit_names;
  c.ranks = calloc(sj.reporters, sizeof *c.ranks);
  c.shards = calloc(sj.n_units ? sj.n_units : 1, sizeof *c.shards);
  if (pol == NULL || c.ranks == NULL || c.shards == NULL) {
    store_query_fail(q, GNMR_E_NOMEM, "out of memory");
    goto out;
  }
  for (uint32_t r = 0; r < sj.n_ranks; r++)
    for (uint32_t i = 0; i < sj.rank_n[r]; i++)
      if (sj.rank_ids[r][i] < sj.n_units)
        c.shards[sj.rank_ids[r][i]]++;
  if (q->command == GNMR_CMD_STATUS) {
    out = views_status(&c);
    json_object_set_new(out, "state", json_string(state));
  } else {
    out = views_units(&c, q->command == GNMR_CMD_TOP ? (q->limit ? q->limit
                                                                  : 10)
                                                      : 0);
  }
out:
  free(c.ranks);
  free(c.shards);
  policy_destroy(&pol);
  store__job_free(&sj);
  return out;
}
