/* SPDX-License-Identifier: MIT */
/* test_security.c — CURVE: gnmrctl keygen, a daemon that lets in only the
 * listed keys (an allowed key is served; an unknown key, a plaintext peer
 * and a peer with the wrong server key are refused and counted), a rank
 * bound to the key it joined with, gnmrctl with and without keys, and the
 * refusal to serve a non-loopback endpoint without CURVE. */
#include <sys/stat.h>
#include <zmq.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <jansson.h>

#include "gnmr/agent.h"
#include "historyutil.h"
#include "keys.h"
#include "keyutil.h"
#include "rawpeer.h"
#include "testutil.h"


START_TEST(keygen_writes_a_private_pair_and_never_overwrites) {
  const char *dir = tu_tmpdir();
  keypair k = keygen(dir, "node");
  struct stat st;
  ck_assert_int_eq(stat(k.path, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0600);
  char pub_path[200], pub[41], err[256];
  snprintf(pub_path, sizeof pub_path, "%s/node.pub", dir);
  ck_assert_int_eq(gnmr__key_file_read(pub_path, pub, NULL, err, sizeof err),
                   GNMR_OK);
  ck_assert_str_eq(pub, k.pub);
  /* a public file has no secret */
  char sec[41];
  ck_assert_int_eq(gnmr__key_file_read(pub_path, NULL, sec, err, sizeof err),
                   GNMR_E_PARSE);
  ck_assert_ptr_nonnull(strstr(err, "no 'secret = KEY' line"));
  char prefix[140];
  snprintf(prefix, sizeof prefix, "%s/node", dir);
  char *again[] = {"gnmrctl", "keygen", prefix, NULL};
  run_result r = tu_run("gnmrctl", again, NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_nonnull(strstr(r.err, "File exists (not overwritten)"));
  tu_run_free(&r);
  char *none[] = {"gnmrctl", "keygen", NULL};
  r = tu_run("gnmrctl", none, NULL);
  ck_assert_int_eq(r.code, 2);
  tu_run_free(&r);
  /* malformed key files */
  const char *bad = "public = tooshort\n";
  char bad_path[200];
  snprintf(bad_path, sizeof bad_path, "%s/bad.key", dir);
  tu_write_file(bad_path, bad);
  ck_assert_int_eq(gnmr__key_file_read(bad_path, pub, NULL, err, sizeof err),
                   GNMR_E_PARSE);
  ck_assert_ptr_nonnull(strstr(err, ":1: not a 40-character Z85"));
  tu_rmrf(dir);
}
END_TEST

static gnmr_agent *curve_agent_n(const char *ep, const char *job,
                                 const char *server_pub, const keypair *k,
                                 size_t n_units) {
  static const char *names[] = {"a", "b", "c", "d", "e", "f", "g", "h"};
  gnmr_agent_config c = {0};
  ck_assert_uint_le(n_units, 8);
  c.endpoint = ep;
  c.job = job;
  c.reporters = 1;
  c.unit_names = names;
  c.n_units = n_units;
  gnmr_params_default(&c.params);
  c.params.warmup_steps = 0;
  if (k != NULL) {
    c.curve_server_key = server_pub;
    c.curve_public_key = k->pub;
    c.curve_secret_key = k->sec;
  }
  gnmr_agent *a;
  int orv = gnmr_agent_open(&c, &a);
  ck_assert_msg(orv == GNMR_OK, "agent for %s: %s", job, gnmr_strerror(orv));
  return a;
}

static gnmr_agent *curve_agent(const char *ep, const char *job,
                               const char *server_pub, const keypair *k) {
  return curve_agent_n(ep, job, server_pub, k, 2);
}

/* Whether the agent joins within ms. */
static int joins(gnmr_agent *a, int ms) {
  for (int i = 0; i < ms / 20 && !gnmr_agent_joined(a); i++)
    tu_sleep_ms(20);
  return gnmr_agent_joined(a);
}

/* Whether a is refused with code within ms, and has not joined: waits for
 * the refusal itself, not for a join that has not come yet (a daemon under
 * valgrind, beside other suites, answers in seconds). */
static int refused_with(gnmr_agent *a, int code, int ms) {
  char why[256];
  if (getenv("GNMR_VALGRIND") != NULL)
    ms *= 10;
  for (int i = 0; i < ms / 20; i++) {
    if (gnmr_agent_joined(a))
      return 0;
    if (gnmr_agent_last_error(a, why, sizeof why) == code)
      return !gnmr_agent_joined(a);
    tu_sleep_ms(20);
  }
  return 0;
}

static int refused(gnmr_agent *a, int ms) {
  return refused_with(a, GNMR_E_DENIED, ms);
}

static run_result ctl_keys(const tu_daemon *d, const char *server_pub,
                           const char *key_file) {
  char admin[300];
  snprintf(admin, sizeof admin, "--admin=%s", d->admin);
  char *argv[10];
  int n = 0;
  argv[n++] = "gnmrctl";
  argv[n++] = admin;
  if (server_pub) {
    argv[n++] = "--curve-server-key";
    argv[n++] = (char *)server_pub;
  }
  if (key_file) {
    argv[n++] = "--key-file";
    argv[n++] = (char *)key_file;
  }
  /* 1 s, 10 s under valgrind (gnmrctl's CURVE handshake there took over
   * a second on a loaded VM) */
  char ms[16];
  snprintf(ms, sizeof ms, "%d", 1000 * tu_slow());
  argv[n++] = "stats";
  argv[n++] = "--timeout-ms";
  argv[n++] = ms;
  argv[n] = NULL;
  return tu_run("gnmrctl", argv, NULL);
}

static long long counter_of(const char *stats, const char *name) {
  char key[64];
  snprintf(key, sizeof key, "%s ", name);
  const char *p = strstr(stats, key);
  return p ? strtoll(p + strlen(key), NULL, 10) : -1;
}

/* Connects to a tcp://HOST:PORT endpoint, sends an HTTP request, closes. */
static void send_junk(const char *endpoint) {
  char host[64];
  int port = 0;
  ck_assert_int_eq(sscanf(endpoint, "tcp://%63[^:]:%d", host, &port), 2);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  ck_assert_int_eq(inet_pton(AF_INET, host, &sa.sin_addr), 1);
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
  ck_assert_int_eq(write(fd, req, sizeof req - 1), (ssize_t)(sizeof req - 1));
  tu_sleep_ms(300);
  close(fd);
  tu_sleep_ms(300);
}

START_TEST(only_listed_keys_are_served_and_refusals_are_counted) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  keypair server = keygen(d.dir, "server"), agent = keygen(d.dir, "agent"),
          client = keygen(d.dir, "client"), stranger = keygen(d.dir, "x");
  char allow[300], allow_path[200];
  snprintf(allow, sizeof allow, "# allowed keys\n%s agent-node-1\n%s ops\n",
           agent.pub, client.pub);
  snprintf(allow_path, sizeof allow_path, "%s/allowed", d.dir);
  tu_write_file(allow_path, allow);
  char *extra[] = {"--curve-key", server.path, "--curve-allow", allow_path,
                   NULL};
  tu_daemon_start_in(&d, NULL, NULL, d.dir, extra);

  /* an allowed key is served */
  gnmr_agent *good = curve_agent(d.agents, "secure", server.pub, &agent);
  double s[2] = {1, 4};
  for (uint64_t t = 1; t <= 5; t++) {
    ck_assert_int_eq(gnmr_agent_report_sums(good, t, s, NULL, NULL), GNMR_OK);
    ck_assert_int_eq(gnmr_agent_wait(good, t, 5000 * tu_slow()), GNMR_OK);
  }
  /* an unknown key, a plaintext peer, a wrong server key: never let in */
  gnmr_agent *unknown = curve_agent(d.agents, "intruder", server.pub,
                                    &stranger);
  gnmr_agent *plain = curve_agent(d.agents, "intruder", NULL, NULL);
  gnmr_agent *wrong = curve_agent(d.agents, "intruder", client.pub, &agent);
  ck_assert(!joins(unknown, 1000));
  ck_assert(!joins(plain, 200));
  ck_assert(!joins(wrong, 200));
  /* another allowed key cannot take over the good agent's rank */
  gnmr_agent *thief = curve_agent(d.agents, "secure", server.pub, &client);
  ck_assert(!joins(thief, 1000));
  gnmr_agent_stats st;
  gnmr_agent_stats_get(thief, &st);
  ck_assert_int_eq(st.last_error, GNMR_E_MISMATCH);

  /* junk on the TCP port: an HTTP request, then the connection closes */
  send_junk(d.agents);

  /* gnmrctl with its allowed key works; the counters saw each refusal,
   * by kind */
  run_result r = ctl_keys(&d, server.pub, client.path);
  ck_assert_msg(r.code == 0, "stats with keys: %s", r.err);
  ck_assert_int_ge(counter_of(r.out, "auth_denied"), 1);
  ck_assert_int_ge(counter_of(r.out, "handshake_failures"), 3);
  ck_assert_int_ge(counter_of(r.out, "refused_client_key"), 1);
  /* the plaintext and wrong-key peers: refused at the handshake, counted as
   * plaintext / server key when gnmrd reads their greeting first, as junk
   * (cut short) when the peer notices the mismatch and leaves first */
  ck_assert_int_ge(counter_of(r.out, "refused_plaintext") +
                       counter_of(r.out, "refused_server_key") +
                       counter_of(r.out, "refused_junk"),
                   2);
  ck_assert_int_eq(counter_of(r.out, "handshake_failures"),
                   counter_of(r.out, "refused_plaintext") +
                       counter_of(r.out, "refused_server_key") +
                       counter_of(r.out, "refused_client_key") +
                       counter_of(r.out, "refused_junk"));
  ck_assert_int_ge(counter_of(r.out, "steps_decided"), 5);
  tu_run_free(&r);
  /* a server key given as the .pub file works too */
  char pub_file[200];
  snprintf(pub_file, sizeof pub_file, "%s/server.pub", d.dir);
  r = ctl_keys(&d, pub_file, client.path);
  ck_assert_int_eq(r.code, 0);
  tu_run_free(&r);
  /* without keys, or with a key not listed: no answer */
  r = ctl_keys(&d, NULL, NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_nonnull(strstr(r.err, "no answer from gnmrd"));
  tu_run_free(&r);
  r = ctl_keys(&d, server.pub, stranger.path);
  ck_assert_int_eq(r.code, 1);
  tu_run_free(&r);
  r = ctl_keys(&d, server.pub, NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_nonnull(strstr(r.err, "needs both"));
  tu_run_free(&r);

  gnmr_agent_close(&good);
  gnmr_agent_close(&unknown);
  gnmr_agent_close(&plain);
  gnmr_agent_close(&wrong);
  gnmr_agent_close(&thief);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  char *log = tu_daemon_log(&d);
  ck_assert_ptr_nonnull(strstr(log, "AUTH-DENY refused CURVE client key"));
  /* refusals logged, rate-limited: the agents retried many times */
  ck_assert_ptr_nonnull(strstr(log, "PEER-REFUSED refused a CURVE key not in "
                                    "the allow list"));
  int lines = 0;
  for (const char *q = log; (q = strstr(q, "PEER-REFUSED")) != NULL; q++)
    lines++;
  ck_assert_int_le(lines, 8);
  ck_assert_ptr_nonnull(strstr(log, "CURVE on; server public key"));
  free(log);
  tu_rmrf(d.dir);
}
END_TEST

START_TEST(curve_setup_errors_and_network_endpoints_without_curve) {
  const char *dir = tu_tmpdir();
  keypair server = keygen(dir, "server");
  char data[128], empty[200];
  snprintf(data, sizeof data, "%s/data", dir);
  snprintf(empty, sizeof empty, "%s/empty", dir);
  tu_write_file(empty, "# nobody\n");
  char allow[200], allow_line[100];
  snprintf(allow, sizeof allow, "%s/allow", dir);
  snprintf(allow_line, sizeof allow_line, "%s somebody\n", server.pub);
  tu_write_file(allow, allow_line);
  static const struct {
    const char *args[8];
    const char *err;
  } cases[] = {
      {{"--curve-key", "KEY", NULL}, "needs both curve_key_file and "
                                     "curve_allow_file"},
      {{"--curve-key", "KEY", "--curve-allow", "EMPTY", NULL},
       "no key listed: nobody could connect"},
      {{"--curve-key", "/nonexistent.key", "--curve-allow", "EMPTY", NULL},
       "/nonexistent.key: No such file"},
      {{"--agents", "tcp://0.0.0.0:*", NULL},
       "refusing to serve tcp://0.0.0.0:* without CURVE"},
      /* metrics are plaintext HTTP: off the loopback only when told */
      {{"--metrics", "0.0.0.0:0", NULL},
       "refusing to serve metrics on 0.0.0.0:0: they are plaintext"},
      {{"--curve-key", "KEY", "--curve-allow", "ALLOW", "--metrics",
        "192.0.2.1:0", NULL},
       "refusing to serve metrics on 192.0.2.1:0"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *argv[16] = {"gnmrd", "--data-dir", data, "--admin",
                      "tcp://127.0.0.1:*"};
    int n = 5;
    for (int k = 0; cases[i].args[k]; k++) {
      const char *a = cases[i].args[k];
      argv[n++] = strcmp(a, "KEY") == 0     ? server.path
                  : strcmp(a, "EMPTY") == 0 ? empty
                  : strcmp(a, "ALLOW") == 0 ? allow
                                            : (char *)a;
    }
    argv[n] = NULL;
    run_result r = tu_run("gnmrd", argv, NULL);
    ck_assert_msg(r.code == 2, "case %zu: exit %d: %s", i, r.code, r.err);
    ck_assert_msg(strstr(r.err, cases[i].err) != NULL, "case %zu: %s", i,
                  r.err);
    tu_run_free(&r);
  }
  /* --insecure lets an operator serve a network endpoint in the clear */
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", dir);
  char *insecure[] = {"--insecure", "--metrics", "0.0.0.0:0", NULL};
  tu_daemon_start_in(&d, "tcp://0.0.0.0:*", NULL, d.dir, insecure);
  ck_assert_ptr_nonnull(strstr(d.agents, "tcp://0.0.0.0:"));
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  char *log = tu_daemon_log(&d);
  ck_assert_ptr_nonnull(strstr(log, "METRICS-INSECURE metrics on 0.0.0.0:0 "
                                    "are plaintext HTTP"));
  free(log);
  tu_rmrf(dir);
}
END_TEST

START_TEST(agent_refuses_partial_or_malformed_curve_settings) {
  static const char *names[] = {"a"};
  gnmr_agent_config c = {0};
  gnmr_agent *a;
  char pub[41], sec[41];
  ck_assert_int_eq(zmq_curve_keypair(pub, sec), 0);
  c.endpoint = "tcp://127.0.0.1:1";
  c.job = "j";
  c.reporters = 1;
  c.unit_names = names;
  c.n_units = 1;
  gnmr_params_default(&c.params);
  c.curve_server_key = pub; /* one of three */
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_E_INVAL);
  c.curve_public_key = pub;
  c.curve_secret_key = "not a key";
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_E_INVAL);
  c.curve_secret_key = sec;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  gnmr_agent_close(&a);
}
END_TEST

/* gnmrctl with a key, any command; argv ends with NULL. */
static run_result ctl_as(const tu_daemon *d, const char *server_pub,
                         const keypair *k, char *a1, char *a2, char *a3) {
  char admin[300];
  snprintf(admin, sizeof admin, "--admin=%s", d->admin);
  char *argv[] = {"gnmrctl", admin, "--curve-server-key", (char *)server_pub,
                  "--key-file", (char *)k->path, a1, a2, a3, NULL};
  return tu_run("gnmrctl", argv, NULL);
}

static gnmr_agent *curve_observer(const char *ep, const char *job,
                                  const char *server_pub, const keypair *k) {
  static const char *names[] = {"a", "b"};
  gnmr_agent_config c = {0};
  c.endpoint = ep;
  c.job = job;
  c.reporters = 1;
  c.unit_names = names;
  c.n_units = 2;
  c.observer = 1;
  gnmr_params_default(&c.params);
  c.params.warmup_steps = 0;
  c.curve_server_key = server_pub;
  c.curve_public_key = k->pub;
  c.curve_secret_key = k->sec;
  gnmr_agent *a;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  return a;
}

START_TEST(tenants_see_and_touch_only_their_own_jobs) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  keypair server = keygen(d.dir, "server"), op = keygen(d.dir, "op"),
          alice = keygen(d.dir, "alice"), bob = keygen(d.dir, "bob"),
          carol = keygen(d.dir, "carol");
  char allow[600], allow_path[200];
  snprintf(allow, sizeof allow,
           "%s ops team role=operator\n%s alice\n"
           "%s bob jobs=alice-shared*\n%s carol role=agent\n",
           op.pub, alice.pub, bob.pub, carol.pub);
  snprintf(allow_path, sizeof allow_path, "%s/allowed", d.dir);
  tu_write_file(allow_path, allow);
  char *extra[] = {"--curve-key", server.path, "--curve-allow", allow_path,
                   "--metrics", "127.0.0.1:0", NULL};
  tu_daemon_start_in(&d, NULL, NULL, d.dir, extra);
  gnmr_agent *a1 = curve_agent(d.agents, "alice-job", server.pub, &alice);
  gnmr_agent *a2 = curve_agent(d.agents, "alice-shared-1", server.pub,
                               &alice);
  ck_assert(joins(a1, 3000) && joins(a2, 3000));
  double s[2] = {1, 4};
  for (uint64_t t = 1; t <= 3; t++) {
    ck_assert_int_eq(gnmr_agent_report_sums(a1, t, s, NULL, NULL), GNMR_OK);
    ck_assert_int_eq(gnmr_agent_wait(a1, t, 5000 * tu_slow()), GNMR_OK);
  }
  { /* /metrics, open to every local user, names no tenant's job */
    char url[256];
    int status;
    tu_metrics_url(&d, url, sizeof url);
    char *text = tu_http_get(url, &status);
    ck_assert_int_eq(status, 200);
    ck_assert_msg(strstr(text, "alice") == NULL, "%s", text);
    ck_assert_msg(strstr(text, "gnmr_job_step{run=\"") != NULL, "%s", text);
    free(text);
  }
  /* joining another tenant's job: refused, unless the grant matches */
  gnmr_agent *b1 = curve_observer(d.agents, "alice-job", server.pub, &bob);
  gnmr_agent *b2 = curve_observer(d.agents, "alice-shared-1", server.pub,
                                  &bob);
  gnmr_agent *c1 = curve_observer(d.agents, "alice-shared-1", server.pub,
                                  &carol);
  /* an operator key joins any job: alice's, as an observer */
  gnmr_agent *o1 = curve_observer(d.agents, "alice-job", server.pub, &op);
  ck_assert(joins(b2, 3000) && joins(o1, 3000));
  ck_assert(refused(b1, 3000) && refused(c1, 3000));
  char why[256];
  ck_assert_int_eq(gnmr_agent_last_error(b1, why, sizeof why),
                   GNMR_E_DENIED);
  ck_assert_msg(strstr(why, "belongs to another key"), "%s", why);
  /* queries: carol sees nothing of alice's, alice her own, ops all */
  run_result r = ctl_as(&d, server.pub, &carol, "jobs", NULL, NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_msg(strstr(r.out, "alice") == NULL, "%s", r.out);
  tu_run_free(&r);
  r = ctl_as(&d, server.pub, &carol, "status", "alice-job", NULL);
  ck_assert_int_ne(r.code, 0);
  ck_assert_msg(strstr(r.err, "unknown job") || strstr(r.err, "no running"),
                "%s", r.err);
  tu_run_free(&r);
  r = ctl_as(&d, server.pub, &carol, "history", "alice-job", NULL);
  ck_assert_int_ne(r.code, 0);
  tu_run_free(&r);
  /* stats: the daemon's counters (every tenant's traffic) are for
   * operators; an agent key gets its own jobs only */
  r = ctl_as(&d, server.pub, &carol, "stats", NULL, NULL);
  ck_assert_msg(r.code == 0, "%s", r.err);
  ck_assert_msg(strstr(r.out, "alice") == NULL &&
                    strstr(r.out, "reports ") == NULL &&
                    strstr(r.out, "hellos ") == NULL,
                "carol's stats: %s", r.out);
  tu_run_free(&r);
  r = ctl_as(&d, server.pub, &alice, "stats", NULL, NULL);
  ck_assert_msg(r.code == 0 && strstr(r.out, "job alice-job") &&
                    strstr(r.out, "hellos ") == NULL,
                "alice's stats: %s", r.out);
  tu_run_free(&r);
  r = ctl_as(&d, server.pub, &op, "stats", NULL, NULL);
  ck_assert_msg(r.code == 0 && strstr(r.out, "hellos ") &&
                    strstr(r.out, "job alice-job"),
                "the operator's stats: %s", r.out);
  tu_run_free(&r);
  /* every other query of the job: "unknown" to her, nothing of it shown */
  static const char *reads[] = {"runs", "decisions", "units", "top",
                                "status"};
  for (size_t i = 0; i < sizeof reads / sizeof reads[0]; i++) {
    r = ctl_as(&d, server.pub, &carol, (char *)reads[i], "alice-job", NULL);
    ck_assert_msg(r.code != 0, "carol's %s of alice-job: %s", reads[i],
                  r.out);
    ck_assert_msg(strstr(r.err, "unknown job") || strstr(r.err, "no running"),
                  "%s: %s", reads[i], r.err);
    ck_assert_msg(strstr(r.out, "alice") == NULL && r.out[0] == '\0',
                  "%s: %s", reads[i], r.out);
    tu_run_free(&r);
  }
  r = ctl_as(&d, server.pub, &alice, "status", "alice-job", NULL);
  ck_assert_msg(r.code == 0, "%s", r.err);
  tu_run_free(&r);
  r = ctl_as(&d, server.pub, &alice, "jobs", NULL, NULL);
  ck_assert(strstr(r.out, "alice-job") && strstr(r.out, "alice-shared-1"));
  tu_run_free(&r);
  r = ctl_as(&d, server.pub, &bob, "jobs", NULL, NULL);
  ck_assert(strstr(r.out, "alice-shared-1") && !strstr(r.out, "alice-job"));
  tu_run_free(&r);
  /* retuning, finishing and exporting are for operators */
  r = ctl_as(&d, server.pub, &alice, "set", "alice-job", "alpha=3");
  ck_assert_int_ne(r.code, 0);
  ck_assert_msg(strstr(r.err, "'set' is for operator keys"), "%s", r.err);
  tu_run_free(&r);
  r = ctl_as(&d, server.pub, &alice, "export", "alice-job", NULL);
  ck_assert_int_ne(r.code, 0);
  tu_run_free(&r);
  r = ctl_as(&d, server.pub, &op, "set", "alice-job", "alpha=3");
  ck_assert_msg(r.code == 0, "%s", r.err);
  tu_run_free(&r);
  r = ctl_as(&d, server.pub, &op, "jobs", NULL, NULL);
  ck_assert(strstr(r.out, "alice-job") && strstr(r.out, "alice-shared-1"));
  tu_run_free(&r);
  /* ownership survives a restart of gnmrd */
  gnmr_agent *agents[] = {a1, a2, b1, b2, c1, o1};
  for (int i = 0; i < 6; i++)
    gnmr_agent_close(&agents[i]);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_daemon_start_in(&d, NULL, NULL, d.dir, extra);
  r = ctl_as(&d, server.pub, &carol, "jobs", NULL, NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_msg(strstr(r.out, "alice") == NULL, "%s", r.out);
  tu_run_free(&r);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  /* a malformed grant is an error with its line */
  snprintf(allow, sizeof allow, "%s x role=boss\n", op.pub);
  tu_write_file(allow_path, allow);
  gnmr_allow al;
  char err[300];
  ck_assert_int_eq(gnmr__allow_load(allow_path, &al, err, sizeof err),
                   GNMR_E_PARSE);
  ck_assert_msg(strstr(err, ":1: role is operator or agent"), "%s", err);
  tu_rmrf(d.dir);
}
END_TEST

/* An export stream is its opener's: its id is not guessable (64 random
 * bits, not a counter), another key holding it (an agent key, or another
 * operator) is refused, and it only gives the chunk that comes next, so the
 * opener's export is never one with a hole that still parses. */
START_TEST(an_export_stream_is_its_openers_and_has_no_holes) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  const int EVENTS = 30000; /* about 3 MiB: three chunks or more */
  big_history(&d, EVENTS);
  keypair server = keygen(d.dir, "server"), op = keygen(d.dir, "op"),
          op2 = keygen(d.dir, "op2"), alice = keygen(d.dir, "alice");
  char allow[600], allow_path[200];
  snprintf(allow, sizeof allow,
           "%s ops role=operator\n%s ops2 role=operator\n%s alice "
           "role=agent jobs=*\n", op.pub, op2.pub, alice.pub);
  snprintf(allow_path, sizeof allow_path, "%s/allowed", d.dir);
  tu_write_file(allow_path, allow);
  char *extra[] = {"--curve-key", server.path, "--curve-allow", allow_path,
                   NULL};
  tu_daemon_start_in(&d, NULL, NULL, d.dir, extra);
  raw_peer po = raw_open_curve(d.admin, server.pub, op.pub, op.sec),
           p2 = raw_open_curve(d.admin, server.pub, op2.pub, op2.sec),
           pa = raw_open_curve(d.admin, server.pub, alice.pub, alice.sec);
  int ms = raw_reply_ms() * 4;
  /* two exports: ids that are not 1, 2 or each other's neighbours */
  raw_admin(&po, "export", "big", 0, 0);
  Gnmr__Envelope *e1 = raw_recv(&po, ms);
  raw_admin(&po, "export", "big", 0, 0);
  Gnmr__Envelope *e2 = raw_recv(&po, ms);
  ck_assert(e1 && e2 && e1->body_case == GNMR__ENVELOPE__BODY_ADMIN_REPLY &&
            e2->body_case == GNMR__ENVELOPE__BODY_ADMIN_REPLY);
  uint64_t s1 = e1->admin_reply->stream, s2 = e2->admin_reply->stream;
  ck_assert(e1->admin_reply->more && e1->admin_reply->chunk == 0);
  ck_assert_msg(s1 > 2 && s2 > 2 && s1 != s2 && s1 + 1 != s2 &&
                    s2 + 1 != s1,
                "stream ids %llu and %llu look like a counter's",
                (unsigned long long)s1, (unsigned long long)s2);
  size_t cap = (size_t)64 << 20, len = 0;
  char *text = malloc(cap);
  ck_assert_ptr_nonnull(text);
  size_t n = strlen(e1->admin_reply->json);
  memcpy(text, e1->admin_reply->json, n);
  len += n;
  gnmr__wire_free(&e1);
  gnmr__wire_free(&e2);
  /* an agent key, even one whose grant matches every job: DENIED */
  raw_admin(&pa, "export", "big", s1, 1);
  expect_error(&pa, GNMR_E_DENIED, "for operator keys");
  /* another operator holding the id: DENIED, the stream untouched */
  raw_admin(&p2, "export", "big", s1, 1);
  expect_error(&p2, GNMR_E_DENIED, "another request's");
  /* the opener asking for a chunk that is not the next: MISMATCH */
  raw_admin(&po, "export", "big", s1, 2);
  expect_error(&po, GNMR_E_MISMATCH, "sends chunk 1 next");
  /* the opener reads on: every chunk in order, one whole document */
  uint64_t chunk = 1;
  for (int more = 1; more;) {
    raw_admin(&po, "export", "big", s1, chunk);
    Gnmr__Envelope *e = raw_recv(&po, ms);
    ck_assert_msg(e && e->body_case == GNMR__ENVELOPE__BODY_ADMIN_REPLY,
                  "chunk %llu: %s", (unsigned long long)chunk,
                  e && e->body_case == GNMR__ENVELOPE__BODY_ERROR
                      ? e->error->message
                      : "no reply");
    ck_assert_uint_eq(e->admin_reply->chunk, chunk);
    n = strlen(e->admin_reply->json);
    ck_assert(len + n < cap);
    memcpy(text + len, e->admin_reply->json, n);
    len += n;
    more = e->admin_reply->more;
    gnmr__wire_free(&e);
    chunk++;
  }
  ck_assert_uint_ge(chunk, 3);
  json_error_t jerr;
  json_t *doc = json_loadb(text, len, 0, &jerr);
  ck_assert_msg(doc != NULL, "export is not JSON: %s", jerr.text);
  ck_assert_uint_eq(json_array_size(json_object_get(doc, "events")),
                    (size_t)EVENTS);
  json_decref(doc);
  free(text);
  /* finished: the id is gone for everyone */
  raw_admin(&po, "export", "big", s1, chunk);
  expect_error(&po, GNMR_E_NOJOB, "no such export stream");
  raw_close(&po);
  raw_close(&p2);
  raw_close(&pa);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Every allow-list mistake is refused at start with file:line, and none
 * widens a key's rights: a line longer than the reader's buffer (whose
 * tail fgets would have read as a grant of its own), a NUL byte, a key
 * listed twice, two roles or two patterns on one line, an empty pattern,
 * an unknown word=value. */
START_TEST(allow_list_mistakes_are_refused_with_their_line) {
  char dir[200], path[260], err[400];
  snprintf(dir, sizeof dir, "%s", tu_tmpdir());
  keypair a = keygen(dir, "a"), b = keygen(dir, "b");
  snprintf(path, sizeof path, "%s/allowed", dir);
  char pad[700];
  memset(pad, 'x', sizeof pad - 1);
  pad[sizeof pad - 1] = '\0';
  struct {
    char text[2000];
    const char *part;
  } cases[8];
  int n = 0;
  /* a comment of 600 bytes whose tail is "KEY role=operator" */
  snprintf(cases[n].text, sizeof cases[n].text,
           "%s role=agent\n# %.*s%s role=operator\n", a.pub, 470, pad,
           b.pub);
  cases[n++].part = ":2: a NUL byte or a line longer than 511 bytes";
  snprintf(cases[n].text, sizeof cases[n].text, "%s agent %s\n", a.pub, pad);
  cases[n++].part = ":1: a NUL byte or a line longer than 511 bytes";
  snprintf(cases[n].text, sizeof cases[n].text,
           "%s role=agent\n%s role=operator\n", a.pub, a.pub);
  cases[n++].part = ":2: this key is listed already (line 1)";
  snprintf(cases[n].text, sizeof cases[n].text,
           "%s role=agent role=operator\n", a.pub);
  cases[n++].part = ":1: two role= words";
  snprintf(cases[n].text, sizeof cases[n].text,
           "%s role=agent jobs=a* jobs=*\n", a.pub);
  cases[n++].part = ":1: jobs= takes one non-empty pattern";
  snprintf(cases[n].text, sizeof cases[n].text, "%s role=agent jobs=\n",
           a.pub);
  cases[n++].part = ":1: jobs= takes one non-empty pattern";
  snprintf(cases[n].text, sizeof cases[n].text, "%s role=agent Role=boss\n",
           a.pub);
  cases[n++].part = ":1: unknown word with '='";
  for (int i = 0; i < n; i++) {
    tu_write_file(path, cases[i].text);
    gnmr_allow al;
    ck_assert_msg(gnmr__allow_load(path, &al, err, sizeof err) ==
                      GNMR_E_PARSE,
                  "case %d was accepted", i);
    ck_assert_msg(strstr(err, cases[i].part) != NULL, "case %d: '%s' lacks "
                  "'%s'", i, err, cases[i].part);
  }
  /* a NUL byte inside a line */
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "%s role=agent", a.pub);
  fputc('\0', f);
  fprintf(f, "\n%s role=operator\n", b.pub);
  fclose(f);
  gnmr_allow al;
  ck_assert_int_eq(gnmr__allow_load(path, &al, err, sizeof err),
                   GNMR_E_PARSE);
  ck_assert_msg(strstr(err, ":1: a NUL byte"), "%s", err);
  /* gnmrd refuses to start on such a file, naming the line */
  tu_write_file(path, cases[0].text);
  keypair server = keygen(dir, "server");
  char *argv[] = {"gnmrd", "--curve-key", server.path, "--curve-allow", path,
                  "--check-config", "/dev/null", NULL};
  run_result r = tu_run("gnmrd", argv, NULL);
  ck_assert_int_ne(r.code, 0);
  ck_assert_msg(strstr(r.err, ":2: a NUL byte or a line longer"), "%s",
                r.err);
  tu_run_free(&r);
  /* and a correct list still loads, its rights as written */
  snprintf(cases[0].text, sizeof cases[0].text,
           "%s a team role=agent jobs=a-*\n%s role=operator\n", a.pub,
           b.pub);
  tu_write_file(path, cases[0].text);
  ck_assert_int_eq(gnmr__allow_load(path, &al, err, sizeof err), GNMR_OK);
  ck_assert(!gnmr__allow_operator(&al, a.pub) &&
            gnmr__allow_operator(&al, b.pub));
  ck_assert(gnmr__allow_may(&al, a.pub, b.pub, "a-1") &&
            !gnmr__allow_may(&al, a.pub, b.pub, "b-1"));
  ck_assert_str_eq(gnmr__allow_find(&al, a.pub)->name, "a team");
  gnmr__allow_clear(&al);
  tu_rmrf(dir);
}
END_TEST

/* owns=GLOB reserves a namespace: a name inside another key's owns=
 * pattern cannot be started by a squatter (who would then own, read and
 * observe its owner's later runs); its owner and operators start it. */
START_TEST(a_reserved_name_is_its_owners_to_start) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  keypair server = keygen(d.dir, "server"), op = keygen(d.dir, "op"),
          a = keygen(d.dir, "a"), b = keygen(d.dir, "b");
  char allow[600], allow_path[200];
  snprintf(allow, sizeof allow,
           "%s ops role=operator\n%s team-a owns=team-a-*\n%s team-b\n",
           op.pub, a.pub, b.pub);
  snprintf(allow_path, sizeof allow_path, "%s/allowed", d.dir);
  tu_write_file(allow_path, allow);
  char *extra[] = {"--curve-key", server.path, "--curve-allow", allow_path,
                   NULL};
  tu_daemon_start_in(&d, NULL, NULL, d.dir, extra);
  gnmr_agent *sq = curve_agent(d.agents, "team-a-train", server.pub, &b);
  ck_assert(refused_with(sq, GNMR_E_DENIED, 3000));
  char why[256];
  gnmr_agent_last_error(sq, why, sizeof why);
  ck_assert_msg(strstr(why, "reserved for another key (team-a, "
                            "owns=team-a-*"), "%s", why);
  gnmr_agent *own = curve_agent(d.agents, "team-a-train", server.pub, &a);
  gnmr_agent *ops = curve_agent(d.agents, "team-a-ops", server.pub, &op);
  gnmr_agent *elsewhere = curve_agent(d.agents, "team-b-x", server.pub, &b);
  ck_assert(joins(own, 3000) && joins(ops, 3000) && joins(elsewhere, 3000));
  run_result r = ctl_as(&d, server.pub, &b, "jobs", NULL, NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_msg(strstr(r.out, "team-a") == NULL, "%s", r.out);
  tu_run_free(&r);
  gnmr_agent *all[] = {sq, own, ops, elsewhere};
  for (int i = 0; i < 4; i++)
    gnmr_agent_close(&all[i]);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  /* one owns= a line; an empty one is refused with its line */
  snprintf(allow, sizeof allow, "%s x owns=a* owns=b*\n%s y owns=\n",
           a.pub, b.pub);
  tu_write_file(allow_path, allow);
  gnmr_allow al;
  char err[300];
  ck_assert_int_eq(gnmr__allow_load(allow_path, &al, err, sizeof err),
                   GNMR_E_PARSE);
  ck_assert_msg(strstr(err, ":1: owns= takes one non-empty pattern"), "%s",
                err);
  tu_rmrf(d.dir);
}
END_TEST

/* Whether `gnmrctl jobs` (as k) shows job in state within ms. */
static int job_state_is(const tu_daemon *d, const char *server_pub,
                        const keypair *k, const char *job, const char *state,
                        int ms) {
  if (getenv("GNMR_VALGRIND") != NULL)
    ms *= 10;
  for (int i = 0; i <= ms / 100; i++) {
    run_result r = ctl_as(d, server_pub, k, "jobs", NULL, NULL);
    int found = 0;
    for (char *line = strtok(r.out, "\n"); line && !found;
         line = strtok(NULL, "\n"))
      found = strncmp(line, job, strlen(job)) == 0 &&
              line[strlen(job)] == ' ' && strstr(line, state) != NULL;
    tu_run_free(&r);
    if (found)
      return 1;
    tu_sleep_ms(100);
  }
  return 0;
}

/* A job's name stays its owner's after the job ends and after gnmrd
 * restarts: another tenant's agent (rank or observer) cannot start a new
 * run of it, which would hide the owner's runs from `gnmrctl jobs` and lock
 * the owner out of the name; a key whose grant matches the name can. */
START_TEST(a_job_name_stays_its_owners_after_the_job_ends) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  keypair server = keygen(d.dir, "server"), op = keygen(d.dir, "op"),
          alice = keygen(d.dir, "alice"), bob = keygen(d.dir, "bob"),
          carol = keygen(d.dir, "carol");
  char allow[600], allow_path[200];
  snprintf(allow, sizeof allow,
           "%s ops role=operator\n%s alice\n%s bob jobs=alice-shared*\n"
           "%s carol role=agent\n",
           op.pub, alice.pub, bob.pub, carol.pub);
  snprintf(allow_path, sizeof allow_path, "%s/allowed", d.dir);
  tu_write_file(allow_path, allow);
  char *extra[] = {"--curve-key", server.path, "--curve-allow", allow_path,
                   NULL};
  tu_daemon_start_in(&d, NULL, NULL, d.dir, extra);
  double s[2] = {1, 4};
  const char *mine[] = {"alice-solo", "alice-shared-2"};
  for (int i = 0; i < 2; i++) {
    gnmr_agent *a = curve_agent(d.agents, mine[i], server.pub, &alice);
    ck_assert(joins(a, 3000));
    for (uint64_t t = 1; t <= 2; t++) {
      ck_assert_int_eq(gnmr_agent_report_sums(a, t, s, NULL, NULL), GNMR_OK);
      ck_assert_int_eq(gnmr_agent_wait(a, t, 5000 * tu_slow()), GNMR_OK);
    }
    gnmr_agent_close(&a); /* its only rank says Bye: the job is finished */
    ck_assert_msg(job_state_is(&d, server.pub, &op, mine[i], "finished",
                               5000), "%s did not finish", mine[i]);
  }
  for (int pass = 0; pass < 2; pass++) {
    /* carol may not start a new run of alice's name, as a rank or as an
     * observer */
    gnmr_agent *c1 = curve_agent(d.agents, "alice-solo", server.pub, &carol);
    gnmr_agent *c2 = curve_observer(d.agents, "alice-solo", server.pub,
                                    &carol);
    ck_assert(refused(c1, 3000) && refused(c2, 3000));
    char why[256];
    ck_assert_int_eq(gnmr_agent_last_error(c1, why, sizeof why),
                     GNMR_E_DENIED);
    ck_assert_msg(strstr(why, "belongs to another key"), "%s", why);
    gnmr_agent_close(&c1);
    gnmr_agent_close(&c2);
    run_result r = ctl_as(&d, server.pub, &carol, "jobs", NULL, NULL);
    ck_assert_int_eq(r.code, 0);
    ck_assert_msg(strstr(r.out, "alice") == NULL, "%s", r.out);
    tu_run_free(&r);
    r = ctl_as(&d, server.pub, &alice, "jobs", NULL, NULL);
    ck_assert_msg(strstr(r.out, "alice-solo") && strstr(r.out, "finished"),
                  "%s", r.out);
    tu_run_free(&r);
    /* and after a restart, which must read the owners back */
    ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
    tu_daemon_start_in(&d, NULL, NULL, d.dir, extra);
  }
  /* bob's grant matches alice-shared-*: he may start its next run */
  gnmr_agent *b = curve_agent(d.agents, "alice-shared-2", server.pub, &bob);
  ck_assert(joins(b, 3000));
  gnmr_agent_close(&b);
  /* alice starts her name's next run; carol starts a job of her own */
  gnmr_agent *a = curve_agent(d.agents, "alice-solo", server.pub, &alice);
  gnmr_agent *c = curve_agent(d.agents, "carol-job", server.pub, &carol);
  ck_assert(joins(a, 3000) && joins(c, 3000));
  ck_assert_int_eq(gnmr_agent_report_sums(a, 1, s, NULL, NULL), GNMR_OK);
  ck_assert_int_eq(gnmr_agent_wait(a, 1, 5000 * tu_slow()), GNMR_OK);
  run_result r = ctl_as(&d, server.pub, &alice, "runs", "alice-solo", NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_msg(strstr(r.out, "running") && strstr(r.out, "finished"), "%s",
                r.out);
  tu_run_free(&r);
  gnmr_agent_close(&a);
  gnmr_agent_close(&c);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* [limits] max_jobs_per_key and max_units_per_key: one tenant cannot take
 * gnmrd's whole capacity from the others; operator keys are not bound. */
START_TEST(one_tenant_cannot_take_every_job_or_unit) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  keypair server = keygen(d.dir, "server"), op = keygen(d.dir, "op"),
          alice = keygen(d.dir, "alice"), carol = keygen(d.dir, "carol");
  char allow[600], allow_path[200], conf_path[200];
  snprintf(allow, sizeof allow, "%s ops role=operator\n%s alice\n%s carol\n",
           op.pub, alice.pub, carol.pub);
  snprintf(allow_path, sizeof allow_path, "%s/allowed", d.dir);
  tu_write_file(allow_path, allow);
  snprintf(conf_path, sizeof conf_path, "%s/gnmrd.conf", d.dir);
  tu_write_file(conf_path, "[limits]\nmax_jobs_per_key = 2\n"
                           "max_units_per_key = 5\n");
  char *extra[] = {"--config", conf_path, "--curve-key", server.path,
                   "--curve-allow", allow_path, NULL};
  tu_daemon_start_in(&d, NULL, NULL, d.dir, extra);
  /* alice: two jobs, then BUSY naming the limit and her */
  gnmr_agent *a1 = curve_agent(d.agents, "alice-1", server.pub, &alice);
  ck_assert(joins(a1, 3000));
  gnmr_agent *a2 = curve_agent(d.agents, "alice-2", server.pub, &alice);
  ck_assert(joins(a2, 3000));
  gnmr_agent *a3 = curve_agent(d.agents, "alice-3", server.pub, &alice);
  ck_assert(refused_with(a3, GNMR_E_BUSY, 3000));
  char why[256];
  gnmr_agent_last_error(a3, why, sizeof why);
  ck_assert_msg(strstr(why, "alice owns 2 live jobs already ([limits] "
                            "max_jobs_per_key)"), "%s", why);
  /* carol is not held back by alice's share */
  gnmr_agent *c1 = curve_agent(d.agents, "carol-1", server.pub, &carol);
  ck_assert(joins(c1, 3000));
  /* 2 units held, 4 more asked, 5 allowed: RANGE naming the limit */
  gnmr_agent *c2 = curve_agent_n(d.agents, "carol-2", server.pub, &carol, 4);
  ck_assert(refused_with(c2, GNMR_E_RANGE, 3000));
  gnmr_agent_last_error(c2, why, sizeof why);
  ck_assert_msg(strstr(why, "the jobs of carol hold at most 5 units "
                            "([limits] max_units_per_key); 3 are free"),
                "%s", why);
  /* 3 fit */
  gnmr_agent *c3 = curve_agent_n(d.agents, "carol-3", server.pub, &carol, 3);
  ck_assert(joins(c3, 3000));
  /* a job that ends gives its share back */
  gnmr_agent_close(&a1);
  gnmr_agent *a4 = curve_agent(d.agents, "alice-4", server.pub, &alice);
  ck_assert(joins(a4, 10000));
  /* an operator key is bound by the global limits only */
  gnmr_agent *o[3];
  for (int i = 0; i < 3; i++) {
    char job[32];
    snprintf(job, sizeof job, "ops-%d", i);
    o[i] = curve_agent_n(d.agents, job, server.pub, &op, 6);
    ck_assert(joins(o[i], 3000));
  }
  run_result r = ctl_as(&d, server.pub, &op, "stats", NULL, NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_msg(counter_of(r.out, "refused_key_jobs") >= 1 &&
                    counter_of(r.out, "refused_key_units") >= 1,
                "%s", r.out);
  tu_run_free(&r);
  gnmr_agent *all[] = {a2, a3, a4, c1, c2, c3, o[0], o[1], o[2]};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    gnmr_agent_close(&all[i]);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Issue 47: with the default limits one agent key took all 1,024 job
 * places. The defaults now give a key a quarter of them: its 257th live
 * job is refused (BUSY), and another key's job is still welcomed. */
START_TEST(the_default_limits_leave_room_for_other_keys) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  keypair server = keygen(d.dir, "server"), op = keygen(d.dir, "op"),
          mal = keygen(d.dir, "mal"), eve = keygen(d.dir, "eve");
  char allow[600], allow_path[200];
  snprintf(allow, sizeof allow, "%s ops role=operator\n%s mal\n%s eve\n",
           op.pub, mal.pub, eve.pub);
  snprintf(allow_path, sizeof allow_path, "%s/allowed", d.dir);
  tu_write_file(allow_path, allow);
  char *extra[] = {"--curve-key", server.path, "--curve-allow", allow_path,
                   NULL};
  tu_daemon_start_in(&d, NULL, NULL, d.dir, extra);
  enum { N = 257 };
  void *ctx = zmq_ctx_new();
  static void *sock[N];
  static char *units[] = {"u"};
  int welcomed = 0, busy = 0, zero = 0;
  for (int i = 0; i < N; i++) {
    raw_peer p = {ctx, zmq_socket(ctx, ZMQ_DEALER)};
    sock[i] = p.sock;
    zmq_setsockopt(p.sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(p.sock, ZMQ_CURVE_SERVERKEY, server.pub, 41);
    zmq_setsockopt(p.sock, ZMQ_CURVE_PUBLICKEY, mal.pub, 41);
    zmq_setsockopt(p.sock, ZMQ_CURVE_SECRETKEY, mal.sec, 41);
    ck_assert_int_eq(zmq_connect(p.sock, d.agents), 0);
    char job[32];
    snprintf(job, sizeof job, "mal-%d", i);
    hello(&p, job, 0, 1, units, 1, 2.0);
    Gnmr__Envelope *e = raw_recv(&p, raw_reply_ms());
    ck_assert_ptr_nonnull(e);
    if (e->body_case == GNMR__ENVELOPE__BODY_WELCOME)
      welcomed++;
    else if (e->body_case == GNMR__ENVELOPE__BODY_ERROR &&
             e->error->code == GNMR_E_BUSY &&
             strstr(e->error->message, "max_jobs_per_key"))
      busy++;
    gnmr__wire_free(&e);
  }
  ck_assert_int_eq(welcomed, 256);
  ck_assert_int_eq(busy, 1);
  raw_peer q = raw_open_curve(d.agents, server.pub, eve.pub, eve.sec);
  hello(&q, "eve-1", 0, 1, units, 1, 2.0);
  Gnmr__Envelope *e = expect_body(&q, GNMR__ENVELOPE__BODY_WELCOME);
  gnmr__wire_free(&e);
  raw_close(&q);
  for (int i = 0; i < N; i++)
    zmq_close(sock[i]);
  zmq_ctx_term(ctx);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Issue 47: one agent key filled every place of the agents endpoint
 * (one message per connection, then silence), and other tenants got BUSY.
 * With tenancy on, an agent key holds at most a quarter of
 * max_connections there. With max_connections = 8: mal's third
 * connection is refused, naming why, and eve is welcomed. */
START_TEST(one_key_holds_a_quarter_of_the_agent_places) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  keypair server = keygen(d.dir, "server"), op = keygen(d.dir, "op"),
          mal = keygen(d.dir, "mal"), eve = keygen(d.dir, "eve");
  char allow[600], allow_path[200], conf_path[200];
  snprintf(allow, sizeof allow, "%s ops role=operator\n%s mal\n%s eve\n",
           op.pub, mal.pub, eve.pub);
  snprintf(allow_path, sizeof allow_path, "%s/allowed", d.dir);
  tu_write_file(allow_path, allow);
  snprintf(conf_path, sizeof conf_path, "%s/gnmrd.conf", d.dir);
  tu_write_file(conf_path, "[limits]\nmax_connections = 8\n");
  char *extra[] = {"--config", conf_path, "--curve-key", server.path,
                   "--curve-allow", allow_path, NULL};
  tu_daemon_start_in(&d, NULL, NULL, d.dir, extra);
  static char *units[] = {"u"};
  raw_peer m[3];
  for (int i = 0; i < 3; i++) {
    char job[32];
    snprintf(job, sizeof job, "mal-%d", i);
    m[i] = raw_open_curve(d.agents, server.pub, mal.pub, mal.sec);
    hello(&m[i], job, 0, 1, units, 1, 2.0);
    if (i < 2) {
      Gnmr__Envelope *e = expect_body(&m[i], GNMR__ENVELOPE__BODY_WELCOME);
      gnmr__wire_free(&e);
    } else {
      expect_error(&m[i], GNMR_E_BUSY, "agent connections already");
    }
  }
  raw_peer q = raw_open_curve(d.agents, server.pub, eve.pub, eve.sec);
  hello(&q, "eve-1", 0, 1, units, 1, 2.0);
  Gnmr__Envelope *e = expect_body(&q, GNMR__ENVELOPE__BODY_WELCOME);
  gnmr__wire_free(&e);
  run_result r = ctl_as(&d, server.pub, &op, "stats", NULL, NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_msg(counter_of(r.out, "refused_key_places") >= 1, "%s", r.out);
  tu_run_free(&r);
  raw_close(&q);
  for (int i = 0; i < 3; i++)
    raw_close(&m[i]);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Admin places with tenancy on: an agent key holds at most 16 of the 64
 * admin connections, and agent keys together at most 56: the last 8 are
 * kept for operator keys. Four agent keys open 17, 16, 16 and 16
 * connections, each sending a request and reading its answer: before,
 * they took all 64 places and the operator's gnmrctl got BUSY. */
START_TEST(admin_places_per_key_and_a_reserve_for_operators) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  keypair server = keygen(d.dir, "server"), op = keygen(d.dir, "op");
  keypair k[4];
  char allow[1200], allow_path[200];
  size_t off = (size_t)snprintf(allow, sizeof allow, "%s ops role=operator\n",
                                op.pub);
  for (int i = 0; i < 4; i++) {
    char name[16];
    snprintf(name, sizeof name, "t%d", i);
    k[i] = keygen(d.dir, name);
    off += (size_t)snprintf(allow + off, sizeof allow - off,
                            "%s %s role=agent\n", k[i].pub, name);
  }
  snprintf(allow_path, sizeof allow_path, "%s/allowed", d.dir);
  tu_write_file(allow_path, allow);
  char *extra[] = {"--curve-key", server.path, "--curve-allow", allow_path,
                   NULL};
  tu_daemon_start_in(&d, NULL, NULL, d.dir, extra);
  enum { PER = 16 };
  raw_peer conns[4][PER + 1];
  int open[4][PER + 1] = {{0}};
  int answered[4] = {0}, refused_key = 0, refused_reserve = 0;
  for (int i = 0; i < 4; i++) {
    int n = i == 0 ? PER + 1 : PER;
    for (int c = 0; c < n; c++) {
      conns[i][c] = raw_open_curve(d.admin, server.pub, k[i].pub, k[i].sec);
      raw_admin(&conns[i][c], "jobs", "", 0, 0);
      Gnmr__Envelope *env = raw_recv(&conns[i][c], 10000 * tu_slow());
      ck_assert_msg(env != NULL, "key %d connection %d: no answer", i, c);
      if (env->body_case == GNMR__ENVELOPE__BODY_ADMIN_REPLY) {
        answered[i]++;
        open[i][c] = 1; /* it stays, holding its place */
      } else { /* refused: it goes, as gnmrctl would */
        ck_assert_int_eq(env->body_case, GNMR__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(env->error->code, GNMR_E_BUSY);
        ck_assert_msg(strstr(env->error->message, "holds 16 admin "
                                                  "connections"),
                      "%s", env->error->message);
        if (answered[i] == PER)
          refused_key++;
        else
          refused_reserve++;
      }
      gnmr__wire_free(&env);
      if (!open[i][c])
        raw_close(&conns[i][c]);
    }
  }
  /* 16 each for the first three keys (the first's 17th refused), 8 for
   * the fourth: 56 agent-key places, the other 8 kept */
  ck_assert_int_eq(answered[0], PER);
  ck_assert_int_eq(answered[1], PER);
  ck_assert_int_eq(answered[2], PER);
  ck_assert_int_eq(answered[3], 64 - 8 - 3 * PER);
  ck_assert_int_eq(refused_key, 1);
  ck_assert_int_eq(refused_reserve, PER - (64 - 8 - 3 * PER));
  /* the operator is answered while they all stay */
  run_result r = ctl_as(&d, server.pub, &op, "jobs", NULL, NULL);
  ck_assert_msg(r.code == 0, "the operator: %s", r.err);
  tu_run_free(&r);
  r = ctl_as(&d, server.pub, &op, "stats", NULL, NULL);
  ck_assert_msg(r.code == 0, "the operator's stats: %s", r.err);
  const char *kp = strstr(r.out, "refused_key_places ");
  unsigned long long places = 0;
  ck_assert_msg(kp != NULL && sscanf(kp + 19, "%llu", &places) == 1 &&
                    places >= 1 + 8,
                "stats: %s", r.out);
  tu_run_free(&r);
  for (int i = 0; i < 4; i++)
    for (int c = 0; c < (i == 0 ? PER + 1 : PER); c++)
      if (open[i][c])
        raw_close(&conns[i][c]);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("security");
  TCase *tc = tcase_create("curve");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, keygen_writes_a_private_pair_and_never_overwrites);
  tcase_add_test(tc, only_listed_keys_are_served_and_refusals_are_counted);
  tcase_add_test(tc, tenants_see_and_touch_only_their_own_jobs);
  tcase_add_test(tc, an_export_stream_is_its_openers_and_has_no_holes);
  tcase_add_test(tc, allow_list_mistakes_are_refused_with_their_line);
  tcase_add_test(tc, a_job_name_stays_its_owners_after_the_job_ends);
  tcase_add_test(tc, a_reserved_name_is_its_owners_to_start);
  tcase_add_test(tc, one_tenant_cannot_take_every_job_or_unit);
  tcase_add_test(tc, the_default_limits_leave_room_for_other_keys);
  tcase_add_test(tc, one_key_holds_a_quarter_of_the_agent_places);
  tcase_add_test(tc, curve_setup_errors_and_network_endpoints_without_curve);
  tcase_add_test(tc, agent_refuses_partial_or_malformed_curve_settings);
  tcase_add_test(tc, admin_places_per_key_and_a_reserve_for_operators);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
