/* SPDX-License-Identifier: MIT */
/* cmd_watch.c — `gnmrctl watch JOB [--interval-ms MS] [--count N]
 * [--top N]`: a live view of a running job, refreshed in place: step and
 * steps per second, the active units, and the units with the highest
 * scores. It polls the admin endpoint (status + top) every interval. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "gnmr/error.h"
#include "num.h"

#define NAME_MAX_COLS 60

static const char usage[] =
    "usage: gnmrctl watch JOB [--interval-ms MS] [--count N] [--top N]\n"
    "\n"
    "A running job, live: its step and steps a second, the units on the\n"
    "recovery path, and the units with the highest scores, refreshed in\n"
    "place until interrupted. A poll that gnmrd does not answer within 2 s\n"
    "(busy, flooded, restarting) is said on stderr and asked again; a\n"
    "refusal (no such job) ends it; exit 1 when nothing was answered.\n"
    "\n"
    "options:\n"
    "  --interval-ms MS  refresh every MS, at least 50 (default 1000)\n"
    "  --count N         refresh N times, then exit\n"
    "  --top N           show the N highest-scoring units (default 8)\n"
    "global options, before the command: --admin ENDPOINT, "
    "--curve-server-key,\n"
    "--key-file (gnmrctl --help)\n";

/* The answer to cmd, or NULL: *silent says whether gnmrd did not answer
 * in time (a flood, a restart: watch goes on) rather than refuse. */
static json_t *ask(const cli_globals *g, const char *cmd, const char *job,
                   uint32_t limit, int *silent) {
  Gnmr__Envelope req = GNMR__ENVELOPE__INIT;
  Gnmr__AdminRequest ar = GNMR__ADMIN_REQUEST__INIT;
  ar.command = (char *)cmd;
  ar.job = (char *)job;
  ar.limit = limit;
  req.body_case = GNMR__ENVELOPE__BODY_ADMIN_REQUEST;
  req.admin_request = &ar;
  Gnmr__Envelope *env = cli_admin_call(g, &req, 2000);
  json_t *v = NULL;
  *silent = env == NULL;
  if (env == NULL)
    return NULL;
  if (env->body_case == GNMR__ENVELOPE__BODY_ERROR)
    fprintf(stderr, "gnmrctl watch: %s\n", env->error->message);
  else if (env->body_case == GNMR__ENVELOPE__BODY_ADMIN_REPLY)
    v = json_loads(env->admin_reply->json, 0, NULL);
  gnmr__wire_free(&env);
  return v;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double num(const json_t *v) {
  return json_is_number(v) ? json_number_value(v) : 0;
}

/* One view of the job: its status (st) and top units (tp). */
static void show(const char *job, const json_t *st, const json_t *tp,
                 double rate) {
  double step = num(json_object_get(st, "step"));
  printf("gnmr job %s  pass %.0f  step %.0f  (%.1f steps/s)  reporters "
         "%.0f/%.0f  units %.0f\n",
         job, num(json_object_get(st, "pass")), step, rate,
         num(json_object_get(st, "joined")),
         num(json_object_get(st, "reporters")),
         num(json_object_get(st, "units")));
  json_t *act = json_object_get(st, "active");
  printf("recovery path (%zu of max %.0f):", json_array_size(act),
         num(json_object_get(json_object_get(st, "params"), "max_active")));
  size_t i;
  json_t *u;
  json_array_foreach(act, i, u) printf(
      " %s", json_string_value(json_object_get(u, "name")));
  /* the column as wide as the longest name shown, up to NAME_MAX_COLS;
   * a longer name keeps its end ("...layers.0.self_attn.q_proj"), where
   * the units of one layer differ (issue 48: cut to its first 24
   * characters, q, k and v of a layer looked the same) */
  int w = 9;
  json_array_foreach(tp, i, u) {
    const char *nm = json_string_value(json_object_get(u, "name"));
    int len = nm ? (int)strlen(nm) : 0;
    w = len > w ? len : w;
  }
  w = w > NAME_MAX_COLS ? NAME_MAX_COLS : w;
  printf("\n\n%-*s %9s %9s %9s %4s %s\n", w, "TOP UNITS", "S", "G", "D",
         "LOCK", "ACTIVE");
  json_array_foreach(tp, i, u) {
    const char *nm = json_string_value(json_object_get(u, "name"));
    size_t len = nm ? strlen(nm) : 0;
    if (nm == NULL)
      nm = "";
    if ((int)len > w)
      printf("...%-*s", w - 3, nm + len - (size_t)(w - 3));
    else
      printf("%-*s", w, nm);
    printf(" %9.3g %9.3g %9.3g %4.0f %s\n",
           num(json_object_get(u, "s")), num(json_object_get(u, "g")),
           num(json_object_get(u, "d")), num(json_object_get(u, "lock")),
           json_is_true(json_object_get(u, "active")) ? "yes" : "");
  }
}

int cmd_watch(const cli_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {
      {"interval-ms", required_argument, NULL, 'i'},
      {"count", required_argument, NULL, 'n'},
      {"top", required_argument, NULL, 't'},
      {"help", no_argument, NULL, 'h'},
      {0},
  };
  uint64_t interval = 1000, count = 0, top = 8;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    uint64_t *dst = c == 'i' ? &interval : c == 'n' ? &count : &top;
    if (c == 'h') {
      fputs(usage, stdout);
      return CLI_OK;
    }
    if (c == '?') {
      fputs(usage, stderr);
      return CLI_USAGE;
    }
    if (gnmr__parse_u64(optarg, 1000000, dst) != 0 || *dst < 1 ||
        (c == 'i' && *dst < 50)) {
      fprintf(stderr, "gnmrctl watch: %s '%s': expected %s to 1000000\n%s",
              c == 'i' ? "--interval-ms" : c == 'n' ? "--count" : "--top",
              optarg, c == 'i' ? "50" : "1", usage);
      return CLI_USAGE;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "gnmrctl watch: give exactly one JOB\n%s", usage);
    return CLI_USAGE;
  }
  const char *job = argv[optind];
  int tty = isatty(1), answered = 0;
  double last_t = 0, last_step = -1;
  for (uint64_t k = 0; count == 0 || k < count; k++) {
    int silent = 0;
    json_t *st = ask(g, "status", job, 0, &silent), *tp = NULL;
    if (st != NULL)
      tp = ask(g, "top", job, (uint32_t)top, &silent);
    if (tp == NULL) {
      json_decref(st);
      if (!silent)
        return CLI_FAIL; /* refused: no such job, not allowed */
      /* no answer in time (gnmrd busy, flooded or restarting): the view
       * stays and is asked again, as agents ask again (issue 62) */
      fprintf(stderr, "gnmrctl watch: no answer this time; asking again\n");
      if (count == 0 || k + 1 < count)
        usleep((useconds_t)interval * 1000);
      continue;
    }
    answered = 1;
    double t = now_s(), step = num(json_object_get(st, "step"));
    double rate = last_step >= 0 && t > last_t
                      ? (step - last_step) / (t - last_t)
                      : 0;
    last_t = t;
    last_step = step;
    if (tty)
      fputs("\033[H\033[2J", stdout); /* home, clear */
    show(job, st, tp, rate);
    fflush(stdout);
    json_decref(st);
    json_decref(tp);
    if (count == 0 || k + 1 < count)
      usleep((useconds_t)interval * 1000);
  }
  return answered ? CLI_OK : CLI_FAIL;
}
