/* SPDX-License-Identifier: MIT */
/* bench/load.c — gnmrd under load: JOBS jobs at once, each with REPORTERS
 * reporters x 10k units (every unit sharded over all of them), STEPS steps,
 * up to 4 steps in flight per job. Checks that every step is decided and no
 * report is lost or late, and reports step latency (first report sent to
 * decision received), the daemon's CPU time and RSS, and its bytes/s
 * against raw ZeroMQ PUSH/PULL of the same reports measured in the same
 * run. */
#include <stdint.h>
#include <zmq.h>

#include "wire.h"

#include "benchutil.h"

#define JOBS 2
#define REPORTERS 100
#define UNITS 10000
#define STEPS 1000
#define IN_FLIGHT 4

typedef struct proc_usage {
  double cpu_s;
  long rss_kb;
} proc_usage;

static proc_usage usage_of(pid_t pid) {
  proc_usage u = {0, 0};
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (f && fgets(buf, sizeof buf, f)) {
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    /* fields after the name: state(3) ... utime(14) stime(15) */
    if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu "
                           "%lu", &ut, &st) == 2)
      u.cpu_s = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
  }
  if (f)
    fclose(f);
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  f = fopen(path, "r");
  while (f && fgets(buf, sizeof buf, f))
    if (sscanf(buf, "VmRSS: %ld kB", &u.rss_kb) == 1)
      break;
  if (f)
    fclose(f);
  return u;
}

static uint8_t *encode_report(const char *job, uint32_t rank, uint64_t step,
                              double *sumsq, size_t *len) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Report r = GNMR__REPORT__INIT;
  uint8_t *b;
  r.job = (char *)job;
  r.rank = rank;
  r.step = step;
  r.n_sumsq = UNITS;
  r.sumsq = sumsq;
  env.body_case = GNMR__ENVELOPE__BODY_REPORT;
  env.report = &r;
  gnmr__wire_encode(&env, &b, len);
  return b;
}

int main(void) {
  static double lat[JOBS * STEPS];
  static uint8_t buf[1 << 16];
  bu_daemon d = {0};
  char *names[UNITS];
  double *sumsq = malloc(UNITS * sizeof *sumsq);
  for (int u = 0; u < UNITS; u++) {
    names[u] = malloc(16);
    snprintf(names[u], 16, "u%d", u);
    sumsq[u] = 1 + (u % 89) / 89.0;
  }
  if (bu_daemon_start(&d) != 0) {
    fprintf(stderr, "load: cannot start gnmrd (build it first)\n");
    return 1;
  }
  void *ctx = zmq_ctx_new(), *s[JOBS][REPORTERS];
  char job[JOBS][16];
  for (int j = 0; j < JOBS; j++) {
    snprintf(job[j], sizeof job[j], "load-%d", j);
    for (int r = 0; r < REPORTERS; r++) {
      int zero = 0, hwm = 0;
      s[j][r] = zmq_socket(ctx, ZMQ_DEALER);
      zmq_setsockopt(s[j][r], ZMQ_LINGER, &zero, sizeof zero);
      zmq_setsockopt(s[j][r], ZMQ_SNDHWM, &hwm, sizeof hwm);
      zmq_setsockopt(s[j][r], ZMQ_RCVHWM, &hwm, sizeof hwm);
      zmq_connect(s[j][r], d.agents);
      if (bu_hello(s[j][r], job[j], (uint32_t)r, REPORTERS, names, UNITS)) {
        fprintf(stderr, "load: no Welcome for %s rank %d\n", job[j], r);
        return 1;
      }
    }
  }
  proc_usage u0 = usage_of(d.pid);
  double sent_at[JOBS][STEPS + 1], t0 = bu_now();
  size_t bytes = 0;
  uint64_t decided = 0;
  /* steps of both jobs interleaved; decisions read on every socket */
  for (int step = 1; step <= STEPS + IN_FLIGHT; step++) {
    for (int j = 0; j < JOBS && step <= STEPS; j++) {
      sent_at[j][step] = bu_now();
      for (int r = 0; r < REPORTERS; r++) {
        size_t len;
        uint8_t *b = encode_report(job[j], (uint32_t)r, (uint64_t)step,
                                   sumsq, &len);
        zmq_send(s[j][r], b, len, 0);
        bytes += len;
        free(b);
      }
    }
    int done = step - IN_FLIGHT; /* its decision must now come */
    if (done < 1)
      continue;
    for (int j = 0; j < JOBS; j++) {
      for (int r = 0; r < REPORTERS; r++) {
        int n = zmq_recv(s[j][r], buf, sizeof buf, 0);
        Gnmr__Envelope *env;
        if (n <= 0 || gnmr__wire_decode(buf, (size_t)n, &env, NULL, 0) != 0 ||
            env->body_case != GNMR__ENVELOPE__BODY_DECISION ||
            env->decision->step != (uint64_t)done) {
          fprintf(stderr, "load: %s rank %d: no decision for step %d\n",
                  job[j], r, done);
          return 1;
        }
        if (r == 0) {
          lat[decided++] = bu_now() - sent_at[j][done];
        }
        gnmr__wire_free(&env);
      }
    }
  }
  double dt = bu_now() - t0;
  proc_usage u1 = usage_of(d.pid);
  /* nothing lost: gnmrd's own counters */
  char cmd[512], line[256];
  const char *bin = getenv("GNMR_BIN_DIR");
  long long reports = -1, deadline = -1, late = -1, refused = -1;
  snprintf(cmd, sizeof cmd, "%s/gnmrctl --admin ipc://%s/admin.sock stats",
           bin ? bin : "build/bin", d.dir);
  FILE *p = popen(cmd, "r");
  while (p && fgets(line, sizeof line, p)) {
    sscanf(line, "reports %lld", &reports);
    sscanf(line, "deadline_decisions %lld", &deadline);
    sscanf(line, "late_reports %lld", &late);
    sscanf(line, "reports_refused %lld", &refused);
  }
  if (p)
    pclose(p);
  for (int j = 0; j < JOBS; j++)
    for (int r = 0; r < REPORTERS; r++)
      zmq_close(s[j][r]);
  zmq_ctx_term(ctx);
  bu_daemon_stop(&d);

  /* the raw limit: the same number and size of messages */
  size_t one;
  uint8_t *sample = encode_report("load-0", 50, STEPS, sumsq, &one);
  int n_socks = 50, rounds = JOBS * REPORTERS * STEPS / 50;
  const uint8_t **msgs = malloc((size_t)n_socks * rounds * sizeof *msgs);
  size_t *lens = malloc((size_t)n_socks * rounds * sizeof *lens);
  for (int i = 0; i < n_socks * rounds; i++) {
    msgs[i] = sample;
    lens[i] = one;
  }
  double raw = bu_raw_pushpull(n_socks, rounds, msgs, lens);
  double raw_bytes = (double)one * n_socks * rounds;
  printf("load %d jobs x %d reporters x %d units, %d steps each: %llu of "
         "%d steps decided, %.0f steps/s, %.2f M unit-reports/s\n",
         JOBS, REPORTERS, UNITS, STEPS, (unsigned long long)decided,
         JOBS * STEPS, decided / dt, (double)JOBS * REPORTERS * UNITS * STEPS
                                           / dt / 1e6);
  printf("load reports accepted %lld of %d sent; deadline decisions %lld, "
         "late reports %lld, refused %lld\n", reports,
         JOBS * REPORTERS * STEPS, deadline, late, refused);
  printf("load step latency (reports sent to decision, %d in flight): p50 "
         "%.1f ms, p99 %.1f ms\n", IN_FLIGHT,
         bu_quantile(lat, decided, 0.5) * 1e3,
         bu_quantile(lat, decided, 0.99) * 1e3);
  printf("load gnmrd: %.0f%% of one core, RSS %ld -> %ld MB; %.0f MB/s = "
         "%.0f%% of raw PUSH/PULL (%.0f MB/s)\n",
         100 * (u1.cpu_s - u0.cpu_s) / dt, u0.rss_kb / 1024, u1.rss_kb / 1024,
         bytes / dt / 1e6, 100 * (bytes / dt) / (raw_bytes / raw),
         raw_bytes / raw / 1e6);
  free(sample);
  free(msgs);
  free(lens);
  for (int u = 0; u < UNITS; u++)
    free(names[u]);
  free(sumsq);
  return decided == (uint64_t)JOBS * STEPS &&
                 reports == (long long)JOBS * REPORTERS * STEPS &&
                 deadline == 0 && late == 0 && refused == 0
             ? 0
             : 1;
}
