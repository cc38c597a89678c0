/* SPDX-License-Identifier: MIT */
/* cli.h — what gnmrctl's subcommands share: their entry signature and the
 * exit codes every subcommand uses. */
#ifndef GNMR_CLI_H
#define GNMR_CLI_H

/* Exit codes of gnmrctl: 0 success, 1 the work failed (malformed trace,
 * I/O, daemon error), 2 the command line was wrong. */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

typedef struct cli_globals {
  const char *admin;      /* --admin ENDPOINT */
  const char *server_key; /* --curve-server-key KEY|FILE */
  const char *key_file;   /* --key-file FILE: this client's key pair */
  const char *store;      /* --store URL|FILE: read the history there */
} cli_globals;

#include "replay.h"
#include "wire.h"

/* Sends req to the admin endpoint (with CURVE when the globals give a
 * server key) and waits up to timeout_ms for the reply. Returns the
 * decoded envelope (free with gnmr__wire_free) or NULL after printing why
 * on stderr. */
Gnmr__Envelope *cli_admin_call(const cli_globals *g, Gnmr__Envelope *req,
                               int timeout_ms);

/* The admin endpoint: --admin, $GNMR_ADMIN, or gnmrd's default. */
const char *cli_admin_endpoint(const cli_globals *g);

/* argv[0] is the subcommand's name; getopt state is reset by the caller. */
int cmd_replay(const cli_globals *g, int argc, char **argv);
/* Reads a replay schedule (schedule.c): export JSON (its first params row
 * replaces *base) or STEP key=value lines. 0, or an error with a message
 * naming the file and line. */
int cli_schedule_load(const char *path, policy_params *base,
                      gnmr_schedule *s, char *err, size_t errlen);
int cmd_stats(const cli_globals *g, int argc, char **argv);
int cmd_query(const cli_globals *g, int argc, char **argv);
int cmd_watch(const cli_globals *g, int argc, char **argv);
int cmd_keygen(const cli_globals *g, int argc, char **argv);
int cmd_plot(const cli_globals *g, int argc, char **argv);

#endif /* GNMR_CLI_H */
