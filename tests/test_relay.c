/* SPDX-License-Identifier: MIT */
/* test_relay.c — node relays (gnmrd --relay-to, docs/protocol.md "Node
 * relays") between real agents and a real gnmrd: the decisions of a job
 * whose two nodes report through relays are the decisions of the same
 * job reporting to gnmrd directly, bit for bit; a rank that does not
 * report leaves its units missing; a relay killed and started again, and
 * a gnmrd restarted, cost the node some steps, never the job. */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agentutil.h"
#include "keys.h"
#include "keyutil.h"
#include "rawpeer.h"
#include "storeutil.h"
#include "gnmr/agent.h"
#include "testutil.h"

extern char **environ;

#define RANKS 6
#define PER_NODE 3 /* three shards a node: their order shows in the sum */

typedef struct relay_proc {
  pid_t pid;
  char ep[200];
  char log[200];
} relay_proc;

static void relay_start_x(relay_proc *r, const char *dir, int node,
                          const char *upstream, char *const *extra) {
  char path[512];
  snprintf(path, sizeof path, "%s/gnmrd", tu_bin_dir());
  snprintf(r->ep, sizeof r->ep, "ipc://%s/node%d.sock", dir, node);
  snprintf(r->log, sizeof r->log, "%s/relay%d.err", dir, node);
  char *argv[16];
  int n = tu_valgrind_argv(argv);
  argv[n++] = path;
  argv[n++] = "--relay-to";
  argv[n++] = (char *)upstream;
  argv[n++] = "--agents";
  argv[n++] = r->ep;
  for (int i = 0; extra != NULL && extra[i] != NULL && n < 15; i++)
    argv[n++] = extra[i];
  argv[n] = NULL;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, r->log,
                                   O_WRONLY | O_CREAT | O_APPEND, 0600);
  const char *exe = getenv("GNMR_VALGRIND") ? "/usr/bin/valgrind" : path;
  int rv = posix_spawn(&r->pid, exe, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  ck_assert_msg(rv == 0, "spawn relay: %s", strerror(rv));
  tu_track_daemon(r->pid, 1);
}

static void relay_start(relay_proc *r, const char *dir, int node,
                        const char *upstream) {
  relay_start_x(r, dir, node, upstream, NULL);
}

/* Stops a relay; returns its exit status (SIGTERM: 0 when clean). */
static int relay_stop(relay_proc *r, int sig) {
  int st = 0;
  kill(r->pid, sig);
  waitpid(r->pid, &st, 0);
  tu_track_daemon(r->pid, 0);
  r->pid = 0;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Each rank's units: w on every rank (a shard each), y on ranks 2 and 3
 * (one on each node), and its own x<rank>; job-wide ids as a framework
 * gives them. */
static const char *names_of[RANKS][3] = {
    {"w", "x0", NULL}, {"w", "x1", NULL}, {"w", "y", "x2"},
    {"w", "y", "x3"},  {"w", "x4", NULL}, {"w", "x5", NULL}};
static const uint32_t ids_of[RANKS][3] = {{0, 2, 0}, {0, 3, 0}, {0, 1, 4},
                                          {0, 1, 5}, {0, 6, 0}, {0, 7, 0}};

static uint32_t n_units_of(int r) { return names_of[r][2] ? 3 : 2; }

static gnmr_agent *open_rank_n(const char *endpoint, const char *job, int r,
                               uint32_t node_ranks) {
  gnmr_agent_config c =
      tu_agent_config(endpoint, job, names_of[r], n_units_of(r));
  c.rank = (uint32_t)r;
  c.reporters = RANKS;
  c.node_ranks = node_ranks;
  /* every unit risky at every step: each decision carries every g, d
   * and s, all of them compared */
  c.params.alpha = c.params.beta = 1e-3;
  c.unit_ids = ids_of[r];
  c.barrier_ms = 2000 * (uint32_t)tu_slow();
  gnmr_agent *a = NULL;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  return a;
}

static gnmr_agent *open_rank(const char *endpoint, const char *job, int r) {
  return open_rank_n(endpoint, job, r, PER_NODE);
}

static void wait_joined(gnmr_agent **a, int n) {
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < 1000 * tu_slow() && !gnmr_agent_joined(a[i]); k++)
      tu_sleep_ms(10);
    ck_assert_msg(gnmr_agent_joined(a[i]), "rank %d did not join", i);
  }
}

/* Rank r's sums at step t: each shard its own scale and noise (sums of
 * six such differ in their last bits by their order on about half the
 * steps), a spike in w at steps 20-21 (on every rank) and in y at step
 * 30 (one rank). */
static void sums_of(int r, uint64_t t, double *s) {
  uint64_t h = (t * 2654435761u) ^ ((uint64_t)r * 40503u);
  for (uint32_t k = 0; k < n_units_of(r); k++) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    double noise = 0.9 + 0.2 * (double)(h >> 11) / 9007199254740992.0;
    double v = (1.0 + 0.37 * r + 0.11 * k) * noise;
    if (strcmp(names_of[r][k], "w") == 0 && (t == 20 || t == 21))
      v *= 40;
    if (strcmp(names_of[r][k], "y") == 0 && t == 30 && r == 3)
      v *= 60;
    s[k] = v * v * 1e-3;
  }
}

typedef struct seen {
  uint32_t n, units[4];
  double g[4], d[4], s[4];
  uint8_t routes[3];
} seen;

static void look(gnmr_agent *a, int r, seen *o) {
  memset(o, 0, sizeof *o);
  gnmr_agent_risky(a, o->units, o->g, o->d, o->s, 4, &o->n);
  gnmr_agent_routes(a, o->routes, n_units_of(r));
}

/* The job's exceed events (each unit over its threshold at each step,
 * with its norm, g, d and s, as the store has them), without what
 * differs between two jobs of the same steps: their names, runs and
 * times. */
static char *exceed_history(const tu_daemon *d, const char *job,
                            size_t *events) {
  char name[64];
  snprintf(name, sizeof name, "%s", job);
  char *args[] = {"history", name, "--kind", "exceed", "--limit", "100000",
                  "--json", NULL};
  run_result r = ctl(d, args);
  ck_assert_msg(r.code == 0, "%s", r.err);
  char *o = r.out, *w = r.out;
  *events = 0;
  while (*o) {
    if (strncmp(o, "\"at\":", 5) == 0 || strncmp(o, "\"job\":", 6) == 0 ||
        strncmp(o, "\"run\":", 6) == 0) {
      o = strchr(o, ':') + 1;
      while (*o == ' ')
        o++;
      if (*o == '"')
        o = strchr(o + 1, '"') + 1;
      else
        while (*o && *o != ',' && *o != '}')
          o++;
      continue;
    }
    *events += strncmp(o, "\"kind\":", 7) == 0;
    *w++ = *o++;
  }
  *w = '\0';
  free(r.err);
  return r.out;
}

START_TEST(relayed_nodes_get_the_direct_jobs_decisions_bit_for_bit) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  relay_proc rl[2];
  for (int k = 0; k < 2; k++)
    relay_start(&rl[k], d.dir, k, d.agents);
  /* the same job three ways: direct with node_ranks (gnmrd sums node by
   * node), through the relays, and direct without (plain rank order) */
  gnmr_agent *direct[RANKS], *relayed[RANKS], *plain[RANKS];
  for (int r = 0; r < RANKS; r++) {
    direct[r] = open_rank(d.agents, "direct", r);
    relayed[r] = open_rank(rl[r / PER_NODE].ep, "relayed", r);
    plain[r] = open_rank_n(d.agents, "plain", r, 0);
  }
  wait_joined(direct, RANKS);
  wait_joined(relayed, RANKS);
  wait_joined(plain, RANKS);
  /* a replica of rank 2 observing through node 1's relay (passed
   * through: its own connection to gnmrd) */
  gnmr_agent_config oc =
      tu_agent_config(rl[1].ep, "relayed", names_of[2], n_units_of(2));
  oc.reporters = RANKS;
  oc.node_ranks = PER_NODE;
  oc.unit_ids = ids_of[2];
  oc.params.alpha = oc.params.beta = 1e-3;
  oc.barrier_ms = 2000 * (uint32_t)tu_slow();
  oc.observer = 1;
  gnmr_agent *obs = NULL;
  ck_assert_int_eq(gnmr_agent_open(&oc, &obs), GNMR_OK);
  wait_joined(&obs, 1);
  int risky_steps = 0;
  for (uint64_t t = 1; t <= 40; t++) {
    for (int r = 0; r < RANKS; r++) {
      double s[3];
      sums_of(r, t, s);
      ck_assert_int_eq(gnmr_agent_report_sums(direct[r], t, s, NULL, NULL),
                       GNMR_OK);
      ck_assert_int_eq(gnmr_agent_report_sums(relayed[r], t, s, NULL, NULL),
                       GNMR_OK);
      ck_assert_int_eq(gnmr_agent_report_sums(plain[r], t, s, NULL, NULL),
                       GNMR_OK);
    }
    for (int r = 0; r < RANKS; r++) {
      ck_assert_msg(gnmr_agent_wait(direct[r], t, 10000 * tu_slow()) == 0,
                    "direct rank %d: no decision of step %llu", r,
                    (unsigned long long)t);
      ck_assert_msg(gnmr_agent_wait(relayed[r], t, 10000 * tu_slow()) == 0,
                    "relayed rank %d: no decision of step %llu", r,
                    (unsigned long long)t);
      ck_assert_int_eq(gnmr_agent_wait(plain[r], t, 10000 * tu_slow()), 0);
      seen a, b;
      look(direct[r], r, &a);
      look(relayed[r], r, &b);
      if (r == 2) { /* the observer holds rank 2's decision */
        seen o;
        ck_assert_int_eq(gnmr_agent_wait(obs, t, 10000 * tu_slow()), 0);
        look(obs, 2, &o);
        ck_assert_msg(memcmp(&o, &b, sizeof o) == 0,
                      "step %llu: the observer's decision differs",
                      (unsigned long long)t);
      }
      ck_assert_msg(memcmp(&a, &b, sizeof a) == 0,
                    "step %llu rank %d: the relayed decision differs "
                    "(%u risky, %u direct)", (unsigned long long)t, r, b.n,
                    a.n);
      risky_steps += r == 0 && a.n > 0;
    }
  }
  ck_assert_int_ge(risky_steps, 30); /* every unit's g, d, s compared */
  /* the history's norms too: the same as the direct job's, once the
   * store has every step; summed in plain rank order, some differ (the
   * order shows in the data) */
  size_t nd = 0, nr = 0, np = 0;
  char *hd = NULL, *hr = NULL, *hp = NULL;
  for (int k = 0; k < 100 * tu_slow(); k++) {
    free(hd), free(hr), free(hp);
    hd = exceed_history(&d, "direct", &nd);
    hr = exceed_history(&d, "relayed", &nr);
    hp = exceed_history(&d, "plain", &np);
    if (nd >= 8 * 35 && nd == nr && nd == np)
      break;
    tu_sleep_ms(100);
  }
  ck_assert_msg(nd >= 8 * 35 && nd == nr && nd == np,
                "%zu, %zu and %zu exceed events", nd, nr, np);
  ck_assert_msg(strcmp(hd, hr) == 0, "the relayed job's history differs");
  ck_assert_msg(strcmp(hd, hp) != 0,
                "summed in plain rank order, nothing differs: this data "
                "cannot tell the orders apart");
  free(hd), free(hr), free(hp);
  for (int r = 0; r < RANKS; r++) {
    gnmr_agent_close(&direct[r]);
    gnmr_agent_close(&relayed[r]);
    gnmr_agent_close(&plain[r]);
  }
  gnmr_agent_close(&obs);
  for (int k = 0; k < 2; k++)
    ck_assert_int_eq(relay_stop(&rl[k], SIGTERM), 0);
  /* the central gnmrd saw two reporters for the relayed job, four for
   * the direct one */
  char *args[] = {"status", "relayed", "--json", NULL};
  run_result st = ctl(&d, args);
  ck_assert_int_eq(st.code, 0);
  ck_assert_msg(strstr(st.out, "\"reporters\": 2") != NULL, "%s", st.out);
  tu_run_free(&st);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* Reports every rank but `skip` at step t through the agents, and waits
 * for the decision on rank `watch`; returns 0 when it came. */
static int step_all(gnmr_agent **a, uint64_t t, int skip, int watch,
                    int timeout_ms) {
  for (int r = 0; r < RANKS; r++) {
    double s[3];
    sums_of(r, t, s);
    if (r != skip)
      gnmr_agent_report_sums(a[r], t, s, NULL, NULL);
  }
  return gnmr_agent_wait(a[watch], t, timeout_ms);
}

START_TEST(a_silent_rank_a_killed_relay_and_a_restarted_gnmrd_cost_steps_not_the_job) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  relay_proc rl[2];
  for (int k = 0; k < 2; k++)
    relay_start(&rl[k], d.dir, k, d.agents);
  gnmr_agent *a[RANKS];
  for (int r = 0; r < RANKS; r++)
    a[r] = open_rank(rl[r / PER_NODE].ep, "faults", r);
  wait_joined(a, RANKS);
  int slow = tu_slow();
  uint64_t t = 1;
  for (; t <= 5; t++)
    ck_assert_int_eq(step_all(a, t, -1, 0, 10000 * slow), 0);
  /* rank 4 says nothing at step 6: node 1's relay sends what came at
   * half the barrier; x4 and w are missing centrally, the step decided */
  ck_assert_int_eq(step_all(a, t, 4, 0, 10000 * slow), 0);
  ck_assert_int_eq(gnmr_agent_wait(a[3], t, 10000 * slow), 0);
  ck_assert_int_ge(tu_counter(&d, "missing_units"), 2);
  t++;
  /* node 1's relay killed: node 0 goes on (gnmrd's barrier decides
   * without node 1); started again, node 1's agents join through it */
  relay_stop(&rl[1], SIGKILL);
  for (int i = 0; i < 2; i++, t++)
    ck_assert_int_eq(step_all(a, t, -1, 0, 10000 * slow), 0);
  relay_start(&rl[1], d.dir, 1, d.agents);
  int back = 0;
  for (int i = 0; i < 40 && !back; i++, t++)
    back = step_all(a, t, -1, 0, 10000 * slow) == 0 &&
           gnmr_agent_wait(a[3], t, 500 * slow) == 0 &&
           gnmr_agent_wait(a[5], t, 500 * slow) == 0;
  ck_assert_msg(back, "node 1 did not come back through its new relay");
  /* gnmrd restarted on the same endpoint: the relays join it again */
  char *extra[] = {NULL};
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_daemon_start_in(&d, d.agents, NULL, d.dir, extra);
  back = 0;
  for (int i = 0; i < 60 && !back; i++, t++) {
    back = step_all(a, t, -1, 0, 1000 * slow) == 0;
    for (int r = 1; r < RANKS && back; r++)
      back = gnmr_agent_wait(a[r], t, 1000 * slow) == 0;
  }
  ck_assert_msg(back, "the job did not go on after gnmrd restarted");
  for (int r = 0; r < RANKS; r++)
    gnmr_agent_close(&a[r]);
  for (int k = 0; k < 2; k++)
    ck_assert_int_eq(relay_stop(&rl[k], SIGTERM), 0);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

/* What a relay refuses, and says: a rank of another node, and a command
 * line without its endpoints or with a node endpoint beyond loopback. */
START_TEST(a_relay_refuses_what_it_does_not_serve_and_says_why) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  relay_proc rl;
  relay_start(&rl, d.dir, 0, d.agents);
  gnmr_agent *a0 = open_rank(rl.ep, "refuse", 0);
  /* the relay serves node 0 of the job once rank 0's Hello is in (before
   * that, rank 3's could come first and make it node 1's) */
  int seen_job = 0;
  for (int k = 0; k < 1000 * tu_slow() && !seen_job; k++) {
    char *log = tu_read_file(rl.log, NULL);
    seen_job = log != NULL && strstr(log, "job refuse: node 0 of 2") != NULL;
    free(log);
    if (!seen_job)
      tu_sleep_ms(10);
  }
  ck_assert_msg(seen_job, "the relay did not take rank 0's Hello");
  /* rank 3 is node 1's */
  gnmr_agent *other = open_rank(rl.ep, "refuse", 3);
  char why[512] = "";
  for (int k = 0; k < 1000 * tu_slow() &&
                  gnmr_agent_last_error(other, why, sizeof why) ==
                                 0; k++)
    tu_sleep_ms(10);
  ck_assert_int_eq(gnmr_agent_last_error(other, why, sizeof why),
                   GNMR_E_UNSUPPORTED);
  ck_assert_msg(strstr(why, "this relay serves its node 0") != NULL, "%s",
                why);
  gnmr_agent_close(&other);
  gnmr_agent_close(&a0);
  ck_assert_int_eq(relay_stop(&rl, SIGTERM), 0);
  /* the command line */
  char *argv1[] = {"gnmrd", "--relay-to", d.agents, NULL};
  run_result bad = tu_run("gnmrd", argv1, NULL);
  ck_assert_int_eq(bad.code, 2);
  ck_assert_msg(strstr(bad.err, "usage: gnmrd --relay-to") != NULL, "%s",
                bad.err);
  tu_run_free(&bad);
  char *argv2[] = {"gnmrd", "--relay-to", d.agents, "--agents",
                   "tcp://10.1.2.3:5555", NULL};
  bad = tu_run("gnmrd", argv2, NULL);
  ck_assert_int_eq(bad.code, 1);
  ck_assert_msg(strstr(bad.err, "loopback") != NULL, "%s", bad.err);
  tu_run_free(&bad);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST


/* Toward a gnmrd with CURVE and tenancy, each relay is one peer with its
 * own key: the listed relays' nodes are served (the job's name matching
 * their grant), a relay whose key is not listed never gets in, and its
 * node's ranks never join; a relay with half its keys does not start. */
START_TEST(relays_connect_with_curve_and_gnmrd_sees_their_keys) {
  tu_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  keypair server = keygen(d.dir, "server"), k0 = keygen(d.dir, "relay0"),
          k1 = keygen(d.dir, "relay1"), stranger = keygen(d.dir, "x"),
          op = keygen(d.dir, "op");
  char allow[400], allow_path[200];
  snprintf(allow, sizeof allow,
           "%s node-0 role=agent jobs=secure*\n%s node-1 role=agent "
           "jobs=secure*\n%s ops role=operator\n", k0.pub, k1.pub, op.pub);
  snprintf(allow_path, sizeof allow_path, "%s/allowed", d.dir);
  tu_write_file(allow_path, allow);
  char *extra[] = {"--curve-key", server.path, "--curve-allow", allow_path,
                   NULL};
  tu_daemon_start_in(&d, NULL, NULL, d.dir, extra);
  relay_proc rl[3];
  keypair *keys[3] = {&k0, &k1, &stranger};
  for (int k = 0; k < 3; k++) {
    char *rx[] = {"--curve-server-key", server.pub, "--key-file",
                  keys[k]->path, NULL};
    relay_start_x(&rl[k], d.dir, k, d.agents, rx);
  }
  gnmr_agent *a[RANKS];
  for (int r = 0; r < RANKS; r++)
    a[r] = open_rank(rl[r / PER_NODE].ep, "secure-job", r);
  wait_joined(a, RANKS);
  for (uint64_t t = 1; t <= 5; t++) {
    for (int r = 0; r < RANKS; r++) {
      double s[3];
      sums_of(r, t, s);
      ck_assert_int_eq(gnmr_agent_report_sums(a[r], t, s, NULL, NULL),
                       GNMR_OK);
    }
    for (int r = 0; r < RANKS; r++)
      ck_assert_int_eq(gnmr_agent_wait(a[r], t, 10000 * tu_slow()), 0);
  }
  /* the stranger's node: its relay is refused at the handshake */
  gnmr_agent *lost = open_rank(rl[2].ep, "secure-other", 0);
  tu_sleep_ms(1500 * tu_slow());
  ck_assert(!gnmr_agent_joined(lost));
  size_t nlog = 0;
  char *log = tu_read_file(rl[2].log, &nlog);
  ck_assert_msg(log != NULL && strstr(log, "RELAY-REFUSED") != NULL &&
                    strstr(log, "refused this relay's connection") != NULL,
                "the refused relay said nothing: %s", log ? log : "(no log)");
  free(log);
  char admin[300], tmo[32];
  snprintf(admin, sizeof admin, "--admin=%s", d.admin);
  snprintf(tmo, sizeof tmo, "--timeout-ms=%d", 3000 * tu_slow());
  char *st[] = {"gnmrctl", admin, "--curve-server-key", server.pub,
                "--key-file", op.path, "stats", tmo, NULL};
  run_result sr = tu_run("gnmrctl", st, NULL);
  ck_assert_msg(sr.code == 0, "%s", sr.err);
  const char *ad = strstr(sr.out, "auth_denied ");
  ck_assert_msg(ad != NULL && strtoll(ad + 12, NULL, 10) >= 1, "%s", sr.out);
  tu_run_free(&sr);
  gnmr_agent_close(&lost);
  for (int r = 0; r < RANKS; r++)
    gnmr_agent_close(&a[r]);
  for (int k = 0; k < 3; k++)
    ck_assert_int_eq(relay_stop(&rl[k], SIGTERM), 0);
  /* both keys or none */
  char *half[] = {"gnmrd", "--relay-to", d.agents, "--agents",
                  "ipc:///tmp/gnmr-relay-half.sock", "--curve-server-key",
                  server.pub, NULL};
  run_result bad = tu_run("gnmrd", half, NULL);
  ck_assert_int_eq(bad.code, 2);
  ck_assert_msg(strstr(bad.err, "needs both --curve-server-key and "
                                "--key-file") != NULL, "%s", bad.err);
  tu_run_free(&bad);
  /* plaintext toward a gnmrd beyond loopback: only when said */
  char *far[] = {"gnmrd", "--relay-to", "tcp://10.1.2.3:5555", "--agents",
                 "ipc:///tmp/gnmr-relay-far.sock", NULL};
  bad = tu_run("gnmrd", far, NULL);
  ck_assert_int_eq(bad.code, 1);
  ck_assert_msg(strstr(bad.err, "without CURVE") != NULL, "%s", bad.err);
  tu_run_free(&bad);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

static char *unit_names1[] = {"u0"};

/* Bad input at a relay gets the answer gnmrd would give and loses
 * nothing: bytes that are not an envelope, a message of three frames, a
 * Report from a connection that said no Hello, a body a relay does not
 * take, a Hello that is not valid, a Report of the wrong length; the
 * node's good rank is served all along. */
START_TEST(a_relay_answers_bad_input_as_gnmrd_does_and_goes_on) {
  tu_daemon d = {0};
  tu_daemon_start(&d);
  relay_proc rl;
  relay_start(&rl, d.dir, 0, d.agents);
  raw_peer p = raw_open(rl.ep);
  raw_send(&p, "\xff\xff\xff", 3);
  expect_error(&p, GNMR_E_PARSE, "");
  ck_assert_int_ge(zmq_send(p.sock, "a", 1, ZMQ_SNDMORE), 0);
  ck_assert_int_ge(zmq_send(p.sock, "b", 1, 0), 0); /* [id][a][b]: dropped */
  expect_silence(&p);
  double s2[2] = {1, 4};
  report(&p, "bad", 0, 1, s2, 2, NULL, 0);
  expect_error(&p, GNMR_E_NOJOB, "unknown agent: send Hello first");
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__StatsRequest sr = GNMR__STATS_REQUEST__INIT;
  env.body_case = GNMR__ENVELOPE__BODY_STATS_REQUEST;
  env.stats_request = &sr;
  raw_send_env(&p, &env);
  expect_error(&p, GNMR_E_UNSUPPORTED, "a node relay takes Hello, Report");
  char *bad_names[] = {"ok", "bad\x1b[31m"};
  hello(&p, "bad", 0, 1, bad_names, 2, 2.0); /* a control character */
  expect_error(&p, GNMR_E_INVAL, "control character");
  hello(&p, "bad\xc0\xaf", 0, 1, unit_names1, 1, 2.0); /* overlong UTF-8 */
  expect_error(&p, GNMR_E_INVAL, "job name");
  hello(&p, "bad", 0, 1, unit_names1, 1, 2.0);
  Gnmr__Envelope *w = raw_recv(&p, raw_reply_ms() * tu_slow());
  ck_assert_msg(w != NULL && w->body_case == GNMR__ENVELOPE__BODY_WELCOME,
                "no Welcome through the relay");
  gnmr__wire_free(&w);
  report(&p, "bad", 0, 1, s2, 2, NULL, 0); /* one unit, two sums */
  expect_error(&p, GNMR_E_PROTO, "sumsq has 2 entries");
  report(&p, "bad", 0, 1, s2, 1, NULL, 0);
  w = raw_recv(&p, raw_reply_ms() * tu_slow());
  ck_assert_msg(w != NULL && w->body_case == GNMR__ENVELOPE__BODY_DECISION,
                "no decision through the relay");
  ck_assert_uint_eq(w->decision->step, 1);
  gnmr__wire_free(&w);
  report(&p, "bad", 0, 1, s2, 1, NULL, 0); /* late: its step went */
  expect_silence(&p);
  raw_close(&p);
  ck_assert_int_eq(relay_stop(&rl, SIGTERM), 0);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("relay");
  TCase *tc = tcase_create("relay");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, relayed_nodes_get_the_direct_jobs_decisions_bit_for_bit);
  tcase_add_test(
      tc, a_silent_rank_a_killed_relay_and_a_restarted_gnmrd_cost_steps_not_the_job);
  tcase_add_test(tc, a_relay_refuses_what_it_does_not_serve_and_says_why);
  tcase_add_test(tc, relays_connect_with_curve_and_gnmrd_sees_their_keys);
  tcase_add_test(tc, a_relay_answers_bad_input_as_gnmrd_does_and_goes_on);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
