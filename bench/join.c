/* SPDX-License-Identifier: MIT */
/* join.c — how long a new agent takes to join gnmrd (open to Welcome),
 * the wait in front of every job's first step, against its limit measured
 * in the same run: a raw ZeroMQ DEALER that connects to a ROUTER echo and
 * gets its first message back (the handshake plus one round trip). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "benchutil.h"
#include "gnmr/agent.h"

#define N 50

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
      break;
    zmq_msg_send(&id, s, ZMQ_SNDMORE);
    zmq_msg_send(&body, s, 0);
  }
  zmq_close(s);
  zmq_ctx_term(ctx);
  _exit(0);
}

/* Connect, send a Hello-sized message as soon as the pipe is up, get it
 * back: what joining costs at least. */
static void raw_connect(double *t) {
  char ep_file[] = "/tmp/gnmr-join-ep-XXXXXX";
  int fd = mkstemp(ep_file);
  close(fd);
  unlink(ep_file);
  pid_t pid = fork();
  if (pid == 0)
    echo_server(ep_file);
  char ep[256], buf[256];
  bu_wait_endpoint(ep_file, ep, sizeof ep);
  void *ctx = zmq_ctx_new();
  for (int i = 0; i < N; i++) {
    int zero = 0;
    double t0 = bu_now();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_connect(s, ep);
    zmq_send(s, buf, 100, 0); /* queued until connected */
    zmq_recv(s, buf, sizeof buf, 0);
    t[i] = bu_now() - t0;
    zmq_close(s);
  }
  void *s = zmq_socket(ctx, ZMQ_DEALER);
  zmq_connect(s, ep);
  zmq_send(s, "", 0, 0);
  zmq_close(s);
  zmq_ctx_term(ctx);
  waitpid(pid, NULL, 0);
}

int main(void) {
  double raw[N], join[N];
  bu_daemon d;
  raw_connect(raw);
  if (bu_daemon_start(&d) != 0) {
    fprintf(stderr, "join: cannot start gnmrd\n");
    return 1;
  }
  const char *names[] = {"a", "b"};
  for (int i = 0; i < N; i++) {
    char job[32];
    snprintf(job, sizeof job, "join-%d", i);
    gnmr_agent_config c = {0};
    c.endpoint = d.agents;
    c.job = job;
    c.reporters = 1;
    c.unit_names = names;
    c.n_units = 2;
    gnmr_params_default(&c.params);
    gnmr_agent *a = NULL;
    double t0 = bu_now();
    if (gnmr_agent_open(&c, &a) != GNMR_OK) {
      fprintf(stderr, "join: open failed\n");
      bu_daemon_stop(&d);
      return 1;
    }
    while (!gnmr_agent_joined(a) && bu_now() - t0 < 5)
      usleep(50);
    join[i] = bu_now() - t0;
    gnmr_agent_close(&a);
  }
  bu_daemon_stop(&d);
  double rp50 = bu_quantile(raw, N, 0.5), jp50 = bu_quantile(join, N, 0.5);
  double jmax = bu_quantile(join, N, 1.0);
  printf("join %d agents, open to Welcome: p50 %.2f ms, max %.2f ms; raw "
         "DEALER connect + first round trip p50 %.2f ms: %.2fx raw\n",
         N, jp50 * 1e3, jmax * 1e3, rp50 * 1e3, jp50 / rp50);
  return 0;
}
