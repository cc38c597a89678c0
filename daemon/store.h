/* SPDX-License-Identifier: MIT */
/* store.h — gnmrd's history: jobs, their parameters over time, units, one
 * row per decided step (with its decision), the policy's events,
 * operational events, and policy-state snapshots. It lives in SQLite
 * (DATA_DIR/gnmr.db, the default) or in PostgreSQL (a postgresql:// URL:
 * `--store`), through one interface (db.h) and one set of statements. The
 * loop thread hands records to store_put(), which never waits on the
 * database; the store's writer thread owns its connection and commits
 * whatever is queued in one transaction. A record is applied whole or not
 * at all, so a step's snapshot always commits with its step row. */
#ifndef GNMRD_STORE_H
#define GNMRD_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "store_restore.h" /* store_job: restoring at start-up */
#include "policy.h"
#include "store_rec.h"
#include "store_schema.h"

/* How far a run's history is committed: the newest (pass, step) whose
 * step record the writer has committed. Every decision of the run before
 * it (in the order decided) is committed too, since the writer commits in
 * queue order; decisions restored from agents, queued later than steps
 * after them, hold it back (store_mark_hold). The loop reads it into each Decision (durable_*), so that
 * agents forget the decisions they hold for gnmrd up to there; the writer
 * advances it after each commit. Shared by reference: a record may outlive
 * its job. Any thread. */
store_mark *store_mark_new(uint32_t pass, uint64_t step);
store_mark *store_mark_ref(store_mark *m);
void store_mark_free(store_mark **m);
void store_mark_get(store_mark *m, uint32_t *pass, uint64_t *step);
/* Moves the mark to (pass, step) when that is after it. */
void store_mark_advance(store_mark *m, uint32_t pass, uint64_t step);
/* A step record of (pass, step) queued after records of later steps (a
 * decision an agent held across a restart, adopted once the job decided
 * on): committing those must not tell agents to forget this one. Until
 * the record (its mark_held set) is committed or dropped, store_mark_get
 * reads no later than just before the oldest such record. */
void store_mark_hold(store_mark *m, uint32_t pass, uint64_t step);

/* The store's figures, one table: XX(field, name in gnmrctl stats,
 * /metrics name after gnmr_, counter or gauge, help). */
#define STORE_STATS(XX)                                                      \
  XX(records, "store_records", "store_records_total", counter,              \
     "Records committed.")                                                   \
  XX(batches, "store_batches", "store_batches_total", counter,              \
     "Batches committed (one transaction each).")                            \
  XX(errors, "store_errors", "store_errors_total", counter,                 \
     "Failed commits (retried).")                                            \
  XX(dropped, "store_dropped", "store_dropped_total", counter,              \
     "Records lost: store queue full.")                                      \
  XX(fair_batches, "store_fair_batches", "store_fair_batches_total",        \
     counter,                                                                \
     "Batches taken a fair share per job from a queue over 16 MB.")          \
  XX(queued, "store_queued", "store_queue_depth", gauge,                    \
     "Records waiting for the store.")                                       \
  XX(queued_bytes, "store_queued_bytes", "store_queue_bytes", gauge,        \
     "Bytes of records waiting for the store (capped by [limits] "           \
     "store_queue_mb).")

typedef struct store_stats {
#define STORE__STAT_FIELD(field, name, metric, type, help) uint64_t field;
  STORE_STATS(STORE__STAT_FIELD)
#undef STORE__STAT_FIELD
} store_stats;

typedef struct store store;

/* Opens (creating or migrating) the store at where (store_target) and
 * starts the writer thread. snapshot_every: steps between snapshots;
 * retain_steps: history kept per job (0 = all). Errors: GNMR_E_STORE with
 * a message in err (the URL's password never shown). */
int store_open(const char *where, uint32_t snapshot_every, uint64_t retain_steps,
               store **out, char *err, size_t errlen);

/* The most the queue holds, in bytes of records (about): while the
 * database is away, records wait up to it, then new ones are dropped
 * (counted as store_dropped, logged once per episode). 0: no byte cap
 * (the record cap, a million, still holds). Any thread. */
void store_set_queue_cap(store *s, uint64_t bytes);

/* Commits everything queued, stops the writer, closes. NULL-safe. */
void store_close(store **s);

/* Queues r (taken over; freed by the store). Never blocks on SQLite. */
void store_put(store *s, store_rec *r);

/* A new zeroed record of kind for job (copied). NULL on no memory. */
store_rec *store_rec_new(int kind, const char *job);
/* The record's job belongs to the tenant whose CURVE key is owner: it
 * takes that tenant's fair share of the writer, with every other job of
 * the key, not one of its own (NULL: its job name's, as made). */
void store_rec_tenant(store_rec *r, const char *owner);
void store_rec_free(store_rec **rp);

/* The commit-time histogram: counts per bucket of latency.h's
 * LATENCY_BUCKETS (buckets has LATENCY_N_BUCKETS), total count and sum of
 * seconds. Any thread. */
void store_commit_histogram(store *s, uint64_t *buckets, uint64_t *count,
                            double *sum);

uint32_t store_snapshot_every(const store *s);

/* The largest run id in the store at open (0: none): new runs take the
 * ids after it, so that none is ever reused. */
uint64_t store_last_run(const store *s);
/* Whether records of run are queued or being committed (some of its
 * history is not yet readable). Any thread. */
int store_run_pending(store *s, uint64_t run);
/* The key gnmrd seals its decisions with (seal.h): the store's, the same
 * for every gnmrd of one database; STORE_SEAL_KEY_BYTES bytes. */
const uint8_t *store_seal_key(const store *s);
/* This gnmrd's leadership term: taken from the store when it opened, one
 * more than any gnmrd of this database had (Decision.term). */
uint64_t store_term(const store *s);
/* The target (store_target): what queries open. */
const char *store_path(const store *s);
void store_get_stats(store *s, store_stats *st);

#endif /* GNMRD_STORE_H */
