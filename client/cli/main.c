/* SPDX-License-Identifier: MIT */
/* main.c — gnmrctl: parses the global options and dispatches to one
 * subcommand from the table below. Each subcommand lives in its own file. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "gnmr/error.h"
#include "ipc.h"

#ifndef GNMR_VERSION
#define GNMR_VERSION "0.0.0"
#endif

/* gnmrctl's own commands; the admin commands (proto/commands.h) come
 * between replay and these, each with its summary from that table. */
typedef struct command {
  const char *name;
  int (*run)(const cli_globals *, int, char **);
  const char *summary;
} command;

static const command first[] = {
    {"replay", cmd_replay, "replay a gradient-norm trace offline"},
};
static const command last[] = {
    {"watch", cmd_watch, "a live view of a running job"},
    {"stats", cmd_stats, "show gnmrd's counters and live jobs"},
    {"plot", cmd_plot, "draw a job's GNMR, active set and budget (PNG/SVG)"},
    {"keygen", cmd_keygen, "write a CURVE key pair (PREFIX.key, PREFIX.pub)"},
};
enum { N_FIRST = sizeof first / sizeof first[0],
       N_LAST = sizeof last / sizeof last[0],
       N_COMMANDS = N_FIRST + GNMR_CMD_COUNT + N_LAST };

/* The i-th command of --help's list. */
static command command_at(size_t i) {
  if (i < N_FIRST)
    return first[i];
  if (i < N_FIRST + GNMR_CMD_COUNT) {
    const gnmr_admin_command *a = &gnmr_admin_commands[i - N_FIRST];
    return (command){a->name, cmd_query, a->summary};
  }
  return last[i - N_FIRST - GNMR_CMD_COUNT];
}

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
  for (size_t i = 0; i < N_COMMANDS; i++)
    fprintf(f, "  %-10s %s\n", command_at(i).name, command_at(i).summary);
  fputs("\n--store (or $GNMR_STORE) reads jobs, runs, status, units, top, "
        "history,\ndecisions and export straight from a store, with no gnmrd: "
        "a PostgreSQL\nURL, or a SQLite file (DATA_DIR/gnmr.db) or its "
        "directory.\n"
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
  for (size_t i = 0; i < N_COMMANDS; i++) {
    command cmd = command_at(i);
    if (strcmp(argv[optind], cmd.name) == 0) {
      char **sub = argv + optind;
      int subc = argc - optind;
      optind = 0; /* full getopt reset (GNU) for the subcommand */
      return cmd.run(&g, subc, sub);
    }
  }
  fprintf(stderr, "gnmrctl: unknown command '%s'\n", argv[optind]);
  usage(stderr);
  return CLI_USAGE;
}
