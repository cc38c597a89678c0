/* SPDX-License-Identifier: MIT */
/* owner.h — which thread runs what, asserted where threads meet. A
 * gnmr_owner names one thread: the one that last called gnmr_owner_claim()
 * on it (a thread claims what it alone may run when it starts, or when
 * ownership passes to it). GNMR_OWNED(o) at a site that only that thread
 * may reach aborts, naming the site and both threads, when another gets
 * there: a broken rule shows where it is broken, not as corrupt state
 * later. An unclaimed owner (zero) passes: what runs before the owning
 * thread exists (set-up, tear-down after its join) is the creator's.
 * Costs a thread-pointer read and a load. */
#ifndef GNMR_OWNER_H
#define GNMR_OWNER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct gnmr_owner {
  _Atomic unsigned long tid; /* pthread_self() of the owner, 0: none */
} gnmr_owner;

static inline void gnmr_owner_claim(gnmr_owner *o) {
  atomic_store(&o->tid, (unsigned long)pthread_self());
}

/* The owner gone (joined): whoever remains may run its sites. */
static inline void gnmr_owner_drop(gnmr_owner *o) { atomic_store(&o->tid, 0); }

static inline void gnmr__owner_check(gnmr_owner *o, const char *what,
                                     const char *file, int line) {
  unsigned long t = atomic_load_explicit(&o->tid, memory_order_relaxed);
  unsigned long self = (unsigned long)pthread_self();
  if (t != 0 && t != self) {
    fprintf(stderr,
            "gnmr: %s:%d: %s runs on thread %#lx only, not on "
            "thread %#lx\n",
            file, line, what, t, self);
    fflush(stderr);
    abort();
  }
}

#define GNMR_OWNED(o, what) gnmr__owner_check((o), (what), __FILE__, __LINE__)

#endif /* GNMR_OWNER_H */
