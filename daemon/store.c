/* SPDX-License-Identifier: MIT */
/* store.c — the history's writer (see store.h). The writer thread takes
 * the whole queue per batch (a fair share per job of it, past 16 MB:
 * take_fair) and commits it in one transaction. A failed
 * batch (disk full, a read-only file or database, a PostgreSQL server
 * that went away) is rolled back, logged, counted and retried with
 * backoff, reconnecting first when the connection was lost; records are
 * only freed once committed, and stay queued (up to QUEUE_CAP records and
 * the byte cap, store_set_queue_cap) while the
 * database is away. SQLite's file runs in WAL with synchronous=NORMAL,
 * which survives a crash of gnmrd. */
#include "store.h"
#include "store_sql.h"

#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <sys/stat.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gnmr/error.h"
#include "latency.h"
#include "log.h"

#define QUEUE_CAP 1000000 /* records; beyond it new records are dropped */
#define RETRY_MAX_MS 5000

/* ---- marks -------------------------------------------------------------- */

struct store_mark {
  pthread_mutex_t mu;
  atomic_uint refs;
  uint32_t pass;
  uint64_t step;
  /* records queued out of order (store_mark_hold) and not yet committed
   * or dropped, and the oldest (pass, step) among them since none was */
  uint64_t pending;
  uint32_t floor_pass;
  uint64_t floor_step;
};

store_mark *store_mark_new(uint32_t pass, uint64_t step) {
  store_mark *m = calloc(1, sizeof *m);
  if (m == NULL)
    return NULL;
  pthread_mutex_init(&m->mu, NULL);
  atomic_init(&m->refs, 1);
  m->pass = pass;
  m->step = step;
  return m;
}

store_mark *store_mark_ref(store_mark *m) {
  if (m != NULL)
    atomic_fetch_add(&m->refs, 1);
  return m;
}

void store_mark_free(store_mark **mp) {
  store_mark *m = *mp;
  *mp = NULL;
  if (m == NULL || atomic_fetch_sub(&m->refs, 1) != 1)
    return;
  pthread_mutex_destroy(&m->mu);
  free(m);
}

void store_mark_get(store_mark *m, uint32_t *pass, uint64_t *step) {
  *pass = 0;
  *step = 0;
  if (m == NULL)
    return;
  pthread_mutex_lock(&m->mu);
  *pass = m->pass;
  *step = m->step;
  if (m->pending > 0 &&
      (m->floor_pass < *pass ||
       (m->floor_pass == *pass && m->floor_step <= *step))) {
    /* just before the oldest record still queued out of order: agents
     * keep that decision (and every later one) until it is committed */
    *pass = m->floor_pass;
    *step = m->floor_step;
    if (*step > 0)
      (*step)--;
    else if (*pass > 0)
      (*pass)--, *step = UINT64_MAX;
  }
  pthread_mutex_unlock(&m->mu);
}

void store_mark_hold(store_mark *m, uint32_t pass, uint64_t step) {
  if (m == NULL)
    return;
  pthread_mutex_lock(&m->mu);
  if (m->pending++ == 0 || pass < m->floor_pass ||
      (pass == m->floor_pass && step < m->floor_step)) {
    m->floor_pass = pass;
    m->floor_step = step;
  }
  pthread_mutex_unlock(&m->mu);
}

static void store_mark_release(store_mark *m) {
  if (m == NULL)
    return;
  pthread_mutex_lock(&m->mu);
  if (m->pending > 0)
    m->pending--;
  pthread_mutex_unlock(&m->mu);
}

void store_mark_advance(store_mark *m, uint32_t pass, uint64_t step) {
  if (m == NULL)
    return;
  pthread_mutex_lock(&m->mu);
  if (pass > m->pass || (pass == m->pass && step > m->step)) {
    m->pass = pass;
    m->step = step;
  }
  pthread_mutex_unlock(&m->mu);
}

/* ---- records ------------------------------------------------------------ */

/* A 64-bit FNV-1a of a job name, or of a tenant's key after a 0x01 (no
 * name holds a control character, so no name shares a tenant's); two that
 * share one are served as one: their records then keep one order, which
 * costs nothing. */
static uint64_t fair_key(const char *prefix, const char *text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *p = prefix; *p; p++)
    h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  for (const char *p = text ? text : ""; *p; p++)
    h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  return h;
}

store_rec *store_rec_new(int kind, const char *job) {
  store_rec *r = calloc(1, sizeof *r);
  if (r == NULL)
    return NULL;
  r->kind = kind;
  if ((r->job = strdup(job)) == NULL) {
    free(r);
    return NULL;
  }
  r->share = fair_key("", job);
  return r;
}

void store_rec_tenant(store_rec *r, const char *owner) {
  if (r != NULL)
    r->share = owner != NULL ? fair_key("\x01", owner) : fair_key("", r->job);
}

void store_rec_free(store_rec **rp) {
  store_rec *r = *rp;
  if (r == NULL)
    return;
  *rp = NULL;
  if (r->names && r->names_block == NULL)
    for (uint32_t i = 0; i < r->n; i++)
      free(r->names[i]);
  free(r->names);
  free(r->names_block);
  free(r->ids);
  free(r->job);
  free(r->active);
  free(r->events);
  if (r->snap == NULL) /* else the bytes are the snapshot handle's */
    free(r->snapshot);
  policy_snap_free(&r->snap);
  if (r->restored && r->mark != NULL) /* committed (advanced first), or
                                         dropped */
    store_mark_release(r->mark);
  store_mark_free(&r->mark);
  free(r->text);
  free(r->detail);
  free(r);
}

/* Serializes the snapshots the batch's records still owe (off the loop:
 * policy_snap_take, which appends the id table); one that fails is logged
 * and left out, the step's record kept. */
static void take_snapshots(store_rec *batch) {
  for (store_rec *r = batch; r != NULL; r = r->next) {
    int rv = GNMR_OK;
    uint64_t step = r->step;
    if (r->snap != NULL && r->snapshot == NULL) { /* not on a retry */
      step = policy_snap_step(r->snap);
      /* the bytes stay the handle's, which the record keeps (and frees) */
      rv = policy_snap_take(r->snap, &r->snapshot, &r->snapshot_len);
    }
    if (rv != GNMR_OK) {
      policy_snap_free(&r->snap);
      r->snapshot = NULL;
      r->snapshot_len = 0;
      LOG(ERROR, "SNAPSHOT", "job %s: snapshot at step %llu not taken: %s",
          r->job, (unsigned long long)step, gnmr_strerror(rv));
    }
  }
}

static void gap_flush(store *s);
static uint64_t rec_bytes(const store_rec *r);
/* A job's last snapshot of at least this many bytes gives its memory back
 * once written. */
#define STORE_TRIM_BYTES (8u << 20)

/* After a failed commit the writer retries with at most half as many
 * records per transaction, down to one, and doubles again after each
 * success until it takes the whole queue again (past RETRY_WHOLE): a
 * backlog too large for the space freed (a full disk, a WAL that cannot
 * grow) is then written as far as it fits, instead of failing whole for
 * ever. */
#define RETRY_WHOLE 65536

static void run_account(store *s, const store_rec *r, int in);

/* SQLite: whether the file at the store's path is still the one opened
 * (GNMR_OK), else GNMR_E_STORE with why: a file renamed over it, or its
 * removal, would take every later commit to an inode nobody can read. The
 * batch then stays queued (retried, counted, logged) until the file is
 * back or gnmrd restarts, instead of being lost without a word. */
static int file_still_ours(store *s, char *err, size_t errlen) {
  struct stat sb;
  if (!s->file_known)
    return GNMR_OK;
  int gone = stat(s->path, &sb) != 0 ||
             (uint64_t)sb.st_dev != s->file_dev ||
             (uint64_t)sb.st_ino != s->file_ino;
  if (gone && !s->file_gone)
    LOG(ERROR, "STORE-REPLACED", "%s: the database file is no longer the "
        "one gnmrd opened (replaced or removed): its history is kept "
        "queued, not written where nobody could read it; put the file back "
        "or restart gnmrd", s->shown);
  else if (!gone && s->file_gone)
    LOG(INFO, "STORE-REPLACED", "%s: the database file is back", s->shown);
  s->file_gone = gone;
  if (!gone)
    return GNMR_OK;
  snprintf(err, errlen, "the database file was replaced or removed");
  return GNMR_E_STORE;
}

/* What the writer took from the queue. */
typedef struct wbatch {
  store_rec *head;
  uint64_t n, bytes;
  int stop; /* gnmrd stops: this is the last of the queue */
} wbatch;

/* A queue of more than FAIR_BATCH_BYTES that holds more than one share
 * (queue_shared; a share: every job of one tenant, the CURVE key that
 * created them, or one job name without tenancy) is taken a fair batch at
 * a time: each share at most FAIR_RUN_BYTES of it (its first record always),
 * its records in their order (every run of a name together: a fresh run
 * that ends the name's last one commits after that run's records, so no
 * crash finds both running); the first FAIR_RUNS shares and names met
 * are served,
 * the rest wait for the next batch. One job's bulk (a job whose every
 * unit exceeds queued 513 MB in 8 s beside a 2-rank job: issue 62) then
 * holds another job's decisions back for one batch, not for the whole
 * backlog's transaction. */
#define FAIR_BATCH_BYTES ((uint64_t)16 << 20)
#define FAIR_RUN_BYTES ((uint64_t)4 << 20)
#define FAIR_RUNS 64

typedef struct fair_run {
  uint64_t key, bytes, n; /* key: the records' share (store_rec.share) */
  int used, closed;
} fair_run;

/* key's entry (a small open-addressed table of FAIR_RUNS * 2), NULL when
 * the table is full: that name waits for the next batch. */
static fair_run *fair_slot(fair_run *t, unsigned *n, uint64_t key) {
  unsigned cap = FAIR_RUNS * 2, i = (unsigned)(key >> 57) % cap;
  for (unsigned k = 0; k < cap; k++, i = (i + 1) % cap) {
    if (t[i].used && t[i].key == key)
      return &t[i];
    if (!t[i].used) {
      if (*n >= FAIR_RUNS)
        return NULL;
      (*n)++;
      t[i] = (fair_run){.key = key, .used = 1};
      return &t[i];
    }
  }
  return NULL;
}

/* Takes a fair batch out of the queue (under mu): see FAIR_BATCH_BYTES;
 * after a failure at most `limit` records, each name at most half of
 * them (one at least). What stays keeps its order, and each name's taken
 * records come before its records left, so a failed batch requeued in
 * front (requeue) keeps every name's order. */
static void take_fair(store *s, uint64_t limit, wbatch *w) {
  fair_run t[FAIR_RUNS * 2], names[FAIR_RUNS * 2];
  unsigned n_runs = 0, n_names = 0;
  memset(t, 0, sizeof t);
  memset(names, 0, sizeof names);
  store_rec *bh = NULL, **bt = &bh, *prev = NULL;
  uint64_t n = 0, bytes = 0;
  uint64_t per_name = limit ? (limit / 2 ? limit / 2 : 1) : UINT64_MAX;
  for (store_rec *r = s->head; r != NULL && bytes < FAIR_BATCH_BYTES &&
                               (limit == 0 || n < limit);) {
    store_rec *next = r->next;
    fair_run *f = fair_slot(t, &n_runs, r->share);
    /* a name's records keep their order whichever share took them (a
     * name used again by another tenant) */
    fair_run *nm = fair_slot(names, &n_names, fair_key("", r->job));
    int take = f != NULL && nm != NULL && !f->closed && !nm->closed &&
               f->n < per_name &&
               (f->bytes == 0 || f->bytes + r->held <= FAIR_RUN_BYTES);
    if (!take) {
      if (f != NULL)
        f->closed = 1; /* nothing more of this share in this batch */
      if (nm != NULL)
        nm->closed = 1; /* nor of this name */
      prev = r;
    } else { /* unlinked from the queue, appended to the batch */
      if (prev != NULL)
        prev->next = next;
      else
        s->head = next;
      if (s->tail == r)
        s->tail = prev;
      r->next = NULL;
      *bt = r;
      bt = &r->next;
      f->bytes += r->held;
      f->n++;
      bytes += r->held;
      n++;
    }
    r = next;
  }
  w->head = bh;
  w->n = n;
  w->bytes = bytes < s->queued_bytes ? bytes : s->queued_bytes;
  s->queued -= n;
  s->queued_bytes -= w->bytes;
  s->fair_batches++;
}

/* Whether the queue holds records of more than one job name (under mu):
 * a queue of one name is taken as ever, whole or its first `limit`. */
static int queue_shared(const store *s) {
  uint64_t first = s->head != NULL ? s->head->share : 0;
  for (const store_rec *r = s->head; r != NULL; r = r->next)
    if (r->share != first)
      return 1;
  return 0;
}

/* Waits for records (or the stop), then takes the queue: all of it, a
 * fair batch of it when it holds more than FAIR_BATCH_BYTES of more than
 * one job, or its first `limit` records after a failure (0: no limit;
 * a fair batch again when the queue is shared). */
static void take_batch(store *s, uint64_t limit, wbatch *w) {
  pthread_mutex_lock(&s->mu);
  for (;;) {
    /* the queue is down to half its cap (or gnmrd stops): what was shed
     * becomes the runs' history_gap events */
    if (s->n_gaps > 0 && (s->queue_cap_bytes == 0 || s->stop ||
                          s->queued_bytes <= s->queue_cap_bytes / 2))
      gap_flush(s);
    if (s->head != NULL || s->stop)
      break;
    pthread_cond_wait(&s->cv, &s->mu);
  }
  w->head = s->head;
  w->n = s->queued;
  w->bytes = s->queued_bytes;
  if (!s->stop &&
      (s->queued_bytes > FAIR_BATCH_BYTES ||
       (limit != 0 && s->queued > limit)) &&
      queue_shared(s)) {
    take_fair(s, limit, w);
  } else if (limit == 0 || w->n <= limit) {
    s->head = s->tail = NULL;
    s->queued = 0;
    s->queued_bytes = 0;
  } else { /* the first `limit` records; the rest stay queued */
    store_rec *last = w->head;
    uint64_t b = last->held, n;
    for (n = 1; n < limit; n++) {
      last = last->next;
      b += last->held;
    }
    s->head = last->next;
    last->next = NULL;
    w->n = n;
    w->bytes = b < s->queued_bytes ? b : s->queued_bytes;
    s->queued -= n;
    s->queued_bytes -= w->bytes;
  }
  s->batch_bytes = w->bytes; /* still held, while the writer has them */
  w->stop = s->stop;
  pthread_mutex_unlock(&s->mu);
}

/* One transaction: every record of the batch, and the retention of each
 * step's run. GNMR_OK, or the error with its text in err. */
static int commit_batch(store *s, store_rec *batch, char *err, size_t errlen) {
  int rv = file_still_ours(s, err, errlen);
  store__discard(&s->sql); /* rows of a batch that failed */
  if (rv == GNMR_OK && (rv = db_begin(s->sql.db)) != GNMR_OK)
    snprintf(err, errlen, "%s", db_errmsg(s->sql.db));
  for (store_rec *r = batch; rv == GNMR_OK && r; r = r->next) {
    rv = store__apply(&s->sql, r);
    if (rv == GNMR_OK && r->kind == REC_STEP)
      rv = store__retain(&s->sql, r->run, r->step);
    if (rv != GNMR_OK)
      snprintf(err, errlen, "%s", db_errmsg(s->sql.db));
  }
  if (rv == GNMR_OK && (rv = store__flush(&s->sql)) != GNMR_OK)
    snprintf(err, errlen, "%s", db_errmsg(s->sql.db));
  if (rv == GNMR_OK)
    rv = store__exec(s->sql.db, "COMMIT", err, errlen);
  return rv;
}

/* The batch leaves the store's hands: its runs' bytes given back, each
 * step's mark advanced when it was committed, the records freed. */
static void release_batch(store *s, store_rec *batch, int committed) {
  pthread_mutex_lock(&s->mu);
  s->batch_bytes = 0;
  if (committed)
    s->dropping = 0;
  for (store_rec *r = batch; r != NULL; r = r->next)
    run_account(s, r, 0);
  pthread_mutex_unlock(&s->mu);
  size_t bytes = 0;
  while (batch) {
    store_rec *next = batch->next;
    if (committed && batch->kind == REC_STEP) /* agents may forget it */
      store_mark_advance(batch->mark, batch->pass, batch->step);
    if (batch->kind == REC_SNAPSHOT) /* a job's last: at its end */
      bytes += batch->held;
    store_rec_free(&batch);
    batch = next;
  }
  /* a large job's last snapshot (tens of MB, written when it ends) goes
   * back to the system once written, not only to this thread's arena
   * (issue 62); a running job's batches are not trimmed: its next step
   * would take the same pages again, faulting them in */
  if (bytes >= STORE_TRIM_BYTES) {
    /* and the snapshot buffers kept for reuse (a 2^19-unit job's: 56
     * MB), which stayed until a larger snapshot came; a live job's next
     * snapshot maps its buffer anew */
    policy_snap_spares_drop();
    malloc_trim(0);
  }
}

/* A damaged file: retrying cannot help, so the history stops here,
 * loudly; decisions go on (they never wait on the store). */
static void drop_damaged(store *s, const wbatch *w, const char *err) {
  store__exec(s->sql.db, "ROLLBACK", NULL, 0);
  atomic_fetch_add(&s->errors, 1);
  atomic_fetch_add(&s->dropped, w->n);
  if (!s->corrupt)
    LOG(ERROR, "STORE-CORRUPT",
        "%s: %s: the database is damaged; no "
        "more history is written (restore it from a backup, or move it "
        "away and restart gnmrd)",
        s->shown, err);
  s->corrupt = 1;
  release_batch(s, w->head, 0);
}

/* A failed batch goes back in front of anything queued since. */
static void requeue(store *s, const wbatch *w) {
  pthread_mutex_lock(&s->mu);
  store_rec *last = w->head;
  while (last && last->next)
    last = last->next;
  if (last) {
    last->next = s->head;
    if (s->tail == NULL)
      s->tail = last;
    s->head = w->head;
    s->queued += w->n;
    s->queued_bytes += w->bytes;
    s->batch_bytes = 0;
  }
  pthread_mutex_unlock(&s->mu);
}

/* A committed batch: its time and counts. */
static void count_commit(store *s, uint64_t n, const struct timespec *c0) {
  struct timespec c1;
  clock_gettime(CLOCK_MONOTONIC, &c1);
  uint64_t ns = (uint64_t)(c1.tv_sec - c0->tv_sec) * 1000000000u +
                (uint64_t)(c1.tv_nsec - c0->tv_nsec);
  int b = latency_bucket((double)ns * 1e-9);
  if (b < LATENCY_N_BUCKETS)
    atomic_fetch_add(&s->commit_buckets[b], 1);
  atomic_fetch_add(&s->commit_ns, ns);
  atomic_fetch_add(&s->batches, 1);
  atomic_fetch_add(&s->records, n);
}

/* The writer thread: takes the whole queue, commits it in one
 * transaction, retries a failed batch (see the top of the file). */
static void *writer_main(void *arg) {
  store *s = arg;
  pthread_setname_np(pthread_self(), "gnmrd-store");
  uint32_t backoff_ms = 0;
  uint64_t since_checkpoint = 0, limit = 0; /* 0: the whole queue */
  for (;;) {
    wbatch w;
    take_batch(s, limit, &w);
    if (w.head == NULL && w.stop)
      break;
    db_fault_tick(s->fault, s->sql.db); /* tests: GNMR_STORE_FAULT */
    take_snapshots(w.head);
    char err[256] = "";
    struct timespec c0;
    clock_gettime(CLOCK_MONOTONIC, &c0);
    int rv = commit_batch(s, w.head, err, sizeof err);
    int ec = rv != GNMR_OK ? db_error_class(s->sql.db) : 0;
    if (ec == DB_ERR_DAMAGED) {
      drop_damaged(s, &w, err);
      continue;
    }
    if (rv != GNMR_OK) {
      if (ec != DB_ERR_CONNECTION)
        db_rollback(s->sql.db);
      atomic_fetch_add(&s->errors, 1);
      LOG(ERROR, "STORE-COMMIT", "%s: %s (%llu records kept, retrying)",
          s->shown, err, (unsigned long long)w.n);
      requeue(s, &w);
      limit = w.n > 1 ? w.n / 2 : 1;
      backoff_ms = backoff_ms ? backoff_ms * 2 : 100;
      if (backoff_ms > RETRY_MAX_MS)
        backoff_ms = RETRY_MAX_MS;
      if (w.stop && backoff_ms >= RETRY_MAX_MS) {
        LOG(ERROR, "STORE-LOST",
            "giving up at shutdown: %llu records not "
            "committed",
            (unsigned long long)w.n);
        break;
      }
      usleep(backoff_ms * 1000);
      if (ec == DB_ERR_CONNECTION) {
        if (db_reconnect(s->sql.db) == GNMR_OK)
          LOG(INFO, "STORE-RECONNECT", "%s: connected again", s->shown);
        else
          LOG(WARN, "STORE-RECONNECT", "%s: %s", s->shown,
              db_errmsg(s->sql.db));
      }
      continue;
    }
    backoff_ms = 0;
    if (limit != 0 && (limit *= 2) > RETRY_WHOLE)
      limit = 0;
    count_commit(s, w.n, &c0);
    release_batch(s, w.head, 1);
    if ((since_checkpoint += w.n) > 50000) {
      db_checkpoint(s->sql.db, 0);
      since_checkpoint = 0;
    }
  }
  /* anything left after a failed shutdown */
  while (s->head) {
    store_rec *next = s->head->next;
    store_rec_free(&s->head);
    s->head = next;
  }
  return NULL;
}

int store_open(const char *where, uint32_t snapshot_every, uint64_t retain_steps,
               store **out, char *err, size_t errlen) {
  store *s = calloc(1, sizeof *s);
  *out = NULL;
  if (s == NULL)
    return GNMR_E_NOMEM;
  store_target(where, s->path, sizeof s->path);
  db_target_display(s->path, s->shown, sizeof s->shown);
  gnmr_owner_claim(&s->loop);
  s->snapshot_every = snapshot_every ? snapshot_every : 1;
  s->sql.retain_steps = retain_steps;
  if (db_open(s->path, DB_CREATE, &s->sql.db, err, errlen) != GNMR_OK)
    goto fail;
  if (store__configure(s->sql.db) != GNMR_OK) {
    snprintf(err, errlen, "%s: %s", s->shown, db_errmsg(s->sql.db));
    goto fail;
  }
  if (store__integrity(s->sql.db, err, errlen) != GNMR_OK ||
      store__migrate(s->sql.db, err, errlen) != GNMR_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", err);
    snprintf(err, errlen, "%s: %s", s->shown, why);
    goto fail;
  }
  if (store_newest_run(s->sql.db, &s->last_run) != GNMR_OK) {
    snprintf(err, errlen, "%s: %s", s->shown, db_errmsg(s->sql.db));
    goto fail;
  }
  {
    char why[400];
    if (store__seal_key(s->sql.db, s->seal_key, why, sizeof why) !=
            GNMR_OK ||
        store__term_next(s->sql.db, &s->term, why, sizeof why) != GNMR_OK) {
      snprintf(err, errlen, "%s: %s", s->shown, why);
      goto fail;
    }
  }
  if (db_kind(s->sql.db) == DB_SQLITE) {
    struct stat sb;
    if (stat(s->path, &sb) == 0) {
      s->file_dev = (uint64_t)sb.st_dev;
      s->file_ino = (uint64_t)sb.st_ino;
      s->file_known = 1;
    }
  }
  {
    char what[64];
    if (db_kind(s->sql.db) == DB_SQLITE &&
        (s->fault = db_fault_from_env(what, sizeof what)) != NULL)
      LOG(WARN, "STORE-FAULT", "test hook: the database is %s", what);
  }
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  if (pthread_create(&s->thread, NULL, writer_main, s) != 0) {
    snprintf(err, errlen, "cannot start the store thread");
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    goto fail;
  }
  *out = s;
  return GNMR_OK;
fail:
  db_fault_free(&s->fault);
  db_close(&s->sql.db);
  free(s);
  return GNMR_E_STORE;
}

void store_close(store **ps) {
  if (ps == NULL || *ps == NULL)
    return;
  store *s = *ps;
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  store__stmts_finalize(&s->sql);
  db_checkpoint(s->sql.db, 1);
  db_close(&s->sql.db);
  db_fault_free(&s->fault);
  for (size_t i = 0; i < s->n_gaps; i++)
    free(s->gaps[i].job);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  memset(s->seal_key, 0, sizeof s->seal_key);
  hmap_clear(&s->run_bytes);
  free(s);
  *ps = NULL;
}

/* What a record holds in memory, about. */
static uint64_t rec_bytes(const store_rec *r) {
  uint64_t b = sizeof *r + strlen(r->job) + 1 + r->snapshot_len +
               (r->snap ? policy_snap_size(r->snap) : 0) +
               (uint64_t)r->n_events * sizeof *r->events +
               (r->ids ? (uint64_t)r->n * sizeof *r->ids : 0) +
               (r->active ? strlen(r->active) + 1 : 0) +
               (r->text ? strlen(r->text) + 1 : 0) +
               (r->detail ? strlen(r->detail) + 1 : 0);
  if (r->names_block != NULL)
    b += (uint64_t)r->n * sizeof *r->names + r->names_bytes;
  else if (r->names)
    for (uint32_t i = 0; i < r->n; i++)
      b += sizeof *r->names + (r->names[i] ? strlen(r->names[i]) + 1 : 0);
  return b;
}

void store_set_queue_cap(store *s, uint64_t bytes) {
  pthread_mutex_lock(&s->mu);
  s->queue_cap_bytes = bytes;
  pthread_mutex_unlock(&s->mu);
}

/* A dropped record's run and steps join its run's gap (under mu). Past
 * STORE_MAX_GAPS runs at once, the last slot takes every other run's too
 * (its event then says so). */
static void gap_note(store *s, const store_rec *r) {
  struct store_gap *g = NULL;
  for (size_t i = 0; i < s->n_gaps && g == NULL; i++)
    if (s->gaps[i].run == r->run && strcmp(s->gaps[i].job, r->job) == 0)
      g = &s->gaps[i];
  if (g == NULL && s->n_gaps < STORE_MAX_GAPS) {
    char *job = strdup(r->job);
    if (job != NULL) {
      g = &s->gaps[s->n_gaps++];
      *g = (struct store_gap){job, r->run, r->pass, r->step, r->step, 0};
    }
  }
  if (g == NULL)
    g = &s->gaps[STORE_MAX_GAPS - 1];
  if (g->run == r->run) {
    g->first = r->step < g->first ? r->step : g->first;
    g->last = r->step > g->last ? r->step : g->last;
  }
  g->records++;
}

/* What run holds in the queue, and its change as a record comes in or
 * leaves committed (under mu). Best effort without memory: a run whose
 * count cannot be kept is not held to a share. */
static uint64_t run_held(const store *s, uint64_t run) {
  uint64_t v;
  return hmap_get(&s->run_bytes, &run, sizeof run, &v) ? v : 0;
}

static void run_account(store *s, const store_rec *r, int in) {
  uint64_t run = r->run, v = run_held(s, run);
  if (in) {
    if (v == 0 && r->held > 0)
      s->n_runs_held++;
    v += r->held;
  } else {
    v = v > r->held ? v - r->held : 0;
  }
  if (v == 0) {
    if (hmap_del(&s->run_bytes, &run, sizeof run) == GNMR_OK &&
        s->n_runs_held > 0)
      s->n_runs_held--;
  } else if (hmap_put(&s->run_bytes, &run, sizeof run, v) != GNMR_OK &&
             in && v == r->held && s->n_runs_held > 0) {
    s->n_runs_held--;
  }
}

/* Appends r to the queue, counted (under mu). */
static void enqueue(store *s, store_rec *r) {
  r->next = NULL;
  if (s->tail)
    s->tail->next = r;
  else
    s->head = r;
  s->tail = r;
  s->queued++;
  s->queued_bytes += r->held;
  run_account(s, r, 1);
}

/* Gap i becomes an event of its run (queued past the cap: a small record),
 * so that the history says which steps it lacks (under mu). */
static void gap_event(store *s, size_t i) {
  struct store_gap *g = &s->gaps[i];
  store_rec *e = store_rec_new(REC_EVENT, g->job);
  char detail[200];
  snprintf(detail, sizeof detail, "steps %llu-%llu: %llu records not "
           "stored: the store queue was full ([limits] store_queue_mb)%s",
           (unsigned long long)g->first, (unsigned long long)g->last,
           (unsigned long long)g->records,
           i == STORE_MAX_GAPS - 1 ? " (with other runs' records)" : "");
  if (e != NULL) {
    e->run = g->run;
    e->pass = g->pass;
    e->step = g->first;
    e->rank = UINT32_MAX;
    e->text = strdup(store_op_event_name(STORE_EV_HISTORY_GAP));
    e->detail = strdup(detail);
    e->held = rec_bytes(e);
    enqueue(s, e);
  }
  free(g->job);
}

/* The queue takes records again: each gap becomes its run's event. */
static void gap_flush(store *s) {
  for (size_t i = 0; i < s->n_gaps; i++)
    gap_event(s, i);
  s->n_gaps = 0;
}

/* The gap of run alone, when it has one of its own (under mu): the run
 * takes records again while others may still be shedding. Past
 * STORE_MAX_GAPS runs, the last slot is every other run's: left to
 * gap_flush. */
static int run_gap(const store *s, uint64_t run) {
  for (size_t i = 0; i < s->n_gaps; i++)
    if (s->gaps[i].run == run)
      return 1;
  return 0;
}

static void gap_flush_run(store *s, uint64_t run) {
  if (s->n_gaps >= STORE_MAX_GAPS)
    return;
  for (size_t i = 0; i < s->n_gaps; i++)
    if (s->gaps[i].run == run) {
      gap_event(s, i);
      memmove(&s->gaps[i], &s->gaps[i + 1],
              (s->n_gaps - i - 1) * sizeof s->gaps[0]);
      s->n_gaps--;
      return;
    }
}

void store_put(store *s, store_rec *r) {
  /* one thread queues, so that records arrive in the order decided (the
   * mark's rule, store_mark_*) */
  GNMR_OWNED(&s->loop, "queueing a history record");
  if (r == NULL)
    return;
  r->next = NULL;
  uint64_t bytes = r->held = rec_bytes(r);
  /* what a run's history means (its job, units, ranks, parameters, state)
   * is never dropped: small, and without it the steps kept would belong
   * to an unknown job; steps, snapshots and events are what the cap sheds */
  int sheddable = r->kind == REC_STEP || r->kind == REC_SNAPSHOT ||
                  r->kind == REC_EVENT;
  pthread_mutex_lock(&s->mu);
  uint64_t cap = s->queue_cap_bytes;
  uint64_t held = s->queued_bytes + s->batch_bytes + bytes;
  /* each run's share, so that one job's flood (a job whose every unit
   * is risky every step) cannot drop another's records: a run never holds
   * more than half the cap (the other half is room for the runs that come
   * later), and once the queue is half full, a run holding more than the
   * cap divided among the runs holding records sheds first */
  uint64_t mine = run_held(s, r->run) + bytes;
  uint64_t runs = s->n_runs_held + (mine == bytes);
  int over_share = cap != 0 && (mine > cap / 2 ||
                                (runs > 1 && held > cap / 2 &&
                                 mine > cap / runs));
  /* once a run sheds, it goes on until the queue is down to half the cap,
   * so that a gap is every step of its range, not one record in three */
  if (sheddable &&
      (s->queued >= QUEUE_CAP || over_share ||
       (cap != 0 &&
        (held > cap || (run_gap(s, r->run) && held > cap / 2))))) {
    uint64_t qb = s->queued_bytes, q = s->queued;
    int first = !s->dropping;
    s->dropping = 1;
    gap_note(s, r);
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add(&s->dropped, 1);
    if (first) /* once per episode: a database away drops many */
      LOG(ERROR, "STORE-DROP",
          "store queue full (%llu records, %llu MB): records of job %s "
          "%s are lost until the database takes writes again "
          "(store_dropped counts them)",
          (unsigned long long)q, (unsigned long long)(qb >> 20), r->job,
          over_share ? "(over its share of the queue)" : "and others");
    store_rec_free(&r);
    return;
  }
  if (sheddable) /* room again for this run, not only for structure */
    gap_flush_run(s, r->run);
  enqueue(s, r);
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

void store_commit_histogram(store *s, uint64_t *buckets, uint64_t *count,
                            double *sum) {
  for (int i = 0; i < LATENCY_N_BUCKETS; i++)
    buckets[i] = atomic_load(&s->commit_buckets[i]);
  *count = atomic_load(&s->batches);
  *sum = (double)atomic_load(&s->commit_ns) * 1e-9;
}

uint32_t store_snapshot_every(const store *s) { return s->snapshot_every; }
uint64_t store_last_run(const store *s) { return s->last_run; }

int store_run_pending(store *s, uint64_t run) {
  pthread_mutex_lock(&s->mu);
  int pending = run_held(s, run) > 0;
  pthread_mutex_unlock(&s->mu);
  return pending;
}
const uint8_t *store_seal_key(const store *s) { return s->seal_key; }
uint64_t store_term(const store *s) { return s->term; }
const char *store_path(const store *s) { return s->path; }

void store_get_stats(store *s, store_stats *st) {
  st->records = atomic_load(&s->records);
  st->batches = atomic_load(&s->batches);
  st->errors = atomic_load(&s->errors);
  st->dropped = atomic_load(&s->dropped);
  pthread_mutex_lock(&s->mu);
  st->queued = s->queued;
  st->queued_bytes = s->queued_bytes + s->batch_bytes;
  st->fair_batches = s->fair_batches;
  pthread_mutex_unlock(&s->mu);
}

