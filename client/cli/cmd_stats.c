/* SPDX-License-Identifier: MIT */
/* cmd_stats.c — `gnmrctl [--admin ENDPOINT] stats [--json]`: the daemon's
 * counters and live jobs, from its admin endpoint. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "text.h"
#include "gnmr/error.h"
#include "wire.h"

static const char usage[] =
    "usage: gnmrctl stats [--json] [--timeout-ms MS]\n"
    "\n"
    "What gnmrd is and how it has done since it started: its version and\n"
    "uptime; for operators its endpoints, data directory and leadership\n"
    "term; its counters (reports, decisions, refusals, the store's queue;\n"
    "the HELP lines of gnmrd's /metrics say what each counts) and its live\n"
    "jobs. With tenancy on, an\n"
    "agent key gets its own live jobs and no counters.\n"
    "\n"
    "options:\n"
    "  --json           the answer as JSON\n"
    "  --timeout-ms MS  how long to wait for gnmrd (default 2000)\n"
    "global options, before the command: --admin ENDPOINT, "
    "--curve-server-key,\n"
    "--key-file (gnmrctl --help)\n";

int cmd_stats(const cli_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {
      {"json", no_argument, NULL, 'j'},
      {"timeout-ms", required_argument, NULL, 't'},
      {"help", no_argument, NULL, 'h'},
      {0},
  };
  int c, json = 0, timeout = 2000;
  while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
    if (c == 'j') {
      json = 1;
    } else if (c == 't') {
      char *end;
      long v = strtol(optarg, &end, 10);
      if (*optarg == '\0' || *end != '\0' || v < 1 || v > 600000) {
        fprintf(stderr, "gnmrctl stats: --timeout-ms '%s': expected 1 to "
                        "600000\n", optarg);
        return CLI_USAGE;
      }
      timeout = (int)v;
    } else if (c == 'h') {
      fputs(usage, stdout);
      return CLI_OK;
    } else {
      fputs(usage, stderr);
      return CLI_USAGE;
    }
  }
  if (optind != argc) {
    fprintf(stderr, "gnmrctl stats: unexpected argument '%s'\n%s",
            argv[optind], usage);
    return CLI_USAGE;
  }
  Gnmr__Envelope req = GNMR__ENVELOPE__INIT;
  Gnmr__StatsRequest sr = GNMR__STATS_REQUEST__INIT;
  req.body_case = GNMR__ENVELOPE__BODY_STATS_REQUEST;
  req.stats_request = &sr;
  Gnmr__Envelope *env = cli_admin_call(g, &req, timeout);
  if (env == NULL)
    return CLI_FAIL;
  int code = CLI_OK;
  if (env->body_case == GNMR__ENVELOPE__BODY_ERROR) {
    fprintf(stderr, "gnmrctl stats: %s\n", env->error->message);
    code = CLI_FAIL;
  } else if (env->body_case != GNMR__ENVELOPE__BODY_STATS) {
    fprintf(stderr, "gnmrctl stats: unexpected reply\n");
    code = CLI_FAIL;
  } else if (json) {
    /* counter names are identifiers and job names are printable: only
     * quotes and backslashes need escaping */
    printf("{\"counters\":{");
    for (size_t i = 0; i < env->stats->n_counters; i++)
      printf("%s\"%s\":%llu", i ? "," : "", env->stats->counters[i]->name,
             (unsigned long long)env->stats->counters[i]->value);
    printf("},\"jobs\":[");
    for (size_t i = 0; i < env->stats->n_jobs; i++) {
      printf("%s\"", i ? "," : "");
      for (const char *p = env->stats->jobs[i]; *p; p++)
        printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
      printf("\"");
    }
    printf("]");
    const Gnmr__Stats *t = env->stats;
    json_t *who = json_pack("{s:s,s:I}", "version", t->version ? t->version
                                                                : "",
                            "uptime_s", (json_int_t)t->uptime_s);
    if (t->agents != NULL && t->agents[0] != '\0') {
      json_object_set_new(who, "agents", json_string(t->agents));
      json_object_set_new(who, "admin", json_string(t->admin));
      json_object_set_new(who, "data_dir", json_string(t->data_dir));
      json_object_set_new(who, "term", json_integer((json_int_t)t->term));
    }
    char *w = json_dumps(who, JSON_COMPACT | JSON_ENSURE_ASCII);
    printf(",\"gnmrd\":%s}\n", w ? w : "{}");
    free(w);
    json_decref(who);
  } else {
    for (size_t i = 0; i < env->stats->n_counters; i++)
      printf("%-20s %llu\n", env->stats->counters[i]->name,
             (unsigned long long)env->stats->counters[i]->value);
    /* who answers, after the counters; its words escaped (a peer's) */
    const Gnmr__Stats *t = env->stats;
    char esc[1200];
    if (t->version != NULL && t->version[0] != '\0')
      printf("%-20s %s\n%-20s %llu\n", "version",
             gnmr__escape(t->version, esc, sizeof esc), "uptime_s",
             (unsigned long long)t->uptime_s);
    if (t->agents != NULL && t->agents[0] != '\0') {
      printf("%-20s %s\n", "agents", gnmr__escape(t->agents, esc, sizeof esc));
      printf("%-20s %s\n", "admin", gnmr__escape(t->admin, esc, sizeof esc));
      printf("%-20s %s\n", "data_dir",
             gnmr__escape(t->data_dir, esc, sizeof esc));
      printf("%-20s %llu\n", "term", (unsigned long long)t->term);
    }
    for (size_t i = 0; i < env->stats->n_jobs; i++)
      printf("job %s\n", env->stats->jobs[i]);
  }
  gnmr__wire_free(&env);
  return code;
}
