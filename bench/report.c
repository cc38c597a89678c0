/* SPDX-License-Identifier: MIT */
/* report.c — what gnmr_agent_report_sums costs the training thread (pack
 * the step's per-unit sums and hand them to the agent's I/O thread),
 * against its limit measured in the same run: a raw zmq_send of the same
 * number of bytes into an inproc PUSH socket that another thread drains.
 *
 * Both are timed in the same loop, one after the other right after each
 * step's decision came back, the order alternating: each sees the same
 * caches, just stirred by gnmrd's step and the I/O thread. (The raw send
 * timed alone, its buffers hot in the core's cache and nothing else
 * running, was 1.5-3x faster than the same send after a step: the
 * figure compared a cold copy with a hot one.) The figure is the calling
 * thread's CPU time (CLOCK_THREAD_CPUTIME_ID): on a machine with fewer
 * cores than busy threads (this 2-CPU VM: the training thread, the
 * agent's I/O thread, gnmrd's two workers and its store writer) a call's
 * wall time is mostly the time the thread waited for a core while gnmrd
 * finished the previous step (0.8x to 50x the raw send from one run to
 * the next); the wall medians are printed beside it. */
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

static double thread_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The raw limit: a PUSH into an inproc pipe that a thread drains. */
typedef struct raw_pipe {
  void *ctx, *push, *pull;
  pthread_t th;
} raw_pipe;

static void raw_open(raw_pipe *r) {
  int hwm = 100000;
  r->ctx = zmq_ctx_new();
  r->push = zmq_socket(r->ctx, ZMQ_PUSH);
  r->pull = zmq_socket(r->ctx, ZMQ_PULL);
  zmq_setsockopt(r->push, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(r->pull, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_bind(r->pull, "inproc://raw");
  zmq_connect(r->push, "inproc://raw");
  pthread_create(&r->th, NULL, drain, r->pull);
}

static void raw_close(raw_pipe *r) {
  zmq_send(r->push, "", 0, 0);
  pthread_join(r->th, NULL);
  zmq_close(r->push);
  zmq_close(r->pull);
  zmq_ctx_term(r->ctx);
}

/* Times f() in wall and thread CPU seconds into *wall and *cpu. */
#define TIMED(wall, cpu, f)                                                    \
  do {                                                                         \
    double t0_ = bu_now(), c0_ = thread_cpu();                                 \
    f;                                                                         \
    *(cpu) = thread_cpu() - c0_;                                               \
    *(wall) = bu_now() - t0_;                                                  \
  } while (0)

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
  size_t bytes = (size_t)units * 9 + 64; /* packed doubles and framing */
  char *buf = malloc(bytes);
  memset(buf, 0x5a, bytes); /* real pages, not the shared zero page */
  raw_pipe rp;
  raw_open(&rp);
  double rw[CALLS], rc[CALLS], zw[CALLS], zc[CALLS];
  for (int i = 0; i < CALLS; i++) {
    uint64_t step = (uint64_t)i + 1;
    if (i % 2 == 0) {
      TIMED(&zw[i], &zc[i], zmq_send(rp.push, buf, bytes, 0));
      TIMED(&rw[i], &rc[i], gnmr_agent_report_sums(a, step, s, NULL, NULL));
    } else {
      TIMED(&rw[i], &rc[i], gnmr_agent_report_sums(a, step, s, NULL, NULL));
      TIMED(&zw[i], &zc[i], zmq_send(rp.push, buf, bytes, 0));
    }
    gnmr_agent_wait(a, step, 2000);
  }
  raw_close(&rp);
  free(buf);
  double rep = bu_quantile(rc, CALLS, 0.5), raw = bu_quantile(zc, CALLS, 0.5);
  printf("report %7u units: gnmr_agent_report_sums p50 %.1f us CPU "
         "(%.1f us wall); raw zmq_send of %zu bytes p50 %.1f us CPU (%.1f us "
         "wall): %.2fx raw (target <= 1.5x)\n",
         units, rep * 1e6, bu_quantile(rw, CALLS, 0.5) * 1e6, bytes,
         raw * 1e6, bu_quantile(zw, CALLS, 0.5) * 1e6, rep / raw);
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
