/* SPDX-License-Identifier: MIT */
/* report.c — what gnmr_agent_report_sums costs the training thread (pack
 * the step's per-unit sums and hand them to the agent's I/O thread),
 * against its limit measured in the same run: a raw zmq_send of the same
 * number of bytes into an inproc PUSH socket that another thread drains. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "benchutil.h"
#include "gnmr/agent.h"

#define CALLS 400

static void *drain(void *sock) {
  zmq_msg_t m;
  zmq_msg_init(&m);
  while (zmq_msg_recv(&m, sock, 0) >= 0)
    if (zmq_msg_size(&m) == 0)
      break;
  zmq_msg_close(&m);
  return NULL;
}

/* Median seconds of one zmq_send of len bytes into an inproc pipe. */
static double raw_send(size_t len) {
  void *ctx = zmq_ctx_new(), *push = zmq_socket(ctx, ZMQ_PUSH),
       *pull = zmq_socket(ctx, ZMQ_PULL);
  int hwm = 100000;
  zmq_setsockopt(push, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(pull, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_bind(pull, "inproc://raw");
  zmq_connect(push, "inproc://raw");
  pthread_t th;
  pthread_create(&th, NULL, drain, pull);
  char *buf = malloc(len);
  memset(buf, 0x5a, len); /* real pages, not the shared zero page */
  double t[CALLS];
  for (int i = 0; i < CALLS; i++) {
    double t0 = bu_now();
    zmq_send(push, buf, len, 0);
    t[i] = bu_now() - t0;
    usleep(200); /* a step's worth of other work */
  }
  zmq_send(push, "", 0, 0);
  pthread_join(th, NULL);
  zmq_close(push);
  zmq_close(pull);
  zmq_ctx_term(ctx);
  free(buf);
  return bu_quantile(t, CALLS, 0.5);
}

static void run(const char *ep, uint32_t units) {
  char **names = malloc(units * sizeof *names);
  double *s = malloc(units * sizeof *s);
  for (uint32_t u = 0; u < units; u++) {
    names[u] = malloc(16);
    snprintf(names[u], 16, "u%u", u);
    s[u] = 1.0 + u % 7;
  }
  char job[32];
  snprintf(job, sizeof job, "report-%u", units);
  gnmr_agent_config c = {0};
  c.endpoint = ep;
  c.job = job;
  c.reporters = 1;
  c.unit_names = (const char *const *)names;
  c.n_units = units;
  gnmr_params_default(&c.params);
  gnmr_agent *a = NULL;
  if (gnmr_agent_open(&c, &a) != GNMR_OK) {
    fprintf(stderr, "report: open failed\n");
    exit(1);
  }
  for (int i = 0; i < 500 && !gnmr_agent_joined(a); i++)
    usleep(10000);
  double t[CALLS];
  for (int i = 0; i < CALLS; i++) {
    double t0 = bu_now();
    gnmr_agent_report_sums(a, (uint64_t)i + 1, s, NULL, NULL);
    t[i] = bu_now() - t0;
    gnmr_agent_wait(a, (uint64_t)i + 1, 2000);
  }
  double rep = bu_quantile(t, CALLS, 0.5);
  size_t bytes = (size_t)units * 9 + 64; /* packed doubles and framing */
  double raw = raw_send(bytes);
  printf("report %7u units: gnmr_agent_report_sums p50 %.1f us; raw "
         "zmq_send of %zu bytes p50 %.1f us: %.2fx raw (target <= 1.5x)\n",
         units, rep * 1e6, bytes, raw * 1e6, rep / raw);
  gnmr_agent_close(&a);
  for (uint32_t u = 0; u < units; u++)
    free(names[u]);
  free(names);
  free(s);
}

int main(void) {
  bu_daemon d;
  if (bu_daemon_start(&d) != 0) {
    fprintf(stderr, "report: cannot start gnmrd\n");
    return 1;
  }
  run(d.agents, 10000);
  run(d.agents, 100000);
  bu_daemon_stop(&d);
  return 0;
}
