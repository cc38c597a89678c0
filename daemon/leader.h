/* SPDX-License-Identifier: MIT */
/* leader.h — which gnmrd serves the jobs of a PostgreSQL store: the one
 * holding the store's leadership, a PostgreSQL session advisory lock.
 *
 * Why an advisory lock and not a lease row: the server releases it the
 * moment the holder's session ends (gnmrd killed, its host gone once TCP
 * keepalives give up), so a standby needs no clock, no lease length to
 * tune and no clock agreement between hosts; a lease row would make every
 * failover wait out the lease.
 *
 * The holder checks its session every LEADER_CHECK_MS. When the session is
 * gone (the server restarted, or cannot be reached) it takes the lock
 * again on a new one: regained, it goes on serving; held by another gnmrd
 * (a standby won the race), or the server still away after
 * LEADER_GRACE_MS, it stops serving (exit 3) so that two never serve at
 * once for longer than a check. */
#ifndef GNMRD_LEADER_H
#define GNMRD_LEADER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

typedef struct leader leader;

/* The lock's key: this constant ("GNMR") and a hash of the schema, so
 * there is one leadership per schema (one gnmrd group each). */
#define LEADER_LOCK_KEY 0x474e4d52

#define LEADER_POLL_MS 100   /* a standby's retry */
#define LEADER_CHECK_MS 250   /* the holder's check of its session */
#define LEADER_GRACE_MS 5000  /* to take it again after losing it */
/* One leader at a time, with no clock shared between hosts: the holder
 * decides only while its last session check that succeeded began less
 * than LEADER_LEASE_MS ago (leader_may_decide), and publishes a decision
 * only within LEADER_LEASE_MS + LEADER_MARGIN_MS / 2 of it; whoever takes
 * the lock waits LEADER_LEASE_MS + LEADER_MARGIN_MS before it serves. The
 * lock was still the old holder's when its last good check began, so the
 * old holder's last decision goes out before the new one's first, as
 * long as the two hosts' clocks run at about the same rate. */
#define LEADER_LEASE_MS 1000
#define LEADER_MARGIN_MS 500

/* Takes the leadership of the store at url. Without wait, it tries for
 * LEADER_GRACE_MS (a killed holder's session ends a moment after it, as a
 * restart comes): still held is an error ("another gnmrd is active..."),
 * as is a server it cannot reach. With wait (a
 * standby), tries every LEADER_POLL_MS until it has it or *stop is set.
 * Errors: GNMR_E_STORE (err says why), GNMR_E_BUSY (held elsewhere),
 * GNMR_E_CLOSED (stopped while waiting). */
int leader_take(const char *url, int wait, volatile sig_atomic_t *stop,
                leader **out, char *err, size_t errlen);

/* Whether the leadership was lost (the session's check failed): then the
 * caller stops serving. Any thread. */
int leader_lost(leader *l);

/* Whether l's holder may decide now (its lease, above, has not run out),
 * or publish (slack: LEADER_MARGIN_MS / 2 more). NULL (no leadership: a
 * SQLite store, one gnmrd) may always. Any thread. */
int leader_may_decide(leader *l, int slack);

/* The monotonic clock the lease is kept in (ms). */
uint64_t leader_now_ms(void);

/* Releases it (closing the session). NULL-safe. */
void leader_release(leader **l);

#endif /* GNMRD_LEADER_H */
