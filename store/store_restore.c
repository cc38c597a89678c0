/* SPDX-License-Identifier: MIT */
/* store_restore.c — reading back the unfinished jobs at start-up (before
 * gnmrd serves): each job's row, its units and ranks, the parameters in
 * force and its newest snapshot. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gnmr/error.h"
#include "log.h"
#include "store_restore.h"
#include "store_schema.h"

void store__read_params(db_stmt *st, int at, policy_params *p) {
  for (int i = 0; i < GNMR_NPARAMS; i++) {
    if (!policy_param_is_f64(i))
      policy_param_set_u64(p, i, (uint64_t)db_column_int64(st, at + i));
    else /* NULL: an unset threshold, or a signal's before its column (off) */
      policy_param_set_f64(p, i, db_column_type(st, at + i) == DB_NULL
                                     ? (policy_param_inherits(i) >= 0 ? NAN
                                                                      : 0)
                                     : db_column_double(st, at + i));
  }
}

void store__job_clear(store_job *j) {
  if (j->unit_names)
    for (uint32_t u = 0; u < j->n_units; u++)
      free(j->unit_names[u]);
  free(j->unit_names);
  free(j->unit_ids);
  if (j->rank_ids)
    for (uint32_t r = 0; r < j->n_ranks; r++)
      free(j->rank_ids[r]);
  free(j->rank_ids);
  free(j->rank_n);
  free(j->snapshot);
  free(j->name);
  free(j->owner);
  free(j->kept);
}

/* The run's units: (id, name). */
static int load_units(db_conn *db, store_job *j) {
  db_stmt *st;
  int rc;
  if (db_prepare(db, "SELECT COUNT(*) FROM units WHERE run=?", &st) !=
      GNMR_OK)
    return GNMR_E_STORE;
  db_bind_int64(st, 1, (int64_t)j->run);
  int64_t count = db_step(st) == DB_ROW ? db_column_int64(st, 0) : 0;
  db_finalize(st);
  if (count < 0 || count > POLICY_MAX_UNITS)
    return GNMR_E_STORE;
  j->unit_names = calloc(count ? (size_t)count : 1, sizeof *j->unit_names);
  j->unit_ids = calloc(count ? (size_t)count : 1, sizeof *j->unit_ids);
  j->rank_n = calloc(j->n_ranks, sizeof *j->rank_n);
  j->rank_ids = calloc(j->n_ranks, sizeof *j->rank_ids);
  if (!j->unit_names || !j->unit_ids || !j->rank_n || !j->rank_ids)
    return GNMR_E_NOMEM;
  if (db_prepare(db, "SELECT id, name FROM units WHERE run=?", &st) != GNMR_OK)
    return GNMR_E_STORE;
  db_bind_int64(st, 1, (int64_t)j->run);
  j->n_units = 0;
  while ((rc = db_step(st)) == DB_ROW && j->n_units < (uint64_t)count) {
    int64_t id = db_column_int64(st, 0);
    const char *name = (const char *)db_column_text(st, 1);
    if (id < 0 || id >= UINT32_MAX || name == NULL)
      continue;
    if ((j->unit_names[j->n_units] = strdup(name)) == NULL) {
      db_finalize(st);
      return GNMR_E_NOMEM;
    }
    j->unit_ids[j->n_units++] = (uint32_t)id;
  }
  db_finalize(st);
  return GNMR_OK;
}

/* Each rank's unit ids, in its order. */
static int load_ranks(db_conn *db, store_job *j) {
  db_stmt *st;
  int rc;
  if (db_prepare(db, "SELECT rank, idx, unit FROM rank_units WHERE run=? "
                         "ORDER BY rank, idx", &st) != GNMR_OK)
    return GNMR_E_STORE;
  db_bind_int64(st, 1, (int64_t)j->run);
  while ((rc = db_step(st)) == DB_ROW) {
    int64_t r = db_column_int64(st, 0), unit = db_column_int64(st, 2);
    if (r < 0 || r >= j->n_ranks || unit < 0 || unit >= UINT32_MAX)
      continue;
    uint32_t *ids = realloc(j->rank_ids[r], (j->rank_n[r] + 1) * sizeof *ids);
    if (ids == NULL) {
      db_finalize(st);
      return GNMR_E_NOMEM;
    }
    ids[j->rank_n[r]++] = (uint32_t)unit;
    j->rank_ids[r] = ids;
  }
  db_finalize(st);
  return GNMR_OK;
}

/* The parameters in force: the last row of the params table. */
static int load_params(db_conn *db, store_job *j) {
  db_stmt *st;
  if (db_prepare(db, "SELECT 0" PARAM_COLS " FROM params WHERE run=? "
                         "ORDER BY rowid DESC LIMIT 1", &st) != GNMR_OK)
    return GNMR_E_STORE;
  db_bind_int64(st, 1, (int64_t)j->run);
  j->params = j->hello_params;
  if (db_step(st) == DB_ROW)
    store__read_params(st, 1, &j->params);
  db_finalize(st);
  return GNMR_OK;
}

/* The newest committed step of the job's pass: decided, so never
 * decided again after the restart (the snapshot may be behind it). */
static int load_last_step(db_conn *db, store_job *j) {
  db_stmt *st;
  if (db_prepare(db, "SELECT MAX(step) FROM steps WHERE run=? AND pass=?",
                 &st) != GNMR_OK)
    return GNMR_E_STORE;
  db_bind_int64(st, 1, (int64_t)j->run);
  db_bind_int64(st, 2, (int64_t)j->pass);
  if (db_step(st) == DB_ROW && db_column_type(st, 0) != DB_NULL) {
    int64_t last = db_column_int64(st, 0);
    j->last_step = last > 0 ? (uint64_t)last : 0;
  }
  db_finalize(st);
  return GNMR_OK;
}

/* The newest steps held, whatever their pass (the job row's pass says
 * only that a restart began one, maybe with nothing committed since):
 * which of the decisions agents hand back the history has already;
 * ascending. */
static int load_kept(db_conn *db, store_job *j) {
  db_stmt *st;
  if (db_prepare(db, "SELECT pass, step FROM steps WHERE run=? ORDER BY "
                     "pass DESC, step DESC LIMIT ?", &st) != GNMR_OK)
    return GNMR_E_STORE;
  db_bind_int64(st, 1, (int64_t)j->run);
  db_bind_int64(st, 2, STORE_KEPT_MAX);
  if ((j->kept = malloc(STORE_KEPT_MAX * sizeof *j->kept)) == NULL) {
    db_finalize(st);
    return GNMR_E_NOMEM;
  }
  while (j->n_kept < STORE_KEPT_MAX && db_step(st) == DB_ROW) {
    j->kept[j->n_kept].pass = (uint32_t)db_column_int64(st, 0);
    j->kept[j->n_kept].step = (uint64_t)db_column_int64(st, 1);
    j->n_kept++;
  }
  db_finalize(st);
  if (j->n_kept > 0) {
    j->kept_pass = j->kept[0].pass;
    j->kept_step = j->kept[0].step;
  }
  for (uint32_t a = 0, b = j->n_kept; a + 1 < b; a++, b--) {
    store_kept t = j->kept[a]; /* ascending */
    j->kept[a] = j->kept[b - 1];
    j->kept[b - 1] = t;
  }
  return GNMR_OK;
}

/* The newest snapshot. */
static int load_snapshot(db_conn *db, store_job *j) {
  db_stmt *st;
  if (db_prepare(db, "SELECT state FROM snapshots WHERE run=? ORDER BY "
                         "pass DESC, step DESC LIMIT 1", &st) != GNMR_OK)
    return GNMR_E_STORE;
  db_bind_int64(st, 1, (int64_t)j->run);
  if (db_step(st) == DB_ROW) {
    int len = db_column_bytes(st, 0);
    const void *b = db_column_blob(st, 0);
    if (len > 0 && (j->snapshot = malloc((size_t)len)) != NULL) {
      memcpy(j->snapshot, b, (size_t)len);
      j->snapshot_len = (size_t)len;
    }
  }
  db_finalize(st);
  return GNMR_OK;
}

int store__load_job(db_conn *db, store_job *j) {
  int rv = load_units(db, j);
  if (rv == GNMR_OK)
    rv = load_ranks(db, j);
  if (rv == GNMR_OK)
    rv = load_params(db, j);
  if (rv == GNMR_OK)
    rv = load_last_step(db, j);
  if (rv == GNMR_OK)
    rv = load_kept(db, j);
  if (rv == GNMR_OK)
    rv = load_snapshot(db, j);
  return rv;
}

int store_newest_run(db_conn *db, uint64_t *run) {
  db_stmt *st;
  *run = 0;
  if (db_prepare(db, "SELECT COALESCE(MAX(run), 0) FROM jobs", &st) !=
      GNMR_OK)
    return GNMR_E_STORE;
  if (db_step(st) == DB_ROW)
    *run = (uint64_t)db_column_int64(st, 0);
  db_finalize(st);
  return GNMR_OK;
}

int store_job_row(db_conn *db, uint64_t run, store_job *j, char *state,
                  size_t cap) {
  db_stmt *st;
  if (db_prepare(db, "SELECT reporters, barrier_ms, pass, state"
                         PARAM_COLS " FROM jobs WHERE run=?", &st) != GNMR_OK)
    return GNMR_E_STORE;
  db_bind_int64(st, 1, (int64_t)run);
  if (db_step(st) != DB_ROW) {
    db_finalize(st);
    return GNMR_E_NOJOB;
  }
  j->run = run;
  j->reporters = (uint32_t)db_column_int64(st, 0);
  j->barrier_ms = (uint32_t)db_column_int64(st, 1);
  j->pass = (uint32_t)db_column_int64(st, 2);
  snprintf(state, cap, "%s",
           db_column_text(st, 3) ? (const char *)db_column_text(st, 3) : "");
  store__read_params(st, 4, &j->hello_params);
  j->n_ranks = j->reporters;
  db_finalize(st);
  return GNMR_OK;
}

int store_restore(const char *where, void (*fn)(const store_job *, void *),
                  void *ctx, char *err, size_t errlen) {
  char path[4200], shown[4200];
  db_conn *db;
  db_stmt *st;
  int rv = GNMR_OK;
  store_target(where, path, sizeof path);
  db_target_display(path, shown, sizeof shown);
  if (!db_target_is_pg(path) && access(path, F_OK) != 0)
    return GNMR_OK; /* nothing to restore */
  if (store_open_reader(path, &db, err, errlen) != GNMR_OK)
    return GNMR_E_STORE;
  if (db_prepare(db, "SELECT name, reporters, barrier_ms, pass, owner"
                         PARAM_COLS ", run FROM jobs WHERE state='running'", &st) != GNMR_OK) {
    snprintf(err, errlen, "%s: %s", shown, db_errmsg(db));
    db_close(&db);
    return GNMR_E_STORE;
  }
  while (db_step(st) == DB_ROW) {
    store_job j = {0};
    j.name = strdup(db_column_text(st, 0));
    j.reporters = (uint32_t)db_column_int64(st, 1);
    j.barrier_ms = (uint32_t)db_column_int64(st, 2);
    j.pass = (uint32_t)db_column_int64(st, 3);
    if (db_column_type(st, 4) == DB_TEXT)
      j.owner = strdup(db_column_text(st, 4));
    store__read_params(st, 5, &j.hello_params);
    j.run = (uint64_t)db_column_int64(st, 5 + GNMR_NPARAMS);
    j.n_ranks = j.reporters;
    if (j.name == NULL || j.reporters == 0 || j.reporters > 4096 ||
        store__load_job(db, &j) != GNMR_OK) {
      LOG(ERROR, "STORE-RESTORE", "job %s: cannot be restored, skipped",
          j.name ? j.name : "?");
      store__job_clear(&j);
      continue;
    }
    fn(&j, ctx);
    store__job_clear(&j);
  }
  db_finalize(st);
  db_close(&db);
  return rv;
}

int store_load_newest(const char *target, const char *name, store_job *j,
                      char *state, size_t cap, char *err, size_t errlen) {
  char path[4200], shown[4200];
  db_conn *db;
  db_stmt *st;
  int64_t run = -1;
  *state = '\0';
  snprintf(path, sizeof path, "%s", target);
  db_target_display(path, shown, sizeof shown);
  if (!db_target_is_pg(path) && access(path, F_OK) != 0)
    return GNMR_E_NOJOB; /* no history yet */
  if (store_open_reader(path, &db, err, errlen) != GNMR_OK)
    return GNMR_E_STORE;
  int rv = GNMR_E_STORE;
  if (db_prepare(db, "SELECT run, owner FROM jobs WHERE name=? ORDER BY run "
                     "DESC LIMIT 1", &st) != GNMR_OK) {
    snprintf(err, errlen, "%s: %s", shown, db_errmsg(db));
    db_close(&db);
    return GNMR_E_STORE;
  }
  db_bind_text(st, 1, name);
  if (db_step(st) == DB_ROW) {
    run = db_column_int64(st, 0);
    if (db_column_type(st, 1) == DB_TEXT)
      j->owner = strdup(db_column_text(st, 1));
  }
  db_finalize(st);
  if (run <= 0) {
    db_close(&db);
    return GNMR_E_NOJOB;
  }
  if ((j->name = strdup(name)) == NULL)
    rv = GNMR_E_NOMEM;
  else if ((rv = store_job_row(db, (uint64_t)run, j, state, cap)) ==
               GNMR_OK &&
           (j->reporters == 0 || j->reporters > 4096))
    rv = GNMR_E_STORE;
  else if (rv == GNMR_OK)
    rv = store__load_job(db, j);
  if (rv == GNMR_E_STORE)
    snprintf(err, errlen, "%s: run %lld of job %s cannot be read", shown,
             (long long)run, name);
  db_close(&db);
  return rv;
}

int store_owners(const char *where,
                 void (*fn)(const char *name, const char *owner, void *ctx),
                 void *ctx, char *err, size_t errlen) {
  char path[4200], shown[4200];
  db_conn *db;
  db_stmt *st;
  int rc;
  store_target(where, path, sizeof path);
  db_target_display(path, shown, sizeof shown);
  if (!db_target_is_pg(path) && access(path, F_OK) != 0)
    return GNMR_OK; /* no history, no owners */
  if (store_open_reader(path, &db, err, errlen) != GNMR_OK)
    return GNMR_E_STORE;
  if (db_prepare(db, "SELECT name, owner FROM jobs WHERE owner IS NOT NULL "
                     "ORDER BY run", &st) != GNMR_OK) {
    snprintf(err, errlen, "%s: %s", shown, db_errmsg(db));
    db_close(&db);
    return GNMR_E_STORE;
  }
  while ((rc = db_step(st)) == DB_ROW) {
    const char *name = db_column_text(st, 0), *owner = db_column_text(st, 1);
    if (name != NULL && owner != NULL)
      fn(name, owner, ctx);
  }
  if (rc != DB_DONE)
    snprintf(err, errlen, "%s: %s", shown, db_errmsg(db));
  db_finalize(st);
  db_close(&db);
  return rc == DB_DONE ? GNMR_OK : GNMR_E_STORE;
}
