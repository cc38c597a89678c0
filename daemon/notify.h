/* SPDX-License-Identifier: MIT */
/* notify.h — systemd's notify protocol for gnmrd (Type=notify): READY once
 * the endpoints are bound, STOPPING on the way out, and WATCHDOG pings from
 * a timer of the loop thread, so that a stuck loop trips the watchdog.
 * Without $NOTIFY_SOCKET every call does nothing. */
#ifndef GNMRD_NOTIFY_H
#define GNMRD_NOTIFY_H

#include "gnmrd.h"

/* Starts the watchdog timer when systemd asked for one (WATCHDOG_USEC). */
void notify_start(gnmrd *d);
void notify_ready(gnmrd *d, const char *agents_endpoint);
void notify_stopping(gnmrd *d);

#endif /* GNMRD_NOTIFY_H */
