/* SPDX-License-Identifier: MIT */
/* test_ops.c — running gnmrd for real: the config file (--check-config,
 * values, flags overriding it, policy defaults), systemd's notify protocol
 * against a real notify socket (READY, WATCHDOG, STOPPING), the unit file
 * through systemd-analyze verify, and the agent's environment variables. */
#include <ctype.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <zmq.h>

#include "counters.h"
#include "gnmr/agent.h"
#include "testutil.h"
#include "wire.h"

static const char *write_tmp(const char *dir, const char *name,
                             const char *text) {
  static char path[4][256];
  static int k;
  char *p = path[k++ % 4];
  snprintf(p, 256, "%s/%s", dir, name);
  tu_write_file(p, text);
  return p;
}

/* The key table is the one source: every key gnmrd --config-keys lists is
 * in the example config, with its default where the line is in force (a
 * commented-out line is an example), and every [limits] key is in gnmrd(8) with the same
 * default; the example file has no key the table lacks (--check-config
 * above). */
START_TEST(config_keys_table_matches_the_example_file_and_the_man_page) {
  char *argv[] = {"gnmrd", "--config-keys", NULL};
  run_result r = tu_run("gnmrd", argv, NULL);
  ck_assert_msg(r.code == 0, "--config-keys: %s", r.err);
  char *conf = tu_read_file("deploy/gnmrd.conf", NULL);
  char *man = tu_read_file("man/man8/gnmrd.8", NULL);
  ck_assert_ptr_nonnull(conf);
  ck_assert_ptr_nonnull(man);
  int n = 0, limits = 0;
  for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
    char name[128], def[128] = "", want[300];
    const char *tab = strchr(line, '\t');
    ck_assert_ptr_nonnull(tab);
    snprintf(name, sizeof name, "%.*s", (int)(tab - line), line);
    const char *tab2 = strchr(tab + 1, '\t');
    ck_assert_ptr_nonnull(tab2);
    ck_assert_msg(tab2[1] != '\0', "%s has no help", name);
    snprintf(def, sizeof def, "%.*s", (int)(tab2 - tab - 1), tab + 1);
    const char *key = strchr(name, '.') + 1;
    if (def[0] != '\0')
      snprintf(want, sizeof want, "\n%s = %s\n", key, def);
    else
      snprintf(want, sizeof want, "%s = ", key);
    char alt[300]; /* commented out: an example value, off by default */
    snprintf(alt, sizeof alt, "\n;%s = ", key);
    ck_assert_msg(strstr(conf, want) || strstr(conf, alt),
                  "deploy/gnmrd.conf lacks '%s' (default '%s')", key, def);
    if (strncmp(name, "limits.", 7) == 0) {
      snprintf(want, sizeof want, ".B %s\n", key);
      const char *at = strstr(man, want);
      ck_assert_msg(at != NULL, "gnmrd(8) does not describe %s", key);
      if (def[0] != '\0') {
        const char *next = strstr(at + 1, ".TP");
        const char *d = strstr(at, "(default");
        ck_assert_msg(d != NULL && (next == NULL || d < next),
                      "gnmrd(8) gives %s no default", key);
        d += strlen("(default");
        while (*d == ' ' || *d == '\n')
          d++; /* a line may break there */
        ck_assert_msg(strncmp(d, def, strlen(def)) == 0 &&
                          !isdigit((unsigned char)d[strlen(def)]),
                      "gnmrd(8) gives %s another default than %s", key, def);
      }
      limits++;
    }
    n++;
  }
  ck_assert_int_ge(n, 30);
  ck_assert_int_ge(limits, 10);
  free(conf);
  free(man);
  tu_run_free(&r);
}
END_TEST

START_TEST(check_config_accepts_the_example_and_names_bad_keys_and_lines) {
  char *ok[] = {"gnmrd", "--check-config", "deploy/gnmrd.conf", NULL};
  run_result r = tu_run("gnmrd", ok, NULL);
  ck_assert_msg(r.code == 0, "example config: %s", r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "is valid"));
  tu_run_free(&r);
  const char *dir = tu_tmpdir();
  static const struct {
    const char *text, *err;
  } bad[] = {
      {"[gnmrd]\nagnets = ipc:///x\n", ":2: unknown key 'agnets' in section "
                                       "[gnmrd]"},
      {"[gnmrd]\nsnapshot_every = 0\n", ":2: key 'snapshot_every': '0' is "
                                        "not an integer from 1"},
      {"[gnmrd]\n\nlog_level = loud\n", ":3: key 'log_level': 'loud' is not "
                                        "error, warn, info or debug"},
      {"[gnmrd]\nagents = /run/x.sock\n", ":2: key 'agents': '/run/x.sock' "
                                          "is not a ZeroMQ endpoint"},
      {"[policy]\nalpha = 0\n", ":2: key 'alpha': '0': expected a finite "
                                "number > 0"},
      {"[policy]\nwindow = 0\n", ":2: key 'window': '0': must be from 1"},
      {"[policy]\nbogus = 1\n", ":2: unknown key 'bogus' in section "
                                  "[policy]"},
      {"[nosuch]\nx = 1\n", ":2: unknown key 'x' in section [nosuch]"},
      {"not ini\n", ":1: not valid INI syntax"},
      /* what --check-config passed and a start then refused */
      {"[gnmrd]\nmetrics = localhost:9464\n", "HOST must be an IPv4 "
                                              "address"},
      {"[gnmrd]\nmetrics = 127.0.0.1:9464x\n", "expected HOST:PORT"},
      {"[gnmrd]\nmetrics = 127.0.0.1:65536\n", "is not HOST:PORT"},
      /* a continuation line replaced the key's value silently */
      {"[gnmrd]\nlog_level = error\n  debug\n", ":3: an indented line"},
      {"[policy]\n\talpha = 3\n", ":2: an indented line"},
      /* issue 47: a key given twice and a section opened again passed,
       * the second silently winning; a password in a bad store URL was
       * printed */
      {"[limits]\nmax_jobs = 10\nmax_jobs = 20\n",
       ":3: key 'max_jobs' in [limits] given twice"},
      {"[gnmrd]\nlog_level = info\n[limits]\nmax_jobs = 9\n[gnmrd]\n"
       "log_level = debug\n", ":6: section [gnmrd] opened again"},
      {"[gnmrd]\nstore = postgresq://u:s3cret@h/db\n",
       "'postgresq://...' is not a postgresql:// URL"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *p = write_tmp(dir, "bad.conf", bad[i].text);
    char *argv[] = {"gnmrd", "--check-config", (char *)p, NULL};
    r = tu_run("gnmrd", argv, NULL);
    ck_assert_msg(r.code == 1, "case %zu: exit %d", i, r.code);
    ck_assert_msg(strstr(r.err, bad[i].err) != NULL,
                  "case %zu: '%s' lacks '%s'", i, r.err, bad[i].err);
    ck_assert_msg(strstr(r.err, "s3cret") == NULL, "case %zu: %s", i, r.err);
    tu_run_free(&r);
  }
  { /* a FIFO as the configuration: refused at once, not waited on */
    char fifo[300];
    snprintf(fifo, sizeof fifo, "%s/fifo.conf", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    char *argv[] = {"gnmrd", "--check-config", fifo, NULL};
    r = tu_run("gnmrd", argv, NULL);
    ck_assert_int_eq(r.code, 1);
    ck_assert_msg(strstr(r.err, "not a regular file") != NULL, "%s", r.err);
    tu_run_free(&r);
    unlink(fifo);
  }
  { /* an indented comment is still a comment */
    const char *p = write_tmp(dir, "ok.conf", "[gnmrd]\n  # a note\n"
                              "\t; another\nlog_level = info\n   \n");
    char *argv[] = {"gnmrd", "--check-config", (char *)p, NULL};
    r = tu_run("gnmrd", argv, NULL);
    ck_assert_msg(r.code == 0, "%s", r.err);
    tu_run_free(&r);
  }
  char *missing[] = {"gnmrd", "--check-config", "/nonexistent.conf", NULL};
  r = tu_run("gnmrd", missing, NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_nonnull(strstr(r.err, "No such file"));
  tu_run_free(&r);
  /* a bad file given to --config stops the daemon with exit 2 */
  const char *p = write_tmp(dir, "bad.conf", "[gnmrd]\nmax_msg = 5\n");
  char *run_bad[] = {"gnmrd", "--config", (char *)p, NULL};
  r = tu_run("gnmrd", run_bad, NULL);
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "key 'max_msg'"));
  tu_run_free(&r);
  tu_rmrf(dir);
}
END_TEST

START_TEST(config_file_is_used_flags_override_and_policy_defaults_apply) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  char conf_text[512];
  snprintf(conf_text, sizeof conf_text,
           "[gnmrd]\nagents = ipc://%s/from-config.sock\nlog_level = debug\n"
           "[policy]\nmax_active = 1\nalpha = 3.5\nbarrier_ms = 777\n",
           d.dir);
  const char *conf = write_tmp(d.dir, "gnmrd.conf", conf_text);
  char *extra[] = {"--config", (char *)conf, NULL};
  /* tu_daemon_start_in passes --agents tcp://127.0.0.1:*: the flag wins */
  tu_daemon_start_in(&d, NULL, NULL, d.dir, extra);
  ck_assert_ptr_nonnull(strstr(d.agents, "tcp://127.0.0.1:"));
  /* a Hello without parameters or barrier takes the [policy] defaults */
  void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
  int zero = 0, tmo = 5000;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  ck_assert_int_eq(zmq_connect(s, d.agents), 0);
  char *units[] = {"u"};
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Hello h = GNMR__HELLO__INIT;
  h.protocol = 1;
  h.job = "defaults";
  h.reporters = 1;
  h.n_units = 1;
  h.units = units;
  env.body_case = GNMR__ENVELOPE__BODY_HELLO;
  env.hello = &h;
  uint8_t *b;
  size_t len;
  ck_assert_int_eq(gnmr__wire_encode(&env, &b, &len), GNMR_OK);
  ck_assert_int_ge(zmq_send(s, b, len, 0), 0);
  free(b);
  zmq_msg_t m;
  zmq_msg_init(&m);
  ck_assert_int_ge(zmq_msg_recv(&m, s, 0), 0);
  Gnmr__Envelope *w;
  ck_assert_int_eq(gnmr__wire_decode(zmq_msg_data(&m), zmq_msg_size(&m), &w,
                                     NULL, 0),
                   GNMR_OK);
  ck_assert_int_eq(w->body_case, GNMR__ENVELOPE__BODY_WELCOME);
  ck_assert_uint_eq(w->welcome->params->max_active, 1);
  ck_assert_double_eq(w->welcome->params->alpha, 3.5);
  gnmr__wire_free(&w);
  zmq_msg_close(&m);
  zmq_close(s);
  zmq_ctx_term(ctx);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  /* the job took the [policy] barrier_ms default */
  char *log = tu_daemon_log(&d);
  ck_assert_ptr_nonnull(strstr(log, "barrier 777 ms"));
  free(log);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(systemd_notify_ready_watchdog_and_stopping) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  char sock_path[128];
  snprintf(sock_path, sizeof sock_path, "%s/notify.sock", d.dir);
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  ck_assert_uint_lt(strlen(sock_path), sizeof sa.sun_path);
  memcpy(sa.sun_path, sock_path, strlen(sock_path) + 1);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setenv("NOTIFY_SOCKET", sock_path, 1);
  setenv("WATCHDOG_USEC", "100000", 1); /* pings every 50 ms */
  tu_daemon_start_in(&d, NULL, NULL, d.dir, NULL);
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  char buf[512];
  int ready = 0, pings = 0, stopping = 0;
  for (int i = 0; i < 200 && !(ready && pings >= 3); i++) {
    ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
    ck_assert_msg(n > 0, "no notify message from gnmrd");
    buf[n] = '\0';
    if (strstr(buf, "READY=1") != NULL) {
      ck_assert_ptr_nonnull(strstr(buf, "STATUS=serving agents on tcp://"));
      ready = 1;
    }
    if (strstr(buf, "WATCHDOG=1") != NULL)
      pings++;
  }
  ck_assert(ready);
  ck_assert_int_ge(pings, 3);
  kill(d.pid, SIGTERM);
  for (int i = 0; i < 200 && !stopping; i++) {
    ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
    ck_assert_msg(n > 0, "no STOPPING from gnmrd");
    buf[n] = '\0';
    stopping = strstr(buf, "STOPPING=1") != NULL;
  }
  ck_assert(stopping);
  int st;
  ck_assert_int_eq(waitpid(d.pid, &st, 0), d.pid); /* a clean exit */
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  tu_track_daemon(d.pid, 0);
  d.pid = 0;
  close(fd);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(unit_file_passes_systemd_analyze_verify) {
  /* systemd-analyze checks ExecStart's binary and the man page; point both
   * at this build and checkout */
  const char *dir = tu_tmpdir();
  char *unit = tu_read_file("systemd/gnmrd.service", NULL);
  ck_assert_ptr_nonnull(unit);
  char bin[512], *text = malloc(strlen(unit) + 1024), *at;
  snprintf(bin, sizeof bin, "%s/gnmrd", tu_bin_dir());
  ck_assert_ptr_nonnull(at = strstr(unit, "/usr/local/bin/gnmrd"));
  snprintf(text, strlen(unit) + 1024, "%.*s%s%s", (int)(at - unit), unit, bin,
           at + strlen("/usr/local/bin/gnmrd"));
  const char *path = write_tmp(dir, "gnmrd.service", text);
  char manpath[600], cmd[1400];
  ck_assert_ptr_nonnull(getcwd(manpath, 400));
  strcat(manpath, "/man");
  snprintf(cmd, sizeof cmd, "MANPATH='%s' systemd-analyze verify '%s' 2>&1",
           manpath, path);
  FILE *p = popen(cmd, "r");
  char out[2048] = "";
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                "systemd-analyze verify failed: %s", out);
  ck_assert_ptr_nonnull(strstr(unit, "Type=notify"));
  ck_assert_ptr_nonnull(strstr(unit, "WatchdogSec="));
  free(unit);
  free(text);
  tu_rmrf(dir);
}
END_TEST

START_TEST(agent_settings_come_from_the_environment) {
  gnmr_agent_config c = {0};
  const char *bad = "unset";
  gnmr_params_default(&c.params);
  c.job = "from-struct";
  setenv("GNMR_ENDPOINT", "ipc:///run/gnmr/agents.sock", 1);
  setenv("GNMR_RANK", "3", 1);
  setenv("GNMR_REPORTERS", "8", 1);
  setenv("GNMR_MAX_ACTIVE", "6", 1);
  setenv("GNMR_ALPHA", "2.5", 1);
  setenv("GNMR_FALLBACK_ROUTE", "high", 1);
  setenv("GNMR_WARMUP_STEPS", "100", 1);
  ck_assert_int_eq(gnmr_agent_config_from_env(&c, &bad), GNMR_OK);
  ck_assert_ptr_null(bad);
  ck_assert_str_eq(c.endpoint, "ipc:///run/gnmr/agents.sock");
  ck_assert_str_eq(c.job, "from-struct"); /* GNMR_JOB unset: kept */
  ck_assert_uint_eq(c.rank, 3);
  ck_assert_uint_eq(c.reporters, 8);
  ck_assert_uint_eq(c.params.max_active, 6);
  ck_assert_double_eq(c.params.alpha, 2.5);
  ck_assert_uint_eq(c.fallback_route, GNMR_ROUTE_HIGH);
  ck_assert_uint_eq(c.params.warmup_steps, 100);
  /* a bad value names the variable and changes nothing */
  static const char *const bad_vals[][2] = {{"GNMR_RANK", "-1"},
                                            {"GNMR_ALPHA", "0"},
                                            {"GNMR_ALPHA", "abc"},
                                            {"GNMR_FALLBACK_ROUTE", "up"},
                                            {"GNMR_WINDOW", "99999999999"}};
  for (size_t i = 0; i < sizeof bad_vals / sizeof bad_vals[0]; i++) {
    gnmr_agent_config before = c;
    setenv(bad_vals[i][0], bad_vals[i][1], 1);
    ck_assert_int_eq(gnmr_agent_config_from_env(&c, &bad), GNMR_E_INVAL);
    ck_assert_str_eq(bad, bad_vals[i][0]);
    ck_assert(memcmp(&before, &c, sizeof c) == 0);
    unsetenv(bad_vals[i][0]);
  }
  ck_assert_int_eq(gnmr_agent_config_from_env(NULL, NULL), GNMR_E_INVAL);
  static const char *const set[] = {"GNMR_ENDPOINT", "GNMR_RANK",
                                    "GNMR_REPORTERS", "GNMR_MAX_ACTIVE",
                                    "GNMR_ALPHA", "GNMR_FALLBACK_ROUTE",
                                    "GNMR_WARMUP_STEPS"};
  for (size_t i = 0; i < sizeof set / sizeof set[0]; i++)
    unsetenv(set[i]);
}
END_TEST

/* With no environment at all (a cron job, env -i) and no --data-dir, an
 * unprivileged gnmrd used to keep its history in /tmp/.local/state, where
 * any local user could have made the directories first: it refuses to
 * start and says what to give. Root stands in for such a user with uid
 * 65534. */
START_TEST(no_environment_means_no_guessed_data_directory) {
  char errp[] = "/tmp/gnmr-noenv-XXXXXX", path[512], src[512];
  int efd = mkstemp(errp);
  ck_assert_int_ge(efd, 0);
  /* a copy where uid 65534 can run it (the build may be in a 0700 home) */
  char *dir = strdup(tu_tmpdir());
  ck_assert_int_eq(chmod(dir, 0755), 0);
  snprintf(src, sizeof src, "%s/gnmrd", tu_bin_dir());
  snprintf(path, sizeof path, "%s/gnmrd", dir);
  {
    char *cp[] = {"cp", src, path, NULL};
    pid_t c = fork();
    if (c == 0) {
      execvp("cp", cp);
      _exit(127);
    }
    int cst;
    ck_assert(waitpid(c, &cst, 0) == c && WIFEXITED(cst) &&
              WEXITSTATUS(cst) == 0);
  }
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    dup2(efd, 2);
    clearenv();
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
      _exit(98);
    char *argv[] = {path, NULL};
    execv(path, argv);
    _exit(97);
  }
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d", st);
  char buf[600] = "";
  ssize_t n = pread(efd, buf, sizeof buf - 1, 0);
  buf[n > 0 ? n : 0] = '\0';
  close(efd);
  unlink(errp);
  ck_assert_msg(strstr(buf, "no data directory: give --data-dir"), "%s", buf);
  ck_assert_int_ne(access("/tmp/.local/state/gnmr", F_OK), 0);
  tu_rmrf(dir);
  free(dir);
}
END_TEST

/* Issue 48: no shell completion. deploy/completion/gnmrctl.bash completes
 * gnmrctl's commands and a command's options (from gnmrctl's own --help)
 * and job names (from the gnmrd the command line names). Issue 62: a
 * peer's job name never runs as the operator: names that hold $(...),
 * backticks or ; are neither expanded nor offered. */
START_TEST(bash_completes_commands_options_and_job_names) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  char mark[300], hostile[3][400];
  snprintf(mark, sizeof mark, "%s/pwned", d.dir);
  snprintf(hostile[0], sizeof hostile[0], "comp$(touch${IFS}%s)", mark);
  snprintf(hostile[1], sizeof hostile[1], "comp`touch %s`", mark);
  snprintf(hostile[2], sizeof hostile[2], "comp;touch %s", mark);
  const char *jobs[] = {"completed-job", hostile[0], hostile[1], hostile[2]};
  for (size_t k = 0; k < 4; k++) {
    char *argv[] = {"gnmr-sim", "--agents", d.agents, "--job",
                    (char *)jobs[k], "--ranks", "1", "--units", "2",
                    "--steps", "3", NULL};
    run_result r = tu_run("gnmr-sim", argv, NULL);
    ck_assert_msg(r.code == 0, "%s: %s", jobs[k], r.err);
    tu_run_free(&r);
  }
  char script[2048];
  snprintf(script, sizeof script,
           "source '%s/deploy/completion/gnmrctl.bash'; "
           "PATH='%s':$PATH; "
           "c() { COMP_WORDS=(\"$@\"); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); "
           "COMPREPLY=(); _gnmrctl; echo \"[${COMPREPLY[*]}]\"; }; "
           "c gnmrctl hi; c gnmrctl history --u; "
           "c gnmrctl --admin '%s' status comp",
           getenv("GNMR_SOURCE_DIR") ? getenv("GNMR_SOURCE_DIR") : ".",
           tu_bin_dir(), d.admin);
  char path[300];
  snprintf(path, sizeof path, "%s/complete.sh", d.dir);
  tu_write_file(path, script);
  char cmd[400], out[4096] = "";
  snprintf(cmd, sizeof cmd, "bash '%s' 2>&1", path);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  ck_assert_int_eq(pclose(p), 0);
  ck_assert_msg(strstr(out, "[history]\n[--unit]\n[completed-job]\n") != NULL,
                "%s", out);
  ck_assert_msg(access(mark, F_OK) != 0, "a job name ran as the operator: "
                "%s exists", mark);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(metrics_endpoint_serves_valid_prometheus_text) {
  tu_daemon d = {0};
  char url[256];
  tu_daemon_start_metrics(&d, url, sizeof url);
  /* a live job whose name needs escaping in a label */
  static const char *names[] = {"a", "b"};
  gnmr_agent_config c = {0};
  c.endpoint = d.agents;
  c.job = "quote\"and\\slash";
  c.reporters = 1;
  c.unit_names = names;
  c.n_units = 2;
  gnmr_params_default(&c.params);
  c.params.warmup_steps = 0;
  gnmr_agent *a;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  /* a NaN in a at step 3 (promoted at once), a's low path measured as
   * damaged at 6 (Report.shadowed: held, no NaN), b's norm 10x at step 8
   * and 100x at 9 (promoted at 9: confirm_steps) */
  for (uint64_t t = 1; t <= 10; t++) {
    double s[2] = {1, t == 8 ? 400.0 : t == 9 ? 40000.0 : 4.0};
    uint64_t nf[2] = {t == 3, 0};
    uint8_t sh[2] = {t == 6, 0};
    ck_assert_int_eq(gnmr_agent_report_sums_shadowed(a, t, s, nf, NULL, sh),
                     GNMR_OK);
    ck_assert_int_eq(gnmr_agent_wait(a, t, 5000 * tu_slow()), GNMR_OK);
  }
  int status;
  char *text = tu_http_get(url, &status);
  ck_assert_int_eq(status, 200);
  ck_assert_ptr_nonnull(strstr(text, "gnmr_steps_decided_total 10\n"));
  /* who answers, and since when (issue 63) */
  ck_assert_ptr_nonnull(strstr(text, "gnmr_build_info{version=\"" GNMR_VERSION
                                     "\"} 1\n"));
  const char *since = strstr(text, "\ngnmr_start_time_seconds ");
  ck_assert_ptr_nonnull(since);
  long long started = atoll(since + 25);
  ck_assert_msg(started > (long long)time(NULL) - 600 &&
                    started <= (long long)time(NULL),
                "start time %lld", started);
  ck_assert_ptr_nonnull(strstr(text, "gnmr_reports_total 10\n"));
  ck_assert_ptr_nonnull(
      strstr(text, "gnmr_decision_latency_seconds_count 10\n"));
  ck_assert_ptr_nonnull(
      strstr(text, "gnmr_job_step{job=\"quote\\\"and\\\\slash\"} 10\n"));
  ck_assert_ptr_nonnull(strstr(text, "gnmr_job_active_units{job="));
  {
    const char *pr = strstr(text, "gnmr_job_promotions_total{"),
               *nf = strstr(text, "gnmr_job_nonfinite_steps_total{");
    ck_assert_msg(pr != NULL && nf != NULL, "no per-job counters");
    static const char want_pr[] =
        "gnmr_job_promotions_total{job=\"quote\\\"and\\\\slash\"} 2\n";
    static const char want_nf[] =
        "gnmr_job_nonfinite_steps_total{job=\"quote\\\"and\\\\slash\"} 1\n";
    ck_assert_msg(strncmp(pr, want_pr, sizeof want_pr - 1) == 0, "%.80s",
                  pr);
    ck_assert_msg(strncmp(nf, want_nf, sizeof want_nf - 1) == 0, "%.80s",
                  nf);
    const char *sh = strstr(text, "gnmr_job_shadowed_steps_total{");
    ck_assert_ptr_nonnull(sh);
    static const char want_sh[] =
        "gnmr_job_shadowed_steps_total{job=\"quote\\\"and\\\\slash\"} 1\n";
    ck_assert_msg(strncmp(sh, want_sh, sizeof want_sh - 1) == 0, "%.80s",
                  sh);
  }
  ck_assert_ptr_nonnull(strstr(text, "gnmr_rejected_total{reason=\"decode\"}"));
  ck_assert_ptr_nonnull(strstr(text, "gnmr_store_commit_seconds_bucket"));
  /* every counter of gnmrd's one table, under its family and labels */
  static const struct {
    const char *field, *metric, *labels;
  } rows[] = {
#define ROW(field, metric, labels, help) {#field, metric, labels},
      GNMRD_COUNTERS(ROW)
#undef ROW
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    char want[200], help[120];
    if (rows[i].labels[0] != '\0')
      snprintf(want, sizeof want, "\ngnmr_%s_total{%s} ", rows[i].metric,
               rows[i].labels);
    else
      snprintf(want, sizeof want, "\ngnmr_%s_total ", rows[i].metric);
    snprintf(help, sizeof help, "# HELP gnmr_%s_total ", rows[i].metric);
    ck_assert_msg(strstr(text, want) != NULL && strstr(text, help) != NULL,
                  "counter %s is not on /metrics as %s", rows[i].field,
                  want + 1);
  }
  { /* as many Hellos as the agent sent (one, or more when a loaded
     * machine made it ask again before the Welcome came) */
    gnmr_agent_stats as;
    char want[64];
    ck_assert_int_eq(gnmr_agent_stats_get(a, &as), GNMR_OK);
    ck_assert_uint_ge(as.hellos, 1);
    snprintf(want, sizeof want, "\ngnmr_hellos_total %llu\n",
             (unsigned long long)as.hellos);
    ck_assert_msg(strstr(text, want) != NULL, "no '%s' on /metrics", want + 1);
  }
  /* every sample line is NAME[{labels}] VALUE */
  for (char *line = text; *line != '\0';) {
    char *nl = strchr(line, '\n');
    size_t len = nl ? (size_t)(nl - line) : strlen(line);
    if (*line != '#') {
      char *sp = memrchr(line, ' ', len);
      ck_assert_msg(sp != NULL && strncmp(line, "gnmr_", 5) == 0,
                    "bad sample line: %.*s", (int)len, line);
    }
    line += len + (nl != NULL);
  }
  /* and the real format checker agrees, where Debian's promtool is */
  if (access("/usr/bin/promtool", X_OK) == 0) {
    char path[128], cmd[300];
    snprintf(path, sizeof path, "%s/metrics.txt", d.dir);
    tu_write_file(path, text);
    snprintf(cmd, sizeof cmd, "promtool check metrics < '%s' 2>&1", path);
    FILE *p = popen(cmd, "r");
    char out[1024] = "";
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "promtool: %s", out);
  } else {
    printf("metrics: promtool not installed; checked by this test's own "
           "rules only\n");
  }
  free(text);
  char other[300];
  snprintf(other, sizeof other, "%.*s/other", (int)(strlen(url) - 8), url);
  text = tu_http_get(other, &status);
  ck_assert_int_eq(status, 404);
  free(text);
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* GNMRD_PARENT_PID (the Python package's private gnmrd, docs/python.md):
 * anything but a process id is refused naming the variable, never echoed;
 * a process that is not gnmrd's parent means the parent has gone: gnmrd
 * does not start. */
/* Issue 63: tables cut their alignment at 20-24 characters, a longer job
 * or unit name pushing the rest of its row out of line. A table's column
 * is now as wide as its widest field (up to 120): every row's next column
 * starts where the header's does. */
static long column_at(const char *text, const char *line_start,
                      const char *word) {
  const char *l = strstr(text, line_start);
  ck_assert_msg(l != NULL, "no line starting %s in:\n%s", line_start, text);
  const char *end = strchr(l, '\n');
  const char *w = strstr(l, word);
  ck_assert_msg(w != NULL && (end == NULL || w < end), "no %s after %s in:\n%s",
                word, line_start, text);
  return (long)(w - l);
}

START_TEST(table_columns_are_as_wide_as_their_names) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  const char *lng = "team-llm.pretrain.fp8-recipe.seed-1234.run-2026-12-07";
  const char *jobs[] = {lng, "short"};
  for (int k = 0; k < 2; k++) {
    char *argv[] = {"gnmr-sim", "--agents", d.agents, "--job", (char *)jobs[k],
                    "--ranks", "1", "--units", "3", "--steps", "5", NULL};
    run_result r = tu_run("gnmr-sim", argv, NULL);
    ck_assert_msg(r.code == 0, "%s", r.err);
    tu_run_free(&r);
  }
  char adm[300];
  snprintf(adm, sizeof adm, "--admin=%s", d.admin);
  char *jargs[] = {"gnmrctl", adm, "jobs", NULL};
  run_result r = tu_run("gnmrctl", jargs, NULL);
  ck_assert_msg(r.code == 0, "%s", r.err);
  long head = column_at(r.out, "JOB", "STATE");
  ck_assert_int_gt(head, (long)strlen(lng));
  ck_assert_int_eq(column_at(r.out, lng, "finished"), head);
  ck_assert_int_eq(column_at(r.out, "short ", "finished"), head);
  tu_run_free(&r);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(a_parent_pid_that_is_not_one_or_not_the_parent_stops_gnmrd) {
  static const char *bad[] = {"abc", "12x", "-5", "0", "1",
                              "99999999999999999999", "\x1b[31m7"};
  char *argv[] = {"gnmrd", "--config-keys", NULL};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("GNMRD_PARENT_PID", bad[i], 1);
    run_result r = tu_run("gnmrd", argv, NULL);
    ck_assert_msg(r.code == 2, "'%s': exit %d", bad[i], r.code);
    ck_assert_ptr_nonnull(strstr(r.err, "GNMRD_PARENT_PID is not a process "
                                        "id"));
    ck_assert_ptr_null(strchr(r.err, '\x1b'));
    ck_assert_str_eq(r.out, "");
    tu_run_free(&r);
  }
  char pid[32]; /* a process id, not the parent's */
  snprintf(pid, sizeof pid, "%d", getppid() == 2 ? 3 : 2);
  setenv("GNMRD_PARENT_PID", pid, 1);
  run_result r = tu_run("gnmrd", argv, NULL);
  ck_assert_msg(r.code == 1, "exit %d", r.code);
  ck_assert_ptr_nonnull(strstr(r.err, "has gone: not starting"));
  tu_run_free(&r);
  unsetenv("GNMRD_PARENT_PID");
  r = tu_run("gnmrd", argv, NULL); /* unset: as ever */
  ck_assert_int_eq(r.code, 0);
  tu_run_free(&r);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ops");
  TCase *tc = tcase_create("ops");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc,
                 check_config_accepts_the_example_and_names_bad_keys_and_lines);
  tcase_add_test(tc,
                 config_file_is_used_flags_override_and_policy_defaults_apply);
  tcase_add_test(tc, config_keys_table_matches_the_example_file_and_the_man_page);
  tcase_add_test(tc, systemd_notify_ready_watchdog_and_stopping);
  tcase_add_test(tc, unit_file_passes_systemd_analyze_verify);
  tcase_add_test(tc, agent_settings_come_from_the_environment);
  tcase_add_test(tc, metrics_endpoint_serves_valid_prometheus_text);
  tcase_add_test(tc, bash_completes_commands_options_and_job_names);
  tcase_add_test(tc, no_environment_means_no_guessed_data_directory);
  tcase_add_test(tc, a_parent_pid_that_is_not_one_or_not_the_parent_stops_gnmrd);
  tcase_add_test(tc, table_columns_are_as_wide_as_their_names);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
