/* SPDX-License-Identifier: MIT */
/* test_hostile.c — regressions for hostile peers and large users (issue
 * 13): names that are not clean UTF-8, names already in an old database,
 * the [limits] caps (jobs, units, held bytes, idle jobs), refused Hellos
 * that must create nothing, ids past 2^32, and the connection cap. Each case runs against a
 * real gnmrd, and a well-behaved peer is served afterwards. */
#include <sqlite3.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <pthread.h>
#include <stdatomic.h>

#include "gnmr/agent.h"
#include "keys.h"
#include "rawpeer.h"
#include "testutil.h"
#include "text.h"

static char *two_units[] = {"u0", "u1"};

static void hello_ids(raw_peer *p, const char *job, uint32_t rank,
                      uint32_t reporters, char **units, size_t n,
                      uint64_t *ids) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Hello h = GNMR__HELLO__INIT;
  Gnmr__Params wp;
  policy_params prm;
  policy_params_default(&prm);
  prm.warmup_steps = 0;
  gnmr__params_to_wire(&prm, &wp);
  h.protocol = 1;
  h.job = (char *)job;
  h.rank = rank;
  h.reporters = reporters;
  h.n_units = n;
  h.units = units;
  h.params = &wp;
  h.barrier_ms = 60000;
  if (ids != NULL) {
    h.n_unit_ids = n;
    h.unit_ids = ids;
  }
  env.body_case = GNMR__ENVELOPE__BODY_HELLO;
  env.hello = &h;
  raw_send_env(p, &env);
}

static void send_report(raw_peer *p, const char *job, uint32_t rank,
                        uint64_t step, double *sumsq, size_t n) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Report r = GNMR__REPORT__INIT;
  r.job = (char *)job;
  r.rank = rank;
  r.step = step;
  r.n_sumsq = n;
  r.sumsq = sumsq;
  env.body_case = GNMR__ENVELOPE__BODY_REPORT;
  env.report = &r;
  raw_send_env(p, &env);
}

static void expect_welcome(raw_peer *p) {
  Gnmr__Envelope *env = expect_body(p, GNMR__ENVELOPE__BODY_WELCOME);
  gnmr__wire_free(&env);
}

static run_result ctl(const tu_daemon *d, char *a1, char *a2) {
  char admin[300];
  snprintf(admin, sizeof admin, "--admin=%s", d->admin);
  char *argv[] = {"gnmrctl", admin, a1, a2, NULL};
  return tu_run("gnmrctl", argv, NULL);
}

/* The bytes that must never pass as a name, and why. */
static const struct {
  const char *s, *why;
} bad_names[] = {
    {"a\xc2\x9b" "b", "control character U+009B"}, /* C1 CSI */
    {"\xe2\x80\xae" "evil", "format character U+202E"}, /* bidi override */
    {"x\xe2\x81\xa6y", "format character U+2066"},       /* bidi isolate */
    {"\xef\xbb\xbf" "bom", "format character U+FEFF"},
    {"zero\xe2\x80\x8bwidth", "format character U+200B"},
    {"line\xe2\x80\xa8sep", "line or paragraph separator U+2028"},
    {"tab\there", "control character U+0009"},
    {"del\x7f", "control character U+007F"},
    {"esc\x1b[2J", "control character U+001B"},
    {"over\xc0\xaf", "not UTF-8 at byte 4"},     /* overlong '/' */
    {"sur\xed\xa0\x80", "not UTF-8 at byte 3"},  /* a surrogate */
    {"big\xf4\x90\x80\x80", "not UTF-8 at byte 3"}, /* past U+10FFFF */
    {"cut\xe6\xa8", "not UTF-8 at byte 3"},      /* truncated */
    {"\x80lone", "not UTF-8 at byte 0"},         /* a continuation byte */
    {"non\xef\xbf\xbf", "noncharacter U+FFFF"},
    {"", "empty"},
};

START_TEST(names_are_utf8_without_controls_or_format_characters) {
  char why[96];
  for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
    ck_assert_msg(!gnmr__name_check(bad_names[i].s, 128, why, sizeof why),
                  "name %zu passed", i);
    ck_assert_msg(strstr(why, bad_names[i].why) != NULL,
                  "name %zu: '%s', expected '%s'", i, why, bad_names[i].why);
  }
  ck_assert(!gnmr__name_check(NULL, 128, why, sizeof why));
  ck_assert_str_eq(why, "missing");
  /* what passes: ASCII, CJK, emoji, combining marks, private use */
  static const char *const good[] = {
      "layers.0.attn.q_proj", "模型.层.3", "expert-\xf0\x9f\x9a\x80",
      "e\xcc\x81t\xc3\xa9", "\xee\x80\x80pua", "a b/c:d=e"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    ck_assert_msg(gnmr__name_check(good[i], 128, why, sizeof why),
                  "'%s' refused: %s", good[i], why);
  /* the length limit is in bytes, exactly */
  char n128[129], n129[130];
  memset(n128, 'a', 128);
  n128[128] = '\0';
  memset(n129, 'a', 129);
  n129[129] = '\0';
  ck_assert(gnmr__name_check(n128, 128, why, sizeof why));
  ck_assert(!gnmr__name_check(n129, 128, why, sizeof why));
  ck_assert_str_eq(why, "longer than 128 bytes");
  /* escaping: odd bytes and backslashes as \xHH, the rest kept */
  char out[64];
  ck_assert_str_eq(gnmr__escape("a\xc2\x9b" "b", out, sizeof out),
                   "a\\xc2\\x9bb");
  ck_assert_str_eq(gnmr__escape("\xe6\xa8", out, sizeof out), "\\xe6\\xa8");
  ck_assert_str_eq(gnmr__escape("模型\\x", out, sizeof out),
                   "模型\\x5cx");
  ck_assert_str_eq(gnmr__escape(NULL, out, sizeof out), "");
  ck_assert_str_eq(gnmr__escape("abcdef", out, 4), "abc"); /* truncated */
}
END_TEST

/* An encoded Hello for job and units, with every 'X' of a name turned
 * into a NUL byte (protobuf-c itself cannot write one). */
static uint8_t *hello_with_nul(const char *job, char **units, size_t n,
                               size_t *len) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Hello h = GNMR__HELLO__INIT;
  h.protocol = 1;
  h.job = (char *)job;
  h.reporters = 1;
  h.n_units = n;
  h.units = units;
  env.body_case = GNMR__ENVELOPE__BODY_HELLO;
  env.hello = &h;
  uint8_t *buf;
  ck_assert_int_eq(gnmr__wire_encode(&env, &buf, len), GNMR_OK);
  for (size_t i = 0; i < *len; i++)
    if (buf[i] == 'X')
      buf[i] = 0;
  return buf;
}

START_TEST(a_nul_byte_inside_a_name_is_refused_not_cut) {
  char *ok[] = {"u0", "u1"}, *nul_unit[] = {"u0", "uXtail"};
  const struct {
    const char *job;
    char **units;
    int bad;
  } cases[] = {{"plain-job", ok, 0},
               {"jobXhidden", ok, 1},   /* would arrive as "job" */
               {"nul-unit", nul_unit, 1}, /* would arrive as "u" */
               {"tailX", ok, 1}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t len;
    uint8_t *buf = hello_with_nul(cases[i].job, cases[i].units, 2, &len);
    Gnmr__Envelope *env = NULL;
    char err[160] = "";
    int rv = gnmr__wire_decode(buf, len, &env, err, sizeof err);
    if (cases[i].bad) {
      ck_assert_int_eq(rv, GNMR_E_PARSE);
      ck_assert_ptr_null(env);
      ck_assert_msg(strstr(err, "NUL byte") != NULL, "%s", err);
    } else {
      ck_assert_int_eq(rv, GNMR_OK);
      gnmr__wire_free(&env);
    }
    free(buf);
  }
}
END_TEST

START_TEST(hostile_names_are_refused_and_create_nothing) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  raw_peer p = raw_open(d.agents);
  for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
    hello_ids(&p, bad_names[i].s, 0, 1, two_units, 2, NULL);
    expect_error(&p, GNMR_E_INVAL, "job name");
    char *bad_unit[] = {"ok", (char *)bad_names[i].s};
    hello_ids(&p, "names-job", 0, 1, bad_unit, 2, NULL);
    expect_error(&p, GNMR_E_INVAL, "unit 1: name");
  }
  /* a NUL inside a name: refused whole, never taken as its prefix */
  char *units[] = {"u0", "u1"};
  size_t nl;
  uint8_t *nb = hello_with_nul("nulXjob", units, 2, &nl);
  raw_send(&p, nb, nl);
  free(nb);
  expect_error(&p, GNMR_E_PARSE, "NUL byte");
  ck_assert_int_eq(tu_counter(&d, "jobs_created"), 0);
  /* admin requests with such names: a clear error, and gnmrd lives on */
  run_result r = ctl(&d, "status", "a\xc2\x9b" "b");
  ck_assert_int_ne(r.code, 0);
  ck_assert_msg(strstr(r.err, "job name: control character U+009B") != NULL,
                "%s", r.err);
  tu_run_free(&r);
  r = ctl(&d, "jobs", NULL);
  ck_assert_int_eq(r.code, 0);
  tu_run_free(&r);
  /* a good peer is served */
  hello_ids(&p, "模型-job", 0, 1, two_units, 2, NULL);
  expect_welcome(&p);
  ck_assert_int_eq(tu_counter(&d, "jobs_created"), 1);
  raw_close(&p);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(old_database_names_are_not_restored_and_are_escaped) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  raw_peer p = raw_open(d.agents);
  hello_ids(&p, "oldjob", 0, 1, two_units, 2, NULL);
  expect_welcome(&p);
  double s[] = {1, 2};
  send_report(&p, "oldjob", 0, 1, s, 2);
  Gnmr__Envelope *env = expect_body(&p, GNMR__ENVELOPE__BODY_DECISION);
  gnmr__wire_free(&env);
  raw_close(&p);
  tu_sleep_ms(300); /* the store commits */
  ck_assert_int_eq(tu_daemon_stop(&d, SIGKILL), 128 + SIGKILL);
  /* an older gnmrd let a C1 control into a running job's name */
  char path[256];
  snprintf(path, sizeof path, "%s/data/gnmr.db", d.dir);
  sqlite3 *db;
  ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
  ck_assert_int_eq(sqlite3_exec(db,
                                "UPDATE jobs SET name=CAST(X'6F6C64C29B6A6F62'"
                                " AS TEXT) WHERE name='oldjob'",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  ck_assert_int_eq(sqlite3_changes(db), 1);
  sqlite3_close(db);
  tu_daemon_start_in(&d, NULL, NULL, d.dir, NULL);
  char *log = tu_daemon_log(&d);
  ck_assert_msg(strstr(log, "not restored, a name is invalid") != NULL, "%s",
                log);
  ck_assert_msg(strstr(log, "old\\xc2\\x9bjob") != NULL, "%s", log);
  free(log);
  run_result r = ctl(&d, "jobs", NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_msg(strstr(r.out, "old\\xc2\\x9bjob") != NULL, "%s", r.out);
  ck_assert(strstr(r.out, "\xc2\x9b") == NULL); /* never raw */
  tu_run_free(&r);
  r = ctl(&d, "jobs", "--json");
  ck_assert_int_eq(r.code, 0);
  tu_run_free(&r);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

static void start_with(tu_daemon *d, const char *conf) {
  const char *dir = tu_tmpdir();
  char path[256];
  snprintf(path, sizeof path, "%s/gnmrd.conf", dir);
  tu_write_file(path, conf);
  static char cfgpath[256];
  snprintf(cfgpath, sizeof cfgpath, "%s", path);
  char *extra[] = {"--config", cfgpath, NULL};
  tu_daemon_start_in(d, NULL, NULL, dir, extra);
}

START_TEST(caps_on_jobs_units_and_ids_refuse_clearly) {
  tu_daemon d = {0};
  start_with(&d, "[limits]\nmax_jobs = 2\nmax_units = 100\n");
  raw_peer p = raw_open(d.agents);
  /* one 60-byte Hello asking for unit id 2^24 - 1: two units, whatever
   * their ids (they are stored sparsely) */
  uint64_t far[] = {(1u << 24) - 1, 0};
  hello_ids(&p, "amp", 0, 1, two_units, 2, far);
  expect_welcome(&p);
  run_result st = ctl(&d, "status", "amp");
  ck_assert_msg(strstr(st.out, "\nunits          2\n") != NULL, "%s", st.out);
  tu_run_free(&st);
  raw_close(&p);
  p = raw_open(d.agents);
  /* more units than max_units */
  char *many[101];
  char buf[101][16];
  for (int i = 0; i < 101; i++) {
    snprintf(buf[i], sizeof buf[i], "m%d", i);
    many[i] = buf[i];
  }
  hello_ids(&p, "amp-many", 0, 1, many, 101, NULL);
  expect_error(&p, GNMR_E_RANGE, "at most 100 units");
  /* an id past 2^32 is not cut to 0; UINT32_MAX is no unit */
  uint64_t wrap[] = {UINT64_C(1) << 32, 1};
  hello_ids(&p, "wrap", 0, 1, two_units, 2, wrap);
  expect_error(&p, GNMR_E_RANGE, "unit id 4294967296 is not below");
  uint64_t top[] = {UINT32_MAX, 1};
  hello_ids(&p, "wrap", 0, 1, two_units, 2, top);
  expect_error(&p, GNMR_E_RANGE, "unit id 4294967295 is not below");
  /* refused Hellos leave no job behind, whatever their number */
  uint64_t dup[] = {5, 5};
  for (int i = 0; i < 50; i++) {
    char name[32];
    snprintf(name, sizeof name, "refused-%d", i);
    hello_ids(&p, name, 0, 1, two_units, 2, dup);
    expect_error(&p, GNMR_E_MISMATCH, "already taken");
  }
  ck_assert_int_eq(tu_counter(&d, "jobs_created"), 1); /* "amp" */
  ck_assert_int_eq(tu_counter(&d, "refused_max_units"), 1);
  raw_peer a = raw_open(d.agents), b = raw_open(d.agents),
           c = raw_open(d.agents);
  hello_ids(&a, "job-a", 0, 1, two_units, 2, NULL);
  expect_welcome(&a);
  hello_ids(&b, "job-b", 0, 1, two_units, 2, NULL);
  expect_error(&b, GNMR_E_BUSY, "max_jobs"); /* "amp" and "job-a" */
  run_result fin = ctl(&d, "finish", "amp");
  ck_assert_msg(fin.code == 0, "finish: %s", fin.err);
  tu_run_free(&fin);
  hello_ids(&b, "job-b", 0, 1, two_units, 2, NULL);
  expect_welcome(&b);
  hello_ids(&c, "job-c", 0, 1, two_units, 2, NULL);
  expect_error(&c, GNMR_E_BUSY, "max_jobs");
  ck_assert_int_eq(tu_counter(&d, "refused_max_jobs"), 2);
  /* a known job's new rank is no new job */
  run_result r = ctl(&d, "jobs", NULL);
  ck_assert(strstr(r.out, "job-a") && strstr(r.out, "job-b"));
  ck_assert(strstr(r.out, "job-c") == NULL && strstr(r.out, "refused") ==
                                                  NULL);
  tu_run_free(&r);
  raw_close(&a);
  raw_close(&b);
  raw_close(&c);
  raw_close(&p);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* A raw TCP connection to endpoint "tcp://HOST:PORT" that says nothing. */
static int tcp_silent(const char *endpoint) {
  char host[64];
  int port;
  ck_assert_int_eq(sscanf(endpoint, "tcp://%63[^:]:%d", host, &port), 2);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  inet_pton(AF_INET, host, &sa.sin_addr);
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  return fd;
}

/* Waits up to ms for the peer to close fd: 1 when it did. */
static int closed_by_peer(int fd, int ms) {
  struct pollfd pf = {fd, POLLIN, 0};
  char buf[256];
  for (int waited = 0; waited < ms; waited += 50) {
    if (poll(&pf, 1, 50) > 0) {
      ssize_t n = read(fd, buf, sizeof buf);
      if (n == 0 || (n < 0 && errno == ECONNRESET))
        return 1;
    }
  }
  return 0;
}

START_TEST(connections_past_the_cap_are_refused_politely_and_counted) {
  tu_daemon d = {0};
  start_with(&d, "[limits]\nmax_connections = 3\n");
  raw_peer in[3];
  for (int i = 0; i < 3; i++) {
    char job[16];
    snprintf(job, sizeof job, "cap-%d", i);
    in[i] = raw_open(d.agents);
    hello_ids(&in[i], job, 0, 1, two_units, 2, NULL);
    expect_welcome(&in[i]);
  }
  /* a fourth peer's Hello: told why, and closed */
  raw_peer x = raw_open(d.agents);
  hello_ids(&x, "cap-x", 0, 1, two_units, 2, NULL);
  expect_error(&x, GNMR_E_BUSY, "max_connections");
  raw_close(&x);
  /* a connection that says nothing is closed after the grace period */
  int fd = tcp_silent(d.agents);
  ck_assert_msg(closed_by_peer(fd, 5000), "a silent connection past the cap "
                "stayed open");
  close(fd);
  ck_assert_int_ge(tu_counter(&d, "refused_connections"), 2);
  /* the three served are untouched, and a freed place is taken again */
  double sumsq[2] = {1, 1};
  send_report(&in[0], "cap-0", 0, 1, sumsq, 2);
  Gnmr__Envelope *dec = expect_body(&in[0], GNMR__ENVELOPE__BODY_DECISION);
  gnmr__wire_free(&dec);
  raw_close(&in[2]);
  int joined = 0;
  for (int tries = 0; tries < 30 && !joined; tries++) {
    raw_peer y = raw_open(d.agents);
    hello_ids(&y, "cap-y", 0, 1, two_units, 2, NULL);
    Gnmr__Envelope *env = raw_recv(&y, 2000);
    joined = env != NULL && env->body_case == GNMR__ENVELOPE__BODY_WELCOME;
    gnmr__wire_free(&env);
    raw_close(&y);
    if (!joined)
      usleep(100000); /* gnmrd has not seen in[2] go yet */
  }
  ck_assert_msg(joined, "no place freed after a peer left");
  raw_close(&in[0]);
  raw_close(&in[1]);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Idle peers cannot hold the places: 70 connections to the admin endpoint
 * (whose places are 64) and 20 to the agents endpoint that complete their
 * handshake and then say nothing used to keep the operator at BUSY and
 * another tenant's Hello waiting for as long as they stayed. Each has
 * [limits] first_message_ms to send a message; then it is closed and
 * counted, and the operator and the agent are served. */
START_TEST(idle_connections_do_not_hold_the_places) {
  tu_daemon d = {0};
  start_with(&d, "[limits]\nfirst_message_ms = 1000\n");
  enum { N_ADMIN = 70, N_AGENTS = 20 };
  void *ctx = zmq_ctx_new();
  void *idle[N_ADMIN + N_AGENTS];
  int zero = 0, never = -1;
  for (int i = 0; i < N_ADMIN + N_AGENTS; i++) {
    idle[i] = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(idle[i], ZMQ_LINGER, &zero, sizeof zero);
    /* a holder that does not come back (one that does is closed again) */
    zmq_setsockopt(idle[i], ZMQ_RECONNECT_IVL, &never, sizeof never);
    ck_assert_int_eq(zmq_connect(idle[i], i < N_ADMIN ? d.admin : d.agents),
                     0);
  }
  /* past the deadline (and valgrind's pace) the operator is answered:
   * until then the idle ones hold every place and gnmrctl gets BUSY */
  char adm[300];
  snprintf(adm, sizeof adm, "--admin=%s", d.admin);
  char *st[] = {"gnmrctl", adm, "jobs", NULL};
  int served = 0;
  tu_sleep_ms(300); /* every idle one connected */
  for (int i = 0; i < 100 * tu_slow() && !served; i++) {
    run_result r = tu_run("gnmrctl", st, NULL);
    served = r.code == 0;
    tu_run_free(&r);
    if (!served)
      tu_sleep_ms(100);
  }
  ck_assert_msg(served, "the operator got no answer while idle peers stayed");
  /* the rest are closed as their own deadlines pass: a socket whose
   * connect zmq finished late (ASan, a loaded machine) is late to idle */
  long long closed = 0;
  for (int i = 0; i < 100 * tu_slow(); i++) {
    closed = tu_counter(&d, "refused_idle");
    if (closed >= N_ADMIN + N_AGENTS - 6)
      break;
    tu_sleep_ms(100);
  }
  ck_assert_msg(closed >= N_ADMIN + N_AGENTS - 6,
                "%lld idle connections closed", closed);
  /* a Hello is welcomed */
  raw_peer p = raw_open(d.agents);
  hello_ids(&p, "after-idle", 0, 1, two_units, 2, NULL);
  expect_welcome(&p);
  /* a connection that speaks at once is never closed for idling */
  tu_sleep_ms(1500);
  double sumsq[2] = {1, 1};
  send_report(&p, "after-idle", 0, 1, sumsq, 2);
  Gnmr__Envelope *dec = expect_body(&p, GNMR__ENVELOPE__BODY_DECISION);
  gnmr__wire_free(&dec);
  raw_close(&p);
  for (int i = 0; i < N_ADMIN + N_AGENTS; i++)
    zmq_close(idle[i]);
  zmq_ctx_term(ctx);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* gnmrd under a descriptor limit of 1024 (soft and hard), serving agents
 * on an ipc socket: before the connection cap, about 1000 connections
 * made libzmq abort it ("Too many open files", ipc_listener.cpp); with
 * the cap, a flood accepted faster than the loop thread closed what was
 * past it still could (seen once in CI), until gnmrd's own accept4 shed
 * connections instead (daemon/accept_guard.c). */
START_TEST(a_connection_flood_under_a_low_descriptor_limit_is_survived) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  char data[160], out[160], err[160], agents[200], admin[200], path[512];
  snprintf(data, sizeof data, "%s/data", d.dir);
  snprintf(out, sizeof out, "%s/out", d.dir);
  snprintf(err, sizeof err, "%s/err", d.dir);
  snprintf(agents, sizeof agents, "ipc://%s/agents.sock", d.dir);
  snprintf(admin, sizeof admin, "ipc://%s/admin.sock", d.dir);
  snprintf(path, sizeof path, "%s/gnmrd", tu_bin_dir());
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) { /* prlimit(1) sets the limit: valgrind, running this
                     test, would refuse it to its own process */
    int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600),
        e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
      _exit(126);
    execlp("prlimit", "prlimit", "--nofile=1024:1024", path, "--data-dir",
           data, "--agents", agents, "--admin", admin, (char *)NULL);
    _exit(127);
  }
  d.pid = pid;
  tu_track_daemon(pid, 1);
  tu_daemon_wait_ready(&d, 10000);
  /* this process needs a descriptor per connection too */
  struct rlimit mine;
  getrlimit(RLIMIT_NOFILE, &mine);
  enum { FLOOD = 1500 };
  if (mine.rlim_cur < FLOOD + 200) {
    mine.rlim_cur = mine.rlim_max < FLOOD + 200 ? mine.rlim_max : FLOOD + 200;
    setrlimit(RLIMIT_NOFILE, &mine);
  }
  static int fds[FLOOD];
  struct sockaddr_un sa = {0};
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s/agents.sock", d.dir);
  int opened = 0;
  for (int i = 0; i < FLOOD; i++) {
    fds[i] = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fds[i] < 0)
      break; /* this process's own limit */
    if (connect(fds[i], (struct sockaddr *)&sa, sizeof sa) != 0) {
      close(fds[i]); /* the listen backlog is full: wait a little */
      fds[i] = -1;
      usleep(20000);
      continue;
    }
    opened++;
  }
  ck_assert_msg(opened > 1024, "only %d connections made", opened);
  usleep(1500000); /* past the grace period */
  ck_assert_msg(kill(pid, 0) == 0 && waitpid(pid, NULL, WNOHANG) == 0,
                "gnmrd died under the flood: %s", tu_daemon_log_tail(&d));
  /* past the cap each new connection either takes the place of the
   * oldest one that has said nothing (refused_idle) or is refused */
  ck_assert_int_ge(tu_counter(&d, "refused_connections") +
                       tu_counter(&d, "refused_idle"),
                   opened - 1024 + 320);
  for (int i = 0; i < FLOOD; i++)
    if (fds[i] > 0)
      close(fds[i]);
  /* served as before */
  int joined = 0;
  for (int tries = 0; tries < 30 && !joined; tries++) {
    raw_peer y = raw_open(agents);
    hello_ids(&y, "after-flood", 0, 1, two_units, 2, NULL);
    Gnmr__Envelope *env = raw_recv(&y, 2000);
    joined = env != NULL && env->body_case == GNMR__ENVELOPE__BODY_WELCOME;
    gnmr__wire_free(&env);
    raw_close(&y);
    if (!joined)
      usleep(100000);
  }
  ck_assert_msg(joined, "gnmrd serves no one after the flood");
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* max_total_units bounds the units of every job together, so that many
 * jobs cannot multiply what max_units allows one. */
START_TEST(units_are_capped_over_all_jobs) {
  tu_daemon d = {0};
  start_with(&d, "[limits]\nmax_units = 100\nmax_total_units = 150\n");
  static char buf[100][16];
  char *names[100];
  for (int i = 0; i < 100; i++) {
    snprintf(buf[i], sizeof buf[i], "u%d", i);
    names[i] = buf[i];
  }
  raw_peer a = raw_open(d.agents), b = raw_open(d.agents);
  hello_ids(&a, "tot-a", 0, 1, names, 100, NULL);
  expect_welcome(&a);
  hello_ids(&b, "tot-b", 0, 1, names, 51, NULL); /* 50 are free */
  expect_error(&b, GNMR_E_RANGE, "max_total_units");
  ck_assert_int_eq(tu_counter(&d, "refused_max_total_units"), 1);
  ck_assert_int_eq(tu_counter(&d, "refused_max_units"), 0);
  ck_assert_int_eq(tu_counter(&d, "jobs_created"), 1);
  uint64_t sparse[] = {7, 4000000000u}; /* 2 units, whatever their ids */
  hello_ids(&b, "tot-b", 0, 1, two_units, 2, sparse);
  expect_welcome(&b);
  raw_close(&a);
  raw_close(&b);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(held_bytes_are_capped_and_freed_by_decisions) {
  enum { U = 100000 }; /* 800 KB of sums per report */
  tu_daemon d = {0};
  start_with(&d, "[limits]\nmax_held_mb = 1\n");
  static char names[U][16];
  static char *units[U];
  static double s[U];
  for (int i = 0; i < U; i++) {
    snprintf(names[i], sizeof names[i], "u%d", i);
    units[i] = names[i];
    s[i] = 1;
  }
  raw_peer r0 = raw_open(d.agents), r1 = raw_open(d.agents);
  hello_ids(&r0, "big", 0, 2, units, U, NULL);
  expect_welcome(&r0);
  hello_ids(&r1, "big", 1, 2, units, U, NULL);
  expect_welcome(&r1);
  send_report(&r0, "big", 0, 1, s, U);       /* held: 0.8 MB */
  send_report(&r0, "big", 0, 2, s, U);       /* 1.6 MB: refused */
  expect_error(&r0, GNMR_E_BUSY, "max_held_mb");
  ck_assert_int_eq(tu_counter(&d, "refused_max_held"), 1);
  send_report(&r1, "big", 1, 1, s, U);       /* step 1 decided, freed */
  Gnmr__Envelope *env = expect_body(&r0, GNMR__ENVELOPE__BODY_DECISION);
  gnmr__wire_free(&env);
  env = expect_body(&r1, GNMR__ENVELOPE__BODY_DECISION);
  gnmr__wire_free(&env);
  send_report(&r0, "big", 0, 2, s, U);       /* the re-send is taken */
  send_report(&r1, "big", 1, 2, s, U);
  env = expect_body(&r0, GNMR__ENVELOPE__BODY_DECISION);
  ck_assert_uint_eq(env->decision->step, 2);
  gnmr__wire_free(&env);
  raw_close(&r0);
  raw_close(&r1);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(idle_jobs_are_retired_and_their_slot_freed) {
  tu_daemon d = {0};
  start_with(&d, "[limits]\nmax_jobs = 1\njob_idle_s = 1\n");
  raw_peer p = raw_open(d.agents), q = raw_open(d.agents);
  hello_ids(&p, "gone", 0, 1, two_units, 2, NULL); /* then killed: silent */
  expect_welcome(&p);
  hello_ids(&q, "next", 0, 1, two_units, 2, NULL);
  expect_error(&q, GNMR_E_BUSY, "max_jobs");
  long long retired = 0;
  for (int i = 0; i < 60 && retired == 0; i++) {
    tu_sleep_ms(100);
    retired = tu_counter(&d, "jobs_retired");
  }
  ck_assert_int_eq(retired, 1);
  hello_ids(&q, "next", 0, 1, two_units, 2, NULL);
  expect_welcome(&q);
  tu_sleep_ms(300);
  run_result r = ctl(&d, "jobs", NULL);
  ck_assert_msg(strstr(r.out, "retired") != NULL, "%s", r.out);
  tu_run_free(&r);
  /* a report from the retired job's connection: it joins afresh */
  double s[] = {1, 1};
  send_report(&p, "gone", 0, 1, s, 2);
  expect_error(&p, GNMR_E_NOJOB, "send Hello first");
  raw_close(&p);
  raw_close(&q);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST


/* Runs gnmrd to completion with argv (it must refuse to start) and returns
 * its exit code and stderr. */
static run_result gnmrd_refuses(char *const *args) {
  char *argv[16] = {"gnmrd"};
  int n = 1;
  for (int i = 0; args[i] != NULL && n < 15; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  return tu_run("gnmrd", argv, NULL);
}

START_TEST(socket_directories_like_ssh_agent) {
  char *dir = strdup(tu_tmpdir());
  char data[256], sock[300], link[256], open_dir[256], adm[300];
  snprintf(data, sizeof data, "%s/data", dir);
  snprintf(open_dir, sizeof open_dir, "%s/open", dir);
  ck_assert_int_eq(mkdir(open_dir, 0700), 0);
  ck_assert_int_eq(chmod(open_dir, 0777), 0); /* others may write */
  snprintf(sock, sizeof sock, "ipc://%s/agents.sock", open_dir);
  snprintf(adm, sizeof adm, "ipc://%s/admin.sock", dir);
  char *a1[] = {"--data-dir", data, "--agents", sock, "--admin", adm, NULL};
  run_result r = gnmrd_refuses(a1);
  ck_assert_int_eq(r.code, 2); /* a settings error */
  ck_assert_msg(strstr(r.err, "is writable by others (mode 0777)"), "%s",
                r.err);
  tu_run_free(&r);
  /* a symlink to a good directory is still refused */
  snprintf(link, sizeof link, "%s/link", dir);
  ck_assert_int_eq(symlink(dir, link), 0);
  snprintf(sock, sizeof sock, "ipc://%s/agents.sock", link);
  char *a2[] = {"--data-dir", data, "--agents", sock, "--admin", adm, NULL};
  r = gnmrd_refuses(a2);
  ck_assert_int_eq(r.code, 2); /* a settings error */
  ck_assert_msg(strstr(r.err, "is a symbolic link"), "%s", r.err);
  tu_run_free(&r);
  /* abstract sockets have no permissions */
  char *a3[] = {"--data-dir", data, "--agents", "ipc://@gnmr-test-abstract",
                "--admin", adm, NULL};
  r = gnmrd_refuses(a3);
  ck_assert_int_eq(r.code, 2); /* a settings error */
  ck_assert_msg(strstr(r.err, "abstract socket"), "%s", r.err);
  tu_run_free(&r);
  /* a directory owned by another user (root can make one) */
  if (geteuid() == 0) {
    char theirs[256];
    snprintf(theirs, sizeof theirs, "%s/theirs", dir);
    ck_assert_int_eq(mkdir(theirs, 0700), 0);
    ck_assert_int_eq(chown(theirs, 65534, 65534), 0);
    snprintf(sock, sizeof sock, "ipc://%s/agents.sock", theirs);
    char *a4[] = {"--data-dir", data, "--agents", sock, "--admin", adm, NULL};
    r = gnmrd_refuses(a4);
    ck_assert_int_eq(r.code, 2); /* a settings error */
    ck_assert_msg(strstr(r.err, "belongs to uid 65534"), "%s", r.err);
    tu_run_free(&r);
    /* gnmrctl will not talk through it either */
    char opt[320];
    snprintf(opt, sizeof opt, "--admin=ipc://%s/admin.sock", theirs);
    char *c[] = {"gnmrctl", opt, "stats", NULL};
    r = tu_run("gnmrctl", c, NULL);
    ck_assert_int_ne(r.code, 0);
    ck_assert_msg(strstr(r.err, "refusing"), "%s", r.err);
    tu_run_free(&r);
    /* our own directory inside theirs: they could move ours away */
    char inner[300];
    snprintf(inner, sizeof inner, "%s/ours", theirs);
    ck_assert_int_eq(mkdir(inner, 0700), 0);
    snprintf(sock, sizeof sock, "ipc://%.200s/agents.sock", inner);
    char *a5[] = {"--data-dir", data, "--agents", sock, "--admin", adm, NULL};
    r = gnmrd_refuses(a5);
    ck_assert_int_eq(r.code, 2);
    ck_assert_msg(strstr(r.err, "above the socket directory") &&
                      strstr(r.err, "belongs to another user"),
                  "%s", r.err);
    tu_run_free(&r);
    /* and one under a directory others may write (not sticky) */
    char wide[300], deep[340];
    snprintf(wide, sizeof wide, "%s/wide", dir);
    snprintf(deep, sizeof deep, "%s/ours", wide);
    ck_assert_int_eq(mkdir(wide, 0700), 0);
    ck_assert_int_eq(chmod(wide, 0777), 0);
    ck_assert_int_eq(mkdir(deep, 0700), 0);
    snprintf(sock, sizeof sock, "ipc://%.200s/agents.sock", deep);
    char *a6[] = {"--data-dir", data, "--agents", sock, "--admin", adm, NULL};
    r = gnmrd_refuses(a6);
    ck_assert_int_eq(r.code, 2);
    ck_assert_msg(strstr(r.err, "is writable by others: they could move"),
                  "%s", r.err);
    tu_run_free(&r);
  } else {
    fprintf(stderr, "socket_directories_like_ssh_agent: not root, the "
                    "another-owner case is skipped\n");
  }
  /* --check-config runs the same checks and says so */
  char conf[300], text[700];
  snprintf(conf, sizeof conf, "%s/gnmrd.conf", dir);
  snprintf(text, sizeof text, "[gnmrd]\nagents = ipc://%s/agents.sock\n",
           open_dir);
  tu_write_file(conf, text);
  char *cc[] = {"--check-config", conf, NULL};
  r = gnmrd_refuses(cc);
  ck_assert_int_eq(r.code, 1);
  ck_assert_msg(strstr(r.err, "is writable by others"), "%s", r.err);
  tu_run_free(&r);
  /* a line inih would split: the tail of a long comment is no setting */
  char longc[600];
  memset(longc, 'x', 300);
  longc[300] = '\0';
  snprintf(text, sizeof text, "[security]\n# %s insecure = true\n", longc);
  tu_write_file(conf, text);
  r = gnmrd_refuses(cc);
  ck_assert_int_eq(r.code, 1);
  ck_assert_msg(strstr(r.err, ":2: line longer than 198 bytes"), "%s", r.err);
  tu_run_free(&r);
  tu_rmrf(dir);
  free(dir);
}
END_TEST

/* Another local user who makes the directory where gnmrd's socket would be
 * (a private /tmp's /tmp/gnmr-UID, say) and serves there gets no Hello and
 * can send no decision: the agent checks the socket directory as gnmrd
 * does, at open and again before every Hello. Root stands in for both
 * users: a real gnmrd serves in a directory then given to uid 12345. */
START_TEST(an_agent_will_not_join_through_another_users_directory) {
  if (geteuid() != 0) {
    fprintf(stderr, "an_agent_will_not_join_through_another_users_directory"
                    ": SKIPPED: not root (it makes a directory another "
                    "user owns)\n");
    return;
  }
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  char theirs[300], later[300], ep[400], ep_later[400];
  snprintf(theirs, sizeof theirs, "%s/theirs", d.dir);
  snprintf(later, sizeof later, "%s/later", d.dir);
  ck_assert_int_eq(mkdir(theirs, 0755), 0);
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", theirs);
  snprintf(ep_later, sizeof ep_later, "ipc://%s/agents.sock", later);
  tu_daemon_start_in(&d, ep, NULL, d.dir, NULL);
  ck_assert_int_eq(chown(theirs, 12345, 12345), 0);
  static const char *names[] = {"u"};
  gnmr_agent_config c = {0};
  c.endpoint = ep;
  c.job = "victim";
  c.reporters = 1;
  c.unit_names = names;
  c.n_units = 1;
  gnmr_params_default(&c.params);
  char why[800];
  /* at open: refused, saying whose directory it is */
  ck_assert_int_eq(gnmr_endpoint_check(ep, why, sizeof why), GNMR_E_DENIED);
  ck_assert_msg(strstr(why, "belongs to uid 12345") &&
                    strstr(why, "refusing ipc://"),
                "%s", why);
  gnmr_agent *a = NULL;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_E_DENIED);
  ck_assert_ptr_null(a);
  /* a directory that appears after the agent opened: no Hello goes */
  c.endpoint = ep_later;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  ck_assert_int_eq(rename(theirs, later), 0); /* gnmrd's socket with it */
  tu_sleep_ms(1500 * tu_slow());
  ck_assert(!gnmr_agent_joined(a));
  ck_assert_int_eq(gnmr_agent_last_error(a, why, sizeof why), GNMR_E_DENIED);
  ck_assert_msg(strstr(why, "belongs to uid 12345"), "%s", why);
  char adm[300];
  snprintf(adm, sizeof adm, "--admin=%s", d.admin);
  char *st[] = {"gnmrctl", adm, "stats", "--json", NULL};
  run_result r = tu_run("gnmrctl", st, NULL);
  ck_assert_msg(r.code == 0, "%s", r.err);
  ck_assert_msg(strstr(r.out, "\"hellos\":0,") != NULL,
                "gnmrd got a Hello: %s", r.out);
  tu_run_free(&r);
  /* the directory given back to this user: the same agent joins */
  ck_assert_int_eq(chown(later, 0, 0), 0);
  for (int i = 0; i < 250 * tu_slow() && !gnmr_agent_joined(a); i++)
    tu_sleep_ms(40);
  ck_assert(gnmr_agent_joined(a));
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* A joined rank is its agent's: a second live peer asking for it is
 * refused whether it names another instance or none (leaving `instance`
 * out used to take the rank over without CURVE); the same agent on a new
 * connection gets it back. */
START_TEST(a_hello_without_instance_does_not_take_over_a_rank) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  char *units[] = {"u"};
  raw_peer p1 = raw_open(d.agents), p2 = raw_open(d.agents);
  hello_xi(&p1, "held", 0, 1, units, 1, 2.0, 60000, 0, "host-a pid 1");
  Gnmr__Envelope *w = expect_body(&p1, GNMR__ENVELOPE__BODY_WELCOME);
  gnmr__wire_free(&w);
  hello_xi(&p2, "held", 0, 1, units, 1, 2.0, 60000, 0, "");
  expect_error(&p2, GNMR_E_MISMATCH, "is held by a live agent (host-a pid 1)"
               "; this agent (no instance given)");
  hello_xi(&p2, "held", 0, 1, units, 1, 2.0, 60000, 0, "host-b pid 2");
  expect_error(&p2, GNMR_E_MISMATCH, "this agent (host-b pid 2)");
  /* the rank's reports still come from p1 and are decided for it */
  double s1[1] = {4};
  report(&p1, "held", 0, 1, s1, 1, NULL, 0);
  Gnmr__Envelope *e;
  while ((e = raw_recv(&p1, raw_reply_ms())) != NULL &&
         e->body_case == GNMR__ENVELOPE__BODY_WELCOME)
    gnmr__wire_free(&e); /* the liveness probes' repeats */
  ck_assert_msg(e != NULL && e->body_case == GNMR__ENVELOPE__BODY_DECISION,
                "no decision for the rank's own agent");
  gnmr__wire_free(&e);
  /* p2 sends nothing as rank 0: its report is from no joined agent */
  report(&p2, "held", 0, 2, s1, 1, NULL, 0);
  expect_error(&p2, GNMR_E_NOJOB, "send Hello first");
  /* the same instance on a new connection replaces the old one */
  raw_peer p3 = raw_open(d.agents);
  hello_xi(&p3, "held", 0, 1, units, 1, 2.0, 60000, 0, "host-a pid 1");
  w = expect_body(&p3, GNMR__ENVELOPE__BODY_WELCOME);
  gnmr__wire_free(&w);
  raw_close(&p1);
  raw_close(&p2);
  raw_close(&p3);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(a_second_gnmrd_does_not_take_over_a_live_socket) {
  tu_daemon a = {0};
  tu_daemon_start(&a);
  char data[256];
  snprintf(data, sizeof data, "%s/other-data", a.dir);
  char *args[] = {"--data-dir", data, "--agents", "tcp://127.0.0.1:*",
                  "--admin", a.admin, NULL};
  run_result r = gnmrd_refuses(args);
  ck_assert_int_eq(r.code, 1);
  ck_assert_msg(strstr(r.err, "is served by another process"), "%s", r.err);
  tu_run_free(&r);
  /* the first one still answers */
  ck_assert_int_ge(tu_counter(&a, "hellos"), 0);
  ck_assert_int_eq(tu_daemon_stop(&a, SIGTERM), 0);
  /* a stale socket (its gnmrd killed) is replaced */
  tu_daemon_start_in(&a, NULL, NULL, a.dir, NULL);
  ck_assert_int_eq(tu_daemon_stop(&a, SIGKILL), 128 + SIGKILL);
  tu_daemon_start_in(&a, NULL, NULL, a.dir, NULL);
  ck_assert_int_eq(tu_daemon_stop(&a, SIGTERM), 0);
  tu_rmrf(a.dir);
}
END_TEST

START_TEST(key_files_others_can_read_or_change_are_refused) {
  char *dir = strdup(tu_tmpdir());
  char prefix[256], key[300], pub[300], allow[300], k[41], sec[41];
  char err[400];
  snprintf(prefix, sizeof prefix, "%s/server", dir);
  ck_assert_int_eq(gnmr__keygen(prefix, k, err, sizeof err), GNMR_OK);
  snprintf(key, sizeof key, "%s.key", prefix);
  snprintf(pub, sizeof pub, "%s.pub", prefix);
  ck_assert_int_eq(gnmr__key_file_read(key, k, sec, err, sizeof err),
                   GNMR_OK);
  ck_assert_int_eq(chmod(key, 0644), 0); /* world-readable secret */
  ck_assert_int_eq(gnmr__key_file_read(key, k, sec, err, sizeof err),
                   GNMR_E_INVAL);
  ck_assert_msg(strstr(err, "mode 0644: a secret key"), "%s", err);
  ck_assert_int_eq(chmod(key, 0606), 0); /* world-writable */
  ck_assert_int_eq(gnmr__key_file_read(key, k, NULL, err, sizeof err),
                   GNMR_E_INVAL);
  ck_assert_int_eq(gnmr__key_file_read(pub, k, NULL, err, sizeof err),
                   GNMR_OK); /* a public key may be read by all */
  snprintf(allow, sizeof allow, "%s/allow", dir);
  char line[64];
  snprintf(line, sizeof line, "%s client\n", k);
  tu_write_file(allow, line);
  ck_assert_int_eq(chmod(allow, 0666), 0);
  gnmr_allow al;
  ck_assert_int_eq(gnmr__allow_load(allow, &al, err, sizeof err),
                   GNMR_E_INVAL);
  ck_assert_msg(strstr(err, "others could change it"), "%s", err);
  ck_assert_int_eq(chmod(allow, 0644), 0);
  ck_assert_int_eq(gnmr__allow_load(allow, &al, err, sizeof err), GNMR_OK);
  gnmr__allow_clear(&al);
  tu_rmrf(dir);
  free(dir);
}
END_TEST

START_TEST(a_damaged_database_is_refused_at_start) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  raw_peer p = raw_open(d.agents);
  hello_ids(&p, "dmg", 0, 1, two_units, 2, NULL);
  expect_welcome(&p);
  double s[] = {1, 2};
  for (uint64_t t = 1; t <= 50; t++) {
    send_report(&p, "dmg", 0, t, s, 2);
    Gnmr__Envelope *env = expect_body(&p, GNMR__ENVELOPE__BODY_DECISION);
    gnmr__wire_free(&env);
  }
  raw_close(&p);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  char path[256];
  snprintf(path, sizeof path, "%s/data/gnmr.db", d.dir);
  sqlite3 *db;
  ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
  ck_assert_int_eq(sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL,
                                NULL, NULL),
                   SQLITE_OK);
  sqlite3_close(db);
  /* scribble over the second half of every page after the first */
  FILE *f = fopen(path, "r+b");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  static unsigned char junk[2048];
  memset(junk, 0xa5, sizeof junk);
  for (long off = 4096 + 2048; off < size; off += 4096) {
    fseek(f, off, SEEK_SET);
    ck_assert_uint_eq(fwrite(junk, 1, sizeof junk, f), sizeof junk);
  }
  fclose(f);
  char data[256];
  snprintf(data, sizeof data, "%s/data", d.dir);
  char adm[300];
  snprintf(adm, sizeof adm, "ipc://%s/admin.sock", d.dir);
  char *args[] = {"--data-dir", data, "--agents", "tcp://127.0.0.1:*",
                  "--admin", adm, NULL};
  run_result r = gnmrd_refuses(args);
  ck_assert_int_eq(r.code, 1);
  ck_assert_msg(strstr(r.err, "the database is damaged"), "%s", r.err);
  tu_run_free(&r);
  tu_rmrf(d.dir);
}
END_TEST

/* Whether a process's RSS measures its live memory: not under ASan
 * (freed memory waits in its quarantine) or valgrind (its own allocator);
 * there the memory checks are theirs, and the RSS bounds are checked by
 * the plain run of make check. */
static int rss_tells(void) {
  return getenv("GNMR_SANITIZED") == NULL && tu_slow() == 1;
}

/* Seconds since t0 (CLOCK_MONOTONIC). */
static double since(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0->tv_sec) +
         (double)(t1.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* How long gnmrctl waits for an answer: under valgrind gnmrd and gnmrctl
 * run at a tenth of their pace. */
static char *ctl_wait(void) { return tu_slow() > 1 ? "60000" : "3000"; }

static long daemon_rss_kb(pid_t pid) {
  char path[64], line[256];
  long kb = -1;
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  while (f != NULL && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
      break;
  if (f != NULL)
    fclose(f);
  return kb;
}

/* Sixteen Hellos whose `instance` is 20 MB (the round sent 100 MB: gnmrd
 * kept 800 MB for the job's life and echoed the text, terminal escapes
 * and all, into another agent's error): each is refused with INVAL naming
 * the field and nothing of it, and gnmrd keeps none of it (its memory
 * does not grow with the number of such Hellos). An instance
 * with an escape sequence is refused the same way. */
START_TEST(a_huge_or_escaped_instance_is_refused_and_not_kept) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  size_t big = (tu_slow() > 1 ? 2u : 20u) << 20;
  char *inst = malloc(big + 1);
  memset(inst, 'x', big);
  inst[big] = '\0';
  long rss4 = 0;
  for (int i = 0; i < 16; i++) {
    if (i == 4) /* what the allocator keeps for reuse, after four */
      rss4 = daemon_rss_kb(d.pid);
    raw_peer p = raw_open(d.agents);
    char job[32];
    snprintf(job, sizeof job, "inst-%d", i);
    hello_xi(&p, job, 0, 1, two_units, 2, 2.0, 1000, 0, inst);
    Gnmr__Envelope *env = expect_body(&p, GNMR__ENVELOPE__BODY_ERROR);
    ck_assert_int_eq(env->error->code, GNMR_E_INVAL);
    ck_assert_str_eq(env->error->ref, "instance");
    ck_assert_msg(strlen(env->error->message) < 300 &&
                      strstr(env->error->message, "xxxx") == NULL,
                  "%.300s", env->error->message);
    gnmr__wire_free(&env);
    raw_close(&p);
  }
  tu_sleep_ms(200);
  long rss16 = daemon_rss_kb(d.pid);
  /* twelve more kept would be 240 MB */
  ck_assert_msg(!rss_tells() || rss16 - rss4 < 2 * (long)(big >> 10),
                "gnmrd kept %ld kB more for 12 more Hellos", rss16 - rss4);
  /* no job was made */
  char adm[300];
  snprintf(adm, sizeof adm, "--admin=%s", d.admin);
  char *jobs[] = {"gnmrctl", adm, "jobs", "--timeout-ms", ctl_wait(), NULL};
  run_result r = tu_run("gnmrctl", jobs, NULL);
  ck_assert_msg(r.code == 0 && strstr(r.out, "inst-") == NULL, "%s", r.out);
  tu_run_free(&r);
  raw_peer p = raw_open(d.agents);
  hello_xi(&p, "escaped", 0, 1, two_units, 2, 2.0, 1000, 0,
           "host\x1b[31m pid 1");
  Gnmr__Envelope *env = expect_body(&p, GNMR__ENVELOPE__BODY_ERROR);
  ck_assert_int_eq(env->error->code, GNMR_E_INVAL);
  ck_assert_str_eq(env->error->ref, "instance");
  ck_assert_ptr_null(strchr(env->error->message, '\x1b'));
  gnmr__wire_free(&env);
  raw_close(&p);
  free(inst);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* A peer that never said Hello sends Reports of a million units (8 MB
 * each) as fast as gnmrd takes them, beside a working job: the round
 * measured another job's step stalled up to 1.5 s, gnmrd decoding each
 * one before refusing it. Refused from the envelope's body field without
 * a decode, they leave the job's steps within 250 ms over 2 s of steps
 * (the slowest is printed). */
typedef struct flood_arg {
  const char *ep;
  atomic_int stop;
  int sent;
} flood_arg;

static void *report_flood(void *p) {
  flood_arg *f = p;
  void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
  int zero = 0, hwm = 4;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_connect(s, f->ep);
  enum { N = 1 << 20 };
  double *sq = calloc(N, sizeof *sq);
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Report r = GNMR__REPORT__INIT;
  r.job = "victim";
  r.step = 1;
  r.n_sumsq = N;
  r.sumsq = sq;
  env.body_case = GNMR__ENVELOPE__BODY_REPORT;
  env.report = &r;
  uint8_t *buf;
  size_t len;
  if (gnmr__wire_encode(&env, &buf, &len) == GNMR_OK) {
    while (!atomic_load(&f->stop)) {
      if (zmq_send(s, buf, len, ZMQ_DONTWAIT) >= 0)
        f->sent++;
      else
        usleep(1000);
      zmq_msg_t m; /* its NOJOB answers */
      zmq_msg_init(&m);
      while (zmq_msg_recv(&m, s, ZMQ_DONTWAIT) >= 0)
        ;
      zmq_msg_close(&m);
    }
    free(buf);
  }
  free(sq);
  zmq_close(s);
  zmq_ctx_term(ctx);
  return NULL;
}

/* A job of 4 units that another test's flood must not stall: joined,
 * its first 5 steps decided; *t is its next step. */
static gnmr_agent *victim_job(const tu_daemon *d, uint64_t *t) {
  static const char *names[] = {"a", "b", "c", "d"};
  static const double sq[4] = {1, 2, 3, 4};
  gnmr_agent_config c = {0};
  c.endpoint = d->agents;
  c.job = "victim";
  c.reporters = 1;
  c.unit_names = names;
  c.n_units = 4;
  gnmr_params_default(&c.params);
  c.barrier_ms = 5000;
  gnmr_agent *a;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  for (*t = 1; *t <= 5; (*t)++) {
    ck_assert_int_eq(gnmr_agent_report_sums(a, *t, sq, NULL, NULL), GNMR_OK);
    ck_assert_int_eq(gnmr_agent_wait(a, *t, 10000 * tu_slow()), GNMR_OK);
  }
  return a;
}

/* One step of the victim job, reported and waited for: its seconds. */
static double victim_step(gnmr_agent *a, uint64_t t) {
  static const double sq[4] = {1, 2, 3, 4};
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ck_assert_int_eq(gnmr_agent_report_sums(a, t, sq, NULL, NULL), GNMR_OK);
  ck_assert_int_eq(gnmr_agent_wait(a, t, 10000 * tu_slow()), GNMR_OK);
  return since(&t0);
}

START_TEST(reports_without_hello_do_not_stall_another_job) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  uint64_t t;
  gnmr_agent *a = victim_job(&d, &t);
  flood_arg f = {d.agents, 0, 0};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, report_flood, &f), 0);
  tu_sleep_ms(200);
  double worst = 0, spent = 0;
  int steps = 0;
  for (; steps < 100 || spent < 2.0; steps++, t++) { /* 2 s of steps */
    double w = victim_step(a, t);
    worst = w > worst ? w : worst;
    spent += w;
  }
  atomic_store(&f.stop, 1);
  pthread_join(th, NULL);
  long long refused = tu_counter(&d, "unknown_agent");
  printf("reports without Hello: %d of 8 MB sent, %lld refused; the other "
         "job's slowest of %d steps %.1f ms\n", f.sent, refused, steps,
         worst * 1e3);
  fflush(stdout);
  ck_assert_int_ge(refused, 10);
  ck_assert_msg(worst < 0.25 * tu_slow(), "a step waited %.0f ms",
                worst * 1e3);
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* A new job of 2^20 units (the default max_units), its Hello ~45 MB:
 * what another job's steps wait while gnmrd takes it in. Before, the
 * loop decoded, checked and registered it whole: another job's step
 * waited 2.2 s. Now decoding, checking and the new job's unit table are
 * made on the thread pool (dispatch.c), and the loop takes the table
 * over. */
typedef struct big_hello_arg {
  const char *ep;
  atomic_int done;
  double took;
  int n;
} big_hello_arg;

static void free_names(char **units, int n);

/* n unit names of a mixture-of-experts model, per experts a layer:
 * "model.layers.L.mlp.experts.E.PROJ", for free_names(). */
static char **expert_names(int n, int per, const char *proj) {
  char **units = malloc((size_t)n * sizeof *units);
  ck_assert_ptr_nonnull(units);
  for (int i = 0; i < n; i++) {
    char name[64];
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s",
             i / per, i % per, proj);
    units[i] = strdup(name);
  }
  return units;
}

static void *big_hello(void *p) {
  big_hello_arg *b = p;
  /* under the sanitizers 2^17 units (5 MB), under valgrind 2^15 (1.3 MB:
   * still a large Hello; valgrind runs one thread at a time, the pool's
   * work included) */
  const int N = tu_slow() > 1                        ? 1 << 15
                : getenv("GNMR_SANITIZED") != NULL ? 1 << 17
                                                   : 1 << 20;
  char **units = expert_names(N, 1024, "down_proj");
  b->n = N;
  raw_peer ag = raw_open(b->ep);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  hello(&ag, "million", 0, 1, units, (size_t)N, 2.0);
  Gnmr__Envelope *w = raw_recv(&ag, 60000);
  b->took = since(&t0);
  if (w != NULL && w->body_case == GNMR__ENVELOPE__BODY_WELCOME)
    atomic_store(&b->done, 1);
  else
    atomic_store(&b->done, -1);
  if (w != NULL)
    gnmr__wire_free(&w);
  raw_close(&ag);
  free_names(units, N);
  return NULL;
}

START_TEST(a_million_unit_hello_does_not_stall_another_job) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  uint64_t t;
  gnmr_agent *a = victim_job(&d, &t);
  big_hello_arg b = {d.agents, 0, 0, 0};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, big_hello, &b), 0);
  double worst = 0;
  int steps = 0;
  for (; atomic_load(&b.done) == 0 || steps < 50; steps++, t++) {
    double w = victim_step(a, t);
    worst = w > worst ? w : worst;
    tu_sleep_ms(5);
  }
  pthread_join(th, NULL);
  printf("a %d-unit Hello: welcomed in %.0f ms; the other job's slowest "
         "of %d steps %.1f ms\n", b.n, b.took * 1e3, steps, worst * 1e3);
  fflush(stdout);
  ck_assert_int_eq(atomic_load(&b.done), 1);
  /* 82-100 ms on the 2-CPU VM, quiet (2,170 ms when the loop decoded,
   * checked and registered it); the bound leaves a slower or busier
   * machine room and still fails the old way by 4x. Under valgrind (one
   * thread at a time, code translated as it first runs) 1.2-1.5 s
   * whatever the size: there the test is of memory */
  ck_assert_msg(worst < (tu_slow() > 1 ? 5.0 : 0.5), "a step waited %.0f ms",
                worst * 1e3);
  gnmr_agent_close(&a);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* A Hello over 1 MiB is decoded and checked off the loop: its refusals
 * are the same as a small one's (the field, the code, the words), and a
 * good one is welcomed. */
START_TEST(a_large_hellos_refusals_are_a_small_ones) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  enum { N = 1 << 16 }; /* about 2.6 MB of names */
  char **units = expert_names(N, 256, "up_proj");
  raw_peer ag = raw_open(d.agents);
  char *keep = units[N - 1];
  units[N - 1] = units[3]; /* listed twice */
  hello(&ag, "large", 0, 1, units, (size_t)N, 2.0);
  Gnmr__Envelope *e = expect_body(&ag, GNMR__ENVELOPE__BODY_ERROR);
  ck_assert_int_eq(e->error->code, GNMR_E_DUP);
  ck_assert_str_eq(e->error->ref, "units");
  ck_assert_msg(strstr(e->error->message, "listed twice") != NULL, "%s",
                e->error->message);
  gnmr__wire_free(&e);
  units[N - 1] = "bad\x01name"; /* a control character */
  hello(&ag, "large", 0, 1, units, (size_t)N, 2.0);
  e = expect_body(&ag, GNMR__ENVELOPE__BODY_ERROR);
  ck_assert_int_eq(e->error->code, GNMR_E_INVAL);
  ck_assert_msg(strstr(e->error->message, "control character") != NULL,
                "%s", e->error->message);
  gnmr__wire_free(&e);
  units[N - 1] = keep;
  hello(&ag, "large", 0, 1, units, (size_t)N, 2.0);
  e = expect_body(&ag, GNMR__ENVELOPE__BODY_WELCOME);
  ck_assert_uint_eq(e->welcome->n_unit_ids, N);
  ck_assert_uint_eq(e->welcome->unit_ids[N - 1], N - 1);
  gnmr__wire_free(&e);
  ck_assert_int_eq(tu_counter(&d, "hellos_away"), 3);
  ck_assert_int_eq(tu_counter(&d, "hellos_refused"), 2);
  raw_close(&ag);
  free_names(units, N);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Issue 62: one peer's large Hellos took every place gnmrd decodes them
 * in (32 connections looping 2^20-unit Hellos kept a real large job BUSY
 * for 21 s). A connection now has one away at a time: five pipelined
 * from one connection are one decoded (refused: a name listed twice) and
 * four BUSY, and another connection's, sent right after them, is taken
 * in (before: four of the five away, the other's BUSY). */
START_TEST(one_connection_has_one_large_hello_away) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  const int N = tu_slow() > 1 ? 1 << 15 : 1 << 16; /* over 1 MiB */
  char **units = expert_names(N, 256, "up_proj");
  raw_peer flood = raw_open(d.agents), other = raw_open(d.agents);
  char *keep = units[N - 1];
  units[N - 1] = units[3]; /* listed twice: refused after decoding */
  for (int k = 0; k < 5; k++)
    hello(&flood, "dup-large", 0, 1, units, (size_t)N, 2.0);
  units[N - 1] = keep;
  hello(&other, "good-large", 0, 1, units, (size_t)N, 2.0);
  Gnmr__Envelope *e = raw_recv(&other, 60000);
  ck_assert_ptr_nonnull(e);
  ck_assert_msg(e->body_case == GNMR__ENVELOPE__BODY_WELCOME,
                "the other connection's Hello: body %d (%s)",
                (int)e->body_case,
                e->body_case == GNMR__ENVELOPE__BODY_ERROR
                    ? e->error->message
                    : "");
  gnmr__wire_free(&e);
  int busy = 0, dup = 0;
  for (int k = 0; k < 5; k++) {
    e = raw_recv(&flood, 60000);
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(e->body_case, GNMR__ENVELOPE__BODY_ERROR);
    if (e->error->code == GNMR_E_BUSY) {
      busy++;
      ck_assert_msg(strstr(e->error->message, "this connection's") != NULL,
                    "%s", e->error->message);
    }
    dup += e->error->code == GNMR_E_DUP;
    gnmr__wire_free(&e);
  }
  ck_assert_int_ge(busy, 1);
  ck_assert_int_eq(busy + dup, 5);
  ck_assert_int_eq(tu_counter(&d, "hellos_away_busy"), busy);
  raw_close(&flood);
  raw_close(&other);
  free_names(units, N);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* A Hello of n units under `job` as bytes (the caller frees them), to be
 * sent again and again without encoding it each time. */
static uint8_t *hello_bytes(const char *job, char **units, size_t n,
                            size_t *len) {
  return hello_encode(job, 0, 1, units, n, 2.0, 60000, 0, "", 0, len);
}

/* Issue 62, without tenancy: 32 connections of one host looping large
 * Hellos refused only after decoding kept a real large job BUSY for 21 s
 * (a place a connection: one host held all four, and took each place
 * back the moment it came free). An address group takes no more than
 * two places while another group waits (daemon/fair.h). Four connections
 * from 127.0.0.1 take the four places (one Hello decoded in a fraction
 * of the others' time); a job's Hello from 127.0.0.2 is BUSY and sent again every
 * 100 ms; when the quick one is answered, a fifth connection of
 * 127.0.0.1 is BUSY for its address (before: it took the free place), and
 * the other host's next try takes it and is welcomed. */
START_TEST(one_hosts_connections_leave_a_place_to_another) {
  if (tu_slow() > 1) {
    /* the order it needs (the quick Hello still away when the other
     * host first asks, answered while the slow ones are) comes from the
     * Hellos' decode times, which valgrind's one thread at a time and
     * its slow gnmrctl make a matter of chance; the plain and ASan runs
     * hold it */
    printf("one_hosts_connections_leave_a_place_to_another: skipped under "
           "valgrind (its order comes from decode times)\n");
    return;
  }
  tu_daemon d = {0};
  tu_daemon_start(&d);
  const int SLOW = 1 << 19, QUICK = 1 << 17, GOOD = 1 << 15;
  char **units = expert_names(SLOW, 256, "up_proj");
  /* the last name not a valid one: refused only once decoded and checked
   * (a name listed twice is found before decoding) */
  char bad[] = "bad\x01name";
  char *keep = units[QUICK - 1];
  units[QUICK - 1] = bad;
  size_t quick_len, slow_len, good_len;
  uint8_t *quick = hello_bytes("flood", units, (size_t)QUICK, &quick_len);
  units[QUICK - 1] = keep;
  char *keep_last = units[SLOW - 1];
  units[SLOW - 1] = bad;
  uint8_t *slow = hello_bytes("flood", units, (size_t)SLOW, &slow_len);
  units[SLOW - 1] = keep_last;
  uint8_t *good = hello_bytes("good-large", units, (size_t)GOOD, &good_len);
  raw_peer a[5];
  for (int k = 0; k < 5; k++)
    a[k] = raw_open(d.agents);
  char other_ep[600];
  snprintf(other_ep, sizeof other_ep, "tcp://127.0.0.2:0;%s",
           d.agents + strlen("tcp://"));
  raw_peer b = raw_open(other_ep);
  for (int k = 1; k < 4; k++)
    raw_send(&a[k], slow, slow_len);
  raw_send(&a[0], quick, quick_len);
  for (int waited = 0; tu_counter(&d, "hellos_away") < 4; waited += 10) {
    ck_assert_msg(waited < 60000, "the four Hellos did not arrive");
    tu_sleep_ms(10);
  }
  /* the other host waits, sending again every 100 ms, until the quick
   * one is answered */
  int b_busy = 0;
  Gnmr__Envelope *e = NULL;
  for (;;) {
    raw_send(&b, good, good_len);
    e = raw_recv(&b, raw_reply_ms());
    ck_assert_ptr_nonnull(e);
    if (e->body_case == GNMR__ENVELOPE__BODY_WELCOME)
      break; /* a place came free before the quick one's answer was read */
    ck_assert_int_eq(e->body_case, GNMR__ENVELOPE__BODY_ERROR);
    ck_assert_msg(e->error->code == GNMR_E_BUSY, "%s", e->error->message);
    gnmr__wire_free(&e);
    b_busy++;
    e = raw_recv(&a[0], 100);
    if (e != NULL)
      break;
  }
  ck_assert_int_ge(b_busy, 1);
  if (e->body_case == GNMR__ENVELOPE__BODY_ERROR) {
    /* the quick one is answered: a place is free */
    ck_assert_int_eq(e->error->code, GNMR_E_INVAL);
    gnmr__wire_free(&e);
    raw_send(&a[4], slow, slow_len);
    e = raw_recv(&a[4], raw_reply_ms());
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(e->body_case, GNMR__ENVELOPE__BODY_ERROR);
    ck_assert_msg(e->error->code == GNMR_E_BUSY &&
                      strstr(e->error->message, "this address's") != NULL,
                  "a fifth Hello of the flooding host, with a place free "
                  "and another host waiting: %s", e->error->message);
    gnmr__wire_free(&e);
    raw_send(&b, good, good_len);
    e = raw_recv(&b, raw_reply_ms());
    ck_assert_ptr_nonnull(e);
    ck_assert_msg(e->body_case == GNMR__ENVELOPE__BODY_WELCOME,
                  "the other host's Hello: %s",
                  e->body_case == GNMR__ENVELOPE__BODY_ERROR
                      ? e->error->message
                      : "not a Welcome");
  }
  gnmr__wire_free(&e);
  printf("one host's four large Hellos away: another host's BUSY %d times, "
         "then welcomed; the host's fifth told to share\n", b_busy);
  for (int k = 0; k < 5; k++)
    raw_close(&a[k]);
  raw_close(&b);
  free(quick);
  free(slow);
  free(good);
  free_names(units, SLOW);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Issue 62: after refused 105 MB observer Hellos gnmrd kept +272 MB: a
 * large Hello's blocks, freed, stayed in the malloc arenas (glibc's mmap
 * threshold rises to each large block freed). gnmrd maps blocks of 16 MiB
 * and more on their own and trims after a large Hello, a large job's end
 * and its last snapshot: eight 2^19-unit Hellos (23 MB each), each
 * decoded, checked and refused (a name listed twice), leave its RSS
 * within 16 MB of where it was; a 2^19-unit job that comes and goes,
 * within 16 MB too once the store has written its records. */
START_TEST(memory_comes_back_after_large_hellos_and_jobs) {
  if (!rss_tells()) {
    printf("memory_comes_back_after_large_hellos_and_jobs: skipped under "
           "the sanitizers and valgrind (their allocators keep memory)\n");
    return;
  }
  tu_daemon d = {0};
  tu_daemon_start(&d);
  enum { N = 1 << 19 };
  char **units = expert_names(N, 1024, "gate_proj");
  long rss0 = daemon_rss_kb(d.pid), peak = rss0;
  char *keep = units[N - 1];
  units[N - 1] = units[5]; /* listed twice: refused after decoding */
  for (int k = 0; k < 8; k++) {
    raw_peer ag = raw_open(d.agents);
    hello(&ag, "hog", 0, 1, units, (size_t)N, 2.0);
    Gnmr__Envelope *e = raw_recv(&ag, 60000);
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(e->body_case, GNMR__ENVELOPE__BODY_ERROR);
    ck_assert_int_eq(e->error->code, GNMR_E_DUP);
    gnmr__wire_free(&e);
    raw_close(&ag);
    long now = daemon_rss_kb(d.pid);
    peak = now > peak ? now : peak;
  }
  tu_sleep_ms(300);
  long refused = daemon_rss_kb(d.pid);
  units[N - 1] = keep;
  raw_peer ag = raw_open(d.agents);
  hello(&ag, "big-job", 0, 1, units, (size_t)N, 2.0);
  Gnmr__Envelope *w = expect_body(&ag, GNMR__ENVELOPE__BODY_WELCOME);
  gnmr__wire_free(&w);
  long joined = daemon_rss_kb(d.pid);
  Gnmr__Envelope bye = GNMR__ENVELOPE__INIT;
  Gnmr__Bye b = GNMR__BYE__INIT;
  b.job = "big-job";
  bye.body_case = GNMR__ENVELOPE__BODY_BYE;
  bye.bye = &b;
  raw_send_env(&ag, &bye);
  long after = 0;
  /* the job is freed once its Bye is in; its records (22 MB of names,
   * a 56 MB last snapshot) once the store has written them */
  for (int i = 0; i < 300; i++) {
    tu_sleep_ms(100);
    after = daemon_rss_kb(d.pid);
    if (after - rss0 < 16 * 1024)
      break;
  }
  printf("memory back: gnmrd RSS %ld kB, peak %ld kB under 8 refused "
         "2^19-unit Hellos (%ld kB after them), %ld kB with a 2^19-unit "
         "job, %ld kB after it ended\n", rss0, peak, refused, joined, after);
  fflush(stdout);
  /* the refused Hellos' memory all back (before: +72 MB); after the job
   * ended and the store wrote its records, +4 MB here (before: +131 MB,
   * then +60 MB: the 56 MB buffer of its last snapshot, kept for a
   * snapshot that might reuse it) */
  ck_assert_msg(refused - rss0 < 16 * 1024, "after the refused Hellos "
                "gnmrd kept %ld kB", refused - rss0);
  ck_assert_msg(after - rss0 < 16 * 1024, "after the job gnmrd kept %ld kB",
                after - rss0);
  raw_close(&ag);
  free_names(units, N);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* A joined rank of 4 units sends a Report of 2^21 sums (16 MB): before,
 * the loop decoded all of it (every other job's step waiting) only to
 * refuse it for its count; now it is refused by its length, undecoded,
 * naming the bound, and the rank's next honest report is decided. An
 * observer's Report is refused undecoded too. */
START_TEST(a_report_longer_than_its_rank_needs_is_refused_undecoded) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  static char *four[] = {"a", "b", "c", "d"};
  raw_peer ag = raw_open(d.agents), ob = raw_open(d.agents);
  hello(&ag, "huge", 0, 1, four, 4, 2.0);
  expect_welcome(&ag);
  hello_x(&ob, "huge", 0, 1, four, 4, 2.0, 60000, 1);
  expect_welcome(&ob);
  enum { N = 1 << 21 };
  double *big = calloc(N, sizeof *big);
  ck_assert_ptr_nonnull(big);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  send_report(&ag, "huge", 0, 7, big, N);
  Gnmr__Envelope *e = expect_body(&ag, GNMR__ENVELOPE__BODY_ERROR);
  double took = since(&t0);
  ck_assert_int_eq(e->error->code, GNMR_E_RANGE);
  ck_assert_uint_eq(e->error->step, 7);
  ck_assert_msg(strstr(e->error->message, "rank 0's 4 units need at most") !=
                    NULL, "%s", e->error->message);
  printf("a 16 MB report of a 4-unit rank: %s (%.1f ms)\n",
         e->error->message, took * 1e3);
  fflush(stdout);
  gnmr__wire_free(&e);
  send_report(&ob, "huge", 0, 7, big, N);
  expect_error(&ob, GNMR_E_PROTO, "an observer does not report");
  free(big);
  ck_assert_int_eq(tu_counter(&d, "reports_oversized"), 1);
  double sq[4] = {1, 2, 3, 4};
  send_report(&ag, "huge", 0, 1, sq, 4); /* the rank goes on */
  e = expect_body(&ag, GNMR__ENVELOPE__BODY_DECISION);
  ck_assert_uint_eq(e->decision->step, 1);
  gnmr__wire_free(&e);
  raw_close(&ag);
  raw_close(&ob);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* 100 connections to /metrics, each sending a request line, then a
 * header line every 400 ms (a slowloris): MHD's timeout counts only
 * inactivity, so before they held its 64 places for as long as they kept
 * at it and the scraper's GET found none. Now a request must be whole
 * within 3 s of its connection and at most 32 connections wait for
 * theirs (a new one cuts the oldest): the scraper is answered
 * throughout and every slow connection is cut. */
/* One scrape: 1 when it got the exposition within 2 s. */
static int scraped(const char *url, int *asked) {
  int status = 0;
  char *body = tu_http_get_in(url, &status, 2 * tu_slow());
  int ok = status == 200 && strstr(body, "gnmr_steps_decided_total") != NULL;
  if (!ok)
    printf("scrape %d: HTTP %d, %zu bytes\n", *asked + 1, status,
           strlen(body));
  (*asked)++;
  free(body);
  return ok;
}

START_TEST(a_slow_metrics_client_does_not_hold_out_the_scraper) {
  tu_daemon d = {0};
  char url[256];
  int port = 0;
  tu_daemon_start_metrics(&d, url, sizeof url);
  ck_assert_int_eq(sscanf(url, "http://127.0.0.1:%d/", &port), 1);
  enum { SLOW = 100 };
  int fds[SLOW], open_n = SLOW;
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  static const char line[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < SLOW; i++) {
    fds[i] = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fds[i], 0);
    ck_assert_int_eq(connect(fds[i], (struct sockaddr *)&sa, sizeof sa), 0);
    (void)send(fds[i], line, sizeof line - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int served = 0, asked = 0;
  double last_cut = 0;
  for (int tick = 0; open_n > 0 && since(&t0) < 20.0 * tu_slow(); tick++) {
    tu_sleep_ms(200);
    for (int i = 0; i < SLOW; i++) {
      if (fds[i] < 0)
        continue;
      int gone = 0;
      struct pollfd pfd = {fds[i], POLLIN, 0};
      if (poll(&pfd, 1, 0) > 0) {
        char b[512];
        ssize_t n = recv(fds[i], b, sizeof b, MSG_DONTWAIT);
        gone = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
      }
      if (!gone && tick % 2 == 0 &&
          send(fds[i], "X: y\r\n", 6, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
          errno != EAGAIN)
        gone = 1;
      if (gone) {
        close(fds[i]);
        fds[i] = -1;
        open_n--;
        last_cut = since(&t0);
      }
    }
    if (tick == 5 || tick == 12) /* 1.2 and 2.6 s: while they trickle */
      served += scraped(url, &asked);
  }
  served += scraped(url, &asked); /* and after */
  printf("slow /metrics clients: %d connections trickling a header line "
         "every 400 ms; the scraper answered %d of %d times; the last cut "
         "%.1f s after they came, %d still open\n", SLOW, served, asked,
         last_cut, open_n);
  fflush(stdout);
  long long cut = tu_counter(&d, "metrics_cut");
  ck_assert_int_eq(asked, 3);
  ck_assert_int_eq(served, asked);
  ck_assert_int_eq(open_n, 0);
  ck_assert_int_ge(cut, SLOW);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* 70 connections to the admin endpoint (64 places) that say nothing and
 * come back at once when closed, with a long first_message_ms (60 s): the
 * places are always full of them. Before, the operator got BUSY for as
 * long as they kept at it; now a new connection takes the place of the
 * oldest silent one, so the operator's gnmrctl is answered at once. */
START_TEST(silent_connections_that_come_back_do_not_lock_the_operator_out) {
  tu_daemon d = {0};
  start_with(&d, "[limits]\nfirst_message_ms = 60000\n");
  enum { N_IDLE = 70 };
  void *ctx = zmq_ctx_new();
  void *idle[N_IDLE];
  int zero = 0, soon = 10;
  for (int i = 0; i < N_IDLE; i++) {
    idle[i] = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(idle[i], ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(idle[i], ZMQ_RECONNECT_IVL, &soon, sizeof soon);
    ck_assert_int_eq(zmq_connect(idle[i], d.admin), 0);
  }
  tu_sleep_ms(500 * tu_slow()); /* every one connected */
  char adm[300];
  snprintf(adm, sizeof adm, "--admin=%s", d.admin);
  char *st[] = {"gnmrctl", adm, "jobs", "--timeout-ms", ctl_wait(), NULL};
  int served = 0;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < 5 && !served; i++) {
    run_result r = tu_run("gnmrctl", st, NULL);
    served = r.code == 0;
    tu_run_free(&r);
  }
  double took = since(&t0);
  ck_assert_msg(served, "the operator got no answer in 5 tries (%.1f s) "
                "while silent peers held the places", took);
  ck_assert_int_ge(tu_counter(&d, "refused_idle"), 1);
  for (int i = 0; i < N_IDLE; i++)
    zmq_close(idle[i]);
  zmq_ctx_term(ctx);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* A job of n units named like a model's, joined by ag (rank 0 of 1):
 * the names, for free_names(). */
static char **wide_job(raw_peer *ag, const char *job, int n) {
  char **units = malloc((size_t)n * sizeof *units);
  ck_assert_ptr_nonnull(units);
  for (int i = 0; i < n; i++) {
    char name[48];
    snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj", i);
    units[i] = strdup(name);
  }
  hello(ag, job, 0, 1, units, (size_t)n, 2.0);
  Gnmr__Envelope *w = expect_body(ag, GNMR__ENVELOPE__BODY_WELCOME);
  gnmr__wire_free(&w);
  return units;
}

static void free_names(char **units, int n) {
  for (int i = 0; i < n; i++)
    free(units[i]);
  free(units);
}

/* The length bound is the most a Report can take, not what the agent
 * sends: a valid Report in protobuf's widest encoding (every per-unit
 * field unpacked: a tagged double for sumsq and measure, a ten-byte
 * varint count, three tagged bools) of a rank wide enough that the 64 KiB
 * slack does not hide it is decoded and decided. Before the measure
 * field counted (24 bytes a unit) it was refused as oversized. */
static uint8_t *put_varint(uint8_t *o, uint64_t v) {
  while (v >= 0x80) {
    *o++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *o++ = (uint8_t)v;
  return o;
}

static uint8_t *put_double(uint8_t *o, uint8_t key, double v) {
  *o++ = key;
  memcpy(o, &v, 8);
  return o + 8;
}

START_TEST(the_widest_encoding_of_a_valid_report_is_accepted) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  enum { N = 1 << 16 }; /* 2 bytes a unit over N: more than the slack */
  raw_peer ag = raw_open(d.agents);
  char **units = wide_job(&ag, "wideenc", N);
  size_t cap = (size_t)N * 40 + 256;
  uint8_t *rep = malloc(cap), *msg = malloc(cap + 32);
  ck_assert_ptr_nonnull(rep);
  ck_assert_ptr_nonnull(msg);
  uint8_t *o = rep;
  *o++ = 0x0a; /* job */
  *o++ = 7;
  memcpy(o, "wideenc", 7);
  o += 7;
  *o++ = 0x10; /* rank 0 */
  o = put_varint(o, 0);
  *o++ = 0x18; /* step 1 */
  o = put_varint(o, 1);
  for (int i = 0; i < N; i++)
    o = put_double(o, 0x21, 1.0 + i % 7); /* sumsq, unpacked */
  for (int i = 0; i < N; i++) {
    *o++ = 0x28; /* nonfinite: 0, in ten bytes (a varint may be padded) */
    for (int k = 0; k < 9; k++)
      *o++ = 0x80;
    *o++ = 0x00;
  }
  for (int i = 0; i < N; i++) {
    *o++ = 0x30; /* not_reported */
    *o++ = 0;
  }
  for (int i = 0; i < N; i++) {
    *o++ = 0x38; /* shadowed */
    *o++ = 0;
  }
  for (int i = 0; i < N; i++)
    o = put_double(o, 0x41, NAN); /* measure: not measured */
  for (int i = 0; i < N; i++) {
    *o++ = 0x48; /* missing */
    *o++ = 0;
  }
  size_t rep_len = (size_t)(o - rep);
  uint8_t *m = msg;
  *m++ = 0x08; /* version 1 */
  *m++ = 1;
  *m++ = 0x62; /* report = 12, length-delimited */
  m = put_varint(m, rep_len);
  memcpy(m, rep, rep_len);
  m += rep_len;
  printf("the widest valid Report of a %d-unit rank: %zu bytes\n", N,
         (size_t)(m - msg));
  raw_send(&ag, msg, (size_t)(m - msg));
  Gnmr__Envelope *e = raw_recv(&ag, 10000 * tu_slow());
  ck_assert_ptr_nonnull(e);
  ck_assert_msg(e->body_case == GNMR__ENVELOPE__BODY_DECISION, "%s",
                e->body_case == GNMR__ENVELOPE__BODY_ERROR ? e->error->message
                                                           : "not a decision");
  ck_assert_uint_eq(e->decision->step, 1);
  gnmr__wire_free(&e);
  ck_assert_int_eq(tu_counter(&d, "reports_oversized"), 0);
  free(rep);
  free(msg);
  free_names(units, N);
  raw_close(&ag);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* A client of the admin endpoint that reads nothing: its ZeroMQ takes
 * one message (RCVHWM 1) and its kernel buffer little, then stops
 * reading; sndhwm 0 lets it queue every request it sends. */
static void *unread_client(void *ctx, const char *admin, int sndhwm) {
  void *s = zmq_socket(ctx, ZMQ_DEALER);
  int zero = 0, one = 1, small = 4096;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  if (sndhwm == 0)
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
  zmq_setsockopt(s, ZMQ_RCVHWM, &one, sizeof one);
  zmq_setsockopt(s, ZMQ_RCVBUF, &small, sizeof small);
  ck_assert_int_eq(zmq_connect(s, admin), 0);
  return s;
}

/* Sends `units JOB` n times on s. */
static void ask_n(void *s, const char *command, const char *job, int n) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__AdminRequest q = GNMR__ADMIN_REQUEST__INIT;
  uint8_t *buf;
  size_t len;
  q.command = (char *)command;
  q.job = (char *)job;
  env.body_case = GNMR__ENVELOPE__BODY_ADMIN_REQUEST;
  env.admin_request = &q;
  ck_assert_int_eq(gnmr__wire_encode(&env, &buf, &len), GNMR_OK);
  for (int i = 0; i < n; i++)
    ck_assert_int_ge(zmq_send(s, buf, len, 0), 0);
  free(buf);
}

static void ask_units(void *s, const char *job, int n) {
  ask_n(s, "units", job, n);
}

/* The operator's `gnmrctl jobs` (its output naming want): how long it
 * took, in seconds, or -1 when it failed or did not name want. */
static double operator_jobs(const tu_daemon *d, const char *want) {
  char adm[300];
  snprintf(adm, sizeof adm, "--admin=%s", d->admin);
  char *st[] = {"gnmrctl", adm, "jobs", "--timeout-ms", ctl_wait(), NULL};
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  run_result r = tu_run("gnmrctl", st, NULL);
  double took = since(&t0);
  int ok = r.code == 0 && strstr(r.out, want) != NULL;
  if (!ok)
    printf("jobs: exit %d: %s", r.code, r.err);
  tu_run_free(&r);
  return ok ? took : -1;
}

/* Issue 62: 100,000 `history` requests pipelined on one connection took
 * gnmrd to 484 MB and kept the operator's `jobs` waiting 5 s: each was
 * queued on the pool. A connection now has at most 8 history queries in
 * progress; the rest are BUSY at once, before anything is built, and the
 * operator is answered. */
START_TEST(pipelined_history_queries_are_bounded_per_connection) {
  tu_daemon d = {0};
  if (tu_slow() > 1)
    start_with(&d, "[limits]\nfirst_message_ms = 120000\n");
  else
    tu_daemon_start(&d);
  const int N_REQ = tu_slow() > 1 ? 2000 : 20000;
  raw_peer ag = raw_open(d.agents);
  char **units = wide_job(&ag, "queried", 4);
  void *ctx = zmq_ctx_new();
  void *fl = unread_client(ctx, d.admin, 0);
  ask_n(fl, "history", "queried", N_REQ);
  tu_sleep_ms(300);
  double waited = operator_jobs(&d, "queried");
  ck_assert(waited >= 0);
  long long refused = 0;
  for (int i = 0; i < 100 * tu_slow() && refused == 0; i++) {
    refused = tu_counter(&d, "admin_queries_refused");
    if (refused == 0)
      tu_sleep_ms(100);
  }
  printf("pipelined history: %d requests on one connection, %lld refused "
         "BUSY; the operator's jobs answered in %.0f ms\n", N_REQ, refused,
         waited * 1e3);
  ck_assert_int_gt(refused, 0);
  ck_assert_msg(waited < 1.0 * tu_slow(), "jobs waited %.1f s", waited);
  zmq_close(fl);
  zmq_ctx_term(ctx);
  free_names(units, 4);
  raw_close(&ag);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* A client that sends 3000 admin requests and reads no reply, each
 * answered with the unit list of a 500-unit job (about 110 KB): the
 * hostile round saw gnmrd grow by 310 MB and the operator wait 5 s. gnmrd
 * keeps few replies queued for a connection (the rest are dropped and
 * counted), so it grows by a bounded amount, and an operator asking
 * meanwhile is answered within a second. */
START_TEST(an_admin_flood_that_reads_nothing_is_bounded) {
  tu_daemon d = {0};
  /* under valgrind gnmrd works through the flood for 12-20 s, past the
   * default 10 s in which a connection must say something: a bound on
   * time, scaled there as tu_slow() scales the others */
  if (tu_slow() > 1)
    start_with(&d, "[limits]\nfirst_message_ms = 120000\n");
  else
    tu_daemon_start(&d);
  /* under valgrind (gnmrd too) a tenth of the requests: still far more
   * than gnmrd keeps for a client */
  enum { N_UNITS = 500 };
  const int N_REQ = tu_slow() > 1 ? 300 : 3000;
  raw_peer ag = raw_open(d.agents);
  char **units = wide_job(&ag, "flooded", N_UNITS);
  long rss0 = daemon_rss_kb(d.pid);
  void *ctx = zmq_ctx_new();
  void *fl = unread_client(ctx, d.admin, 0);
  ask_units(fl, "flooded", N_REQ);
  /* while gnmrd works through them, the operator asks */
  tu_sleep_ms(500);
  char adm[300];
  snprintf(adm, sizeof adm, "--admin=%s", d.admin);
  char *st[] = {"gnmrctl", adm, "jobs", "--timeout-ms", ctl_wait(), NULL};
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  run_result r = tu_run("gnmrctl", st, NULL);
  double waited = since(&t0);
  ck_assert_msg(r.code == 0 && strstr(r.out, "flooded"), "jobs: %s", r.err);
  tu_run_free(&r);
  /* every request read (the stats answer comes after them) */
  char *sargs[] = {"gnmrctl", adm, "stats", "--timeout-ms", ctl_wait(),
                   NULL};
  long peak = daemon_rss_kb(d.pid);
  uint64_t dropped = 0;
  unsigned long long seen = 0;
  for (int i = 0; i < 600 * tu_slow(); i++) {
    long now = daemon_rss_kb(d.pid);
    peak = now > peak ? now : peak;
    r = tu_run("gnmrctl", sargs, NULL);
    const char *p = strstr(r.out, "admin_requests ");
    unsigned long long dr = 0;
    const char *q = strstr(r.out, "admin_replies_dropped ");
    if (p != NULL)
      sscanf(p + strlen("admin_requests "), "%llu", &seen);
    if (q != NULL)
      sscanf(q + strlen("admin_replies_dropped "), "%llu", &dr);
    tu_run_free(&r);
    dropped = dr;
    if (seen >= (unsigned long long)N_REQ)
      break;
    tu_sleep_ms(100);
  }
  char *uargs[] = {"gnmrctl", adm, "units", "flooded", "--json",
                   "--timeout-ms", ctl_wait(), NULL};
  r = tu_run("gnmrctl", uargs, NULL);
  size_t reply = strlen(r.out);
  tu_run_free(&r);
  printf("admin flood: %d requests (%llu read) for a %zu-byte unit list, "
         "unread: gnmrd RSS %ld -> peak %ld kB, %llu replies dropped; the "
         "operator's jobs answered in %.0f ms\n", N_REQ, seen, reply, rss0,
         peak,
         (unsigned long long)dropped, waited * 1e3);
  fflush(stdout);
  ck_assert_msg(!rss_tells() || peak - rss0 < 16 * 1024, "gnmrd grew %ld kB",
                peak - rss0);
  /* under valgrind gnmrd works through the flood at a tenth of its pace:
   * the bound there is only that the operator is answered */
  ck_assert_msg(waited < (tu_slow() > 1 ? 30.0 : 1.0),
                "the operator waited %.1f s", waited);
  ck_assert_uint_gt(dropped, 0);
  zmq_close(fl);
  zmq_ctx_term(ctx);
  raw_close(&ag);
  free_names(units, N_UNITS);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* The round: 48 admin connections pipelining 8 `units` requests each of
 * a 2^17-unit job, reading nothing: the operator's `gnmrctl jobs` went
 * unanswered for 5 s and gnmrd kept +239 MB; the cap counted replies
 * (8 a connection), not bytes. Here 16 connections x 8 requests of a
 * 2^14-unit job (a 3.7 MB answer): before, gnmrd built all 128 and held up
 * to 8 a connection (hundreds of MB); now what ZeroMQ holds unread is
 * bounded in bytes (16 MB a connection, 64 MB in all, one answer larger
 * than that when nothing else waits), the rest are BUSY before they are
 * built, the operator's small answer comes at once, and the bytes are
 * given back when the flood's connections go. */
START_TEST(unread_admin_replies_are_bounded_in_bytes) {
  tu_daemon d = {0};
  if (tu_slow() > 1)
    start_with(&d, "[limits]\nfirst_message_ms = 120000\n");
  else
    tu_daemon_start(&d);
  /* under ASan a quarter of the units, under valgrind (gnmrd too, at a
   * tenth of its pace) a sixteenth and a quarter of the flood: what they
   * check there is memory, not the bounds' figures */
  const int sanitized = getenv("GNMR_SANITIZED") != NULL;
  const int N_UNITS = tu_slow() > 1 ? 1 << 11 : sanitized ? 1 << 13 : 1 << 14;
  const int CONNS = tu_slow() > 1 ? 4 : 16, REQS = tu_slow() > 1 ? 4 : 8;
  raw_peer ag = raw_open(d.agents);
  char **units = wide_job(&ag, "wide", N_UNITS);
  char adm[300];
  snprintf(adm, sizeof adm, "--admin=%s", d.admin);
  char *uargs[] = {"gnmrctl", adm, "units", "wide", "--json", "--timeout-ms",
                   ctl_wait(), NULL};
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  run_result r = tu_run("gnmrctl", uargs, NULL);
  double alone = since(&t0);
  ck_assert_msg(r.code == 0, "units: %s", r.err);
  size_t answer = strlen(r.out);
  tu_run_free(&r);
  long rss0 = daemon_rss_kb(d.pid);
  void *ctx = zmq_ctx_new();
  void *fl[16];
  for (int k = 0; k < CONNS; k++) {
    fl[k] = unread_client(ctx, d.admin, -1);
    ask_units(fl[k], "wide", REQS);
  }
  tu_sleep_ms(300);
  char *jargs[] = {"gnmrctl", adm, "jobs", "--timeout-ms", ctl_wait(), NULL};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  r = tu_run("gnmrctl", jargs, NULL);
  double waited = since(&t0);
  int jobs_ok = r.code == 0 && strstr(r.out, "wide") != NULL;
  if (!jobs_ok)
    printf("jobs: %s", r.err);
  tu_run_free(&r);
  /* every request answered or refused: each connection's own ZeroMQ
   * takes two or three answers of this size off gnmrd (its receive queue
   * of 1, one its decoder holds, part of one in its socket buffer),
   * which gnmrd cannot tell from read; the rest wait unread, at most 64
   * MB in all (and one answer past it: 18 here), and every other request
   * is BUSY: 42 and 57 of the 128 built here in two runs, so at least 48
   * refused asked (none before: every one was built and kept) */
  long long refused = 0, requests = 0;
  const long long want = rss_tells() ? CONNS * REQS * 3 / 8 : 0;
  long peak = daemon_rss_kb(d.pid);
  /* up to 240 s (its own case's timeout is 300): the answers are built
   * one a loop turn, 0.2 s each alone here and several times that under
   * the flood's own reading and writing on a loaded 2-CPU machine; the
   * refusals come once the first 50 or so are built (60 s was too short
   * there for 2^15 units: 12 refused when it ran out) */
  for (int i = 0; i < 2400 * tu_slow(); i++) {
    long now = daemon_rss_kb(d.pid);
    peak = now > peak ? now : peak;
    requests = tu_counter(&d, "admin_requests");
    refused = tu_counter(&d, "admin_unread_refused");
    if (requests >= CONNS * REQS + 2 && refused >= want)
      break;
    tu_sleep_ms(100);
  }
  long held = daemon_rss_kb(d.pid);
  printf("unread admin replies: %d connections x %d `units` of a %d-unit job "
         "(%zu-byte answer), read by none: %lld refused BUSY; gnmrd RSS %ld "
         "-> peak %ld kB; the operator's jobs answered in %.0f ms (one "
         "`units` alone: %.0f ms)\n", CONNS,
         REQS, N_UNITS, answer, refused, rss0, peak, waited * 1e3,
         alone * 1e3);
  fflush(stdout);
  ck_assert(jobs_ok);
  ck_assert_int_ge(requests, CONNS * REQS + 2);
  /* at most 64 MB + one answer unread: the rest refused */
  ck_assert_int_ge(refused, want);
  ck_assert_msg(!rss_tells() || peak - rss0 < 128 * 1024,
                "gnmrd grew %ld kB", peak - rss0);
  ck_assert_msg(waited < (tu_slow() > 1 ? 30.0 : 1.0),
                "the operator waited %.1f s", waited);
  (void)held;
  /* the flood goes: its unread bytes are given back, a reader is served */
  for (int k = 0; k < CONNS; k++)
    zmq_close(fl[k]);
  zmq_ctx_term(ctx);
  int served = 0;
  for (int i = 0; i < 50 && !served; i++) {
    r = tu_run("gnmrctl", uargs, NULL);
    served = r.code == 0 && strlen(r.out) == answer;
    tu_run_free(&r);
    if (!served)
      tu_sleep_ms(100);
  }
  ck_assert_msg(served, "a reader was not served after the flood left");
  raw_close(&ag);
  free_names(units, N_UNITS);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Four `decisions` queries of a 400,000-step run, each sent by a client
 * that leaves at once: the hostile round saw such abandoned queries run to
 * their end while `gnmrctl jobs` waited seconds behind them. A query
 * stops when its client's connection goes, so the operator's `jobs` is
 * answered at once; the stopped queries are counted (queries_abandoned). */
START_TEST(abandoned_queries_stop_with_their_client) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  tu_daemon_start_in(&d, NULL, NULL, d.dir, NULL);
  raw_peer ag = raw_open(d.agents);
  hello(&ag, "long-run", 0, 1, two_units, 2, 2.0);
  Gnmr__Envelope *w = expect_body(&ag, GNMR__ENVELOPE__BODY_WELCOME);
  gnmr__wire_free(&w);
  double sq[2] = {1, 2};
  report(&ag, "long-run", 0, 1, sq, 2, NULL, 0);
  w = expect_body(&ag, GNMR__ENVELOPE__BODY_DECISION);
  gnmr__wire_free(&w);
  raw_close(&ag);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  /* 400,000 more steps, written by hand; the run finished */
  char path[300];
  snprintf(path, sizeof path, "%s/data/gnmr.db", d.dir);
  sqlite3 *db;
  ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
  ck_assert_int_eq(
      sqlite3_exec(db,
                   tu_slow() > 1 ? /* valgrind: gnmrd at a tenth the pace */
                   "WITH RECURSIVE c(x) AS (SELECT 2 UNION ALL SELECT x + 1 "
                   "FROM c WHERE x < 40001) INSERT INTO steps(job, run, "
                   "pass, step, reports, risky, pool, n_active, active, "
                   "missing, by_deadline, latency_us, at) SELECT 'long-run',"
                   " 1, 1, x, 1, 0, 0, 1, '1', 0, 0, 10, 0 FROM c;"
                   "UPDATE jobs SET state='finished', last_step=40001;" :
                   "WITH RECURSIVE c(x) AS (SELECT 2 UNION ALL SELECT x + 1 "
                   "FROM c WHERE x < 400001) INSERT INTO steps(job, run, "
                   "pass, step, reports, risky, pool, n_active, active, "
                   "missing, by_deadline, latency_us, at) SELECT 'long-run',"
                   " 1, 1, x, 1, 0, 0, 1, '1', 0, 0, 10, 0 FROM c;"
                   "UPDATE jobs SET state='finished', last_step=400001;",
                   NULL, NULL, NULL),
      SQLITE_OK);
  sqlite3_close(db);
  tu_daemon_start_in(&d, NULL, NULL, d.dir, NULL);
  /* how long one such query takes when its client waits */
  char adm[300];
  snprintf(adm, sizeof adm, "--admin=%s", d.admin);
  char *dec[] = {"gnmrctl", adm, "decisions", "long-run", "--csv",
                 "--timeout-ms", "120000", NULL};
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  run_result r = tu_run("gnmrctl", dec, NULL);
  double whole = since(&t0);
  ck_assert_msg(r.code == 0, "decisions: %s", r.err);
  tu_run_free(&r);
  for (int i = 0; i < 4; i++) { /* asked, then gone once it was read */
    raw_peer p = raw_open(d.admin);
    raw_admin(&p, "decisions", "long-run", 0, 0);
    tu_sleep_ms(200 * tu_slow());
    raw_close(&p);
  }
  tu_sleep_ms(100);
  char *jobs[] = {"gnmrctl", adm, "jobs", "--timeout-ms", ctl_wait(), NULL};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  r = tu_run("gnmrctl", jobs, NULL);
  double waited = since(&t0);
  ck_assert_msg(r.code == 0 && strstr(r.out, "long-run"), "jobs: %s", r.err);
  tu_run_free(&r);
  char *st[] = {"gnmrctl", adm, "stats", "--timeout-ms", ctl_wait(), NULL};
  r = tu_run("gnmrctl", st, NULL);
  unsigned long long abandoned = 0;
  const char *a = strstr(r.out, "queries_abandoned ");
  if (a != NULL)
    sscanf(a + strlen("queries_abandoned "), "%llu", &abandoned);
  tu_run_free(&r);
  printf("abandoned queries: decisions of %d steps takes %.0f ms; after "
         "4 abandoned, jobs answered in %.0f ms (%llu stopped)\n",
         tu_slow() > 1 ? 40001 : 400001, whole * 1e3, waited * 1e3,
         abandoned);
  fflush(stdout);
  ck_assert_msg(waited < whole, "jobs waited %.0f ms behind abandoned "
                "queries (one takes %.0f ms)", waited * 1e3, whole * 1e3);
  /* under valgrind the loop notices a gone client later, and some of the
   * abandoned queries have finished by then: at least one is stopped */
  ck_assert_uint_ge(abandoned, tu_slow() > 1 ? 1 : 2);
  /* a stop under queries whose client still waits (issue 62: a SIGTERM
   * under pool work took 85 s, past systemd's TimeoutStopSec=30): the
   * running ones are stopped and the queued ones cancelled, so the stop
   * does not wait them out (8 of them take over twice one's time here) */
  raw_peer waiting = raw_open(d.admin);
  for (int i = 0; i < 8; i++)
    raw_admin(&waiting, "decisions", "long-run", 0, 0);
  tu_sleep_ms(300 * tu_slow());
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  double stop = since(&t0);
  printf("a stop under 8 waiting queries of %.0f ms each: %.0f ms\n",
         whole * 1e3, stop * 1e3);
  ck_assert_msg(stop < whole, "the stop took %.0f ms: the queries ran on "
                "(one takes %.0f ms)", stop * 1e3, whole * 1e3);
  raw_close(&waiting);
  tu_rmrf(d.dir);
}
END_TEST

/* Writes all of buf to fd (blocking). */
static int write_all(int fd, const void *buf, size_t len) {
  const char *b = buf;
  while (len > 0) {
    ssize_t n = write(fd, b, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    b += n;
    len -= (size_t)n;
  }
  return 0;
}

/* One peer on gnmrd's ipc agents socket in dir: ZMTP 3.0's greeting (the
 * NULL mechanism) and READY as a DEALER, one message (junk: refused,
 * counted), then `big` bytes of a frame of big + 1, and silence. Returns
 * whether gnmrd closed the connection within 15 s (times tu_slow()), its
 * time in *took and gnmrd's largest RSS meanwhile in *peak_kb. */
static int stall_once(const tu_daemon *d, size_t big, int trickle,
                      double *took, long *peak_kb) {
  struct sockaddr_un sa = {0};
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s/agents.sock", d->dir);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  uint8_t greet[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0,
                       'N',  'U', 'L', 'L'};
  ck_assert_int_eq(write_all(fd, greet, sizeof greet), 0);
  uint8_t theirs[64];
  size_t got = 0;
  while (got < sizeof theirs) {
    ssize_t n = read(fd, theirs + got, sizeof theirs - got);
    ck_assert_int_gt(n, 0);
    got += (size_t)n;
  }
  static const uint8_t ready[] = {
      0x04, 28,  5,   'R', 'E', 'A', 'D', 'Y', 11,  'S', 'o', 'c', 'k',
      'e',  't', '-', 'T', 'y', 'p', 'e', 0,   0,   0,   6,   'D', 'E',
      'A',  'L', 'E', 'R'};
  ck_assert_int_eq(write_all(fd, ready, sizeof ready), 0);
  static const uint8_t junk[] = {0x00, 3, 'a', 'b', 'c'};
  ck_assert_int_eq(write_all(fd, junk, sizeof junk), 0);
  tu_sleep_ms(200);
  uint8_t head[9] = {0x02};
  uint64_t size = (uint64_t)big + 1;
  for (int i = 0; i < 8; i++)
    head[1 + i] = (uint8_t)(size >> (56 - 8 * i));
  ck_assert_int_eq(write_all(fd, head, sizeof head), 0);
  /* the whole frame but its last `trickle` bytes at once; those a byte
   * every 200 ms (never the last) */
  size_t now_part = big - (size_t)trickle;
  char *body = calloc(1, big);
  ck_assert_int_eq(write_all(fd, body, now_part), 0);
  free(body);
  /* the stalled peer hears gnmrd's pings and answers none: it cannot,
   * mid-frame (a PONG is a frame of its own) */
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int closed = 0;
  size_t sent = now_part;
  *peak_kb = 0;
  while (!closed && since(&t0) < 15.0 * tu_slow()) {
    long now = daemon_rss_kb(d->pid);
    *peak_kb = now > *peak_kb ? now : *peak_kb;
    if (sent < big) { /* another byte; a refused write is a close */
      char zero = 0;
      ssize_t w = send(fd, &zero, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0 && errno != EAGAIN && errno != EINTR)
        closed = 1;
      else if (w == 1)
        sent++;
    }
    struct pollfd pfd = {fd, POLLIN, 0};
    if (!closed && poll(&pfd, 1, 200) > 0) {
      char b[4096];
      ssize_t n = read(fd, b, sizeof b);
      closed = n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN);
    }
  }
  *took = since(&t0);
  close(fd);
  return closed;
}

/* The round: after one message, a frame sent without its last byte kept
 * its buffer (250 MB a peer) for as long as the peer stayed; the first-
 * message deadline bounds only a connection that never spoke. Now a peer
 * that stops mid-frame answers no heartbeat (gnmrd pings every second and
 * drops a connection silent for 5 s), so the connection and its buffer
 * go within seconds, and three such peers one after another leave gnmrd
 * no larger than one did (the memory freed is reused: what the allocator
 * keeps of it is not more peers' worth). A peer that trickles its frame
 * instead goes the same way (the next test). */
START_TEST(a_frame_stalled_after_a_message_is_dropped_in_seconds) {
  tu_daemon d = {0};
  char ep[200];
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  tu_daemon_start_in(&d, ep, NULL, d.dir, NULL);
  enum { BIG = 24 << 20 };
  long before = daemon_rss_kb(d.pid), peak, after[3] = {0};
  int rounds = rss_tells() ? 3 : 1; /* ASan, valgrind: theirs */
  for (int k = 0; k < rounds; k++) {
    double took;
    int closed = stall_once(&d, BIG, 0, &took, &peak);
    after[k] = daemon_rss_kb(d.pid);
    printf("stalled frame %d: %d MB of %d MB + 1 after a message: closed "
           "by gnmrd after %.1f s; gnmrd RSS %ld -> peak %ld -> %ld kB\n",
           k + 1, BIG >> 20, BIG >> 20, took, before, peak, after[k]);
    fflush(stdout);
    ck_assert_msg(closed, "the stalled connection is still open after "
                  "%.0f s", took);
  }
  if (rss_tells())
    /* one frame's worth may stay with the allocator (or not: it gave it
     * back after the first in some runs, kept it after the second), not
     * one a peer: three kept would be 72 MB */
    ck_assert_msg(after[2] < before + (BIG >> 10) * 3 / 2,
                  "each stalled frame's buffer stayed: RSS %ld -> %ld, %ld, "
                  "%ld kB after 1, 2, 3", before, after[0], after[1],
                  after[2]);
  /* an agent is served as ever */
  raw_peer p = raw_open(d.agents);
  hello_ids(&p, "after-stall", 0, 1, two_units, 2, NULL);
  expect_welcome(&p);
  raw_close(&p);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* The same peer, but trickling its frame's last bytes, a byte every
 * 200 ms: bytes keep coming, yet no message or command can end while a
 * frame is open (ZeroMQ's heartbeat timeout is reset only by one), so
 * the PONG it owes never comes and the connection goes as the stalled
 * one does, after the 5 s timeout. */
START_TEST(a_frame_trickled_after_a_message_is_dropped_in_seconds) {
  tu_daemon d = {0};
  char ep[200];
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  snprintf(ep, sizeof ep, "ipc://%s/agents.sock", d.dir);
  tu_daemon_start_in(&d, ep, NULL, d.dir, NULL);
  enum { BIG = 4 << 20 };
  double took;
  long peak, before = daemon_rss_kb(d.pid);
  int closed = stall_once(&d, BIG, 200, &took, &peak);
  printf("trickled frame: %d MB of %d MB + 1 after a message, then a byte "
         "every 200 ms: closed by gnmrd after %.1f s; gnmrd RSS %ld -> peak "
         "%ld kB\n", BIG >> 20, BIG >> 20, took, before, peak);
  fflush(stdout);
  ck_assert_msg(closed, "the trickling connection is still open after "
                "%.0f s", took);
  ck_assert_msg(took < 10.0 * tu_slow(), "closed only after %.1f s", took);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("hostile");
  TCase *names = tcase_create("names");
  tcase_add_test(names, names_are_utf8_without_controls_or_format_characters);
  tcase_add_test(names, a_nul_byte_inside_a_name_is_refused_not_cut);
  suite_add_tcase(s, names);
  /* its own case: 2^20 units take seconds under the sanitizers */
  TCase *wide = tcase_create("wide");
  tcase_set_timeout(wide, 300);
  tcase_add_test(wide, a_million_unit_hello_does_not_stall_another_job);
  tcase_add_test(wide, a_large_hellos_refusals_are_a_small_ones);
  tcase_add_test(wide, one_connection_has_one_large_hello_away);
  tcase_add_test(wide, one_hosts_connections_leave_a_place_to_another);
  suite_add_tcase(s, wide);
  /* RSS after large Hellos and a large job: a case of its own, so that
   * nothing else in the process of the tests shares its figures */
  /* the unread-replies flood: its own case, with time for a loaded
   * machine to work through it */
  TCase *unread = tcase_create("unread");
  tcase_set_timeout(unread, 300);
  tcase_add_test(unread, unread_admin_replies_are_bounded_in_bytes);
  suite_add_tcase(s, unread);
  TCase *memory = tcase_create("memory");
  tcase_set_timeout(memory, 300);
  tcase_add_test(memory, memory_comes_back_after_large_hellos_and_jobs);
  suite_add_tcase(s, memory);
  TCase *live = tcase_create("live");
  tcase_set_timeout(live, 120);
  tcase_add_test(live, hostile_names_are_refused_and_create_nothing);
  tcase_add_test(live, old_database_names_are_not_restored_and_are_escaped);
  tcase_add_test(live, caps_on_jobs_units_and_ids_refuse_clearly);
  tcase_add_test(live, units_are_capped_over_all_jobs);
  tcase_add_test(live, connections_past_the_cap_are_refused_politely_and_counted);
  tcase_add_test(live, a_connection_flood_under_a_low_descriptor_limit_is_survived);
  tcase_add_test(live, held_bytes_are_capped_and_freed_by_decisions);
  tcase_add_test(live, idle_jobs_are_retired_and_their_slot_freed);
  tcase_add_test(live, socket_directories_like_ssh_agent);
  tcase_add_test(live, idle_connections_do_not_hold_the_places);
  tcase_add_test(live, an_agent_will_not_join_through_another_users_directory);
  tcase_add_test(live, a_hello_without_instance_does_not_take_over_a_rank);
  tcase_add_test(live, a_second_gnmrd_does_not_take_over_a_live_socket);
  tcase_add_test(live, key_files_others_can_read_or_change_are_refused);
  tcase_add_test(live, a_damaged_database_is_refused_at_start);
  tcase_add_test(live,
                 silent_connections_that_come_back_do_not_lock_the_operator_out);
  tcase_add_test(live, an_admin_flood_that_reads_nothing_is_bounded);
  tcase_add_test(live, pipelined_history_queries_are_bounded_per_connection);
  tcase_add_test(live, a_huge_or_escaped_instance_is_refused_and_not_kept);
  tcase_add_test(live, reports_without_hello_do_not_stall_another_job);
  tcase_add_test(live, a_report_longer_than_its_rank_needs_is_refused_undecoded);
  tcase_add_test(live, the_widest_encoding_of_a_valid_report_is_accepted);
  tcase_add_test(live, a_slow_metrics_client_does_not_hold_out_the_scraper);
  tcase_add_test(live, abandoned_queries_stop_with_their_client);
  tcase_add_test(live, a_frame_stalled_after_a_message_is_dropped_in_seconds);
  tcase_add_test(wide, a_frame_trickled_after_a_message_is_dropped_in_seconds);
  suite_add_tcase(s, live);
  return s;
}

int main(void) { return tu_check_main(suite()); }
