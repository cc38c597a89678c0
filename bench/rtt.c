/* SPDX-License-Identifier: MIT */
/* bench/rtt.c — decision round trip for 8 ranks x 1024 units (each unit
 * sharded over all 8) against gnmrd on loopback TCP: from the moment the
 * step's 8 reports are sent until every rank holds the decision. The
 * limit, measured in the same run: a raw ZeroMQ DEALER/ROUTER echo of the
 * same report bytes from 8 sockets through a separate process. Measured
 * twice: with 8 protocol peers in one thread, exactly like the raw
 * baseline (the targets: p50 <= 2x raw, p99 <= 1 ms), and with 8 real
 * agents (each with its own I/O thread; on a 2-core machine they share the
 * cores with gnmrd, which the figure includes). */
#include <stdint.h>
#include <zmq.h>

#include "gnmr/agent.h"
#include "wire.h"

#include "benchutil.h"

#define RANKS 8
#define UNITS 1024
#define WARM 100
#define STEPS 2000
#define PACED_STEPS 1000
#define PACE_US 5000 /* a 5 ms step: fast for a real job */

/* The echo server process: returns every message to its sender. */
static void echo_server(const char *ep_file) {
  void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_ROUTER);
  int zero = 0;
  char ep[256];
  size_t sz = sizeof ep;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_bind(s, "tcp://127.0.0.1:*");
  zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &sz);
  FILE *f = fopen(ep_file, "w");
  fprintf(f, "%s\n", ep);
  fclose(f);
  for (;;) {
    zmq_msg_t id, body;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    if (zmq_msg_recv(&id, s, 0) < 0 || zmq_msg_recv(&body, s, 0) < 0)
      break;
    if (zmq_msg_size(&body) == 0)
      break; /* empty message: stop */
    zmq_msg_send(&id, s, ZMQ_SNDMORE);
    zmq_msg_send(&body, s, 0);
  }
  zmq_close(s);
  zmq_ctx_term(ctx);
  _exit(0);
}

/* Sleeps pace_us microseconds (0: none): the gap a real job leaves
 * between steps, in which the CPUs go idle. */
static void pace(long pace_us) {
  if (pace_us > 0) {
    struct timespec ts = {pace_us / 1000000, (pace_us % 1000000) * 1000};
    nanosleep(&ts, NULL);
  }
}

static void raw_baseline(double *lat, int steps, size_t len_report,
                         long pace_us) {
  char ep_file[] = "/tmp/gnmr-rtt-ep-XXXXXX";
  int fd = mkstemp(ep_file);
  close(fd);
  unlink(ep_file);
  pid_t pid = fork();
  if (pid == 0)
    echo_server(ep_file);
  char ep[256];
  bu_wait_endpoint(ep_file, ep, sizeof ep);
  void *ctx = zmq_ctx_new(), *socks[RANKS];
  char *payload = calloc(1, len_report);
  for (int r = 0; r < RANKS; r++) {
    int zero = 0;
    socks[r] = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(socks[r], ZMQ_LINGER, &zero, sizeof zero);
    zmq_connect(socks[r], ep);
  }
  char *buf = malloc(len_report);
  for (int step = 0; step < WARM + steps; step++) {
    double t0 = bu_now();
    for (int r = 0; r < RANKS; r++)
      zmq_send(socks[r], payload, len_report, 0);
    for (int r = 0; r < RANKS; r++)
      zmq_recv(socks[r], buf, len_report, 0);
    if (step >= WARM)
      lat[step - WARM] = bu_now() - t0;
    pace(pace_us);
  }
  zmq_send(socks[0], "", 0, 0);
  for (int r = 0; r < RANKS; r++)
    zmq_close(socks[r]);
  zmq_ctx_term(ctx);
  waitpid(pid, NULL, 0);
  free(buf);
  free(payload);
}

/* 8 DEALER peers speaking the protocol from one thread, as job `job`. */
static void protocol_peers(const char *ep, const char *job, double *lat,
                           int steps, long pace_us) {
  void *ctx = zmq_ctx_new(), *socks[RANKS];
  char *names[UNITS];
  double sumsq[UNITS];
  static uint8_t buf[1 << 16];
  for (int u = 0; u < UNITS; u++) {
    names[u] = malloc(16);
    snprintf(names[u], 16, "u%d", u);
    sumsq[u] = 1 + (u % 100) / 100.0;
  }
  for (int r = 0; r < RANKS; r++) {
    int zero = 0;
    socks[r] = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(socks[r], ZMQ_LINGER, &zero, sizeof zero);
    zmq_connect(socks[r], ep);
    if (bu_hello(socks[r], job, (uint32_t)r, RANKS, names, UNITS) != 0)
      fprintf(stderr, "no Welcome for rank %d\n", r);
  }
  uint8_t *rank_rep[RANKS];
  for (int s = 0; s < WARM + steps; s++) {
    /* each rank's report, encoded outside the timed region */
    size_t lens[RANKS];
    for (int r = 0; r < RANKS; r++) {
      Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
      Gnmr__Report rp = GNMR__REPORT__INIT;
      rp.job = (char *)job;
      rp.rank = (uint32_t)r;
      rp.step = (uint64_t)s + 1;
      rp.n_sumsq = UNITS;
      rp.sumsq = sumsq;
      env.body_case = GNMR__ENVELOPE__BODY_REPORT;
      env.report = &rp;
      gnmr__wire_encode(&env, &rank_rep[r], &lens[r]);
    }
    double t0 = bu_now();
    for (int r = 0; r < RANKS; r++)
      zmq_send(socks[r], rank_rep[r], lens[r], 0);
    for (int r = 0; r < RANKS; r++)
      zmq_recv(socks[r], buf, sizeof buf, 0);
    if (s >= WARM)
      lat[s - WARM] = bu_now() - t0;
    for (int r = 0; r < RANKS; r++)
      free(rank_rep[r]);
    pace(pace_us);
  }
  for (int r = 0; r < RANKS; r++)
    zmq_close(socks[r]);
  zmq_ctx_term(ctx);
  for (int u = 0; u < UNITS; u++)
    free(names[u]);
}

int main(void) {
  static double lat[STEPS], raw[STEPS], peers[STEPS], quiet[STEPS];
  static double raw_paced[PACED_STEPS], peers_paced[PACED_STEPS];
  bu_daemon d = {0};
  if (bu_daemon_start(&d) != 0) {
    fprintf(stderr, "rtt: cannot start gnmrd (build it first)\n");
    return 1;
  }
  char *names[UNITS];
  for (int u = 0; u < UNITS; u++) {
    names[u] = malloc(16);
    snprintf(names[u], 16, "u%d", u);
  }
  gnmr_agent *ag[RANKS];
  for (int r = 0; r < RANKS; r++) {
    gnmr_agent_config c = {0};
    c.endpoint = d.agents;
    c.job = "rtt";
    c.rank = (uint32_t)r;
    c.reporters = RANKS;
    c.unit_names = (const char *const *)names;
    c.n_units = UNITS;
    gnmr_params_default(&c.params);
    c.barrier_ms = 5000;
    if (gnmr_agent_open(&c, &ag[r]) != GNMR_OK)
      return 1;
  }
  double sumsq[UNITS];
  unsigned seed = 5;
  uint64_t late = 0;
  for (int step = 1; step <= WARM + STEPS; step++) {
    for (int u = 0; u < UNITS; u++)
      sumsq[u] = 1 + (rand_r(&seed) % 100) / 100.0;
    double t0 = bu_now();
    for (int r = 0; r < RANKS; r++)
      gnmr_agent_report_sums(ag[r], (uint64_t)step, sumsq, NULL, NULL);
    for (int r = 0; r < RANKS; r++)
      late += gnmr_agent_wait(ag[r], (uint64_t)step, 5000) != GNMR_OK;
    if (step > WARM)
      lat[step - WARM - 1] = bu_now() - t0;
  }
  for (int r = 0; r < RANKS; r++)
    gnmr_agent_close(&ag[r]);
  protocol_peers(d.agents, "rtt-peers", peers, STEPS, 0);
  protocol_peers(d.agents, "rtt-paced", peers_paced, PACED_STEPS, PACE_US);
  bu_daemon_stop(&d);
  /* the same peers against a gnmrd that takes no snapshot in the run: at
   * 2000 steps a second, snapshot_every 10 writes 200 a second */
  char *no_snap[] = {"--snapshot-every", "1000000", NULL};
  if (bu_daemon_start_args(&d, no_snap) != 0) {
    fprintf(stderr, "rtt: cannot start gnmrd\n");
    return 1;
  }
  protocol_peers(d.agents, "rtt-quiet", quiet, STEPS, 0);
  bu_daemon_stop(&d);
  /* the size of one rank's encoded report */
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Report rep = GNMR__REPORT__INIT;
  rep.job = "rtt";
  rep.step = 1000;
  rep.n_sumsq = UNITS;
  rep.sumsq = sumsq;
  env.body_case = GNMR__ENVELOPE__BODY_REPORT;
  env.report = &rep;
  env.version = 1;
  size_t len = gnmr__envelope__get_packed_size(&env);
  raw_baseline(raw, STEPS, len, 0);
  raw_baseline(raw_paced, PACED_STEPS, len, PACE_US);
  double p50 = bu_quantile(lat, STEPS, 0.5), p99 = bu_quantile(lat, STEPS, 0.99);
  double r50 = bu_quantile(raw, STEPS, 0.5), r99 = bu_quantile(raw, STEPS, 0.99);
  double q50 = bu_quantile(peers, STEPS, 0.5),
         q99 = bu_quantile(peers, STEPS, 0.99);
  printf("rtt %d ranks x %d units (%zu-byte reports), %d steps; raw "
         "DEALER/ROUTER echo of the same bytes: p50 %.0f us, p99 %.0f us\n",
         RANKS, UNITS, len, STEPS, r50 * 1e6, r99 * 1e6);
  printf("rtt protocol peers -> gnmrd: p50 %.0f us = %.2fx raw (target <= "
         "2x); p99 %.0f us = %.2f ms (target <= 1 ms)\n",
         q50 * 1e6, q50 / r50, q99 * 1e6, q99 * 1e3);
  printf("rtt protocol peers -> gnmrd taking no snapshot (--snapshot-every "
         "1000000): p50 %.0f us, p99 %.0f us: the default's snapshot every "
         "10 steps (200 a second here) adds %.0f us to the p99\n",
         bu_quantile(quiet, STEPS, 0.5) * 1e6,
         bu_quantile(quiet, STEPS, 0.99) * 1e6,
         (q99 - bu_quantile(quiet, STEPS, 0.99)) * 1e6);
  double rp50 = bu_quantile(raw_paced, PACED_STEPS, 0.5),
         rp99 = bu_quantile(raw_paced, PACED_STEPS, 0.99),
         pp50 = bu_quantile(peers_paced, PACED_STEPS, 0.5),
         pp99 = bu_quantile(peers_paced, PACED_STEPS, 0.99);
  printf("rtt paced, %d ms between steps (%d steps): raw echo p50 %.0f us, "
         "p99 %.0f us; protocol peers -> gnmrd p50 %.0f us = %.2fx raw, p99 "
         "%.0f us = %.2fx raw\n",
         PACE_US / 1000, PACED_STEPS, rp50 * 1e6, rp99 * 1e6, pp50 * 1e6,
         pp50 / rp50, pp99 * 1e6, pp99 / rp99);
  printf("rtt real agents    -> gnmrd: p50 %.0f us = %.2fx raw; p99 %.0f us; "
         "late decisions %llu (8 agent I/O threads share the cores)\n",
         p50 * 1e6, p50 / r50, p99 * 1e6, (unsigned long long)late);
  for (int u = 0; u < UNITS; u++)
    free(names[u]);
  return 0;
}
