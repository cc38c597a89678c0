/* SPDX-License-Identifier: MIT */
/* admin.c — gnmrd's admin endpoint: answers StatsRequest with the
 * daemon's counters and its live jobs; anything else gets an Error.
 * Loop thread only. */
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "gnmrd.h"
#include "wire.h"

#define MAX_LISTED_JOBS 1024

static void send_stats(gnmrd *d, const void *id, size_t id_len) {
  static const char *const names[] = {
#define GNMRD__COUNTER_NAME(name) #name,
      GNMRD_COUNTERS(GNMRD__COUNTER_NAME)
#undef GNMRD__COUNTER_NAME
  };
  const uint64_t values[] = {
#define GNMRD__COUNTER_VALUE(name) d->c.name,
      GNMRD_COUNTERS(GNMRD__COUNTER_VALUE)
#undef GNMRD__COUNTER_VALUE
  };
  enum { N = sizeof names / sizeof names[0] };
  Gnmr__Counter cs[N], *cp[N];
  const char *jobs[MAX_LISTED_JOBS];
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Stats st = GNMR__STATS__INIT;
  uint8_t *buf;
  size_t len;
  for (size_t i = 0; i < N; i++) {
    gnmr__counter__init(&cs[i]);
    cs[i].name = (char *)names[i];
    cs[i].value = values[i];
    cp[i] = &cs[i];
  }
  st.n_counters = N;
  st.counters = cp;
  st.n_jobs = jobs_names(d, jobs, MAX_LISTED_JOBS);
  st.jobs = (char **)jobs;
  env.body_case = GNMR__ENVELOPE__BODY_STATS;
  env.stats = &st;
  if (gnmr__wire_encode(&env, &buf, &len) == GNMR_OK) {
    server_send(d->admin, id, id_len, buf, len);
    free(buf);
  }
}

void admin_on_message(server *s, const void *id, size_t id_len,
                      const void *data, size_t len, void *ctx) {
  gnmrd *d = ctx;
  Gnmr__Envelope *env;
  char err[128];
  uint8_t *buf;
  size_t blen;
  (void)s;
  d->c.admin_requests++;
  int rv = gnmr__wire_decode(data, len, &env, err, sizeof err);
  if (rv == GNMR_OK && env->body_case == GNMR__ENVELOPE__BODY_STATS_REQUEST) {
    send_stats(d, id, id_len);
  } else {
    if (rv == GNMR_OK) {
      rv = GNMR_E_UNSUPPORTED;
      strcpy(err, "not an admin request");
    }
    if (gnmr__wire_error(rv, err, "admin", 0, &buf, &blen) == GNMR_OK) {
      server_send(d->admin, id, id_len, buf, blen);
      free(buf);
    }
  }
  gnmr__wire_free(&env);
}

void admin_on_bad_frames(server *s, void *ctx) {
  (void)s;
  ((gnmrd *)ctx)->c.admin_requests++;
}
