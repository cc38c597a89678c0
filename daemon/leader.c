/* SPDX-License-Identifier: MIT */
/* leader.c — the store's leadership (leader.h): a session advisory lock
 * on a connection of its own, and a thread that checks that session. */
#include "leader.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db.h"
#include "gnmr/error.h"
#include "log.h"

struct leader {
  db_conn *db;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop;
  atomic_int lost;
  /* when the last session check that succeeded began (leader_now_ms) */
  _Atomic uint64_t lease_from;
};

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

/* 1: taken, 0: held elsewhere, <0: error. */
static int try_lock(db_conn *db) {
  db_stmt *st;
  /* one leadership per schema: two gnmrd groups may share a database,
   * each in its own schema (search_path in the URL's options) */
  if (db_prepare(db, "SELECT pg_try_advisory_lock(CAST(? AS integer), "
                     "hashtext(current_schema()))",
                 &st) != GNMR_OK)
    return GNMR_E_STORE;
  db_bind_int64(st, 1, LEADER_LOCK_KEY);
  int rc = db_step(st), got = rc == DB_ROW ? (int)db_column_int64(st, 0) : 0;
  db_finalize(st);
  return rc == DB_ROW ? got : GNMR_E_STORE;
}

uint64_t leader_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

#define now_ms leader_now_ms

int leader_may_decide(leader *l, int slack) {
  if (l == NULL)
    return 1;
  uint64_t from = atomic_load(&l->lease_from);
  return leader_now_ms() <
         from + LEADER_LEASE_MS + (slack ? LEADER_MARGIN_MS / 2 : 0);
}

/* The session is gone (the server restarted, or cannot be reached): take
 * the lock again on a new session within LEADER_GRACE_MS. 1: regained; 0:
 * another gnmrd holds it now, or the server stayed away. */
static int regain(leader *l) {
  uint64_t until = now_ms() + LEADER_GRACE_MS;
  LOG(WARN, "LEADER-SESSION", "the store's session is gone (%s): taking "
      "the leadership again", db_errmsg(l->db));
  do {
    uint64_t began = now_ms();
    if (db_reconnect(l->db) == GNMR_OK) {
      int got = try_lock(l->db);
      if (got == 1) {
        atomic_store(&l->lease_from, began);
        LOG(INFO, "LEADER-REGAINED", "this gnmrd is still the active one");
        return 1;
      }
      if (got == 0) {
        LOG(ERROR, "LEADER-LOST", "another gnmrd took over the store: "
            "this one stops serving");
        return 0;
      }
    }
    sleep_ms(LEADER_POLL_MS);
  } while (now_ms() < until);
  LOG(ERROR, "LEADER-LOST", "the store stayed out of reach for %d ms (%s): "
      "this gnmrd stops serving, so that a standby can take over",
      LEADER_GRACE_MS, db_errmsg(l->db));
  return 0;
}

static void *check_main(void *arg) {
  leader *l = arg;
  pthread_setname_np(pthread_self(), "gnmrd-leader");
  pthread_mutex_lock(&l->mu);
  while (!l->stop) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += (long)LEADER_CHECK_MS * 1000000;
    until.tv_sec += until.tv_nsec / 1000000000;
    until.tv_nsec %= 1000000000;
    pthread_cond_timedwait(&l->cv, &l->mu, &until);
    if (l->stop)
      break;
    pthread_mutex_unlock(&l->mu);
    /* the lock lives as long as this session: one round trip proves it
     * held when the trip began (the lease counts from then) */
    uint64_t began = now_ms();
    int alive = db_exec(l->db, "SELECT 1") == GNMR_OK;
    if (alive)
      atomic_store(&l->lease_from, began);
    int ok = alive || regain(l);
    pthread_mutex_lock(&l->mu);
    if (!ok) {
      atomic_store(&l->lost, 1);
      break;
    }
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

int leader_take(const char *url, int wait, volatile sig_atomic_t *stop,
                leader **out, char *err, size_t errlen) {
  *out = NULL;
  leader *l = calloc(1, sizeof *l);
  if (l == NULL)
    return GNMR_E_NOMEM;
  int rv, said = 0;
  /* without wait, a lock still held is waited out for LEADER_GRACE_MS:
   * the server ends a killed holder's session a moment after it died, and
   * a supervisor's restart comes in that moment */
  uint64_t until = now_ms() + LEADER_GRACE_MS;
  for (;;) {
    if (l->db == NULL && db_open(url, 0, &l->db, err, errlen) != GNMR_OK) {
      if (!wait)
        goto fail;
      if (!said++)
        LOG(WARN, "STANDBY", "%s (retrying)", err);
    } else {
      int got = try_lock(l->db);
      if (got == 1)
        break;
      if (got < 0) { /* the session broke: open another */
        snprintf(err, errlen, "%s", db_errmsg(l->db));
        db_close(&l->db);
        if (!wait)
          goto fail;
      } else if (!wait && now_ms() >= until) {
        snprintf(err, errlen, "another gnmrd is active on this store (start "
                 "this one with --standby to take over when it stops)");
        rv = GNMR_E_BUSY;
        goto out_fail;
      } else if (!said++) {
        LOG(INFO, "STANDBY", "another gnmrd is active on this store; "
            "standing by to take over");
      }
    }
    if (stop != NULL && *stop) {
      snprintf(err, errlen, "stopped while standing by");
      rv = GNMR_E_CLOSED;
      goto out_fail;
    }
    sleep_ms(LEADER_POLL_MS);
  }
  /* a holder that lost the lock a moment ago may still be deciding
   * until its lease runs out: wait it out, and a margin, before serving
   * (its session's end is what freed the lock, so its last good check
   * began before now) */
  LOG(INFO, "LEADER-TAKEN", "the store's leadership is this gnmrd's; "
      "serving in %d ms, when any earlier holder's lease has run out",
      LEADER_LEASE_MS + LEADER_MARGIN_MS);
  sleep_ms(LEADER_LEASE_MS + LEADER_MARGIN_MS);
  uint64_t began = now_ms(); /* the lease: a check that the lock held */
  if (db_exec(l->db, "SELECT 1") == GNMR_OK)
    atomic_store(&l->lease_from, began);
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->cv, NULL);
  if (pthread_create(&l->thread, NULL, check_main, l) != 0) {
    snprintf(err, errlen, "cannot start the leadership check");
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    goto fail;
  }
  *out = l;
  return GNMR_OK;
fail:
  rv = GNMR_E_STORE;
out_fail:
  db_close(&l->db);
  free(l);
  return rv;
}

int leader_lost(leader *l) { return l != NULL && atomic_load(&l->lost); }

void leader_release(leader **pl) {
  if (pl == NULL || *pl == NULL)
    return;
  leader *l = *pl;
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_signal(&l->cv);
  pthread_mutex_unlock(&l->mu);
  pthread_join(l->thread, NULL);
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->cv);
  db_close(&l->db); /* the server releases the lock with the session */
  free(l);
  *pl = NULL;
}
