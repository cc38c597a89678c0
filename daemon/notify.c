/* SPDX-License-Identifier: MIT */
/* notify.c — see notify.h; libsystemd's sd_notify does the datagram. */
#include "notify.h"

#include <systemd/sd-daemon.h>

#include "log.h"

static void watchdog_cb(uv_timer_t *t) {
  (void)t;
  sd_notify(0, "WATCHDOG=1");
}

void notify_start(gnmrd *d) {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
    return;
  uint64_t ms = usec / 2000; /* ping at half the interval */
  uv_timer_init(d->loop, &d->watchdog);
  uv_timer_start(&d->watchdog, watchdog_cb, ms ? ms : 1, ms ? ms : 1);
  LOG(INFO, "WATCHDOG", "pinging systemd's watchdog every %llu ms",
      (unsigned long long)(ms ? ms : 1));
}

void notify_ready(gnmrd *d, const char *agents_endpoint) {
  (void)d;
  sd_notifyf(0, "READY=1\nSTATUS=serving agents on %s", agents_endpoint);
}

void notify_stopping(gnmrd *d) {
  (void)d;
  sd_notify(0, "STOPPING=1\nSTATUS=stopping");
}
