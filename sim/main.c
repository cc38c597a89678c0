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
    "                [--node-ranks N]\n"
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
    "  MS ms (a training step's compute). --node-ranks N (or\n"
    "  GNMR_NODE_RANKS) says N ranks a node (Hello.node_ranks, for node\n"
    "  relays); with --shards N too, each unit's shards lie on the ranks of\n"
    "  one node (unit u on node u mod R/N), as tensor parallelism within a\n"
    "  node lays them.\n";

enum {
  OPT_AGENTS = 256, OPT_JOB, OPT_RANKS, OPT_SHARDS, OPT_TRACE, OPT_UNITS,
  OPT_STEPS, OPT_SEED, OPT_BARRIER, OPT_TIMEOUT, OPT_WRITE, OPT_HELP,
  OPT_LOCAL, OPT_RANK, OPT_DELAY, OPT_SKEY, OPT_KEYFILE, OPT_STEPMS,
  OPT_NODE_RANKS, OPT_POLICY_BASE = 512
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

/* What main()'s phases share: the command line, which ranks run here,
 * the trace, the layout and each step's buffers, and the run's figures. */
typedef struct sim {
  gnmr_agent_config base; /* the environment, then the flags */
  policy_params prm;
  const char *trace_path, *write_path, *local_list, *skey, *key_file;
  uint64_t ranks, shards, units, steps, seed, barrier, timeout, one_rank,
      step_ms, node_ranks;
  uint32_t node_shards; /* N > 1: each unit's K = N shards on one node */
  int have_rank;
  char *delays[64];
  int n_delays;
  char spub[41], cpub[41], csec[41];
  int *want;       /* [R]: runs here */
  uint64_t *delay; /* [R]: opens this many ms late */
  int all_local;
  trace t;        /* --trace's rows */
  sim_synth gen;  /* else the synthetic trace, a step at a time */
  int synth;
  uint32_t R, K, U;
  uint32_t *mine, n_mine; /* the units with a shard on a local rank */
  sim_rank *rk;
  uint32_t *local_of; /* [u][j]: shard j of unit u's local index */
  double *parts, *norm, *lat;
  uint8_t *present, *active;
  uint32_t *all_ids;
  gnmr_agent *obs; /* reads every unit when some ranks run elsewhere */
  double t_start;
  size_t nsteps;
  uint64_t late, disagree;
} sim;

/* The settings an agent takes from its GNMR_* environment, and the
 * simulator's own defaults. -1 to go on, else the exit status. */
static int settings_from_env(sim *m) {
  gnmr_agent_config *base = &m->base;
  const char *bad_var = NULL;
  base->barrier_ms = 2000;
  gnmr_params_default(&base->params);
  if (gnmr_agent_config_from_env(base, &bad_var) != GNMR_OK) {
    fprintf(stderr, "gnmr-sim: %s: not a valid value\n", bad_var);
    return 2;
  }
  m->ranks = base->reporters;
  m->shards = 1;
  m->units = 64;
  m->steps = 300;
  m->seed = 1;
  m->barrier = base->barrier_ms;
  m->timeout = 5000;
  m->have_rank = getenv("GNMR_RANK") != NULL;
  m->one_rank = base->rank;
  m->node_ranks = base->node_ranks;
  policy_params_from_public(&base->params, &m->prm);
  return -1;
}

/* Phase 1: the environment, then the flags. -1 to go on, else the exit
 * status. */
static int parse_command_line(sim *m, int argc, char **argv) {
  struct option longopts[GNMR_POLICY_NOPTS + 20] = {
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
      {"node-ranks", required_argument, NULL, OPT_NODE_RANKS},
  };
  gnmr_agent_config *base = &m->base;
  int rv = settings_from_env(m);
  if (rv >= 0)
    return rv;
  char msg[256];
  int c;
  gnmr__policy_opts_longopts(&longopts[19], OPT_POLICY_BASE);
  /* the integer options and their largest values */
  const struct {
    int opt;
    uint64_t *num, max;
  } nums[] = {
      {OPT_RANK, &m->one_rank, 1023},     {OPT_RANKS, &m->ranks, 1024},
      {OPT_SHARDS, &m->shards, 1024},     {OPT_UNITS, &m->units, 1u << 20},
      {OPT_STEPS, &m->steps, 10000000},   {OPT_SEED, &m->seed, UINT32_MAX},
      {OPT_BARRIER, &m->barrier, 600000}, {OPT_TIMEOUT, &m->timeout, 600000},
      {OPT_STEPMS, &m->step_ms, 600000},  {OPT_NODE_RANKS, &m->node_ranks, 4096}};
  /* the text options */
  const struct {
    int opt;
    const char **at;
  } texts[] = {{OPT_AGENTS, &base->endpoint}, {OPT_JOB, &base->job},
               {OPT_TRACE, &m->trace_path},   {OPT_WRITE, &m->write_path},
               {OPT_LOCAL, &m->local_list},   {OPT_SKEY, &m->skey},
               {OPT_KEYFILE, &m->key_file}};
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    size_t i, nn = sizeof nums / sizeof nums[0];
    size_t nt = sizeof texts / sizeof texts[0];
    for (i = 0; i < nt && texts[i].opt != c; i++)
      ;
    if (i < nt) {
      *texts[i].at = optarg;
      continue;
    }
    for (i = 0; i < nn && nums[i].opt != c; i++)
      ;
    if (i < nn) {
      m->have_rank |= c == OPT_RANK;
      if (gnmr__parse_u64(optarg, nums[i].max, nums[i].num) == 0)
        continue;
      const char *name = "?";
      for (int o = 0; longopts[o].name; o++)
        if (longopts[o].val == c)
          name = longopts[o].name;
      snprintf(msg, sizeof msg, "--%s '%s': expected an integer from 0 to %llu",
               name, optarg, (unsigned long long)nums[i].max);
      return die_usage(msg);
    }
    if (c == OPT_DELAY) {
      if (m->n_delays == 64)
        return die_usage("at most 64 --start-delay");
      m->delays[m->n_delays++] = optarg;
    } else if (c == OPT_HELP || c == 'h') {
      fputs(usage, stdout);
      return 0;
    } else if (c >= OPT_POLICY_BASE &&
               c < OPT_POLICY_BASE + GNMR_POLICY_NOPTS) {
      if (gnmr__policy_opts_apply(&m->prm, c - OPT_POLICY_BASE, optarg, msg,
                                  sizeof msg) != 0)
        return die_usage(msg);
    } else {
      fputs(usage, stderr);
      return 2;
    }
  }
  if (optind != argc)
    return die_usage("unexpected argument");
  return -1;
}

/* Phase 2: what the flags say together, and CURVE (flags over the
 * environment; a server key may be its .pub file). */
static int check_settings(sim *m) {
  char msg[256];
  if (m->base.endpoint == NULL || m->base.job == NULL || m->ranks == 0)
    return die_usage("--agents, --job and --ranks (>= 1) are required "
                     "(or GNMR_ENDPOINT, GNMR_JOB, GNMR_REPORTERS)");
  if (m->shards == 0 || m->shards > m->ranks)
    return die_usage("--shards must be from 1 to --ranks");
  m->base.node_ranks = (uint32_t)m->node_ranks;
  if (m->node_ranks > 1 && m->shards == m->node_ranks) {
    if (m->ranks % m->node_ranks != 0)
      return die_usage("--node-ranks with --shards N: --ranks a multiple of "
                       "N (whole nodes)");
    m->node_shards = (uint32_t)m->node_ranks;
  }
  if (m->barrier == 0 || m->units == 0 || m->steps == 0)
    return die_usage("--barrier-ms, --units and --steps must be >= 1");
  if (gnmr__policy_opts_check(&m->prm, msg, sizeof msg) != 0)
    return die_usage(msg);
  if (m->skey != NULL) {
    if (gnmr__key_valid(m->skey))
      snprintf(m->spub, sizeof m->spub, "%s", m->skey);
    else if (gnmr__key_file_read(m->skey, m->spub, NULL, msg, sizeof msg) != 0)
      return die_usage(msg);
    m->base.curve_server_key = m->spub;
  }
  if (m->key_file != NULL) {
    if (gnmr__key_file_read(m->key_file, m->cpub, m->csec, msg, sizeof msg) !=
        0)
      return die_usage(msg);
    m->base.curve_public_key = m->cpub;
    m->base.curve_secret_key = m->csec;
  }
  if ((m->skey != NULL) != (m->key_file != NULL))
    return die_usage("--curve-server-key and --key-file go together");
  return -1;
}

/* Phase 3: which ranks run here (want), and how late each opens. */
static int choose_ranks(sim *m) {
  char msg[256];
  uint32_t R = m->R = (uint32_t)m->ranks;
  m->want = calloc(R, sizeof *m->want);
  m->delay = calloc(R, sizeof *m->delay);
  if (m->want == NULL || m->delay == NULL) {
    fprintf(stderr, "gnmr-sim: out of memory\n");
    return 1;
  }
  if (m->local_list != NULL && m->have_rank)
    return die_usage("--local-ranks and --rank (or GNMR_RANK) exclude each "
                     "other");
  if (m->local_list != NULL) {
    if (parse_ranks(m->local_list, R, m->want) != GNMR_OK) {
      snprintf(msg, sizeof msg,
               "--local-ranks '%s': expected ranks below "
               "%u like 0,2-3",
               m->local_list, R);
      return die_usage(msg);
    }
  } else if (m->have_rank) {
    if (m->one_rank >= R) {
      snprintf(msg, sizeof msg, "rank %llu is not below --ranks %u",
               (unsigned long long)m->one_rank, R);
      return die_usage(msg);
    }
    m->want[m->one_rank] = 1;
  } else {
    for (uint32_t r = 0; r < R; r++)
      m->want[r] = 1;
  }
  for (int i = 0; i < m->n_delays; i++) {
    unsigned long long r, ms;
    int end = 0;
    const char *d = m->delays[i];
    if (sscanf(d, "%llu:%llu%n", &r, &ms, &end) != 2 || d[end] != '\0' ||
        r >= R || ms > 3600000) {
      snprintf(msg, sizeof msg,
               "--start-delay '%s': expected RANK:MS with "
               "RANK below %u and MS up to 3600000",
               d, R);
      return die_usage(msg);
    }
    m->delay[r] = ms;
  }
  m->all_local = 1;
  for (uint32_t r = 0; r < R; r++)
    m->all_local &= m->want[r];
  return -1;
}

/* Phase 4: the trace, read or made (and saved with --write-trace). */
static int load_trace(sim *m) {
  char *buf = NULL;
  size_t len;
  if (m->trace_path != NULL) {
    trace_error terr;
    if (trace_read_file(m->trace_path, &buf, &len) != 0) {
      fprintf(stderr, "gnmr-sim: %s: %s\n", m->trace_path, strerror(errno));
      return 1;
    }
    int bad = trace_parse(buf, len, &m->t, &terr);
    free(buf);
    if (bad != 0) {
      fprintf(stderr, "gnmr-sim: %s:%zu: %s\n", m->trace_path, terr.line,
              terr.msg);
      return 1;
    }
  } else {
    /* made a step at a time (split_step): the rows are never held */
    if (sim_synth_open(&m->gen, (uint32_t)m->units, m->steps,
                       (unsigned)m->seed) != 0) {
      fprintf(stderr, "gnmr-sim: out of memory\n");
      return 1;
    }
    m->synth = 1;
    m->t.first_step = 1;
    m->t.last_step = m->steps;
    m->t.n_units = (uint32_t)m->units;
  }
  if (m->write_path != NULL &&
      (m->synth ? sim_synth_write(m->write_path, (uint32_t)m->units,
                                  m->steps, (unsigned)m->seed)
                : sim_write_trace(m->write_path, &m->t)) != 0) {
    fprintf(stderr, "gnmr-sim: %s: %s\n", m->write_path, strerror(errno));
    return 1;
  }
  m->K = (uint32_t)m->shards;
  m->U = m->t.n_units;
  return -1;
}

/* The rank of unit u's shard j: (u + j) mod R, or with node shards rank
 * j of node u mod R/N. */
static uint32_t shard_rank(const sim *m, uint32_t u, uint32_t j) {
  uint32_t N = m->node_shards;
  return N > 1 ? u % (m->R / N) * N + j : (u % m->R + j) % m->R;
}

/* Phase 5: the layout, rank r holding unit u when (r - u) mod R < K (or
 * u's node is r's, with node shards), and each step's buffers. */
static int lay_out(sim *m) {
  uint32_t R = m->R, K = m->K, U = m->U;
  m->rk = calloc(R, sizeof *m->rk);
  m->local_of = malloc((size_t)U * K * sizeof *m->local_of);
  m->parts = malloc(K * sizeof *m->parts);
  m->norm = malloc(U * sizeof *m->norm);
  m->present = malloc(U);
  m->active = malloc(U);
  m->lat = malloc((m->t.last_step - m->t.first_step + 1) * sizeof *m->lat);
  m->all_ids = malloc(U * sizeof *m->all_ids);
  m->base.reporters = R;
  m->base.barrier_ms = (uint32_t)m->barrier;
  policy_params_to_public(&m->prm, &m->base.params);
  if (!m->rk || !m->local_of || !m->parts || !m->norm || !m->present ||
      !m->active || !m->lat || !m->all_ids) {
    fprintf(stderr, "gnmr-sim: out of memory\n");
    return 1;
  }
  for (uint32_t r = 0; r < R; r++) {
    sim_rank *k = &m->rk[r];
    uint32_t n = 0;
    k->local = m->want[r];
    k->delay_ms = m->delay[r];
    k->units = malloc(((size_t)U * K / R + K + 1) * sizeof(uint32_t));
    if (k->units == NULL)
      return 1;
    for (uint32_t u = 0; u < U; u++) {
      uint32_t N = m->node_shards, j = (r + R - u % R) % R;
      if (N > 1) /* on node u mod R/N, shard j on its rank j */
        j = r / N == u % (R / N) ? r % N : K;
      if (j < K) {
        m->local_of[(size_t)u * K + j] = n;
        k->units[n++] = u;
      }
    }
    k->n_local = n;
  }
  m->mine = malloc((U ? U : 1) * sizeof *m->mine);
  if (m->mine == NULL)
    return 1;
  for (uint32_t u = 0; u < U; u++)
    for (uint32_t j = 0; j < K; j++)
      if (m->rk[shard_rank(m, u, j)].local) {
        m->mine[m->n_mine++] = u;
        break;
      }
  /* The ranks with no units (K < R with few units) do not join: the job
   * expects every rank, so refuse that layout up front. */
  for (uint32_t r = 0; r < R; r++)
    if (m->rk[r].n_local == 0) {
      fprintf(stderr, "gnmr-sim: rank %u would hold no unit: use fewer "
                      "--ranks or more units\n", r);
      return 1;
    }
  for (uint32_t r = 0; r < R; r++) {
    sim_rank *k = &m->rk[r];
    k->sumsq = malloc(k->n_local * sizeof(double));
    k->nonfinite = malloc(k->n_local * sizeof(uint64_t));
    k->nr = malloc(k->n_local);
    if (!k->sumsq || !k->nonfinite || !k->nr)
      return 1;
  }
  return -1;
}

/* Opens the local ranks that are due. 0, or -1 after saying why. */
static int open_due(sim *m) {
  for (uint32_t r = 0; r < m->R; r++) {
    sim_rank *k = &m->rk[r];
    if (!k->local || k->agent != NULL ||
        (now_s() - m->t_start) * 1e3 < (double)k->delay_ms)
      continue;
    char **names = unit_names(k->units, k->n_local);
    int orv = names ? open_agent(&m->base, r, names, k->n_local, k->units, 0,
                                 &k->agent)
                    : GNMR_E_NOMEM;
    free_names(names, k->n_local);
    if (orv != GNMR_OK) {
      fprintf(stderr, "gnmr-sim: rank %u: %s\n", r, gnmr_strerror(orv));
      return -1;
    }
  }
  return 0;
}

/* Phase 6: the ranks due now, the observer when some ranks run
 * elsewhere; then waits (bounded by the timeout) until this process's
 * agents have joined: an observer that joins after a step was decided
 * would never get that step's decision. */
static int join(sim *m) {
  m->t_start = now_s();
  if (open_due(m) != 0)
    return 1;
  if (!m->all_local) {
    for (uint32_t u = 0; u < m->U; u++)
      m->all_ids[u] = u;
    char **names = unit_names(m->all_ids, m->U);
    int orv = names
                  ? open_agent(&m->base, 0, names, m->U, m->all_ids, 1, &m->obs)
                  : GNMR_E_NOMEM;
    free_names(names, m->U);
    if (orv != GNMR_OK) {
      fprintf(stderr, "gnmr-sim: observer: %s\n", gnmr_strerror(orv));
      return 1;
    }
  }
  for (double t0 = now_s(); now_s() - t0 < (double)m->timeout * 1e-3;) {
    int all = m->obs == NULL || gnmr_agent_joined(m->obs);
    for (uint32_t r = 0; r < m->R && all; r++)
      all = m->rk[r].agent == NULL || gnmr_agent_joined(m->rk[r].agent);
    if (all)
      break;
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  return -1;
}

/* A step's norms (*row: the trace's next row), split into each rank's
 * shard partials. */
static void split_step(sim *m, uint64_t step, size_t *row) {
  uint32_t R = m->R, K = m->K, U = m->U;
  if (m->synth) {
    sim_synth_step(&m->gen, m->norm);
    memset(m->present, 1, U);
  } else {
    memset(m->present, 0, U);
    for (; *row < m->t.n_rows && m->t.rows[*row].step == step; (*row)++) {
      m->norm[m->t.rows[*row].unit] = m->t.rows[*row].norm;
      m->present[m->t.rows[*row].unit] = 1;
    }
  }
  for (uint32_t i_u = 0; i_u < m->n_mine; i_u++) {
    uint32_t u = m->mine[i_u];
    double n = m->norm[u];
    int present = m->present[u], nonfinite = present && !isfinite(n);
    if (present && !nonfinite)
      sim_split_norm(n, K, m->parts);
    /* shard j of u lives on rank (u + j) % R (with node shards, on rank
     * j of node u mod R/N); partials go in rank order */
    uint32_t first = shard_rank(m, u, 0);
    for (uint32_t j = 0; j < K; j++) {
      uint32_t r = shard_rank(m, u, j);
      if (!m->rk[r].local)
        continue;
      /* index of this shard among u's shards sorted by rank (a node's
       * shards are in rank order already) */
      uint32_t order = 0;
      if (m->node_shards > 1)
        order = j;
      else
        for (uint32_t q = 0; q < K; q++)
          order += (first + q) % R < r;
      uint32_t i = m->local_of[(size_t)u * K + j];
      m->rk[r].nr[i] = !present;
      m->rk[r].nonfinite[i] = nonfinite ? 1 : 0;
      m->rk[r].sumsq[i] = present && !nonfinite ? m->parts[order] : 0;
    }
  }
}

/* The step's decision as the routes say it: a unit is active when they
 * say HIGH (all shards here must agree); with ranks elsewhere, the
 * observer's route is the answer. Printed as a CSV row. 0 or -1. */
static int print_decision(sim *m, uint64_t step) {
  uint32_t K = m->K, U = m->U, n_act = 0;
  for (uint32_t u = 0; u < U; u++) {
    int high = -1;
    for (uint32_t j = 0; j < K; j++) {
      uint32_t r = shard_rank(m, u, j);
      if (m->rk[r].agent == NULL)
        continue;
      int h =
          gnmr_agent_route(m->rk[r].agent, m->local_of[(size_t)u * K + j]) ==
          GNMR_ROUTE_HIGH;
      if (high >= 0 && h != high)
        m->disagree++;
      high = h;
    }
    if (m->obs != NULL) {
      int h = gnmr_agent_route(m->obs, u) == GNMR_ROUTE_HIGH;
      if (high >= 0 && h != high)
        m->disagree++;
      high = h;
    }
    m->active[u] = (uint8_t)(high > 0);
    n_act += m->active[u];
  }
  uint32_t *ids = malloc((n_act ? n_act : 1) * sizeof *ids), k = 0;
  if (ids == NULL)
    return -1;
  for (uint32_t u = 0; u < U; u++)
    if (m->active[u])
      ids[k++] = u;
  gnmr__write_decision_row(stdout, step, ids, k);
  free(ids);
  return 0;
}

/* Phase 7: every step in lockstep: report, wait for the decision, print
 * it, and (--step-ms) take the training step's own time. */
static int run_steps(sim *m) {
  size_t row = 0;
  fputs("step,active\n", stdout);
  for (uint64_t step = m->t.first_step; step <= m->t.last_step; step++) {
    double step_t0 = now_s();
    if (open_due(m) != 0)
      return 1;
    split_step(m, step, &row);
    double t0 = now_s();
    for (uint32_t r = 0; r < m->R; r++)
      if (m->rk[r].agent != NULL)
        gnmr_agent_report_sums(m->rk[r].agent, step, m->rk[r].sumsq,
                               m->rk[r].nonfinite, m->rk[r].nr);
    for (uint32_t r = 0; r < m->R; r++)
      if (m->rk[r].agent != NULL &&
          gnmr_agent_wait(m->rk[r].agent, step, (int)m->timeout) != GNMR_OK)
        m->late++;
    if (m->obs != NULL &&
        gnmr_agent_wait(m->obs, step, (int)m->timeout) != GNMR_OK)
      m->late++;
    m->lat[m->nsteps++] = now_s() - t0;
    if (print_decision(m, step) != 0)
      return 1;
    double left = (double)m->step_ms * 1e-3 - (now_s() - step_t0);
    if (left > 0) {
      struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) *
                                                 1e9)};
      nanosleep(&ts, NULL);
    }
  }
  fflush(stdout);
  return -1;
}

/* Phase 8: the round trips and what went wrong, on stderr. */
static int summarize(sim *m) {
  size_t n = m->nsteps;
  qsort(m->lat, n, sizeof *m->lat, cmp_double);
  uint32_t here = 0;
  for (uint32_t r = 0; r < m->R; r++)
    here += m->rk[r].local;
  char who[48] = "";
  if (here < m->R)
    snprintf(who, sizeof who, "%u of ", here);
  fprintf(stderr,
          "gnmr-sim: %s%u ranks x %u units (%u shards each), %zu "
          "steps: round trip p50 %.1f us, p99 %.1f us, max %.1f us; "
          "late decisions %llu\n",
          who, m->R, m->U, m->K, n, m->lat[n / 2] * 1e6,
          m->lat[(size_t)((double)(n - 1) * 0.99)] * 1e6, m->lat[n - 1] * 1e6,
          (unsigned long long)m->late);
  if (m->disagree)
    fprintf(stderr, "gnmr-sim: %llu unit-steps where shards disagreed\n",
            (unsigned long long)m->disagree);
  return m->late || m->disagree ? 1 : 0;
}

static void sim_clear(sim *m) {
  gnmr_agent_close(&m->obs);
  for (uint32_t r = 0; m->rk != NULL && r < m->R; r++) {
    gnmr_agent_close(&m->rk[r].agent);
    free(m->rk[r].units);
    free(m->rk[r].sumsq);
    free(m->rk[r].nonfinite);
    free(m->rk[r].nr);
  }
  free(m->rk);
  free(m->local_of);
  free(m->parts);
  free(m->norm);
  free(m->present);
  free(m->active);
  free(m->lat);
  free(m->all_ids);
  free(m->mine);
  free(m->want);
  free(m->delay);
  trace_clear(&m->t);
  sim_synth_clear(&m->gen);
}

int main(int argc, char **argv) {
  static sim m; /* large: kept off the stack */
  { /* every agent is a few descriptors: take what the hard limit allows */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  int code = parse_command_line(&m, argc, argv);
  if (code < 0)
    code = check_settings(&m);
  if (code < 0)
    code = choose_ranks(&m);
  if (code < 0)
    code = load_trace(&m);
  if (code < 0 && m.U == 0) { /* nothing to report */
    fputs("step,active\n", stdout);
    code = 0;
  }
  if (code < 0)
    code = lay_out(&m);
  if (code < 0)
    code = join(&m);
  if (code < 0)
    code = run_steps(&m);
  if (code < 0)
    code = summarize(&m);
  sim_clear(&m);
  return code;
}
