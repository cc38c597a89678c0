/* SPDX-License-Identifier: MIT */
/* main.c — gnmrctl: parses the global options and dispatches to one
 * subcommand from the table below. Each subcommand lives in its own file. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "gnmr/error.h"
#include "ipc.h"

#ifndef GNMR_VERSION
#define GNMR_VERSION "0.0.0"
#endif

static const struct {
  const char *name;
  int (*run)(const cli_globals *, int, char **);
  const char *summary;
} commands[] = {
    {"replay", cmd_replay, "replay a gradient-norm trace offline"},
    {"jobs", cmd_query, "list jobs, live and finished"},
    {"status", cmd_query, "a job: step, parameters, active units"},
    {"units", cmd_query, "a job's units with their statistics"},
    {"top", cmd_query, "a job's units with the highest scores"},
    {"history", cmd_query, "a job's events, filtered by step, unit, kind"},
    {"decisions", cmd_query, "a job's decisions over a step range"},
    {"set", cmd_query, "change a running job's parameters (key=value)"},
    {"export", cmd_query, "a job's whole history as JSON"},
    {"finish", cmd_query, "end a running job whose processes are gone"},
    {"runs", cmd_query, "the runs of a job name, oldest first"},
    {"watch", cmd_watch, "a live view of a running job"},
    {"stats", cmd_stats, "show gnmrd's counters and live jobs"},
    {"plot", cmd_plot, "draw a job's GNMR, active set and budget (PNG/SVG)"},
    {"keygen", cmd_keygen, "write a CURVE key pair (PREFIX.key, PREFIX.pub)"},
};

const char *cli_admin_endpoint(const cli_globals *g) {
  static char def[512];
  const char *e;
  if (g->admin != NULL)
    return g->admin;
  /* gnmrd's default: ipc://RUN/admin.sock (see gnmrd --help) */
  if ((e = getenv("RUNTIME_DIRECTORY")) != NULL)
    snprintf(def, sizeof def, "ipc://%s/admin.sock", e);
  else if ((e = getenv("XDG_RUNTIME_DIR")) != NULL)
    snprintf(def, sizeof def, "ipc://%s/gnmr/admin.sock", e);
  else
    snprintf(def, sizeof def, "ipc:///tmp/gnmr-%u/admin.sock",
             (unsigned)getuid());
  return def;
}

static void usage(FILE *f) {
  fputs("usage: gnmrctl [--admin ENDPOINT] [--curve-server-key KEY|FILE "
        "--key-file FILE]\n               [--store postgresql://...|FILE] "
        "COMMAND [ARGS]\n"
        "       gnmrctl --version | --help\n\ncommands:\n",
        f);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fputs("\n--store (or $GNMR_STORE) reads jobs, runs, history, decisions "
        "and export\nstraight from a store, with no gnmrd: a PostgreSQL "
        "URL, or a SQLite file\n(DATA_DIR/gnmr.db) or its directory.\n"
        "'gnmrctl COMMAND --help' describes each command.\n", f);
}

int main(int argc, char **argv) {
  cli_globals g = {.admin = getenv("GNMR_ADMIN"),
                   .server_key = getenv("GNMR_CURVE_SERVER_KEY"),
                   .key_file = getenv("GNMR_KEY_FILE"),
                   .store = getenv("GNMR_STORE")};
  static const struct option longopts[] = {
      {"admin", required_argument, NULL, 'a'},
      {"curve-server-key", required_argument, NULL, 's'},
      {"key-file", required_argument, NULL, 'k'},
      {"store", required_argument, NULL, 'S'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {0},
  };
  int c;
  /* '+': stop at the first non-option, the subcommand. */
  while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
    switch (c) {
    case 'a':
      g.admin = optarg;
      break;
    case 's':
      g.server_key = optarg;
      break;
    case 'k':
      g.key_file = optarg;
      break;
    case 'S':
      g.store = optarg;
      break;
    case 'h':
      usage(stdout);
      return CLI_OK;
    case 'V':
      printf("gnmrctl %s\n", GNMR_VERSION);
      return CLI_OK;
    default:
      usage(stderr);
      return CLI_USAGE;
    }
  }
  char why[512];
  if (g.admin != NULL && gnmr__endpoint_check(g.admin, 0, why, sizeof why) !=
                             GNMR_OK) {
    fprintf(stderr, "gnmrctl: --admin: %s\n", why);
    return CLI_USAGE;
  }
  if (optind >= argc) {
    fputs("gnmrctl: missing COMMAND\n", stderr);
    usage(stderr);
    return CLI_USAGE;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    if (strcmp(argv[optind], commands[i].name) == 0) {
      char **sub = argv + optind;
      int subc = argc - optind;
      optind = 0; /* full getopt reset (GNU) for the subcommand */
      return commands[i].run(&g, subc, sub);
    }
  }
  fprintf(stderr, "gnmrctl: unknown command '%s'\n", argv[optind]);
  usage(stderr);
  return CLI_USAGE;
}
