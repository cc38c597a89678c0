/* SPDX-License-Identifier: MIT */
/* store_restore.c — reading back the unfinished jobs at start-up (before
 * gnmrd serves): each job's row, its units and ranks, the parameters in
 * force and its newest snapshot. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gnmr/error.h"
#include "log.h"
#include "store_sql.h"

void store__job_free(store_job *j) {
  if (j->unit_names)
    for (uint32_t u = 0; u < j->n_units; u++)
      free(j->unit_names[u]);
  free(j->unit_names);
  if (j->rank_ids)
    for (uint32_t r = 0; r < j->n_ranks; r++)
      free(j->rank_ids[r]);
  free(j->rank_ids);
  free(j->rank_n);
  free(j->snapshot);
  free(j->name);
  free(j->owner);
}

int store__load_job(sqlite3 *db, store_job *j) {
  sqlite3_stmt *st;
  int rc;
  /* units */
  if (sqlite3_prepare_v2(db,
                         "SELECT COALESCE(MAX(id)+1,0) FROM units WHERE "
                         "run=?",
                         -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  sqlite3_bind_int64(st, 1, (sqlite3_int64)j->run);
  j->n_units = sqlite3_step(st) == SQLITE_ROW
                   ? (uint32_t)sqlite3_column_int64(st, 0)
                   : 0;
  sqlite3_finalize(st);
  if (j->n_units > POLICY_MAX_UNITS)
    return GNMR_E_STORE;
  j->unit_names = calloc(j->n_units ? j->n_units : 1, sizeof *j->unit_names);
  j->rank_n = calloc(j->n_ranks, sizeof *j->rank_n);
  j->rank_ids = calloc(j->n_ranks, sizeof *j->rank_ids);
  if (!j->unit_names || !j->rank_n || !j->rank_ids)
    return GNMR_E_NOMEM;
  if (sqlite3_prepare_v2(db, "SELECT id, name FROM units WHERE run=?", -1, &st,
                         NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  sqlite3_bind_int64(st, 1, (sqlite3_int64)j->run);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    int64_t id = sqlite3_column_int64(st, 0);
    if (id >= 0 && id < j->n_units && j->unit_names[id] == NULL)
      j->unit_names[id] = strdup((const char *)sqlite3_column_text(st, 1));
  }
  sqlite3_finalize(st);
  /* ranks */
  if (sqlite3_prepare_v2(db,
                         "SELECT rank, idx, unit FROM rank_units WHERE run=? "
                         "ORDER BY rank, idx",
                         -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  sqlite3_bind_int64(st, 1, (sqlite3_int64)j->run);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    int64_t r = sqlite3_column_int64(st, 0), unit = sqlite3_column_int64(st, 2);
    if (r < 0 || r >= j->n_ranks || unit < 0 || unit >= j->n_units)
      continue;
    uint32_t *ids = realloc(j->rank_ids[r], (j->rank_n[r] + 1) * sizeof *ids);
    if (ids == NULL) {
      sqlite3_finalize(st);
      return GNMR_E_NOMEM;
    }
    ids[j->rank_n[r]++] = (uint32_t)unit;
    j->rank_ids[r] = ids;
  }
  sqlite3_finalize(st);
  /* parameters in force: the last row of the params table */
  if (sqlite3_prepare_v2(db,
                         "SELECT 0" PARAM_COLS " FROM params WHERE run=? "
                         "ORDER BY rowid DESC LIMIT 1",
                         -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  sqlite3_bind_int64(st, 1, (sqlite3_int64)j->run);
  j->params = j->hello_params;
  if (sqlite3_step(st) == SQLITE_ROW)
    store__read_params(st, 1, &j->params);
  sqlite3_finalize(st);
  /* newest snapshot */
  if (sqlite3_prepare_v2(db,
                         "SELECT state FROM snapshots WHERE run=? ORDER BY "
                         "pass DESC, step DESC LIMIT 1",
                         -1, &st, NULL) != SQLITE_OK)
    return GNMR_E_STORE;
  sqlite3_bind_int64(st, 1, (sqlite3_int64)j->run);
  if (sqlite3_step(st) == SQLITE_ROW) {
    int len = sqlite3_column_bytes(st, 0);
    const void *b = sqlite3_column_blob(st, 0);
    if (len > 0 && (j->snapshot = malloc((size_t)len)) != NULL) {
      memcpy(j->snapshot, b, (size_t)len);
      j->snapshot_len = (size_t)len;
    }
  }
  sqlite3_finalize(st);
  return GNMR_OK;
}

int store_restore(const char *dir, void (*fn)(const store_job *, void *),
                  void *ctx, char *err, size_t errlen) {
  char path[4200];
  sqlite3 *db;
  sqlite3_stmt *st;
  int rv = GNMR_OK;
  snprintf(path, sizeof path, "%s/gnmr.db", dir);
  if (access(path, F_OK) != 0)
    return GNMR_OK; /* nothing to restore */
  if (store_open_reader(path, &db) != GNMR_OK) {
    snprintf(err, errlen, "%s: cannot open", path);
    return GNMR_E_STORE;
  }
  if (sqlite3_prepare_v2(db,
                         "SELECT name, reporters, barrier_ms, pass, owner"
                         PARAM_COLS ", run FROM jobs WHERE state='running'",
                         -1, &st, NULL) != SQLITE_OK) {
    snprintf(err, errlen, "%s: %s", path, sqlite3_errmsg(db));
    sqlite3_close(db);
    return GNMR_E_STORE;
  }
  while (sqlite3_step(st) == SQLITE_ROW) {
    store_job j = {0};
    j.name = strdup((const char *)sqlite3_column_text(st, 0));
    j.reporters = (uint32_t)sqlite3_column_int64(st, 1);
    j.barrier_ms = (uint32_t)sqlite3_column_int64(st, 2);
    j.pass = (uint32_t)sqlite3_column_int64(st, 3);
    if (sqlite3_column_type(st, 4) == SQLITE_TEXT)
      j.owner = strdup((const char *)sqlite3_column_text(st, 4));
    store__read_params(st, 5, &j.hello_params);
    j.run = (uint64_t)sqlite3_column_int64(st, 5 + GNMR_NPARAMS);
    j.n_ranks = j.reporters;
    if (j.name == NULL || j.reporters == 0 || j.reporters > 4096 ||
        store__load_job(db, &j) != GNMR_OK) {
      LOG(ERROR, "STORE-RESTORE", "job %s: cannot be restored, skipped",
          j.name ? j.name : "?");
      store__job_free(&j);
      continue;
    }
    fn(&j, ctx);
    store__job_free(&j);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return rv;
}
