/* SPDX-License-Identifier: MIT */
/* cmd_replay.c — `gnmrctl replay [policy options] [--scores[=FILE]] TRACE`:
 * the offline interface of docs/policy.md. Decisions go to stdout; with
 * --scores, the scores CSV goes to FILE (default: standard error). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gnmr/error.h"
#include "params.h"
#include "replay.h"
#include "trace.h"

/* One line of the help a policy option, from the parameters' table. */
#define PARAM_HELP_LINE(name, ctype, kind, opt, env, def, inh)               \
  "    --" opt " " GNMR__PARAM_METAVAR_##kind "\n"

static const char usage[] =
    "usage: gnmrctl replay [POLICY OPTIONS] [--scores[=FILE]] "
    "[--schedule FILE] TRACE\n"
    "\n"
    "The policy, offline: reads a trace (step,unit,norm CSV, or\n"
    "step,unit,norm,measure for a recipe's measured signal; '-' is standard\n"
    "input) and prints the decisions CSV (step,active), one row a step, as\n"
    "gnmrd would have decided them (docs/tools.md).\n"
    "\n"
    "options:\n"
    "  --scores[=FILE]  also write, per step, every risky or lock-held unit\n"
    "                   with norm, g, d, s and its outcome (selected,\n"
    "                   dropped, warmup, held) as CSV to FILE (default stderr)\n"
    "  --schedule FILE  the job's parameter changes: `gnmrctl export` output\n"
    "                   (its parameters, then every `set`), or lines\n"
    "                   'STEP key=value...' applied from step STEP on\n"
    "  POLICY OPTIONS, each a parameter of docs/policy.md (default: the\n"
    "  policy's default; `gnmrctl set --help` lists their keys):\n"
    GNMR_PARAMS_MAP(PARAM_HELP_LINE);

/* Above 255 so that no value collides with a short option character. */
enum { OPT_SCORES = 256, OPT_HELP, OPT_SCHEDULE, OPT_POLICY_BASE = 512 };

/* What `gnmrctl replay` was asked for. */
typedef struct replay_args {
  policy_params prm;
  const char *schedule_path, *scores_path, *path;
  int want_scores;
} replay_args;

/* The options and the one TRACE. -1 to go on, else the exit status. */
static int parse_replay_args(replay_args *a, int argc, char **argv) {
  struct option longopts[GNMR_POLICY_NOPTS + 4];
  char msg[256];
  int c;
  policy_params_default(&a->prm);
  gnmr__policy_opts_longopts(longopts, OPT_POLICY_BASE);
  longopts[GNMR_POLICY_NOPTS] =
      (struct option){"scores", optional_argument, NULL, OPT_SCORES};
  longopts[GNMR_POLICY_NOPTS + 1] =
      (struct option){"help", no_argument, NULL, OPT_HELP};
  longopts[GNMR_POLICY_NOPTS + 2] =
      (struct option){"schedule", required_argument, NULL, OPT_SCHEDULE};
  longopts[GNMR_POLICY_NOPTS + 3] = (struct option){0};
  while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
    if (c == OPT_SCORES) {
      a->want_scores = 1;
      a->scores_path = optarg;
    } else if (c == OPT_SCHEDULE) {
      a->schedule_path = optarg;
    } else if (c == OPT_HELP || c == 'h') {
      fputs(usage, stdout);
      return CLI_OK;
    } else if (c >= OPT_POLICY_BASE &&
               c < OPT_POLICY_BASE + GNMR_POLICY_NOPTS) {
      if (gnmr__policy_opts_apply(&a->prm, c - OPT_POLICY_BASE, optarg, msg,
                                  sizeof msg) != 0) {
        fprintf(stderr, "gnmrctl replay: %s\n", msg);
        return CLI_USAGE;
      }
    } else {
      fputs(usage, stderr);
      return CLI_USAGE;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "gnmrctl replay: %s\n%s",
            optind >= argc ? "missing TRACE" : "more than one TRACE given",
            usage);
    return CLI_USAGE;
  }
  if (gnmr__policy_opts_check(&a->prm, msg, sizeof msg) != 0) {
    fprintf(stderr, "gnmrctl replay: %s\n", msg);
    return CLI_USAGE;
  }
  a->path = argv[optind];
  return -1;
}

/* The trace read and parsed, errors said with the path (and line). */
static int load_replay_trace(const char *path, char **buf, trace *t) {
  size_t len = 0;
  trace_error terr;
  int rv;
  if ((rv = trace_read_file(path, buf, &len)) != 0) {
    fprintf(stderr, "gnmrctl replay: %s: %s\n",
            strcmp(path, "-") == 0 ? "standard input" : path,
            rv == GNMR_E_IO ? strerror(errno) : gnmr_strerror(rv));
    return rv;
  }
  if ((rv = trace_parse(*buf, len, t, &terr)) != 0) {
    if (terr.line > 0)
      fprintf(stderr, "gnmrctl replay: %s:%zu: %s\n", path, terr.line,
              terr.msg);
    else
      fprintf(stderr, "gnmrctl replay: %s: %s\n", path, terr.msg);
  }
  return rv;
}

int cmd_replay(const cli_globals *g, int argc, char **argv) {
  replay_args a = {0};
  gnmr_schedule sched = {0};
  char msg[256], *buf = NULL;
  trace t = {0};
  FILE *scores = NULL;
  int rv, code = parse_replay_args(&a, argc, argv);
  (void)g;
  if (code >= 0)
    return code;
  code = CLI_FAIL;
  if (a.schedule_path != NULL &&
      cli_schedule_load(a.schedule_path, &a.prm, &sched, msg, sizeof msg) !=
          0) {
    fprintf(stderr, "gnmrctl replay: %s\n", msg);
    return CLI_FAIL;
  }
  if (load_replay_trace(a.path, &buf, &t) != 0)
    goto out;
  if (a.want_scores) {
    if (a.scores_path == NULL || strcmp(a.scores_path, "-") == 0) {
      scores = stderr;
    } else if ((scores = fopen(a.scores_path, "w")) == NULL) {
      fprintf(stderr, "gnmrctl replay: %s: %s\n", a.scores_path,
              strerror(errno));
      goto out;
    }
  }
  if ((rv = gnmr__replay(&t, &a.prm, a.schedule_path ? &sched : NULL, stdout,
                         scores)) != 0) {
    fprintf(stderr, "gnmrctl replay: %s\n", gnmr_strerror(rv));
    goto out;
  }
  code = CLI_OK;
out:
  if (scores != NULL && scores != stderr && fclose(scores) != 0 &&
      code == CLI_OK) {
    fprintf(stderr, "gnmrctl replay: %s: %s\n", a.scores_path, strerror(errno));
    code = CLI_FAIL;
  }
  trace_clear(&t);
  free(buf);
  free(sched.e);
  return code;
}
