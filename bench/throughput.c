/* SPDX-License-Identifier: MIT */
/* bench/throughput.c — daemon throughput: 16 reporters, each with the same
 * 10k units (sharded), send reports as fast as gnmrd decides them (up to 8
 * steps in flight), against the limit measured in the same run: raw ZeroMQ
 * PUSH/PULL of the same bytes (same messages, same count) from 16 sockets
 * into a separate process. Target: >= 50% of raw bytes/s. */
#include <stdint.h>
#include <zmq.h>

#include "wire.h"

#include "benchutil.h"

#define REPORTERS 16
#define UNITS 10000
#define STEPS 200
#define IN_FLIGHT 8

static uint8_t *msg[STEPS][REPORTERS];
static size_t msg_len[STEPS][REPORTERS];

static void *dealer(void *ctx, const char *ep) {
  void *s = zmq_socket(ctx, ZMQ_DEALER);
  int zero = 0, hwm = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_connect(s, ep);
  return s;
}

static double run_gnmrd(const char *ep, char **names) {
  void *ctx = zmq_ctx_new(), *s[REPORTERS];
  static uint8_t buf[1 << 16];
  for (int r = 0; r < REPORTERS; r++) {
    s[r] = dealer(ctx, ep);
    if (bu_hello(s[r], "throughput", (uint32_t)r, REPORTERS, names, UNITS) != 0)
      fprintf(stderr, "no Welcome for rank %d\n", r);
  }
  double t0 = bu_now();
  for (int step = 0; step < STEPS + IN_FLIGHT; step++) {
    if (step < STEPS)
      for (int r = 0; r < REPORTERS; r++)
        zmq_send(s[r], msg[step][r], msg_len[step][r], 0);
    if (step >= IN_FLIGHT) /* the decision of step - IN_FLIGHT */
      for (int r = 0; r < REPORTERS; r++)
        zmq_recv(s[r], buf, sizeof buf, 0);
  }
  double dt = bu_now() - t0;
  for (int r = 0; r < REPORTERS; r++)
    zmq_close(s[r]);
  zmq_ctx_term(ctx);
  return dt;
}

static double run_raw(void) {
  return bu_raw_pushpull(REPORTERS, STEPS, (const uint8_t *const *)&msg[0][0],
                         &msg_len[0][0]);
}

int main(void) {
  bu_daemon d = {0};
  char *names[UNITS];
  double *sumsq = malloc(UNITS * sizeof *sumsq);
  size_t bytes = 0;
  for (int u = 0; u < UNITS; u++) {
    names[u] = malloc(16);
    snprintf(names[u], 16, "u%d", u);
    sumsq[u] = 1 + (u % 97) / 97.0;
  }
  for (int step = 0; step < STEPS; step++)
    for (int r = 0; r < REPORTERS; r++) {
      Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
      Gnmr__Report rp = GNMR__REPORT__INIT;
      rp.job = "throughput";
      rp.rank = (uint32_t)r;
      rp.step = (uint64_t)step + 1;
      rp.n_sumsq = UNITS;
      rp.sumsq = sumsq;
      env.body_case = GNMR__ENVELOPE__BODY_REPORT;
      env.report = &rp;
      gnmr__wire_encode(&env, &msg[step][r], &msg_len[step][r]);
      bytes += msg_len[step][r];
    }
  if (bu_daemon_start(&d) != 0) {
    fprintf(stderr, "throughput: cannot start gnmrd (build it first)\n");
    return 1;
  }
  double tg = run_gnmrd(d.agents, names);
  bu_daemon_stop(&d);
  double tr = run_raw();
  double ur = (double)REPORTERS * UNITS * STEPS;
  printf("throughput %d reporters x %d units, %d steps (%.0f MB of "
         "reports): gnmrd %.2f M unit-reports/s (%.0f MB/s, %.0f steps/s); "
         "raw PUSH/PULL %.0f MB/s\n",
         REPORTERS, UNITS, STEPS, bytes / 1e6, ur / tg / 1e6, bytes / tg / 1e6,
         STEPS / tg, bytes / tr / 1e6);
  printf("throughput gnmrd = %.0f%% of raw bytes/s (target >= 50%%)\n",
         100 * tr / tg);
  for (int step = 0; step < STEPS; step++)
    for (int r = 0; r < REPORTERS; r++)
      free(msg[step][r]);
  for (int u = 0; u < UNITS; u++)
    free(names[u]);
  free(sumsq);
  return 0;
}
