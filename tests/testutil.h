/* SPDX-License-Identifier: MIT */
/* testutil.h — helpers shared by the test programs: run a GNMR binary with
 * arguments and optional stdin file, capturing exit code, stdout, stderr;
 * read files; find the binaries ($GNMR_BIN_DIR), the sample traces
 * ($GNMR_TRACES) and ../shared ($GNMR_SHARED, optional). Header-only so that each test stays one program. */
#ifndef GNMR_TESTUTIL_H
#define GNMR_TESTUTIL_H

#include <check.h>
#include <dirent.h>

#include "check_main.h"
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

typedef struct run_result {
  int code;  /* exit status, or 128 + signal */
  char *out; /* NUL-terminated, free() */
  char *err;
  size_t out_len;
} run_result;

static inline const char *tu_bin_dir(void) {
  const char *d = getenv("GNMR_BIN_DIR");
  return d ? d : "build/bin";
}

/* ../shared, for extra cases where it exists; no test may need it. */
static inline const char *tu_shared(void) {
  const char *d = getenv("GNMR_SHARED");
  return d ? d : "../shared";
}

/* The parameters the sample traces' "defaults" decisions were made with:
 * the policy's first defaults (docs/policy.md; the defaults in force are
 * other since the clean-training measurements), as gnmr-sim and gnmrctl
 * options. A case's own options come after them and win. */
#define TU_FIRST_DEFAULTS                                                     \
  "--alpha", "2", "--beta", "2", "--window", "8", "--max-active", "4",        \
      "--lock-steps", "4", "--warmup-steps", "20", "--mean-horizon", "0",     \
      "--job-relative", "0", "--confirm-steps", "0"
#define TU_FIRST_DEFAULTS_N 18

/* The sample traces and their expected decisions (tests/traces). */
static inline const char *tu_traces(void) {
  const char *d = getenv("GNMR_TRACES");
  return d ? d : "tests/traces";
}

static inline char *tu_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  size_t cap = 4096, n = 0, r;
  char *b = malloc(cap + 1);
  while (b && (r = fread(b + n, 1, cap - n, f)) > 0) {
    n += r;
    if (n == cap) {
      char *nb = realloc(b, 2 * cap + 1);
      if (nb == NULL) {
        free(b);
        b = NULL;
        break;
      }
      b = nb;
      cap *= 2;
    }
  }
  fclose(f);
  if (b) {
    b[n] = '\0';
    if (len)
      *len = n;
  }
  return b;
}

static inline void tu_write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(text, 1, strlen(text), f), strlen(text));
  ck_assert_int_eq(fclose(f), 0);
}

/* Makes a fresh temporary directory; returns a static path. */
static inline const char *tu_tmpdir(void) {
  static char dir[64];
  strcpy(dir, "/tmp/gnmr-test-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  return dir;
}

/* Starts bin_dir/prog with argv (argv[0] = prog) on the descriptors
 * given for its stdin, stdout and stderr, and returns its pid. Under
 * `make test-valgrind` (GNMR_VALGRIND set) the child runs under valgrind
 * too; its errors and leaks make it exit 99. */
static inline pid_t tu_spawn(const char *prog, char *const argv[], int ifd,
                             int ofd, int efd) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", tu_bin_dir(), prog);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, ifd, 0);
  posix_spawn_file_actions_adddup2(&fa, ofd, 1);
  posix_spawn_file_actions_adddup2(&fa, efd, 2);
  char *vargv[72];
  char *const *av = argv;
  const char *exe = path;
  if (getenv("GNMR_VALGRIND") != NULL) {
    int n = 0;
    vargv[n++] = "valgrind";
    vargv[n++] = "-q";
    vargv[n++] = "--error-exitcode=99";
    vargv[n++] = "--leak-check=full";
    vargv[n++] = "--errors-for-leak-kinds=definite,indirect";
    vargv[n++] = path;
    for (int i = 1; argv[i] != NULL && n < 71; i++)
      vargv[n++] = argv[i];
    vargv[n] = NULL;
    av = vargv;
    exe = "/usr/bin/valgrind";
  }
  pid_t pid;
  int rv = posix_spawn(&pid, exe, &fa, NULL, av, environ);
  ck_assert_msg(rv == 0, "spawn %s: %s", path, strerror(rv));
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

/* Runs bin_dir/prog with argv (argv[0] = prog), stdin from in_path (NULL =
 * /dev/null). Output goes through temporary files (no pipe deadlocks). */
static inline run_result tu_run(const char *prog, char *const argv[],
                                const char *in_path) {
  run_result r = {0};
  char out_p[] = "/tmp/gnmr-out-XXXXXX", err_p[] = "/tmp/gnmr-err-XXXXXX";
  int ofd = mkstemp(out_p), efd = mkstemp(err_p);
  ck_assert(ofd >= 0 && efd >= 0);
  int ifd = open(in_path ? in_path : "/dev/null", O_RDONLY);
  ck_assert_msg(ifd >= 0, "open %s", in_path ? in_path : "/dev/null");
  pid_t pid = tu_spawn(prog, argv, ifd, ofd, efd);
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  close(ifd);
  close(ofd);
  close(efd);
  r.out = tu_read_file(out_p, &r.out_len);
  r.err = tu_read_file(err_p, NULL);
  unlink(out_p);
  unlink(err_p);
  ck_assert(r.out && r.err);
  return r;
}

static inline void tu_run_free(run_result *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}

/* ---- a real gnmrd for end-to-end tests ---------------------------------- */
#include <signal.h>
#include <time.h>

typedef struct tu_daemon {
  pid_t pid;
  char dir[64];        /* temporary directory: data/, out, err */
  char agents[256];    /* endpoint it printed */
  char admin[256];
} tu_daemon;

/* Daemons started by this process; an exit (a failed assertion included)
 * kills those still running, so that no test leaves a gnmrd behind. */
static pid_t tu_daemon_pids[32];

static inline void tu_kill_daemons(void) {
  for (int i = 0; i < 32; i++)
    if (tu_daemon_pids[i] > 0 && kill(tu_daemon_pids[i], 0) == 0) {
      kill(tu_daemon_pids[i], SIGKILL);
      waitpid(tu_daemon_pids[i], NULL, 0);
    }
}

static inline void tu_track_daemon(pid_t pid, int on) {
  static int registered;
  if (!registered) {
    atexit(tu_kill_daemons);
    registered = 1;
  }
  for (int i = 0; i < 32; i++)
    if (on ? tu_daemon_pids[i] <= 0 : tu_daemon_pids[i] == pid) {
      tu_daemon_pids[i] = on ? pid : 0;
      return;
    }
}

/* How much longer a bound on time must be in this run: 10 under
 * `make test-valgrind` (the suite, gnmrd and gnmrctl all run under valgrind,
 * two suites at once), 1 otherwise. A bound that tests "never blocks" keeps
 * its meaning when scaled: a block lasts forever, a slow CPU does not. */
static inline int tu_slow(void) {
  return getenv("GNMR_VALGRIND") != NULL ? 10 : 1;
}

static inline void tu_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

/* Starts gnmrd with its data in a fresh temporary directory. agents/admin
 * may be NULL: then tcp://127.0.0.1:* and ipc://DIR/admin.sock. With dir
 * set, uses that directory (a restart). extra (NULL-terminated, may be
 * NULL) are more gnmrd options. tu_daemon_start_in waits until it
 * printed its endpoints; tu_daemon_spawn_in does not. */
static inline void tu_daemon_wait_ready(tu_daemon *d, int timeout_ms);

/* (a standby prints its endpoints only once it takes over) */
/* Under GNMR_VALGRIND, valgrind's words before a program the suite
 * starts (gnmrd, a relay), as make test-valgrind runs the suites; the
 * count put in argv (0 without). */
static inline int tu_valgrind_argv(char **argv) {
  int n = 0;
  if (getenv("GNMR_VALGRIND") != NULL) {
    argv[n++] = "valgrind";
    argv[n++] = "-q";
    argv[n++] = "--error-exitcode=99";
    argv[n++] = "--leak-check=full";
    argv[n++] = "--errors-for-leak-kinds=definite,indirect";
  }
  return n;
}

static inline void tu_daemon_spawn_in(tu_daemon *d, const char *agents,
                                      const char *admin, const char *dir,
                                      char *const *extra) {
  char data[128], out[128], err[128], adm[160];
  if (dir == NULL)
    snprintf(d->dir, sizeof d->dir, "%s", tu_tmpdir());
  else if (dir != d->dir)
    snprintf(d->dir, sizeof d->dir, "%s", dir);
  snprintf(data, sizeof data, "%s/data", d->dir);
  snprintf(out, sizeof out, "%s/out", d->dir);
  snprintf(err, sizeof err, "%s/err", d->dir);
  snprintf(adm, sizeof adm, "ipc://%s/admin.sock", d->dir);
  unlink(out);
  char path[512];
  snprintf(path, sizeof path, "%s/gnmrd", tu_bin_dir());
  char *argv[32];
  int n = tu_valgrind_argv(argv);
  argv[n++] = path;
  argv[n++] = "--data-dir";
  argv[n++] = data;
  argv[n++] = "--agents";
  argv[n++] = (char *)(agents ? agents : "tcp://127.0.0.1:*");
  argv[n++] = "--admin";
  argv[n++] = (char *)(admin ? admin : adm);
  for (int i = 0; extra != NULL && extra[i] != NULL && n < 31; i++)
    argv[n++] = extra[i];
  argv[n] = NULL;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_CREAT | O_APPEND,
                                   0600);
  const char *exe = getenv("GNMR_VALGRIND") ? "/usr/bin/valgrind" : path;
  int rv = posix_spawn(&d->pid, exe, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  ck_assert_msg(rv == 0, "spawn gnmrd: %s", strerror(rv));
  tu_track_daemon(d->pid, 1);
}

/* The last 1500 bytes of gnmrd's stderr log, for a failure's message
 * (a static buffer: the test ends right after). */
static inline const char *tu_daemon_log_tail(const tu_daemon *d) {
  static char tail[1501];
  char p[300];
  snprintf(p, sizeof p, "%s/err", d->dir);
  size_t n = 0;
  char *txt = tu_read_file(p, &n);
  if (txt == NULL)
    return "(no log)";
  size_t from = n > 1500 ? n - 1500 : 0;
  snprintf(tail, sizeof tail, "%s", txt + from);
  free(txt);
  return tail;
}

/* Waits until gnmrd printed its endpoints (into d->agents, d->admin). */
static inline void tu_daemon_wait_ready(tu_daemon *d, int timeout_ms) {
  char out[128];
  if (tu_slow() > 1 && timeout_ms < 60000)
    timeout_ms = 60000; /* valgrind: gnmrd starts in seconds */
  snprintf(out, sizeof out, "%s/out", d->dir);
  for (int i = 0; i < timeout_ms / 20; i++) {
    char *txt = tu_read_file(out, NULL);
    char *a = txt ? strstr(txt, "gnmrd: agents ") : NULL;
    char *m = txt ? strstr(txt, "gnmrd: admin ") : NULL;
    if (a && m && strchr(m, '\n')) {
      sscanf(a, "gnmrd: agents %255s", d->agents);
      sscanf(m, "gnmrd: admin %255s", d->admin);
      free(txt);
      return;
    }
    free(txt);
    int st;
    if (waitpid(d->pid, &st, WNOHANG) != 0)
      ck_abort_msg("gnmrd exited early (status %d); its log ends:\n%s", st,
                   tu_daemon_log_tail(d));
    tu_sleep_ms(20);
  }
  ck_abort_msg("gnmrd did not print its endpoints in %d ms; its log ends:\n%s",
               timeout_ms, tu_daemon_log_tail(d));
}

static inline void tu_daemon_start_in(tu_daemon *d, const char *agents,
                                      const char *admin, const char *dir,
                                      char *const *extra) {
  tu_daemon_spawn_in(d, agents, admin, dir, extra);
  /* valgrind is slow: gnmrd and the suite both run under it */
  tu_daemon_wait_ready(d, getenv("GNMR_VALGRIND") != NULL ? 60000 : 20000);
}

static inline void tu_daemon_start(tu_daemon *d) {
  tu_daemon_start_in(d, NULL, NULL, NULL, NULL);
}

/* Stops gnmrd with SIGTERM (or SIGKILL) and returns its exit status. */
static inline int tu_daemon_stop(tu_daemon *d, int sig) {
  int st = 0;
  if (d->pid <= 0)
    return -1;
  kill(d->pid, sig);
  waitpid(d->pid, &st, 0);
  tu_track_daemon(d->pid, 0);
  d->pid = 0;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Reads the daemon's stderr log. */
static inline char *tu_daemon_log(const tu_daemon *d) {
  char p[128];
  snprintf(p, sizeof p, "%s/err", d->dir);
  return tu_read_file(p, NULL);
}

/* gnmrd's log once it contains `needle` (the caller frees it), or NULL
 * after timeout_ms (times tu_slow()): for lines that another thread of
 * gnmrd writes in its own time (the store's writer, the leadership's
 * check). */
static inline char *tu_daemon_log_wait(const tu_daemon *d, const char *needle,
                                       int timeout_ms) {
  for (int waited = 0;; waited += 20) {
    char *log = tu_daemon_log(d);
    if (log != NULL && strstr(log, needle) != NULL)
      return log;
    free(log);
    if (waited >= timeout_ms * tu_slow())
      return NULL;
    tu_sleep_ms(20);
  }
}

/* Removes the temporary directory (best effort). */
static inline void tu_rmrf(const char *dir) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "warning: could not remove %s\n", dir);
}

/* Returns the value of counter `name` from `gnmrctl stats`; the test
 * fails, saying why, when gnmrctl gets no answer or the counter is not
 * there (a -1 would pass for "changed" in a loop that waits for one).
 * Under valgrind gnmrctl waits 60 s for gnmrd's answer, not 3 s: gnmrd's
 * loop, busy with a large job under valgrind, may take seconds. */
static inline long long tu_counter(const tu_daemon *d, const char *name) {
  char opt[300];
  snprintf(opt, sizeof opt, "--admin=%s", d->admin);
  char *argv[] = {"gnmrctl", opt, "stats", "--timeout-ms",
                  tu_slow() > 1 ? "60000" : "3000", NULL};
  run_result r = tu_run("gnmrctl", argv, NULL);
  ck_assert_msg(r.code == 0, "gnmrctl stats (for %s): exit %d: %s", name,
                r.code, r.err);
  long long v = -1;
  char key[64];
  snprintf(key, sizeof key, "\n%s ", name);
  char *all = malloc(strlen(r.out) + 2);
  all[0] = '\n';
  strcpy(all + 1, r.out);
  char *p = strstr(all, key);
  if (p != NULL)
    sscanf(p + strlen(key), " %lld", &v);
  free(all);
  ck_assert_msg(v >= 0, "no counter %s in gnmrctl stats:\n%s", name, r.out);
  tu_run_free(&r);
  return v;
}

/* Threads of process pid (0: this one) named `name`
 * (/proc/PID/task/TID/comm). */
static inline int tu_named_threads(pid_t pid, const char *name) {
  char path[64];
  if (pid == 0)
    snprintf(path, sizeof path, "/proc/self/task");
  else
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *dir = opendir(path);
  ck_assert_msg(dir != NULL, "opendir %s", path);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    char p[sizeof path + sizeof e->d_name + 8], comm[64] = "";
    snprintf(p, sizeof p, "%s/%s/comm", path, e->d_name);
    FILE *f = fopen(p, "r");
    if (f == NULL)
      continue; /* ended meanwhile */
    if (fgets(comm, sizeof comm, f) != NULL) {
      comm[strcspn(comm, "\n")] = '\0';
      n += strcmp(comm, name) == 0;
    }
    fclose(f);
  }
  closedir(dir);
  return n;
}

/* Waits (10 s, times tu_slow()) until counter `name` is at least `min`;
 * the test fails with the last value otherwise. For what gnmrd does when
 * a message comes, such as a job that finishes when its last rank's Bye
 * arrives, after the agent's close has returned. */
static inline void tu_wait_counter(const tu_daemon *d, const char *name,
                                   long long min) {
  long long v = tu_counter(d, name);
  for (int waited = 0; v < min && waited < 10000 * tu_slow(); waited += 50) {
    tu_sleep_ms(50);
    v = tu_counter(d, name);
  }
  ck_assert_msg(v >= min, "%s is %lld, not %lld or more", name, v, min);
}

/* The metrics URL gnmrd printed (gnmrd --metrics HOST:PORT). */
static inline void tu_metrics_url(const tu_daemon *d, char *url,
                                  size_t cap) {
  char p[128];
  snprintf(p, sizeof p, "%s/out", d->dir);
  char *out = tu_read_file(p, NULL);
  char *m = out ? strstr(out, "gnmrd: metrics ") : NULL;
  ck_assert_msg(m != NULL, "gnmrd printed no metrics endpoint");
  ck_assert_int_eq(sscanf(m, "gnmrd: metrics %255s", url), 1);
  (void)cap;
  free(out);
}

/* A gnmrd in a fresh directory serving /metrics on a free loopback
 * port: its URL in url. */
static inline void tu_daemon_start_metrics(tu_daemon *d, char *url,
                                           size_t cap) {
  char *extra[] = {"--metrics", "127.0.0.1:0", NULL};
  snprintf(d->dir, sizeof d->dir, "%s", tu_tmpdir());
  tu_daemon_start_in(d, NULL, NULL, d->dir, extra);
  tu_metrics_url(d, url, cap);
}

/* GET url with curl within max_s seconds (0: no limit): the body, and
 * the HTTP status in *status (0 when no answer came). */
static inline char *tu_http_get_in(const char *url, int *status, int max_s) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "curl -s -m %d -w '\\n%%{http_code}' '%s'",
           max_s, url);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t cap = 1 << 16, n = 0, r;
  char *buf = malloc(cap);
  while ((r = fread(buf + n, 1, cap - n - 1, p)) > 0)
    n += r;
  buf[n] = '\0';
  pclose(p);
  char *last = strrchr(buf, '\n');
  ck_assert_ptr_nonnull(last);
  *status = atoi(last + 1);
  *last = '\0';
  return buf;
}

/* GET url with curl: the body, and the HTTP status in *status. */
static inline char *tu_http_get(const char *url, int *status) {
  return tu_http_get_in(url, status, 0);
}

#endif /* GNMR_TESTUTIL_H */
