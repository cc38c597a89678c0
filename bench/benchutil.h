/* SPDX-License-Identifier: MIT */
/* benchutil.h — what the network benchmarks share: a clock, percentiles,
 * and starting the real gnmrd (build/bin, or $GNMR_BIN_DIR) in a temporary
 * directory on a loopback TCP port. Header-only: each benchmark is one
 * program. */
#ifndef GNMR_BENCHUTIL_H
#define GNMR_BENCHUTIL_H

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static inline double bu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline int bu_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Sorts v and returns its q-quantile (0..1). */
static inline double bu_quantile(double *v, size_t n, double q) {
  qsort(v, n, sizeof *v, bu_cmp);
  return v[(size_t)((double)(n - 1) * q)];
}

/* Waits (up to 5 s) for a forked server to write its endpoint into file,
 * then removes the file. ep is "" when none came. */
static inline void bu_wait_endpoint(const char *file, char *ep, size_t cap) {
  char fmt[16];
  snprintf(fmt, sizeof fmt, "%%%zus", cap - 1);
  ep[0] = '\0';
  for (int i = 0; i < 500 && ep[0] == '\0'; i++) {
    FILE *f = fopen(file, "r");
    if (f) {
      if (fscanf(f, fmt, ep) != 1)
        ep[0] = '\0';
      fclose(f);
    }
    if (ep[0] == '\0')
      usleep(10000);
  }
  unlink(file);
}

typedef struct bu_daemon {
  pid_t pid;
  char dir[64];
  char agents[256];
} bu_daemon;

/* Starts gnmrd with extra arguments (NULL-terminated, at most 8; NULL for
 * none); returns 0 with its agent endpoint, -1 on failure. */
static inline int bu_daemon_start_args(bu_daemon *d, char *const *extra) {
  char path[512], data[128], out[128], adm[128];
  const char *bin = getenv("GNMR_BIN_DIR");
  strcpy(d->dir, "/tmp/gnmr-bench-XXXXXX");
  if (mkdtemp(d->dir) == NULL)
    return -1;
  snprintf(path, sizeof path, "%s/gnmrd", bin ? bin : "build/bin");
  snprintf(data, sizeof data, "%s/data", d->dir);
  snprintf(out, sizeof out, "%s/out", d->dir);
  snprintf(adm, sizeof adm, "ipc://%s/admin.sock", d->dir);
  char *argv[20] = {path, "--data-dir", data, "--agents", "tcp://127.0.0.1:*",
                    "--admin", adm, "--log-level", "warn", NULL};
  for (int i = 0; extra != NULL && extra[i] != NULL && i < 8; i++)
    argv[9 + i] = extra[i];
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  if (posix_spawn(&d->pid, path, &fa, NULL, argv, environ) != 0)
    return -1;
  posix_spawn_file_actions_destroy(&fa);
  for (int i = 0; i < 500; i++) {
    FILE *f = fopen(out, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
      if (sscanf(line, "gnmrd: agents %255s", d->agents) == 1) {
        fclose(f);
        return 0;
      }
    if (f)
      fclose(f);
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
  }
  return -1;
}

/* Starts gnmrd with its defaults. */
static inline int bu_daemon_start(bu_daemon *d) {
  return bu_daemon_start_args(d, NULL);
}

static inline void bu_daemon_stop(bu_daemon *d) {
  char cmd[128];
  if (d->pid > 0) {
    kill(d->pid, SIGTERM);
    waitpid(d->pid, NULL, 0);
  }
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->dir);
  if (system(cmd) != 0)
    fprintf(stderr, "warning: could not remove %s\n", d->dir);
}

#ifdef ZMQ_VERSION
/* The raw limit: n_socks PUSH sockets send rounds x n_socks messages (the
 * bytes of msgs[round * n_socks + sock]) to a PULL in a separate process.
 * Returns the seconds from the first send until the receiver had all. */
static inline double bu_raw_pushpull(int n_socks, int rounds,
                                     const uint8_t *const *msgs,
                                     const size_t *lens) {
  char ep_file[] = "/tmp/gnmr-raw-ep-XXXXXX";
  int fd = mkstemp(ep_file);
  close(fd);
  unlink(ep_file);
  size_t total = (size_t)rounds * (size_t)n_socks;
  pid_t pid = fork();
  if (pid == 0) { /* the PULL side */
    void *ctx = zmq_ctx_new(), *p = zmq_socket(ctx, ZMQ_PULL);
    int hwm = 0;
    char ep[256];
    size_t sz = sizeof ep;
    zmq_setsockopt(p, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_bind(p, "tcp://127.0.0.1:*");
    zmq_getsockopt(p, ZMQ_LAST_ENDPOINT, ep, &sz);
    FILE *f = fopen(ep_file, "w");
    fprintf(f, "%s\n", ep);
    fclose(f);
    zmq_msg_t m;
    zmq_msg_init(&m);
    for (size_t i = 0; i < total; i++)
      zmq_msg_recv(&m, p, 0);
    zmq_msg_close(&m);
    zmq_close(p);
    zmq_ctx_term(ctx);
    _exit(0);
  }
  char ep[256];
  bu_wait_endpoint(ep_file, ep, sizeof ep);
  void *ctx = zmq_ctx_new(), **s = calloc((size_t)n_socks, sizeof *s);
  for (int r = 0; r < n_socks; r++) {
    int zero = 0, hwm = 0;
    s[r] = zmq_socket(ctx, ZMQ_PUSH);
    zmq_setsockopt(s[r], ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s[r], ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_connect(s[r], ep);
  }
  usleep(100000); /* let every socket connect before timing */
  double t0 = bu_now();
  for (int k = 0; k < rounds; k++)
    for (int r = 0; r < n_socks; r++)
      zmq_send(s[r], msgs[(size_t)k * (size_t)n_socks + (size_t)r],
               lens[(size_t)k * (size_t)n_socks + (size_t)r], 0);
  waitpid(pid, NULL, 0);
  double dt = bu_now() - t0;
  for (int r = 0; r < n_socks; r++)
    zmq_close(s[r]);
  free(s);
  zmq_ctx_term(ctx);
  return dt;
}
#endif

#ifdef GNMR_WIRE_H
/* Sends a Hello with the default policy for (job, rank) on a DEALER and
 * waits for the Welcome. Returns 0, or -1 when no Welcome came. */
static inline int bu_hello(void *sock, const char *job, uint32_t rank,
                           uint32_t reporters, char **names, size_t n) {
  static uint8_t reply[1 << 16];
  policy_params prm;
  Gnmr__Params wp;
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Hello h = GNMR__HELLO__INIT;
  uint8_t *b;
  size_t len;
  policy_params_default(&prm);
  gnmr__params_to_wire(&prm, &wp);
  h.protocol = 1;
  h.job = (char *)job;
  h.rank = rank;
  h.reporters = reporters;
  h.n_units = n;
  h.units = names;
  h.params = &wp;
  h.barrier_ms = 10000;
  env.body_case = GNMR__ENVELOPE__BODY_HELLO;
  env.hello = &h;
  if (gnmr__wire_encode(&env, &b, &len) != 0)
    return -1;
  zmq_send(sock, b, len, 0);
  free(b);
  return zmq_recv(sock, reply, sizeof reply, 0) < 0 ? -1 : 0;
}
#endif

#endif /* GNMR_BENCHUTIL_H */
