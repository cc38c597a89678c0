/* SPDX-License-Identifier: MIT */
/* test_e2e.c — the live system end to end: a real gnmrd in a temporary
 * directory, gnmr-sim with several ranks and shards over tcp:// and ipc://,
 * decisions equal to the shared traces' expected files (so equal to
 * gnmrctl replay), two jobs at once, clean shutdown, command-line errors. */
#include "rawpeer.h"
#include "testutil.h"

/* Traces with their options and a rank/shard layout. */
static const struct {
  const char *trace, *expect;
  const char *ranks, *shards;
  const char *opts[20];
} cases[] = {
    {"worked_example.csv", "worked_example.a2_b2_w2_k1_l1_wu0.decisions.csv",
     "1", "1",
     {"--alpha", "2", "--beta", "2", "--window", "2", "--max-active", "1",
      "--lock-steps", "1", "--warmup-steps", "0", NULL}},
    {"small.csv", "small.defaults.decisions.csv", "4", "2", {NULL}},
    /* two ranks a node, each unit's two shards on one node's ranks,
     * summed node by node (Hello.node_ranks) */
    {"small.csv", "small.defaults.decisions.csv", "4", "2",
     {"--node-ranks", "2", NULL}},
    {"moe_idle.csv", "moe_idle.k2_l6.decisions.csv", "3", "3",
     {"--max-active", "2", "--lock-steps", "6", NULL}},
    {"burst.csv", "burst.a1.8_b1.6_w4_k3_l2_wu10_ea3_eb3_es60.decisions.csv",
     "8", "3",
     {"--alpha", "1.8", "--beta", "1.6", "--window", "4", "--max-active", "3",
      "--lock-steps", "2", "--warmup-steps", "10", "--early-alpha", "3",
      "--early-beta", "3", "--early-steps", "60", NULL}},
};

/* Builds gnmr-sim's argv for case i against endpoint. */
static int sim_argv(char **argv, size_t i, const char *endpoint,
                    const char *job, char *trace_p, size_t cap) {
  int n = 0;
  snprintf(trace_p, cap, "%s/%s", tu_traces(), cases[i].trace);
  argv[n++] = "gnmr-sim";
  argv[n++] = "--agents";
  argv[n++] = (char *)endpoint;
  argv[n++] = "--job";
  argv[n++] = (char *)job;
  argv[n++] = "--ranks";
  argv[n++] = (char *)cases[i].ranks;
  argv[n++] = "--shards";
  argv[n++] = (char *)cases[i].shards;
  argv[n++] = "--barrier-ms";
  argv[n++] = "20000";
  argv[n++] = "--timeout-ms";
  argv[n++] = "30000";
  argv[n++] = "--trace";
  argv[n++] = trace_p;
  static const char *const first[] = {TU_FIRST_DEFAULTS};
  for (int k = 0; k < TU_FIRST_DEFAULTS_N; k++)
    argv[n++] = (char *)first[k];
  for (int k = 0; cases[i].opts[k]; k++)
    argv[n++] = (char *)cases[i].opts[k];
  argv[n] = NULL;
  return n;
}

static char *expected(size_t i) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", tu_traces(), cases[i].expect);
  char *e = tu_read_file(p, NULL);
  ck_assert_msg(e != NULL, "cannot read %s", p);
  return e;
}

static void run_all_cases(const tu_daemon *d) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *argv[80], trace_p[512], job[32];
    snprintf(job, sizeof job, "job-%zu", i);
    sim_argv(argv, i, d->agents, job, trace_p, sizeof trace_p);
    run_result r = tu_run("gnmr-sim", argv, NULL);
    if (r.code != 0) { /* keep the whole report: Check cuts long messages */
      char p[128];
      snprintf(p, sizeof p, "%s/sim-%zu.err", d->dir, i);
      tu_write_file(p, r.err);
      fprintf(stderr, "gnmr-sim stderr kept in %s\n", p);
    }
    ck_assert_msg(r.code == 0, "%s: exit %d: %s", cases[i].trace, r.code,
                  r.err);
    char *e = expected(i);
    ck_assert_msg(strcmp(r.out, e) == 0, "%s over %s: decisions differ",
                  cases[i].trace, d->agents);
    ck_assert_ptr_nonnull(strstr(r.err, "round trip p50"));
    free(e);
    tu_run_free(&r);
  }
  ck_assert_int_eq(tu_counter(d, "deadline_decisions"), 0);
  ck_assert_int_eq(tu_counter(d, "missing_units"), 0);
  ck_assert_int_eq(tu_counter(d, "late_reports"), 0);
  ck_assert_int_eq(tu_counter(d, "jobs_finished"),
                   (long long)(sizeof cases / sizeof cases[0]));
}

/* Issue 48: gnmrctl watch cut unit names to their first 24 characters, so
 * the q, k and v projections of a layer looked the same. The column is as
 * wide as the names (up to 60); a longer name keeps its end. */
START_TEST(watch_shows_unit_names_that_tell_units_apart) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  raw_peer p = raw_open(d.agents);
  static char *units[] = {
      "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
      "base_model.model.model.layers.11.self_attn.v_proj.lora_A.default.w"};
  hello(&p, "names", 0, 1, units, 3, 2.0);
  Gnmr__Envelope *e = expect_body(&p, GNMR__ENVELOPE__BODY_WELCOME);
  gnmr__wire_free(&e);
  for (uint64_t t = 1; t <= 3; t++) {
    double s[3] = {1.0 * (double)t, 2.0 * (double)t, 3.0 * (double)t};
    report(&p, "names", 0, t, s, 3, NULL, 0);
    e = expect_body(&p, GNMR__ENVELOPE__BODY_DECISION);
    gnmr__wire_free(&e);
  }
  char adm[300];
  snprintf(adm, sizeof adm, "--admin=%s", d.admin);
  char *argv[] = {"gnmrctl", adm, "watch", "names", "--count", "1",
                  "--top", "3", NULL};
  run_result r = tu_run("gnmrctl", argv, NULL);
  ck_assert_msg(r.code == 0, "%s", r.err);
  ck_assert_msg(strstr(r.out, "model.layers.0.self_attn.q_proj ") &&
                    strstr(r.out, "model.layers.0.self_attn.k_proj ") &&
                    strstr(r.out, "...") &&
                    strstr(r.out, "layers.11.self_attn.v_proj.lora_A."
                                  "default.w"),
                "%s", r.out);
  tu_run_free(&r);
  /* units --csv gives the mean exactly, as --json does (it rounded to 6
   * digits) */
  char *csv[] = {"gnmrctl", adm, "units", "names", "--csv", NULL};
  char *js[] = {"gnmrctl", adm, "units", "names", "--json", NULL};
  run_result rc = tu_run("gnmrctl", csv, NULL), rj = tu_run("gnmrctl", js,
                                                             NULL);
  ck_assert_int_eq(rc.code, 0);
  ck_assert_int_eq(rj.code, 0);
  const char *line = strchr(rc.out, '\n'); /* the first unit's row */
  ck_assert_ptr_nonnull(line);
  const char *f = line + 1;
  for (int k = 0; k < 4 && f != NULL; k++) /* id,name,shards,reports,mean */
    f = strchr(f, ',') ? strchr(f, ',') + 1 : NULL;
  const char *m = strstr(rj.out, "\"mean\": ");
  ck_assert(f != NULL && m != NULL);
  double from_csv = strtod(f, NULL), from_json = strtod(m + 8, NULL);
  ck_assert_msg(from_csv == from_json && from_csv != 0,
                "csv %.17g, json %.17g", from_csv, from_json);
  tu_run_free(&rc);
  tu_run_free(&rj);
  raw_close(&p);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(decisions_equal_replay_over_tcp_with_ranks_and_shards) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  ck_assert_ptr_nonnull(strstr(d.agents, "tcp://127.0.0.1:"));
  run_all_cases(&d);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(decisions_equal_replay_over_ipc) {
  tu_daemon d = {0};
  char ep[160];
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/run/agents.sock", d.dir);
  tu_daemon_start_in(&d, ep, NULL, d.dir, NULL);
  ck_assert_str_eq(d.agents, ep);
  run_all_cases(&d);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Spawns gnmr-sim for case i without waiting; output to files. */
static pid_t spawn_sim(size_t i, const char *endpoint, const char *job,
                       const char *out) {
  char *argv[80], trace_p[512], path[512];
  static char keep_trace[sizeof cases / sizeof cases[0]][512];
  sim_argv(argv, i, endpoint, job, trace_p, sizeof trace_p);
  snprintf(keep_trace[i], sizeof keep_trace[i], "%s", trace_p);
  for (int k = 0; argv[k]; k++)
    if (argv[k] == trace_p)
      argv[k] = keep_trace[i];
  snprintf(path, sizeof path, "%s/gnmr-sim", tu_bin_dir());
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  ck_assert_int_eq(posix_spawn(&pid, path, &fa, NULL, argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

START_TEST(two_jobs_at_once_stay_independent) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  char out1[128], out2[128];
  snprintf(out1, sizeof out1, "%s/sim1", d.dir);
  snprintf(out2, sizeof out2, "%s/sim2", d.dir);
  /* small (defaults) and burst (other parameters) at the same time */
  pid_t p1 = spawn_sim(1, d.agents, "alpha-job", out1);
  pid_t p2 = spawn_sim(3, d.agents, "beta-job", out2);
  int s1, s2;
  waitpid(p1, &s1, 0);
  waitpid(p2, &s2, 0);
  ck_assert(WIFEXITED(s1) && WEXITSTATUS(s1) == 0);
  ck_assert(WIFEXITED(s2) && WEXITSTATUS(s2) == 0);
  char *o1 = tu_read_file(out1, NULL), *o2 = tu_read_file(out2, NULL);
  char *e1 = expected(1), *e2 = expected(3);
  ck_assert_msg(strcmp(o1, e1) == 0, "small differs when run beside burst");
  ck_assert_msg(strcmp(o2, e2) == 0, "burst differs when run beside small");
  free(o1);
  free(o2);
  free(e1);
  free(e2);
  ck_assert_int_eq(tu_counter(&d, "jobs_created"), 2);
  ck_assert_int_eq(tu_counter(&d, "deadline_decisions"), 0);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(daemon_prints_endpoints_and_stops_cleanly_on_sigterm) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  ck_assert_ptr_nonnull(strstr(d.admin, "ipc://"));
  ck_assert_int_eq(tu_counter(&d, "messages_in"), 0);
  /* its threads say what they are (top -H, /proc): the store's writer */
  ck_assert_int_eq(tu_named_threads(d.pid, "gnmrd-store"), 1);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  char *log = tu_daemon_log(&d);
  ck_assert_ptr_nonnull(strstr(log, "STOP stopped cleanly"));
  free(log);
  /* SIGINT too */
  tu_daemon_start_in(&d, NULL, NULL, d.dir, NULL);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGINT), 0);
  /* SIGTERM after SIGTERM while it stops (a private gnmrd gets one each
   * time a thread of its killed trainer that was its parent dies): the
   * stop goes on to its end. Its signal handles closed, SIGTERM once
   * killed it there half-way, without "stopped cleanly". */
  for (int round = 0; round < 3; round++) {
    tu_daemon_start_in(&d, NULL, NULL, d.dir, NULL);
    int st = 0, sent = 0;
    pid_t pid = d.pid;
    while (waitpid(pid, &st, WNOHANG) == 0) {
      kill(pid, SIGTERM);
      sent++;
      usleep(200);
    }
    tu_track_daemon(pid, 0);
    d.pid = 0;
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "round %d: %d SIGTERMs: %s %d", round, sent,
                  WIFEXITED(st) ? "exit" : "signal",
                  WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    ck_assert_int_gt(sent, 1);
  }
  tu_rmrf(d.dir);
}
END_TEST

/* A gnmrd that read a request and died before it answered: a ROUTER on
 * endpoint takes one request, checks it is of kind `body` (and command
 * cmd, for an admin request), then closes, dropping the connection. */
static void take_one_and_go(const char *endpoint, Gnmr__Envelope__BodyCase body,
                            const char *cmd) {
  void *ctx = zmq_ctx_new(), *r = zmq_socket(ctx, ZMQ_ROUTER);
  int zero = 0, wait = 20000 * tu_slow();
  zmq_setsockopt(r, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(r, ZMQ_RCVTIMEO, &wait, sizeof wait);
  ck_assert_int_eq(zmq_bind(r, endpoint), 0);
  zmq_msg_t id, m;
  zmq_msg_init(&id);
  zmq_msg_init(&m);
  ck_assert_int_ge(zmq_msg_recv(&id, r, 0), 0);
  ck_assert_int_ge(zmq_msg_recv(&m, r, 0), 0);
  Gnmr__Envelope *env = NULL;
  char err[128];
  ck_assert_int_eq(gnmr__wire_decode(zmq_msg_data(&m), zmq_msg_size(&m), &env,
                                     err, sizeof err),
                   GNMR_OK);
  ck_assert_int_eq(env->body_case, body);
  if (cmd != NULL)
    ck_assert_str_eq(env->admin_request->command, cmd);
  gnmr__wire_free(&env);
  zmq_msg_close(&id);
  zmq_msg_close(&m);
  zmq_close(r);
  zmq_ctx_term(ctx);
}

/* Starts gnmrctl with argv in the background, its output into
 * dir/ctl.out and dir/ctl.err. */
static pid_t ctl_start(const char *dir, char *const argv[]) {
  char out[300], err[300];
  snprintf(out, sizeof out, "%s/ctl.out", dir);
  snprintf(err, sizeof err, "%s/ctl.err", dir);
  int ifd = open("/dev/null", O_RDONLY);
  int ofd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  int efd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ck_assert(ifd >= 0 && ofd >= 0 && efd >= 0);
  pid_t pid = tu_spawn("gnmrctl", argv, ifd, ofd, efd);
  close(ifd);
  close(ofd);
  close(efd);
  return pid;
}

static int ctl_wait(pid_t pid) {
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Issue 62: a poll gnmrd does not answer in time (here it is stopped, as
 * a flood or a restart would hold it) no longer ends `gnmrctl watch`: it
 * says so and asks again, and shows the job once gnmrd answers; a job
 * gnmrd refuses (unknown) still ends it, with exit 1. */
START_TEST(watch_goes_on_when_a_poll_is_not_answered) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  tu_daemon_start_in(&d, NULL, NULL, d.dir, NULL);
  raw_peer p = raw_open(d.agents);
  static char *units[] = {"a", "b"};
  hello(&p, "watched", 0, 1, units, 2, 2.0);
  Gnmr__Envelope *e = expect_body(&p, GNMR__ENVELOPE__BODY_WELCOME);
  gnmr__wire_free(&e);
  char adm[300];
  snprintf(adm, sizeof adm, "--admin=%s", d.admin);
  /* under valgrind gnmrd (running again) may miss a few more: more
   * polls there */
  char *argv[] = {"gnmrctl", adm, "watch", "watched", "--count",
                  tu_slow() > 1 ? "12" : "3", "--interval-ms", "100", NULL};
  ck_assert_int_eq(kill(d.pid, SIGSTOP), 0);
  pid_t ctl = ctl_start(d.dir, argv);
  /* gnmrd goes on once gnmrctl said its first poll went unanswered (a
   * fixed wait was not enough where gnmrctl itself runs under valgrind:
   * it started after gnmrd was back) */
  char path[400];
  snprintf(path, sizeof path, "%s/ctl.err", d.dir);
  char *err = NULL;
  for (int i = 0; i < 3000; i++) {
    free(err);
    err = tu_read_file(path, NULL);
    if (err != NULL && strstr(err, "asking again") != NULL)
      break;
    tu_sleep_ms(20);
  }
  free(err);
  ck_assert_int_eq(kill(d.pid, SIGCONT), 0);
  ck_assert_int_eq(ctl_wait(ctl), 0);
  err = tu_read_file(path, NULL);
  snprintf(path, sizeof path, "%s/ctl.out", d.dir);
  char *out = tu_read_file(path, NULL);
  ck_assert_msg(err && strstr(err, "no answer this time; asking again"),
                "stderr: %s", err ? err : "(none)");
  ck_assert_msg(out && strstr(out, "gnmr job watched"), "stdout: %s",
                out ? out : "(none)");
  free(err);
  free(out);
  char *unknown[] = {"gnmrctl", adm, "watch", "no-such-job", "--count",
                     "2", NULL};
  run_result r = tu_run("gnmrctl", unknown, NULL);
  ck_assert_int_eq(r.code, 1);
  tu_run_free(&r);
  raw_close(&p);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* A request written to a connection that drops is gone with it (gnmrd
 * restarted, a standby took over, gnmrd closed a connection it took for
 * a silent one): gnmrctl sends a read again on the next connection, and
 * never a command that changes a job. */
START_TEST(gnmrctl_asks_again_when_its_connection_drops) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  char adm[200], opt[220], path[300];
  snprintf(adm, sizeof adm, "ipc://%s/admin.sock", d.dir);
  snprintf(opt, sizeof opt, "--admin=%s", adm);
  char *stats[] = {"gnmrctl",
                   opt,
                   "stats",
                   "--timeout-ms",
                   tu_slow() > 1 ? "120000" : "20000",
                   NULL};
  pid_t ctl = ctl_start(d.dir, stats);
  take_one_and_go(adm, GNMR__ENVELOPE__BODY_STATS_REQUEST, NULL);
  tu_daemon_start_in(&d, NULL, NULL, d.dir, NULL);
  ck_assert_int_eq(ctl_wait(ctl), 0);
  snprintf(path, sizeof path, "%s/ctl.out", d.dir);
  char *out = tu_read_file(path, NULL);
  ck_assert_ptr_nonnull(out);
  ck_assert_msg(strstr(out, "messages_in ") != NULL, "stats said: %s", out);
  free(out);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  /* `set` is not sent twice: it waits out its time, with gnmrd up for
   * most of it (a second send would have had its answer: no such job) */
  char *set[] = {"gnmrctl",
                 opt,
                 "set",
                 "no-such-job",
                 "budget=2",
                 "--timeout-ms",
                 tu_slow() > 1 ? "30000" : "3000",
                 NULL};
  ctl = ctl_start(d.dir, set);
  take_one_and_go(adm, GNMR__ENVELOPE__BODY_ADMIN_REQUEST, "set");
  tu_daemon_start_in(&d, NULL, NULL, d.dir, NULL);
  ck_assert_msg(waitpid(ctl, NULL, WNOHANG) == 0,
                "gnmrctl set ended before gnmrd was back: the test shows "
                "nothing");
  ck_assert_int_eq(ctl_wait(ctl), 1);
  snprintf(path, sizeof path, "%s/ctl.err", d.dir);
  char *err = tu_read_file(path, NULL);
  ck_assert_ptr_nonnull(err);
  ck_assert_msg(strstr(err, "no answer from gnmrd") != NULL, "set said: %s",
                err);
  free(err);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(second_daemon_on_the_same_data_dir_is_refused) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  char data[128];
  snprintf(data, sizeof data, "%s/data", d.dir);
  char *argv[] = {"gnmrd", "--data-dir", data, "--agents",
                  "tcp://127.0.0.1:*", "--admin", "tcp://127.0.0.1:*", NULL};
  run_result r = tu_run("gnmrd", argv, NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_nonnull(strstr(r.err, "another gnmrd uses this data "
                                      "directory"));
  tu_run_free(&r);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(bad_command_lines_exit_2_with_a_message) {
  static const char *const gnmrd_bad[][4] = {
      {"--log-level", "loud", NULL},
      {"--max-msg", "12", NULL},
      {"--bogus", NULL},
      {"extra-arg", NULL},
      {"--workers", "257", NULL},
      {"--workers", "-1", NULL},
      {"--workers", "two", NULL},
  };
  for (size_t i = 0; i < sizeof gnmrd_bad / sizeof gnmrd_bad[0]; i++) {
    char *argv[6] = {"gnmrd"};
    for (int k = 0; gnmrd_bad[i][k]; k++)
      argv[k + 1] = (char *)gnmrd_bad[i][k];
    run_result r = tu_run("gnmrd", argv, NULL);
    ck_assert_msg(r.code == 2, "gnmrd %s: exit %d", gnmrd_bad[i][0], r.code);
    ck_assert(strlen(r.err) > 0);
    tu_run_free(&r);
  }
  /* an endpoint that cannot be bound is a clear error, exit 1 */
  const char *dir = tu_tmpdir();
  char data[128];
  snprintf(data, sizeof data, "%s/data", dir);
  char *bad_ep[] = {"gnmrd", "--data-dir", data, "--agents", "bogus://x",
                    NULL};
  run_result r = tu_run("gnmrd", bad_ep, NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_nonnull(strstr(r.err, "bogus://x"));
  tu_run_free(&r);
  tu_rmrf(dir);

  static const char *const sim_bad[][12] = {
      {"--job", "j", "--ranks", "2", NULL},                 /* no --agents */
      {"--agents", "tcp://127.0.0.1:1", "--job", "j", NULL}, /* no --ranks */
      {"--agents", "tcp://127.0.0.1:1", "--job", "j", "--ranks", "2",
       "--shards", "3", NULL},
      {"--agents", "tcp://127.0.0.1:1", "--job", "j", "--ranks", "x", NULL},
      {"--agents", "tcp://127.0.0.1:1", "--job", "j", "--ranks", "1",
       "--alpha", "0", NULL},
      {"--agents", "tcp://127.0.0.1:1", "--job", "j", "--ranks", "1",
       "--steps", "0", NULL},
      /* shards on the ranks of one node: whole nodes only */
      {"--agents", "tcp://127.0.0.1:1", "--job", "j", "--ranks", "5",
       "--shards", "2", "--node-ranks", "2", NULL},
      {"--agents", "tcp://127.0.0.1:1", "--job", "j", "--ranks", "4",
       "--node-ranks", "4097", NULL},
  };
  for (size_t i = 0; i < sizeof sim_bad / sizeof sim_bad[0]; i++) {
    char *argv[14] = {"gnmr-sim"};
    for (int k = 0; sim_bad[i][k]; k++)
      argv[k + 1] = (char *)sim_bad[i][k];
    r = tu_run("gnmr-sim", argv, NULL);
    ck_assert_msg(r.code == 2, "gnmr-sim case %zu: exit %d", i, r.code);
    ck_assert_ptr_nonnull(strstr(r.err, "gnmr-sim:"));
    tu_run_free(&r);
  }
  /* a malformed trace is exit 1 naming the line */
  const char *d2 = tu_tmpdir();
  char tp[128];
  snprintf(tp, sizeof tp, "%s/t.csv", d2);
  tu_write_file(tp, "step,unit,norm\n1,0,oops\n");
  char *bad_trace[] = {"gnmr-sim", "--agents", "tcp://127.0.0.1:1", "--job",
                       "j", "--ranks", "1", "--trace", tp, NULL};
  r = tu_run("gnmr-sim", bad_trace, NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_nonnull(strstr(r.err, "t.csv:2: norm 'oops'"));
  tu_run_free(&r);
  tu_rmrf(d2);
}
END_TEST

START_TEST(synthetic_job_decisions_equal_replay_of_its_trace) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  char tp[128];
  snprintf(tp, sizeof tp, "%s/synth.csv", d.dir);
  char *argv[] = {"gnmr-sim", "--agents", d.agents, "--job", "synth",
                  "--ranks", "4", "--shards", "2", "--units", "96",
                  "--steps", "150", "--seed", "7", "--barrier-ms", "20000",
                  "--timeout-ms", "30000", "--write-trace", tp, NULL};
  run_result r = tu_run("gnmr-sim", argv, NULL);
  ck_assert_msg(r.code == 0, "exit %d: %s", r.code, r.err);
  char *replay_argv[] = {"gnmrctl", "replay", tp, NULL};
  run_result rr = tu_run("gnmrctl", replay_argv, NULL);
  ck_assert_int_eq(rr.code, 0);
  ck_assert_str_eq(r.out, rr.out);
  /* the synthetic job does select units */
  int active_rows = 0;
  for (const char *p = strstr(r.out, "\n"); p && p[1]; p = strchr(p + 1, '\n')) {
    const char *comma = strchr(p + 1, ',');
    if (comma && comma[1] != '\n')
      active_rows++;
  }
  ck_assert_int_gt(active_rows, 5);
  tu_run_free(&r);
  tu_run_free(&rr);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Every step on a worker thread (GNMR_WORKERS_MIN=0, 3 workers): the four
 * traces, a 6000-unit synthetic job (snapshots every 10 steps while the
 * next step runs) and gnmrctl reading the jobs' engines meanwhile (the
 * loop waits for a job's worker before it reads). Decisions must be
 * those of the loop, i.e. replay's, and every step must have gone to a
 * worker. */
START_TEST(steps_on_worker_threads_decide_exactly_as_replay) {
  tu_daemon d = {0};
  char *extra[] = {"--workers", "3", NULL};
  setenv("GNMR_WORKERS_MIN", "0", 1);
  tu_daemon_start_in(&d, NULL, NULL, NULL, extra);
  unsetenv("GNMR_WORKERS_MIN");
  char *log = tu_daemon_log(&d);
  ck_assert_msg(strstr(log, "3 workers for steps of 0 unit-shards") != NULL,
                "START names the workers: %s", log);
  free(log);
  enum { N = sizeof cases / sizeof cases[0] };
  pid_t pid[N + 1];
  char out[N + 1][128], job[N][32], tp[128];
  for (size_t i = 0; i < N; i++) {
    snprintf(out[i], sizeof out[i], "%s/sim%zu", d.dir, i);
    snprintf(job[i], sizeof job[i], "wk-%zu", i);
    pid[i] = spawn_sim(i, d.agents, job[i], out[i]);
  }
  snprintf(tp, sizeof tp, "%s/big.csv", d.dir);
  snprintf(out[N], sizeof out[N], "%s/big.out", d.dir);
  {
    char path[512];
    char *argv[] = {"gnmr-sim", "--agents", d.agents, "--job", "wk-big",
                    "--ranks", "4", "--shards", "2", "--units", "6000",
                    "--steps", "60", "--seed", "11", "--barrier-ms", "20000",
                    "--timeout-ms", "60000", "--write-trace", tp, NULL};
    snprintf(path, sizeof path, "%s/gnmr-sim", tu_bin_dir());
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out[N],
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    ck_assert_int_eq(posix_spawn(&pid[N], path, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
  }
  /* read the engines while steps run on the workers */
  char adm[300];
  snprintf(adm, sizeof adm, "%s", d.admin);
  /* under valgrind each spawn copies the tracer's address space: fewer */
  int queries = 0, n_queries = getenv("GNMR_VALGRIND") ? 6 : 40;
  for (int k = 0; k < n_queries; k++) {
    char *q1[] = {"gnmrctl", "--admin", adm, "top", "wk-big", NULL};
    char *q2[] = {"gnmrctl", "--admin", adm, "status", "wk-3", NULL};
    run_result r = tu_run("gnmrctl", k % 2 ? q1 : q2, NULL);
    queries += r.code == 0;
    tu_run_free(&r);
  }
  for (size_t i = 0; i <= N; i++) {
    int st;
    waitpid(pid[i], &st, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "sim %zu failed", i);
  }
  for (size_t i = 0; i < N; i++) {
    char *o = tu_read_file(out[i], NULL), *e = expected(i);
    ck_assert_msg(strcmp(o, e) == 0, "%s differs on workers", cases[i].trace);
    free(o);
    free(e);
  }
  char *replay_argv[] = {"gnmrctl", "replay", tp, NULL};
  run_result rr = tu_run("gnmrctl", replay_argv, NULL);
  ck_assert_int_eq(rr.code, 0);
  char *big = tu_read_file(out[N], NULL);
  ck_assert_msg(strcmp(big, rr.out) == 0, "the 6000-unit job differs from "
                "replay on workers");
  free(big);
  tu_run_free(&rr);
  ck_assert_int_gt(queries, 0);
  long long decided = tu_counter(&d, "steps_decided");
  ck_assert_int_gt(decided, 100);
  ck_assert_int_eq(tu_counter(&d, "worker_steps"), decided);
  ck_assert_int_eq(tu_counter(&d, "deadline_decisions"), 0);
  ck_assert_int_eq(tu_counter(&d, "republish_refused"), 0);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("e2e");
  TCase *tc = tcase_create("live");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, decisions_equal_replay_over_tcp_with_ranks_and_shards);
  tcase_add_test(tc, decisions_equal_replay_over_ipc);
  tcase_add_test(tc, watch_shows_unit_names_that_tell_units_apart);
  tcase_add_test(tc, watch_goes_on_when_a_poll_is_not_answered);
  tcase_add_test(tc, two_jobs_at_once_stay_independent);
  tcase_add_test(tc, steps_on_worker_threads_decide_exactly_as_replay);
  tcase_add_test(tc, synthetic_job_decisions_equal_replay_of_its_trace);
  tcase_add_test(tc, daemon_prints_endpoints_and_stops_cleanly_on_sigterm);
  tcase_add_test(tc, second_daemon_on_the_same_data_dir_is_refused);
  tcase_add_test(tc, gnmrctl_asks_again_when_its_connection_drops);
  tcase_add_test(tc, bad_command_lines_exit_2_with_a_message);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
