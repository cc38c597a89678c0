/* SPDX-License-Identifier: MIT */
/* gnmr-sim — R real agents (one socket and I/O thread each) that report a
 * trace to gnmrd in lockstep, each unit's sum of squares split over K
 * ranks, and print the decisions CSV of docs/policy.md as the agents'
 * routes see them; round-trip latency goes to stderr. Unit u lives on ranks
 * (u + j) % R, j < K. Shard partials are chosen so that gnmrd's sum (in
 * rank order) gives back the trace's norm exactly, so the decisions equal
 * `gnmrctl replay` on the same trace and options.
 *
 * As a node of a multi-node job it runs only some ranks (--local-ranks,
 * --rank or GNMR_RANK) and then reads the decisions through an observer
 * that lists every unit, so every node prints the whole decisions CSV.
 * Settings come from the GNMR_* environment as for any agent, flags
 * overriding; CURVE from --curve-server-key and --key-file (or the
 * environment); --start-delay RANK:MS opens a rank late. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "gnmr/agent.h"
#include "keys.h"
#include "num.h"
#include "params.h"
#include "replay.h"
#include "synth.h"
#include "trace.h"

static const char usage[] =
    "usage: gnmr-sim --agents ENDPOINT --job NAME --ranks R [--shards K]\n"
    "                (--trace FILE | [--units N] [--steps S] [--seed X])\n"
    "                [" GNMR_POLICY_OPTS_USAGE "]\n"
    "                [--barrier-ms MS] [--timeout-ms MS] [--write-trace FILE]\n"
    "                [--local-ranks LIST | --rank N] [--start-delay RANK:MS]...\n"
    "                [--curve-server-key KEY|FILE --key-file FILE] [--step-ms MS]\n"
    "  Prints the decisions CSV on stdout, latency on stderr. Without\n"
    "  --trace, generates N units (default 64) over S steps (default 300)\n"
    "  with transient spikes; --write-trace saves the trace it reported.\n"
    "  --local-ranks (e.g. 0,2-3) or --rank (or GNMR_RANK) runs only those\n"
    "  of the job's R ranks here, for a job spread over several hosts; an\n"
    "  observer then reads every unit's decision. GNMR_ENDPOINT, GNMR_JOB,\n"
    "  GNMR_REPORTERS, GNMR_BARRIER_MS, the policy and CURVE variables apply\n"
    "  as for any agent; flags override them. --start-delay RANK:MS opens\n"
    "  that rank MS ms late: it joins the running job and reports from the\n"
    "  step the run has reached. --step-ms MS makes each step last at least\n"
    "  MS ms (a training step's compute).\n";

enum {
  OPT_AGENTS = 256, OPT_JOB, OPT_RANKS, OPT_SHARDS, OPT_TRACE, OPT_UNITS,
  OPT_STEPS, OPT_SEED, OPT_BARRIER, OPT_TIMEOUT, OPT_WRITE, OPT_HELP,
  OPT_LOCAL, OPT_RANK, OPT_DELAY, OPT_SKEY, OPT_KEYFILE, OPT_STEPMS,
  OPT_POLICY_BASE = 512
};

typedef struct sim_rank {
  gnmr_agent *agent;
  int local;            /* runs in this process */
  uint64_t delay_ms;    /* opens this long after the start */
  uint32_t n_local;
  uint32_t *units;      /* trace unit of each local unit, ascending */
  double *sumsq;
  uint64_t *nonfinite;
  uint8_t *nr;
} sim_rank;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int die_usage(const char *msg) {
  fprintf(stderr, "gnmr-sim: %s\n%s", msg, usage);
  return 2;
}

/* Parses "0,2-3" into want[0..R): 0 or GNMR_E_PARSE. */
static int parse_ranks(const char *s, uint32_t R, int *want) {
  const char *p = s;
  if (*p == '\0')
    return GNMR_E_PARSE;
  while (*p) {
    char *end;
    if (*p < '0' || *p > '9')
      return GNMR_E_PARSE;
    unsigned long a = strtoul(p, &end, 10), b = a;
    if (*end == '-') {
      if (end[1] < '0' || end[1] > '9')
        return GNMR_E_PARSE;
      b = strtoul(end + 1, &end, 10);
    }
    if (a > b || b >= R || (*end != ',' && *end != '\0'))
      return GNMR_E_PARSE;
    for (unsigned long r = a; r <= b; r++)
      want[r] = 1;
    p = *end == ',' ? end + 1 : end;
    if (*end == ',' && *p == '\0')
      return GNMR_E_PARSE;
  }
  return GNMR_OK;
}

/* Fills cfg's common part: the job, the policy, CURVE; then opens it. */
static int open_agent(const gnmr_agent_config *base, uint32_t rank,
                      char **names, uint32_t n, uint32_t *ids, int observer,
                      gnmr_agent **out) {
  gnmr_agent_config cfg = *base;
  cfg.rank = rank;
  cfg.unit_names = (const char *const *)names;
  cfg.n_units = n;
  cfg.unit_ids = ids; /* job-wide ids = the trace's unit ids */
  cfg.observer = observer;
  return gnmr_agent_open(&cfg, out);
}

/* Names "unit.ID" for each id; NULL on out of memory. */
static char **unit_names(const uint32_t *ids, uint32_t n) {
  char **names = calloc(n ? n : 1, sizeof *names);
  for (uint32_t i = 0; names && i < n; i++) {
    if ((names[i] = malloc(24)) == NULL) {
      for (uint32_t k = 0; k < i; k++)
        free(names[k]);
      free(names);
      return NULL;
    }
    snprintf(names[i], 24, "unit.%u", ids[i]);
  }
  return names;
}

static void free_names(char **names, uint32_t n) {
  for (uint32_t i = 0; names && i < n; i++)
    free(names[i]);
  free(names);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  { /* every agent is a few descriptors: take what the hard limit allows */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  struct option longopts[GNMR_POLICY_NOPTS + 19] = {
      {"agents", required_argument, NULL, OPT_AGENTS},
      {"job", required_argument, NULL, OPT_JOB},
      {"ranks", required_argument, NULL, OPT_RANKS},
      {"shards", required_argument, NULL, OPT_SHARDS},
      {"trace", required_argument, NULL, OPT_TRACE},
      {"units", required_argument, NULL, OPT_UNITS},
      {"steps", required_argument, NULL, OPT_STEPS},
      {"seed", required_argument, NULL, OPT_SEED},
      {"barrier-ms", required_argument, NULL, OPT_BARRIER},
      {"timeout-ms", required_argument, NULL, OPT_TIMEOUT},
      {"write-trace", required_argument, NULL, OPT_WRITE},
      {"help", no_argument, NULL, OPT_HELP},
      {"local-ranks", required_argument, NULL, OPT_LOCAL},
      {"rank", required_argument, NULL, OPT_RANK},
      {"start-delay", required_argument, NULL, OPT_DELAY},
      {"curve-server-key", required_argument, NULL, OPT_SKEY},
      {"key-file", required_argument, NULL, OPT_KEYFILE},
      {"step-ms", required_argument, NULL, OPT_STEPMS},
  };
  /* the environment first (as for any agent), then the flags */
  gnmr_agent_config base = {0};
  const char *bad_var = NULL;
  base.barrier_ms = 2000;
  gnmr_params_default(&base.params);
  if (gnmr_agent_config_from_env(&base, &bad_var) != GNMR_OK) {
    fprintf(stderr, "gnmr-sim: %s: not a valid value\n", bad_var);
    return 2;
  }
  const char *endpoint = base.endpoint, *job = base.job, *trace_path = NULL,
             *write_path = NULL, *local_list = NULL, *skey = NULL,
             *key_file = NULL;
  uint64_t ranks = base.reporters, shards = 1, units = 64, steps = 300,
           seed = 1, barrier = base.barrier_ms, timeout = 5000, one_rank = 0,
           step_ms = 0;
  int have_rank = getenv("GNMR_RANK") != NULL;
  one_rank = base.rank;
  char *delays[64];
  int n_delays = 0;
  policy_params prm;
  char msg[256];
  int c;
  policy_params_from_public(&base.params, &prm);
  gnmr__policy_opts_longopts(&longopts[18], OPT_POLICY_BASE);
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    uint64_t *num = NULL, max = 0;
    switch (c) {
    case OPT_AGENTS: endpoint = optarg; break;
    case OPT_JOB: job = optarg; break;
    case OPT_TRACE: trace_path = optarg; break;
    case OPT_WRITE: write_path = optarg; break;
    case OPT_LOCAL: local_list = optarg; break;
    case OPT_SKEY: skey = optarg; break;
    case OPT_KEYFILE: key_file = optarg; break;
    case OPT_DELAY:
      if (n_delays == 64)
        return die_usage("at most 64 --start-delay");
      delays[n_delays++] = optarg;
      break;
    case OPT_RANK: num = &one_rank; max = 1023; have_rank = 1; break;
    case OPT_RANKS: num = &ranks; max = 1024; break;
    case OPT_SHARDS: num = &shards; max = 1024; break;
    case OPT_UNITS: num = &units; max = 1u << 20; break;
    case OPT_STEPS: num = &steps; max = 10000000; break;
    case OPT_SEED: num = &seed; max = UINT32_MAX; break;
    case OPT_BARRIER: num = &barrier; max = 600000; break;
    case OPT_TIMEOUT: num = &timeout; max = 600000; break;
    case OPT_STEPMS: num = &step_ms; max = 600000; break;
    case OPT_HELP: case 'h': fputs(usage, stdout); return 0;
    default:
      if (c >= OPT_POLICY_BASE && c < OPT_POLICY_BASE + GNMR_POLICY_NOPTS) {
        if (gnmr__policy_opts_apply(&prm, c - OPT_POLICY_BASE, optarg, msg,
                                    sizeof msg) != 0)
          return die_usage(msg);
        break;
      }
      fputs(usage, stderr);
      return 2;
    }
    if (num != NULL && gnmr__parse_u64(optarg, max, num) != 0) {
      const char *name = "?";
      for (int i = 0; longopts[i].name; i++)
        if (longopts[i].val == c)
          name = longopts[i].name;
      snprintf(msg, sizeof msg, "--%s '%s': expected an integer from 0 to %llu",
               name, optarg, (unsigned long long)max);
      return die_usage(msg);
    }
  }
  if (optind != argc)
    return die_usage("unexpected argument");
  if (endpoint == NULL || job == NULL || ranks == 0)
    return die_usage("--agents, --job and --ranks (>= 1) are required "
                     "(or GNMR_ENDPOINT, GNMR_JOB, GNMR_REPORTERS)");
  if (shards == 0 || shards > ranks)
    return die_usage("--shards must be from 1 to --ranks");
  if (barrier == 0 || units == 0 || steps == 0)
    return die_usage("--barrier-ms, --units and --steps must be >= 1");
  if (gnmr__policy_opts_check(&prm, msg, sizeof msg) != 0)
    return die_usage(msg);

  /* CURVE: flags over the environment; a server key may be its .pub file */
  static char spub[41], cpub[41], csec[41];
  if (skey != NULL) {
    if (gnmr__key_valid(skey))
      snprintf(spub, sizeof spub, "%s", skey);
    else if (gnmr__key_file_read(skey, spub, NULL, msg, sizeof msg) != 0)
      return die_usage(msg);
    base.curve_server_key = spub;
  }
  if (key_file != NULL) {
    if (gnmr__key_file_read(key_file, cpub, csec, msg, sizeof msg) != 0)
      return die_usage(msg);
    base.curve_public_key = cpub;
    base.curve_secret_key = csec;
  }
  if ((skey != NULL) != (key_file != NULL))
    return die_usage("--curve-server-key and --key-file go together");

  uint32_t R = (uint32_t)ranks;
  int *want = calloc(R, sizeof *want);
  uint64_t *delay = calloc(R, sizeof *delay);
  if (want == NULL || delay == NULL) {
    free(want);
    free(delay);
    fprintf(stderr, "gnmr-sim: out of memory\n");
    return 1;
  }
  if (local_list != NULL && have_rank) {
    free(want);
    free(delay);
    return die_usage("--local-ranks and --rank (or GNMR_RANK) exclude each "
                     "other");
  }
  if (local_list != NULL) {
    if (parse_ranks(local_list, R, want) != GNMR_OK) {
      snprintf(msg, sizeof msg, "--local-ranks '%s': expected ranks below "
               "%u like 0,2-3", local_list, R);
      free(want);
      free(delay);
      return die_usage(msg);
    }
  } else if (have_rank) {
    if (one_rank >= R) {
      snprintf(msg, sizeof msg, "rank %llu is not below --ranks %u",
               (unsigned long long)one_rank, R);
      free(want);
      free(delay);
      return die_usage(msg);
    }
    want[one_rank] = 1;
  } else {
    for (uint32_t r = 0; r < R; r++)
      want[r] = 1;
  }
  for (int i = 0; i < n_delays; i++) {
    unsigned long long r, ms;
    int end = 0;
    if (sscanf(delays[i], "%llu:%llu%n", &r, &ms, &end) != 2 ||
        delays[i][end] != '\0' || r >= R || ms > 3600000) {
      snprintf(msg, sizeof msg, "--start-delay '%s': expected RANK:MS with "
               "RANK below %u and MS up to 3600000", delays[i], R);
      free(want);
      free(delay);
      return die_usage(msg);
    }
    delay[r] = ms;
  }
  int all_local = 1;
  for (uint32_t r = 0; r < R; r++)
    all_local &= want[r];

  trace t = {0};
  char *buf = NULL;
  size_t len;
  if (trace_path != NULL) {
    trace_error terr;
    if (trace_read_file(trace_path, &buf, &len) != 0) {
      fprintf(stderr, "gnmr-sim: %s: %s\n", trace_path, strerror(errno));
      free(want);
      free(delay);
      return 1;
    }
    if (trace_parse(buf, len, &t, &terr) != 0) {
      fprintf(stderr, "gnmr-sim: %s:%zu: %s\n", trace_path, terr.line,
              terr.msg);
      free(buf);
      free(want);
      free(delay);
      return 1;
    }
    free(buf);
  } else if (sim_synth(&t, (uint32_t)units, steps, (unsigned)seed) != 0) {
    fprintf(stderr, "gnmr-sim: out of memory\n");
    free(want);
    free(delay);
    return 1;
  }
  if (write_path != NULL && sim_write_trace(write_path, &t) != 0) {
    fprintf(stderr, "gnmr-sim: %s: %s\n", write_path, strerror(errno));
    trace_clear(&t);
    free(want);
    free(delay);
    return 1;
  }
  uint32_t K = (uint32_t)shards, U = t.n_units;
  if (U == 0) {
    fputs("step,active\n", stdout);
    trace_clear(&t);
    free(want);
    free(delay);
    return 0;
  }

  /* Layout: rank r holds unit u when (r - u) mod R < K. */
  sim_rank *rk = calloc(R, sizeof *rk);
  uint32_t *local_of = malloc((size_t)U * K * sizeof *local_of); /* [u][j] */
  double *parts = malloc(K * sizeof *parts);
  double *norm = malloc(U * sizeof *norm);
  uint8_t *present = malloc(U);
  uint8_t *active = malloc(U);
  double *lat = malloc((t.last_step - t.first_step + 1) * sizeof *lat);
  uint32_t *all_ids = malloc(U * sizeof *all_ids);
  gnmr_agent *obs = NULL; /* reads every unit when some ranks run elsewhere */
  int code = 1;
  base.endpoint = endpoint;
  base.job = job;
  base.reporters = R;
  base.barrier_ms = (uint32_t)barrier;
  policy_params_to_public(&prm, &base.params);
  if (!rk || !local_of || !parts || !norm || !present || !active || !lat ||
      !all_ids) {
    fprintf(stderr, "gnmr-sim: out of memory\n");
    goto out;
  }
  for (uint32_t r = 0; r < R; r++) {
    uint32_t n = 0;
    rk[r].local = want[r];
    rk[r].delay_ms = delay[r];
    rk[r].units = malloc(((size_t)U * K / R + K + 1) * sizeof(uint32_t));
    if (rk[r].units == NULL)
      goto out;
    for (uint32_t u = 0; u < U; u++) {
      uint32_t j = (r + R - u % R) % R;
      if (j < K) {
        local_of[(size_t)u * K + j] = n;
        rk[r].units[n++] = u;
      }
    }
    rk[r].n_local = n;
  }
  /* The ranks with no units (K < R with few units) do not join: the job
   * expects every rank, so refuse that layout up front. */
  for (uint32_t r = 0; r < R; r++)
    if (rk[r].n_local == 0) {
      fprintf(stderr, "gnmr-sim: rank %u would hold no unit: use fewer "
                      "--ranks or more units\n", r);
      goto out;
    }
  for (uint32_t r = 0; r < R; r++) {
    uint32_t n = rk[r].n_local;
    rk[r].sumsq = malloc(n * sizeof(double));
    rk[r].nonfinite = malloc(n * sizeof(uint64_t));
    rk[r].nr = malloc(n);
    if (!rk[r].sumsq || !rk[r].nonfinite || !rk[r].nr)
      goto out;
  }
  double t_start = now_s();
  /* opens the local ranks that are due; returns 0 or an error */
#define OPEN_DUE()                                                            \
  do {                                                                        \
    for (uint32_t r = 0; r < R; r++) {                                        \
      if (!rk[r].local || rk[r].agent != NULL ||                              \
          (now_s() - t_start) * 1e3 < (double)rk[r].delay_ms)                 \
        continue;                                                             \
      char **names = unit_names(rk[r].units, rk[r].n_local);                  \
      int orv = names ? open_agent(&base, r, names, rk[r].n_local,            \
                                   rk[r].units, 0, &rk[r].agent)              \
                      : GNMR_E_NOMEM;                                         \
      free_names(names, rk[r].n_local);                                       \
      if (orv != GNMR_OK) {                                                   \
        fprintf(stderr, "gnmr-sim: rank %u: %s\n", r, gnmr_strerror(orv));   \
        goto out;                                                             \
      }                                                                       \
    }                                                                         \
  } while (0)
  OPEN_DUE();
  if (!all_local) {
    for (uint32_t u = 0; u < U; u++)
      all_ids[u] = u;
    char **names = unit_names(all_ids, U);
    int orv = names ? open_agent(&base, 0, names, U, all_ids, 1, &obs)
                    : GNMR_E_NOMEM;
    free_names(names, U);
    if (orv != GNMR_OK) {
      fprintf(stderr, "gnmr-sim: observer: %s\n", gnmr_strerror(orv));
      goto out;
    }
  }

  /* Start once this process's agents have joined (bounded by the
   * timeout): an observer that joins after a step was decided would never
   * get that step's decision. */
  for (double t_join = now_s(); now_s() - t_join < (double)timeout * 1e-3;) {
    int all = obs == NULL || gnmr_agent_joined(obs);
    for (uint32_t r = 0; r < R && all; r++)
      all = rk[r].agent == NULL || gnmr_agent_joined(rk[r].agent);
    if (all)
      break;
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  fputs("step,active\n", stdout);
  size_t row = 0, nsteps = 0;
  uint64_t late = 0, disagree = 0;
  for (uint64_t step = t.first_step; step <= t.last_step; step++) {
    double step_t0 = now_s();
    OPEN_DUE();
    memset(present, 0, U);
    for (; row < t.n_rows && t.rows[row].step == step; row++) {
      norm[t.rows[row].unit] = t.rows[row].norm;
      present[t.rows[row].unit] = 1;
    }
    for (uint32_t u = 0; u < U; u++) {
      double n = norm[u];
      int nonfinite = present[u] && !isfinite(n);
      if (present[u] && !nonfinite)
        sim_split_norm(n, K, parts);
      /* shard j of u lives on rank (u + j) % R; partials go in rank order */
      uint32_t first = u % R;
      for (uint32_t j = 0; j < K; j++) {
        uint32_t r = (first + j) % R;
        /* index of this shard among u's shards sorted by rank */
        uint32_t order = 0;
        for (uint32_t q = 0; q < K; q++)
          order += (first + q) % R < r;
        uint32_t i = local_of[(size_t)u * K + j];
        rk[r].nr[i] = !present[u];
        rk[r].nonfinite[i] = nonfinite ? 1 : 0;
        rk[r].sumsq[i] = present[u] && !nonfinite ? parts[order] : 0;
      }
    }
    double t0 = now_s();
    for (uint32_t r = 0; r < R; r++)
      if (rk[r].agent != NULL)
        gnmr_agent_report_sums(rk[r].agent, step, rk[r].sumsq,
                               rk[r].nonfinite, rk[r].nr);
    for (uint32_t r = 0; r < R; r++)
      if (rk[r].agent != NULL &&
          gnmr_agent_wait(rk[r].agent, step, (int)timeout) != GNMR_OK)
        late++;
    if (obs != NULL && gnmr_agent_wait(obs, step, (int)timeout) != GNMR_OK)
      late++;
    lat[nsteps++] = now_s() - t0;
    /* A unit is active when its routes say HIGH (all shards here must
     * agree); with ranks elsewhere, the observer's route is the answer. */
    uint32_t n_act = 0;
    for (uint32_t u = 0; u < U; u++) {
      int high = -1;
      for (uint32_t j = 0; j < K; j++) {
        uint32_t r = (u % R + j) % R;
        if (rk[r].agent == NULL)
          continue;
        int h = gnmr_agent_route(rk[r].agent, local_of[(size_t)u * K + j]) ==
                GNMR_ROUTE_HIGH;
        if (high >= 0 && h != high)
          disagree++;
        high = h;
      }
      if (obs != NULL) {
        int h = gnmr_agent_route(obs, u) == GNMR_ROUTE_HIGH;
        if (high >= 0 && h != high)
          disagree++;
        high = h;
      }
      active[u] = (uint8_t)(high > 0);
      n_act += active[u];
    }
    uint32_t *ids = malloc((n_act ? n_act : 1) * sizeof *ids), k = 0;
    if (ids == NULL)
      goto out;
    for (uint32_t u = 0; u < U; u++)
      if (active[u])
        ids[k++] = u;
    gnmr__write_decision_row(stdout, step, ids, k);
    free(ids);
    /* --step-ms: the training step's own time (the compute) */
    double left = (double)step_ms * 1e-3 - (now_s() - step_t0);
    if (left > 0) {
      struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) *
                                                 1e9)};
      nanosleep(&ts, NULL);
    }
  }
#undef OPEN_DUE
  fflush(stdout);
  qsort(lat, nsteps, sizeof *lat, cmp_double);
  uint32_t here = 0;
  for (uint32_t r = 0; r < R; r++)
    here += rk[r].local;
  char who[48] = "";
  if (here < R)
    snprintf(who, sizeof who, "%u of ", here);
  fprintf(stderr,
          "gnmr-sim: %s%u ranks x %u units (%u shards each), %zu "
          "steps: round trip p50 %.1f us, p99 %.1f us, max %.1f us; "
          "late decisions %llu\n",
          who, R, U, K, nsteps, lat[nsteps / 2] * 1e6,
          lat[(size_t)((double)(nsteps - 1) * 0.99)] * 1e6,
          lat[nsteps - 1] * 1e6, (unsigned long long)late);
  if (disagree)
    fprintf(stderr, "gnmr-sim: %llu unit-steps where shards disagreed\n",
            (unsigned long long)disagree);
  code = late || disagree ? 1 : 0;
out:
  gnmr_agent_close(&obs);
  if (rk != NULL) {
    for (uint32_t r = 0; r < R; r++) {
      gnmr_agent_close(&rk[r].agent);
      free(rk[r].units);
      free(rk[r].sumsq);
      free(rk[r].nonfinite);
      free(rk[r].nr);
    }
  }
  free(rk);
  free(local_of);
  free(parts);
  free(norm);
  free(present);
  free(active);
  free(lat);
  free(all_ids);
  free(want);
  free(delay);
  trace_clear(&t);
  return code;
}
