/* SPDX-License-Identifier: MIT */
/* accept_guard.h — gnmrd's own accept4(2) and accept(2): out of
 * descriptors, one waiting connection is shed and the caller is told
 * ECONNABORTED, never EMFILE (on which libzmq's ipc listener aborts the
 * process). See accept_guard.c. */
#ifndef GNMR_ACCEPT_GUARD_H
#define GNMR_ACCEPT_GUARD_H

/* Takes the descriptor kept in reserve for the shedding; call it early,
 * while descriptors are free. 0, or -1 with errno when none could be
 * opened (the guard then still never answers EMFILE). */
int accept_guard_init(void);

/* Connections shed for want of a descriptor, since the process began. */
unsigned long accept_guard_shed(void);

#endif
