/* SPDX-License-Identifier: MIT */
/* bench/jobs.c — many jobs at once against one gnmrd: does a job's round
 * trip grow with the number of jobs no faster than the cores allow? Each
 * job has RANKS ranks x UNITS units (every unit sharded over all ranks)
 * and runs closed loop: a step's RANKS reports go out together, the next
 * step's when every rank holds the decision. The round trip is from the
 * first report of a step sent to the last rank's decision received.
 *
 * First one job alone (its p99 is the per-job limit), then JOBS jobs at
 * once, all driven from one thread by zmq_poll. The target (#14): the
 * JOBS-job p99 within 1.5x of the single job's p99 x JOBS / cores, where
 * cores = the CPUs this process may run on (this client shares them with
 * gnmrd, in both runs). Also checks that every step of every job was
 * decided with every report, in order, none by deadline. Steps start
 * once gnmrd's store has written what the Hellos queued. Usage:
 * jobs [JOBS] (default 50). */

#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <zmq.h>

#include "wire.h"

#include "benchutil.h"

#define RANKS 4
#define UNITS 10000
#define SINGLE_STEPS 400
#define MULTI_STEPS 60 /* per job */
#define WARM 5         /* steps of each job not timed */

typedef struct bjob {
  char name[32];
  void *s[RANKS];
  uint64_t step;     /* the step in flight (0: none yet) */
  int got;           /* decisions of it received */
  double sent_at;
  int failed;
} bjob;

static double *g_sumsq;
static void wait_store_idle(void);

static int send_step(bjob *b, uint64_t step) {
  b->step = step;
  b->got = 0;
  b->sent_at = bu_now();
  for (uint32_t r = 0; r < RANKS; r++) {
    Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
    Gnmr__Report rep = GNMR__REPORT__INIT;
    uint8_t *buf;
    size_t len;
    rep.job = b->name;
    rep.rank = r;
    rep.step = step;
    rep.n_sumsq = UNITS;
    rep.sumsq = g_sumsq + r; /* shifted: ranks differ */
    env.body_case = GNMR__ENVELOPE__BODY_REPORT;
    env.report = &rep;
    if (gnmr__wire_encode(&env, &buf, &len) != 0)
      return -1;
    int rc = zmq_send(b->s[r], buf, len, 0);
    free(buf);
    if (rc < 0)
      return -1;
  }
  return 0;
}

/* Reads one message from rank r of b; returns 1 when it was the decision
 * of b's step in flight, 0 for anything else (counted as a failure). */
static int read_decision(bjob *b, int r) {
  static uint8_t buf[1 << 20];
  int n = zmq_recv(b->s[r], buf, sizeof buf, ZMQ_DONTWAIT);
  if (n < 0)
    return -1;
  Gnmr__Envelope *env;
  int ok = n <= (int)sizeof buf &&
           gnmr__wire_decode(buf, (size_t)n, &env, NULL, 0) == 0;
  if (ok) {
    ok = env->body_case == GNMR__ENVELOPE__BODY_DECISION &&
         env->decision->step == b->step;
    gnmr__wire_free(&env);
  }
  if (!ok)
    b->failed++;
  return ok;
}

/* Runs n_jobs jobs closed loop for steps steps each; lat gets every timed
 * round trip. Returns the count, or -1 on a failure. */
static long run(const char *ep, int n_jobs, int steps, const char *tag,
                double *lat, char **names) {
  void *ctx = zmq_ctx_new();
  zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, 4096);
  bjob *jobs = calloc((size_t)n_jobs, sizeof *jobs);
  zmq_pollitem_t *items = calloc((size_t)n_jobs * RANKS, sizeof *items);
  long n_lat = 0;
  int bad = 0;
  for (int j = 0; j < n_jobs && !bad; j++) {
    snprintf(jobs[j].name, sizeof jobs[j].name, "%s-%d", tag, j);
    for (int r = 0; r < RANKS && !bad; r++) {
      int zero = 0, hwm = 0;
      void *s = zmq_socket(ctx, ZMQ_DEALER);
      zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
      zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
      zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
      zmq_connect(s, ep);
      jobs[j].s[r] = s;
      items[j * RANKS + r] = (zmq_pollitem_t){s, 0, ZMQ_POLLIN, 0};
      if (bu_hello(s, jobs[j].name, (uint32_t)r, RANKS, names, UNITS)) {
        fprintf(stderr, "jobs: no Welcome for %s rank %d\n", jobs[j].name, r);
        bad = 1;
      }
    }
  }
  if (!bad)
    wait_store_idle();
  for (int j = 0; j < n_jobs && !bad; j++)
    bad = send_step(&jobs[j], 1) != 0;
  int running = n_jobs;
  double give_up = bu_now() + 120;
  while (!bad && running > 0 && bu_now() < give_up) {
    if (zmq_poll(items, n_jobs * RANKS, 1000) < 0)
      break;
    for (int i = 0; i < n_jobs * RANKS; i++) {
      bjob *b = &jobs[i / RANKS];
      if (!(items[i].revents & ZMQ_POLLIN))
        continue;
      int ok;
      while ((ok = read_decision(b, i % RANKS)) >= 0) {
        if (ok == 0) {
          fprintf(stderr, "jobs: %s rank %d: not the decision of step %llu\n",
                  b->name, i % RANKS, (unsigned long long)b->step);
          bad = 1;
          break;
        }
        if (++b->got < RANKS)
          continue;
        if (b->step > WARM)
          lat[n_lat++] = bu_now() - b->sent_at;
        if (b->step == (uint64_t)steps)
          running--;
        else if (send_step(b, b->step + 1) != 0)
          bad = 1;
      }
    }
  }
  if (running > 0 && !bad)
    fprintf(stderr, "jobs: %d jobs did not finish in 120 s\n", running);
  for (int j = 0; j < n_jobs; j++)
    for (int r = 0; r < RANKS; r++)
      if (jobs[j].s[r])
        zmq_close(jobs[j].s[r]);
  zmq_ctx_term(ctx);
  free(items);
  free(jobs);
  return bad || running > 0 ? -1 : n_lat;
}

/* gnmrd's counters: reports, deadline decisions, records not yet
 * stored. */
static void counters(const bu_daemon *d, long long *reports,
                     long long *deadline, long long *queued) {
  char cmd[512], line[256];
  const char *bin = getenv("GNMR_BIN_DIR");
  *reports = *deadline = *queued = -1;
  snprintf(cmd, sizeof cmd, "%s/gnmrctl --admin ipc://%s/admin.sock stats",
           bin ? bin : "build/bin", d->dir);
  FILE *p = popen(cmd, "r");
  while (p && fgets(line, sizeof line, p)) {
    sscanf(line, "reports %lld", reports);
    sscanf(line, "deadline_decisions %lld", deadline);
    sscanf(line, "store_queued %lld", queued);
  }
  if (p)
    pclose(p);
}

static const bu_daemon *g_daemon;

/* Waits (up to 60 s) until gnmrd's store has written what the Hellos
 * queued (every unit's name): the steps are timed in the steady state,
 * not behind a registration backlog on the store's thread. */
static void wait_store_idle(void) {
  long long r, dl, q = 1;
  for (int i = 0; i < 600 && q != 0; i++) {
    counters(g_daemon, &r, &dl, &q);
    if (q != 0)
      usleep(100000);
  }
}

int main(int argc, char **argv) {
  int n_jobs = argc > 1 ? atoi(argv[1]) : 50;
  if (n_jobs < 1 || n_jobs > 1000) {
    fprintf(stderr, "usage: jobs [JOBS]  (1..1000, default 50)\n");
    return 2;
  }
  cpu_set_t set;
  int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                          : 1;
  char **names = malloc(UNITS * sizeof *names);
  g_sumsq = malloc((UNITS + RANKS) * sizeof *g_sumsq);
  for (int u = 0; u < UNITS; u++) {
    names[u] = malloc(16);
    snprintf(names[u], 16, "u%d", u);
  }
  for (int u = 0; u < UNITS + RANKS; u++)
    g_sumsq[u] = 1 + (u % 89) / 89.0;
  double *one = malloc(SINGLE_STEPS * sizeof *one);
  double *many = malloc((size_t)n_jobs * MULTI_STEPS * sizeof *many);
  bu_daemon d = {0};
  if (bu_daemon_start(&d) != 0) {
    fprintf(stderr, "jobs: cannot start gnmrd (build it first)\n");
    return 1;
  }
  g_daemon = &d;
  long n1 = run(d.agents, 1, SINGLE_STEPS, "single", one, names);
  long nm = n1 < 0 ? -1 : run(d.agents, n_jobs, MULTI_STEPS, "many", many,
                              names);
  long long reports, deadline, queued;
  counters(&d, &reports, &deadline, &queued);
  bu_daemon_stop(&d);
  long long want = (long long)RANKS * (SINGLE_STEPS + (long long)n_jobs *
                                                          MULTI_STEPS);
  int ok = n1 > 0 && nm > 0 && reports == want && deadline == 0;
  if (n1 > 0 && nm > 0) {
    double p50_1 = bu_quantile(one, (size_t)n1, 0.5);
    double p99_1 = bu_quantile(one, (size_t)n1, 0.99);
    double p50_m = bu_quantile(many, (size_t)nm, 0.5);
    double p99_m = bu_quantile(many, (size_t)nm, 0.99);
    double max_m = bu_quantile(many, (size_t)nm, 1.0);
    double limit = p99_1 * n_jobs / cores;
    printf("jobs 1 job x %d ranks x %d units alone: round trip p50 %.2f ms, "
           "p99 %.2f ms\n", RANKS, UNITS, p50_1 * 1e3, p99_1 * 1e3);
    printf("jobs %d jobs at once: p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
           n_jobs, p50_m * 1e3, p99_m * 1e3, max_m * 1e3);
    printf("jobs p99 = %.2fx (single p99 x jobs / cores = %.2f ms, "
           "%d cores; target <= 1.5x)\n", p99_m / limit, limit * 1e3, cores);
    /* the medians, steadier than a tail of a few hundred steps */
    printf("jobs p50 = %.2fx (single p50 x jobs / cores = %.2f ms)\n",
           p50_m / (p50_1 * n_jobs / cores), p50_1 * n_jobs / cores * 1e3);
  }
  printf("jobs reports accepted %lld of %lld; deadline decisions %lld\n",
         reports, want, deadline);
  for (int u = 0; u < UNITS; u++)
    free(names[u]);
  free(names);
  free(g_sumsq);
  free(one);
  free(many);
  return ok ? 0 : 1;
}
