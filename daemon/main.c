/* SPDX-License-Identifier: MIT */
/* main.c — gnmrd's main() in phases: the command line, the settings (file,
 * flags, checks), what the process claims (the data directory's lock, the
 * endpoints' directories, descriptors), the store's leadership, and
 * serving: the store, the endpoints (printed), the loop until
 * SIGTERM/SIGINT, then everything closed in order. */
#include <errno.h>
#include <malloc.h>
#include <fcntl.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "accept_guard.h"
#include "admin.h"
#include "refusals.h"
#include "agents.h"
#include "db.h"
#include "gnmr/error.h"
#include "gnmrd.h"
#include "ipc.h"
#include "keys.h"
#include "leader.h"
#include "log.h"
#include "relay.h"
#include "metrics.h"
#include "notify.h"
#include "num.h"
#include "settings.h"
#include "workers.h"
#include "zap.h"

/* Descriptors kept for everything but peers: the store, logs, metrics,
 * ZeroMQ's own (its I/O threads, inproc pairs, monitors). */
#define NOFILE_RESERVE 256
/* Admin connections at once (gnmrctl calls, watches, dashboards). */
#define ADMIN_MAX_CONNS 64
/* replies queued for an admin client that reads none (docs/reliability.md) */
#define ADMIN_QUEUED_REPLIES 8
/* with tenancy on, the admin places one agent key may hold, and those
 * kept for operator keys (docs/operations.md) */
#define ADMIN_KEY_PLACES 16
#define ADMIN_OPERATOR_RESERVE 8

#ifndef GNMR_VERSION
#define GNMR_VERSION "0.0.0"
#endif

static const char usage[] =
    "usage: gnmrd [--config FILE] [--data-dir DIR] [--agents ENDPOINT]\n"
    "             [--admin ENDPOINT]\n"
    "             [--log-level error|warn|info|debug] [--max-msg BYTES]\n"
    "             [--snapshot-every STEPS] [--retain-steps STEPS]\n"
    "             [--workers N]\n"
    "             [--curve-key FILE --curve-allow FILE] [--insecure]\n"
    "             [--metrics HOST:PORT] [--store postgresql://... [--standby]]\n"
    "       gnmrd --relay-to ENDPOINT --agents ENDPOINT   (a node relay)\n"
    "  Runs in the foreground; stops cleanly on SIGTERM or SIGINT.\n"
    "  Endpoints are ZeroMQ addresses: ipc:///path or tcp://HOST:PORT\n"
    "  (tcp://127.0.0.1:* picks a free port; the bound one is printed).\n"
    "  Defaults: data dir $STATE_DIRECTORY, else /var/lib/gnmr for root,\n"
    "  else $XDG_STATE_HOME/gnmr or ~/.local/state/gnmr; endpoints\n"
    "  ipc://RUN/agents.sock and ipc://RUN/admin.sock, RUN being\n"
    "  $RUNTIME_DIRECTORY, else $XDG_RUNTIME_DIR/gnmr, else /tmp/gnmr-UID.\n"
    "  History goes to DIR/gnmr.db; each job's policy state is snapshotted\n"
    "  every --snapshot-every steps (default 10) and at shutdown, and\n"
    "  unfinished jobs are restored at start. --retain-steps N keeps the\n"
    "  last N steps of history per job (default 0: all).\n"
    "  --workers N decides large steps (16384 unit-shards or more) on N\n"
    "  threads, one step of a job at a time (default 0: one per CPU).\n"
    "  --store postgresql://USER@HOST/DB keeps the history and the jobs'\n"
    "  snapshots in PostgreSQL instead (DIR still holds the lock file).\n"
    "  One gnmrd is active per store; --standby waits for it to stop and\n"
    "  takes over, restoring every live job from its latest snapshot.\n"
    "  --config FILE reads settings (INI, see deploy/gnmrd.conf); flags\n"
    "  override it. gnmrd --check-config FILE validates a file and exits;\n"
    "  gnmrd --config-keys lists every key, its default and its meaning.\n"
    "  --curve-key FILE (the server's key pair, gnmrctl keygen) and\n"
    "  --curve-allow FILE (allowed public keys, one per line) turn CURVE\n"
    "  on; a non-loopback TCP endpoint without CURVE needs --insecure.\n"
    "  --metrics HOST:PORT serves Prometheus text at /metrics; a\n"
    "  non-loopback HOST needs --insecure (plaintext HTTP).\n"
    "  Under systemd (Type=notify) it reports READY, STOPPING and pings\n"
    "  the watchdog from its loop.\n";

/* SIGTERM and SIGINT: gnmrd's own handler, installed before anything
 * else and never removed. A uv_signal handle would give the signal its
 * default action back when it closes during the stop, and a private gnmrd
 * gets a burst of SIGTERMs (one each time a thread of its killed parent
 * that it was handed to dies: PR_SET_PDEATHSIG), one of which then ended
 * gnmrd half-way through committing. The handler sets a flag (read by a
 * standby's wait and before the loop runs) and wakes the loop through a
 * pipe. The pipe's write end stays open until the process exits, so a
 * late signal never writes to a descriptor reused by the store. A hung
 * stop takes SIGKILL. */
static volatile sig_atomic_t stop_asked;
static volatile sig_atomic_t stop_wfd = -1;
static void on_stop_signal(int sig) {
  int saved = errno;
  stop_asked = sig;
  if (stop_wfd >= 0) {
    ssize_t n = write(stop_wfd, "", 1); /* full pipe: woken already */
    (void)n;
  }
  errno = saved;
}

static void stop_signals_install(void) {
  struct sigaction sa = {0};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
}

static void on_stop_readable(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  gnmrd *d = h->data;
  char buf[64];
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)h, &fd) == 0)
    while (read(fd, buf, sizeof buf) > 0)
      ;
  if (!d->stopping)
    LOG(INFO, "SIGNAL", "signal %d: stopping", (int)stop_asked);
  d->stopping = 1;
  uv_stop(h->loop);
}

/* The leadership's watch: a lost session stops this gnmrd (exit 3). */
typedef struct leader_watch {
  leader *l;
  int lost;
} leader_watch;
static void on_leader_check(uv_timer_t *t) {
  leader_watch *w = t->data;
  if (leader_lost(w->l)) {
    w->lost = 1;
    uv_stop(t->loop);
  }
}

/* Closes every handle at shutdown. */
static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

/* A flag given on the command line, applied after the config file. */
typedef struct flag {
  const char *key, *value;
} flag;

/* What main()'s phases hand on: the command line, the settings, what was
 * claimed (the lock, the descriptor budget, the store's leadership). Each
 * phase returns -1 to go on, or the exit code. */
typedef struct startup {
  const char *config_path, *check_path;
  flag flags[16];
  int n_flags;
  gnmrd_config cfg;
  char run[2048], err[2400];
  char curve_pub[41], curve_sec[41];
  gnmr_allow allowed;
  int curve;
  int lock_fd;
  uint32_t max_conns; /* the agents endpoint's connection cap */
  leader *lead;
  leader_watch watch;
  const char *where; /* the store: a postgresql:// URL or data_dir */
  char where_shown[1100];
  int served;        /* serve() ran */
} startup;

/* Phase 1: the command line (--help, --version, --config-keys end here). */
static int parse_command_line(startup *s, int argc, char **argv) {
  static const struct option longopts[] = {
      {"data-dir", required_argument, NULL, 'd'},
      {"agents", required_argument, NULL, 'a'},
      {"admin", required_argument, NULL, 'm'},
      {"log-level", required_argument, NULL, 'l'},
      {"max-msg", required_argument, NULL, 'x'},
      {"snapshot-every", required_argument, NULL, 's'},
      {"retain-steps", required_argument, NULL, 'r'},
      {"workers", required_argument, NULL, 'W'},
      {"metrics", required_argument, NULL, 'M'},
      {"curve-key", required_argument, NULL, 'k'},
      {"curve-allow", required_argument, NULL, 'w'},
      {"insecure", no_argument, NULL, 'I'},
      {"store", required_argument, NULL, 'S'},
      {"standby", no_argument, NULL, 'B'},
      {"config", required_argument, NULL, 'c'},
      {"check-config", required_argument, NULL, 'C'},
      {"config-keys", no_argument, NULL, 'K'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {0},
  };
  /* option letter -> config key */
  static const struct {
    int opt;
    const char *key;
  } flag_keys[] = {{'d', "data_dir"},  {'a', "agents"},
                   {'m', "admin"},     {'l', "log_level"},
                   {'x', "max_msg"},   {'s', "snapshot_every"},
                   {'r', "retain_steps"}, {'k', "curve_key_file"},
                   {'w', "curve_allow_file"}, {'I', "insecure"},
                   {'M', "metrics"}, {'S', "store"},
                   {'B', "standby"}, {'W', "workers"}};
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'c':
      s->config_path = optarg;
      break;
    case 'C':
      s->check_path = optarg;
      break;
    case 'h':
      fputs(usage, stdout);
      return 0;
    case 'K':
      config_print_keys(stdout);
      return 0;
    case 'V':
      printf("gnmrd %s\n", GNMR_VERSION);
      return 0;
    default: {
      const char *key = NULL;
      for (size_t i = 0; i < sizeof flag_keys / sizeof flag_keys[0]; i++)
        if (flag_keys[i].opt == c)
          key = flag_keys[i].key;
      if (key == NULL || s->n_flags == 16) {
        fputs(usage, stderr);
        return 2;
      }
      s->flags[s->n_flags++] =
          (flag){key, c == 'I' || c == 'B' ? "true" : optarg};
    }
    }
  }
  if (optind != argc) {
    fprintf(stderr, "gnmrd: unexpected argument '%s'\n%s", argv[optind],
            usage);
    return 2;
  }
  return -1;
}

/* Phase 2: the settings: defaults, the file, the flags, the derived
 * paths, and every check a start runs (--check-config ends here). */
static int load_settings(startup *s) {
  gnmrd_config *cfg = &s->cfg;
  const char *check_path = s->check_path;
  int bad = check_path != NULL ? 1 : 2;
  config_defaults(cfg);
  if (check_path != NULL) {
    if (config_load(check_path, cfg, s->err, sizeof s->err) != GNMR_OK) {
      fprintf(stderr, "gnmrd: %s\n", s->err);
      return 1;
    }
  } else if (s->config_path != NULL &&
             config_load(s->config_path, cfg, s->err, sizeof s->err) !=
                 GNMR_OK) {
    fprintf(stderr, "gnmrd: %s\n", s->err);
    return 2;
  }
  for (int i = 0; i < s->n_flags; i++) {
    const flag *f = &s->flags[i];
    const char *section = strncmp(f->key, "curve", 5) == 0 ||
                                  strcmp(f->key, "insecure") == 0
                              ? "security"
                              : "gnmrd";
    if (config_set(cfg, section, f->key, f->value, s->err, sizeof s->err) !=
        GNMR_OK) {
      /* name the flag as typed */
      char opt[32];
      snprintf(opt, sizeof opt, "--%s", f->key);
      for (char *p = opt; *p; p++)
        if (*p == '_')
          *p = '-';
      fprintf(stderr, "gnmrd: %s '%s': %s\n", opt, f->value,
              strchr(s->err, ':') ? strchr(s->err, ':') + 2 : s->err);
      return 2;
    }
  }
  gnmr__log_level = cfg->log_level;
  {
    char data_dir[1024];
    settings_default_dirs(s->run, sizeof s->run, data_dir, sizeof data_dir);
    if (cfg->data_dir[0] == '\0')
      snprintf(cfg->data_dir, sizeof cfg->data_dir, "%s", data_dir);
    if (cfg->agents[0] == '\0')
      snprintf(cfg->agents, sizeof cfg->agents, "ipc://%.1000s/agents.sock",
               s->run);
    if (cfg->admin[0] == '\0')
      snprintf(cfg->admin, sizeof cfg->admin, "ipc://%.1000s/admin.sock",
               s->run);
  }
  if (cfg->data_dir[0] == '\0') {
    fprintf(stderr, "gnmrd: no data directory: give --data-dir (or "
            "data_dir in the configuration); HOME, XDG_STATE_HOME and "
            "STATE_DIRECTORY are all unset\n");
    return bad;
  }
  /* every check of the settings, for --check-config as for a start */
  s->curve = cfg->curve_key_file[0] != '\0';
  if (settings_check(cfg, s->curve_pub, s->curve_sec, &s->allowed, s->err,
                     sizeof s->err) != 0) {
    fprintf(stderr, "gnmrd: %s\n", s->err);
    return bad;
  }
  if (check_path != NULL) {
    printf("gnmrd: %s is valid\n", check_path);
    return 0;
  }
  return -1;
}

/* Phase 3: what this process takes before serving: the data directory
 * and its lock, the endpoints' directories, the descriptor budget. */
static int claim_resources(startup *s) {
  const gnmrd_config *cfg = &s->cfg;
  const char *data_dir = cfg->data_dir;
  char *err = s->err;
  size_t errlen = sizeof s->err;
  if (cfg->metrics[0] != '\0' &&
      !settings_metrics_addr_is_loopback(cfg->metrics))
    LOG(WARN, "METRICS-INSECURE", "metrics on %s are plaintext HTTP that "
        "anyone who reaches the port can read (--insecure)", cfg->metrics);
  if (s->curve)
    LOG(INFO, "TENANCY", s->allowed.tenancy
                             ? "tenancy on: agent keys own the jobs they "
                               "create; operator keys act on every job"
                             : "tenancy off: every allowed key may act on "
                               "every job (give operator keys role=operator "
                               "in the allow list to turn it on)");
  else
    LOG(INFO, "NO-CURVE", "CURVE is off: any local peer that can reach the "
        "sockets is trusted (see gnmrd(8), SECURITY)");
  if (settings_mkdirs(data_dir) != 0) {
    LOG(ERROR, "DATA-DIR", "create %s: %s", data_dir, strerror(errno));
    return 1;
  }
  char lock_path[1100];
  snprintf(lock_path, sizeof lock_path, "%s/gnmrd.lock", data_dir);
  s->lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (s->lock_fd < 0 || flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0) {
    LOG(ERROR, "DATA-LOCK", "%s: %s", lock_path,
        errno == EWOULDBLOCK ? "another gnmrd uses this data directory"
                             : strerror(errno));
    return 1;
  }
  for (int i = 0; i < 2; i++) { /* the forms, before anything is made */
    if (gnmr__endpoint_check(i ? cfg->admin : cfg->agents, 1, err, errlen) !=
        GNMR_OK) {
      LOG(ERROR, "ENDPOINT", "%s: %s", i ? "--admin" : "--agents", err);
      return 1;
    }
  }
  if (settings_prepare_endpoint(cfg->agents) != 0 ||
      settings_prepare_endpoint(cfg->admin) != 0) {
    LOG(ERROR, "ENDPOINT-DIR", "cannot create the socket directory: %s",
        strerror(errno));
    return 1;
  }
  for (int i = 0; i < 2; i++) { /* sockets like ssh-agent's */
    const char *ep = i ? cfg->admin : cfg->agents;
    if (gnmr__ipc_dir_check(ep, err, errlen) != GNMR_OK ||
        gnmr__ipc_free(ep, err, errlen) != GNMR_OK) {
      LOG(ERROR, "ENDPOINT", "refusing %s: %s", ep, err);
      return 1;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  if (accept_guard_init() != 0)
    LOG(WARN, "NOFILE", "no descriptor kept in reserve (%s): out of "
        "descriptors, a waiting connection is left waiting, not shed",
        strerror(errno));
  /* each peer is a descriptor: take what the hard limit allows, and keep
   * connections below it (libzmq aborts on an ipc accept without one) */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
      LOG(DEBUG, "NOFILE", "descriptor limit %llu -> %llu",
          (unsigned long long)was, (unsigned long long)rl.rlim_cur);
  }
  uint64_t fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 &&
                         rl.rlim_cur != RLIM_INFINITY
                     ? (uint64_t)rl.rlim_cur
                     : 1u << 20;
  uint64_t room = fds > NOFILE_RESERVE + ADMIN_MAX_CONNS + 16
                      ? fds - NOFILE_RESERVE - ADMIN_MAX_CONNS
                      : 16;
  uint64_t want = cfg->max_connections ? cfg->max_connections : room;
  if (want > room) {
    LOG(WARN, "NOFILE", "[limits] max_connections = %llu does not fit the "
        "descriptor limit (%llu): capped at %llu; raise LimitNOFILE",
        (unsigned long long)want, (unsigned long long)fds,
        (unsigned long long)room);
    want = room;
  }
  s->max_conns = (uint32_t)(want < UINT32_MAX ? want : UINT32_MAX);
  return -1;
}

/* Phase 4: a PostgreSQL store serves one gnmrd at a time: become its
 * leader (a standby waits here). */
static int take_leadership(startup *s) {
  const gnmrd_config *cfg = &s->cfg;
  s->where = cfg->store[0] != '\0' ? cfg->store : cfg->data_dir;
  db_target_display(s->where, s->where_shown, sizeof s->where_shown);
  if (cfg->store[0] == '\0')
    return -1;
  if (cfg->standby)
    LOG(INFO, "STANDBY", "%s: waiting for the store's leadership",
        s->where_shown);
  int rv = leader_take(cfg->store, (int)cfg->standby, &stop_asked, &s->lead,
                       s->err, sizeof s->err);
  if (rv != GNMR_OK) {
    if (rv == GNMR_E_CLOSED)
      LOG(INFO, "STOP", "stopped while standing by");
    else
      LOG(ERROR, "LEADER", "%s", s->err);
    return rv == GNMR_E_CLOSED ? 0 : 1;
  }
  if (stop_asked) { /* asked to stop while taking over: never serves */
    LOG(INFO, "STOP", "stopped while taking the leadership over");
    return 0;
  }
  LOG(INFO, "LEADER", "%s: this gnmrd is active", s->where_shown);
  return -1;
}

/* The worker threads that decide large steps; GNMR_WORKERS_MIN
 * (unit-shards) moves the line below which a step is cheaper to decide
 * on the loop. */
static void start_workers(gnmrd *d, uint64_t configured) {
  unsigned n = (unsigned)configured;
  if (n == 0) {
    cpu_set_t set;
    n = sched_getaffinity(0, sizeof set, &set) == 0 ? (unsigned)CPU_COUNT(&set)
                                                    : 1;
    n = n > 64 ? 64 : n;
  }
  const char *min = getenv("GNMR_WORKERS_MIN");
  char *end = NULL;
  d->worker_min = 16384;
  if (min != NULL && *min != '\0') {
    unsigned long long v = strtoull(min, &end, 10);
    if (*end == '\0' && min[0] != '-')
      d->worker_min = v;
    else
      LOG(WARN, "WORKERS", "GNMR_WORKERS_MIN '%s' is not a number; "
          "using %llu", min, (unsigned long long)d->worker_min);
  }
  d->workers = workers_new(d->loop, n);
  if (d->workers == NULL)
    LOG(WARN, "WORKERS", "no worker threads: every step is decided on "
        "the loop");
}

/* The two endpoints (the ZAP handler first: it must be bound before any
 * CURVE server socket), then the metrics. */
static int open_endpoints(gnmrd *d, startup *s, char *bound_agents,
                          char *bound_admin, size_t cap, char *bound_metrics,
                          size_t mcap) {
  const gnmrd_config *cfg = &s->cfg;
  char *err = s->err;
  size_t errlen = sizeof s->err;
  if (s->curve && zap_open(d->loop, d->zctx, &s->allowed, &d->c.auth_denied,
                           &d->zap, err, errlen) != GNMR_OK) {
    LOG(ERROR, "ZAP", "%s", err);
    return 1;
  }
  server_opts ao = {.endpoint = cfg->agents,
                    .max_msg = (int64_t)cfg->max_msg,
                    .curve_secret = s->curve ? s->curve_sec : NULL,
                    .on_msg = dispatch_on_message,
                    .on_bad = dispatch_on_bad_frames,
                    .on_handshake_failed = refusals_on_handshake_failed,
                    .ctx = d,
                    .max_conns = s->max_conns,
                    .on_over_cap = refusals_on_over_cap,
                    .first_msg_ms = (uint32_t)cfg->first_message_ms,
                    /* with tenancy (CURVE, roles), an agent key holds at
                     * most a quarter of the places, agent keys together
                     * all but an eighth (kept for operators): one key's
                     * silent connections cannot lock the others out */
                    .key_max = s->max_conns / 4 ? s->max_conns / 4 : 1,
                    .reserve = s->max_conns / 8,
                    .privileged = refusals_is_operator,
                    .on_key_cap = refusals_on_agent_key_cap};
  if (server_open(d->loop, d->zctx, &ao, bound_agents, cap, err, errlen,
                  &d->agents) != GNMR_OK) {
    LOG(ERROR, "BIND-AGENTS", "%s", err);
    return 1;
  }
  server_opts mo = {.endpoint = cfg->admin,
                    .max_msg = 1 << 20,
                    .curve_secret = s->curve ? s->curve_sec : NULL,
                    .on_msg = admin_on_message,
                    .on_bad = admin_on_bad_frames,
                    .on_handshake_failed = refusals_on_handshake_failed,
                    .ctx = d,
                    .max_conns = ADMIN_MAX_CONNS,
                    .on_over_cap = refusals_on_over_cap,
                    .first_msg_ms = (uint32_t)cfg->first_message_ms,
                    .sndhwm = ADMIN_QUEUED_REPLIES,
                    .on_gone = admin_on_gone,
                    .key_max = ADMIN_KEY_PLACES,
                    .reserve = ADMIN_OPERATOR_RESERVE,
                    .privileged = refusals_is_operator,
                    .on_key_cap = refusals_on_key_cap};
  if (server_open(d->loop, d->zctx, &mo, bound_admin, cap, err, errlen,
                  &d->admin) != GNMR_OK) {
    LOG(ERROR, "BIND-ADMIN", "%s", err);
    return 1;
  }
  if (s->curve)
    LOG(INFO, "CURVE", "CURVE on; server public key %s", s->curve_pub);
  if (cfg->metrics[0] != '\0' &&
      metrics_open(d, cfg->metrics, bound_metrics, mcap, err, errlen) !=
          GNMR_OK) {
    LOG(ERROR, "METRICS", "%s", err);
    return 1;
  }
  return -1;
}

/* The daemon's state before anything is served. */
static void gnmrd_init(gnmrd *d, uv_loop_t *loop, startup *s) {
  d->loop = loop;
  d->cfg = &s->cfg;
  /* job names a peer chose, kept after their jobs end: keyed (hmap.h) */
  d->owners.keyed = 1;
  d->ended.keyed = 1;
  d->allow = s->curve ? &s->allowed : NULL;
  d->zctx = zmq_ctx_new();
}

/* Phase 5: serve until SIGTERM/SIGINT (or a lost leadership), then close
 * everything in order. */
static int serve(startup *s) {
  const gnmrd_config *cfg = &s->cfg;
  char bound_agents[512], bound_admin[512], bound_metrics[300] = "";
  int code = 1;
  gnmrd d = {0};
  s->served = 1;
  uv_loop_t loop;
  uv_poll_t stop_poll;
  int stop_fds[2] = {-1, -1};
  uv_loop_init(&loop);
  gnmrd_init(&d, &loop, s);
  start_workers(&d, cfg->workers);
  if (store_open(s->where, (uint32_t)cfg->snapshot_every, cfg->retain_steps,
                 &d.st, s->err, sizeof s->err) != GNMR_OK) {
    LOG(ERROR, "STORE-OPEN", "%s", s->err);
    goto out;
  }
  store_set_queue_cap(d.st, cfg->store_queue_mb << 20);
  d.last_run = store_last_run(d.st);
  d.term = store_term(d.st);
  d.lead = s->lead;
  if (store_restore(s->where, lifecycle_restore, &d, s->err, sizeof s->err) !=
          GNMR_OK ||
      store_owners(s->where, lifecycle_owner_restore, &d, s->err,
                   sizeof s->err) != GNMR_OK) {
    LOG(ERROR, "STORE-RESTORE", "%s", s->err);
    goto out;
  }
  lifecycle_start(&d);
  if (open_endpoints(&d, s, bound_agents, bound_admin, sizeof bound_agents,
                     bound_metrics, sizeof bound_metrics) >= 0)
    goto out;
  d.bound_agents = bound_agents;
  d.bound_admin = bound_admin;
  d.started_ms = uv_now(&loop);
  d.started_unix = (int64_t)time(NULL);
  if (pipe2(stop_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    LOG(ERROR, "SIGNAL", "no pipe for SIGTERM: %s", strerror(errno));
    goto out;
  }
  uv_poll_init(&loop, &stop_poll, stop_fds[0]);
  stop_poll.data = &d;
  uv_poll_start(&stop_poll, UV_READABLE, on_stop_readable);
  stop_wfd = stop_fds[1]; /* never closed: see on_stop_signal */
  notify_start(&d);
  uv_timer_t leader_timer;
  if (s->lead != NULL) {
    s->watch.l = s->lead;
    uv_timer_init(&loop, &leader_timer);
    leader_timer.data = &s->watch;
    uv_timer_start(&leader_timer, on_leader_check, 100, 100);
  }

  /* START is logged before the endpoints are printed: whoever waits for
   * them (a supervisor, the tests) finds it in the log already. */
  LOG(INFO, "START", "serving agents on %s, admin on %s (policy SIMD: %s; "
      "%u workers for steps of %llu unit-shards or more)", bound_agents,
      bound_admin, policy_simd_name(policy_simd_get()),
      workers_count(d.workers), (unsigned long long)d.worker_min);
  printf("gnmrd %s: data %s\ngnmrd: agents %s\ngnmrd: admin %s\n",
         GNMR_VERSION, cfg->data_dir, bound_agents, bound_admin);
  if (bound_metrics[0] != '\0')
    printf("gnmrd: metrics %s\n", bound_metrics);
  if (s->lead != NULL)
    printf("gnmrd: store %s\n", s->where_shown);
  fflush(stdout);
  notify_ready(&d, bound_agents);
  /* a SIGTERM that came before the loop could be woken stops it now */
  if (stop_asked) {
    LOG(INFO, "SIGNAL", "a stop asked for while starting: stopping");
    d.stopping = 1;
  } else {
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  notify_stopping(&d);
  code = s->watch.lost ? 3 : 0;
out:
  if (!s->watch.lost) /* a standby may be serving these jobs already */
    lifecycle_snapshot_all(&d);
  lifecycle_shutdown(&d); /* no step is left on a worker */
  reopen_shutdown();
  workers_close(&d.workers);
  admin_shutdown(&d);
  metrics_stop(&d);
  server_close(&d.agents);
  server_close(&d.admin);
  zap_close(&d.zap);
  uv_walk(&loop, close_walk, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  if (stop_fds[0] >= 0)
    close(stop_fds[0]);
  metrics_clear(&d);
  store_close(&d.st); /* commits everything queued, snapshots included */
  zmq_ctx_term(d.zctx);
  return code;
}

/* main() in phases, as each reads: the command line, the settings, what
 * this process claims, the store's leadership, serving. */
/* A gnmrd started for one job (the Python package's private gnmrd,
 * docs/python.md) stops with the process that started it: that process
 * puts its id in GNMRD_PARENT_PID; gnmrd asks the kernel for a SIGTERM
 * when its parent goes (a SIGKILLed trainer too: it then stops cleanly,
 * as on any SIGTERM) and exits at once when the parent is gone already.
 * Returns -1 to go on, else the exit status. */
static int follow_parent(void) {
  const char *p = getenv("GNMRD_PARENT_PID");
  uint64_t pid;
  if (p == NULL || *p == '\0')
    return -1;
  if (gnmr__parse_u64(p, INT32_MAX, &pid) != 0 || pid < 2) {
    fprintf(stderr, "gnmrd: GNMRD_PARENT_PID is not a process id (the "
                    "process whose end stops gnmrd)\n");
    return 2;
  }
  if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) {
    fprintf(stderr, "gnmrd: GNMRD_PARENT_PID: %s\n", strerror(errno));
    return 1;
  }
  if ((uint64_t)getppid() != pid) {
    fprintf(stderr, "gnmrd: the process that started it (%llu) has gone: "
                    "not starting\n", (unsigned long long)pid);
    return 1;
  }
  return -1;
}

int main(int argc, char **argv) {
  static startup s; /* large: kept off the stack */
  s.lock_fd = -1;
  /* blocks of 16 MiB and more (large Hellos) are mapped on their own and
   * unmapped when freed: glibc's threshold otherwise rises to each large
   * block freed, and eight refused 23 MB Hellos left +72 MB in the arenas
   * (issue 62). The per-step blocks of a job of max_units (2^20: 8 MB
   * reports) stay below it, in the heap, not faulted in every step: a
   * 2^20-unit gnmr-sim round trip, p50, 70-81 ms with it against 69-78
   * ms without (this VM, busy; 4 MiB with trims after every store batch
   * measured 102-124 ms) */
  mallopt(M_MMAP_THRESHOLD, 16 << 20);
  for (int i = 1; i < argc; i++) /* a node relay is another program */
    if (strcmp(argv[i], "--relay-to") == 0 ||
        strncmp(argv[i], "--relay-to=", 11) == 0)
      return relay_main(argc, argv);
  stop_signals_install();
  int code = follow_parent();
  if (code < 0)
    code = parse_command_line(&s, argc, argv);
  if (code < 0)
    code = load_settings(&s);
  if (code < 0)
    code = claim_resources(&s);
  if (code < 0)
    code = take_leadership(&s);
  if (code < 0)
    code = serve(&s);
  gnmr__allow_clear(&s.allowed);
  leader_release(&s.lead); /* only now may a standby take over */
  if (s.lock_fd >= 0)
    close(s.lock_fd);
  if (code == 0 && s.served)
    LOG(INFO, "STOP", "stopped cleanly");
  return code;
}
