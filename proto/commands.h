/* SPDX-License-Identifier: MIT */
/* commands.h — the admin commands (AdminRequest.command): one row each,
 * which gnmrd (the server and the store's queries) and gnmrctl (options,
 * help, rendering) all read, as redis's command rows carry their handlers.
 *
 *   XX(ID, name, where, needs_job, csv, operator, changes, large, stream,
 *      opts,
 *      synopsis, summary, help, live, query, render)
 *
 * where      LIVE: answered on gnmrd's loop from a running job's memory;
 *            HISTORY: a query of the store, on the worker pool.
 * needs_job  the request names a job.
 * csv        gnmrctl can print the answer as CSV (--csv).
 * operator   with tenancy on (keys.h), only an operator key may send it.
 * changes    it changes a job: gnmrctl never sends it twice (a read is sent
 *            again when its connection drops before the answer,
 *            client/cli/admin_call.c).
 * large      its answer can be large: refused before it is built while the
 *            client leaves too much unread (daemon/admin.c).
 * stream     answered in chunks, each a reply (export).
 * opts       gnmrctl's options for it, one letter each (client/cli/
 *            cmd_query.c: j json, c csv, f from, t to, u unit, k kind,
 *            l limit, r run, T timeout-ms).
 * synopsis, summary, help
 *            gnmrctl's usage line, its one line in --help (in this order)
 *            and its own help text.
 * live       daemon/admin.c's handler on the loop for a running job, 0 for
 *            none.
 * query      store/store_query.c's query of the history (a stream's is
 *            its own), 0 for none; a command with both is answered from
 *            the store when its job is not running.
 * render     client/cli/cmd_query.c's table and CSV of the answer (JSON is
 *            printed as it is), 0 for the JSON alone.
 *
 * A new command read from the history is a row here and its query in
 * store_query.c, rendered by an existing renderer; a new table shape adds
 * its renderer in cmd_query.c. */
#ifndef GNMR_COMMANDS_H
#define GNMR_COMMANDS_H

#define GNMR_ADMIN_COMMANDS(XX)                                                \
  XX(JOBS, "jobs", HISTORY, 0, 1, 0, 0, 0, 0, "jcT", "jobs [--json|--csv]",    \
     "list jobs, live and finished",                                           \
     "Every job name gnmrd knows, its latest run: live, finished or\n"         \
     "retired, its pass, last decided step and reporters.",                    \
     0, query_jobs, render_jobs)                                               \
  XX(STATUS, "status", LIVE, 1, 0, 0, 0, 0, 0, "jrT",                          \
     "status JOB [--run ID] [--json]",                                         \
     "a job: step, parameters, active units",                                  \
     "A job's state, step, ranks joined, parameters and active units\n"        \
     "(a finished job's from its last snapshot).",                             \
     live_status, query_view, render_status)                                   \
  XX(UNITS, "units", LIVE, 1, 1, 0, 0, 1, 0, "jcrT",                           \
     "units JOB [--run ID] [--json|--csv]",                                    \
     "a job's units with their statistics",                                    \
     "A job's units: reports, historical mean, GNMR (G), delta-GNMR (D),\n"    \
     "score (S), lock, whether active, promotions. A job that is not\n"        \
     "running is read from its last snapshot, which keeps no step's G, D\n"   \
     "or S (-).",                                                              \
     live_units, query_view, render_units)                                     \
  XX(TOP, "top", LIVE, 1, 1, 0, 0, 1, 0, "jclrT",                              \
     "top JOB [--limit N] [--run ID] [--json|--csv]",                          \
     "a job's units with the highest scores",                                  \
     "A job's units with the highest scores (--limit, default 10); of a\n"     \
     "job that is not running, those promoted most.",                          \
     live_top,                                                                 \
     query_view, render_units)                                                 \
  XX(HISTORY, "history", HISTORY, 1, 1, 0, 0, 1, 0, "jcftuklrT",               \
     "history JOB [--from S] [--to S] [--unit NAME] [--kind K]\n"              \
     "                       [--limit N] [--run ID] [--json|--csv]",           \
     "a job's events, filtered by step, unit, kind",                           \
     "A job's events in step order: the policy's (promotions, locks,\n"        \
     "nonfinite, missing...) and the operational ones (agents joining and\n"   \
     "leaving, with their RANK; restarts; parameter changes).",                \
     0, query_history, render_history)                                         \
  XX(DECISIONS, "decisions", HISTORY, 1, 1, 0, 0, 1, 0, "jcftrT",              \
     "decisions JOB [--from S] [--to S] [--run ID] [--json|--csv]",            \
     "a job's decisions over a step range",                                    \
     "The active set of every step. The table names each unit next to its\n"   \
     "id; --csv is the policy's decisions CSV (step,active with ids), as\n"    \
     "'gnmrctl replay' prints it; --json has both.",                           \
     0, query_decisions, render_decisions)                                     \
  XX(SET, "set", LIVE, 1, 0, 1, 1, 0, 0, "jT",                                 \
     "set JOB key=value... [--json]",                                          \
     "change a running job's parameters (key=value)",                          \
     "Changes a running job's policy parameters from its next step (an\n"      \
     "operator key under tenancy).",                                           \
     live_set, 0, render_status)                                               \
  XX(EXPORT, "export", HISTORY, 1, 0, 1, 0, 1, 1, "rT",                        \
     "export JOB [--run ID]", "a job's whole history as JSON",                 \
     "A run's whole history as one JSON document, streamed.", 0, 0, 0)         \
  XX(FINISH, "finish", LIVE, 1, 0, 1, 1, 0, 0, "jT", "finish JOB [--json]",    \
     "end a running job whose processes are gone",                             \
     "Ends a running job whose processes are gone (an operator key under\n"    \
     "tenancy).",                                                              \
     live_finish, 0, render_status)                                            \
  XX(RUNS, "runs", HISTORY, 1, 1, 0, 0, 0, 0, "jcT",                           \
     "runs JOB [--json|--csv]", "the runs of a job name, oldest first",        \
     "The runs of a job name, oldest first (tables show times in UTC,\n"       \
     "ISO 8601; CSV and JSON in epoch milliseconds). RUN is the store's\n"     \
     "run id (what --run takes), shared by every job name; NTH counts this\n" \
     "name's runs (1 its first).",                                             \
     0, query_runs, render_runs)

enum gnmr_admin_cmd {
#define GNMR__CMD_ENUM(id, name, where, job, csv, op, changes, large, stream,  \
                       opts, synopsis, summary, help, live, query, render)     \
  GNMR_CMD_##id,
  GNMR_ADMIN_COMMANDS(GNMR__CMD_ENUM)
#undef GNMR__CMD_ENUM
      GNMR_CMD_COUNT
};

enum gnmr_admin_where { GNMR_AT_LIVE, GNMR_AT_HISTORY };

typedef struct gnmr_admin_command {
  const char *name;
  int where;     /* enum gnmr_admin_where */
  int needs_job;
  int csv;
  int operator;
  int changes;
  int large;
  int stream;
  const char *opts;
  const char *synopsis;
  const char *summary;
  const char *help;
} gnmr_admin_command;

extern const gnmr_admin_command gnmr_admin_commands[GNMR_CMD_COUNT];

/* The command named name, or -1. */
int gnmr__admin_command_find(const char *name);

#endif /* GNMR_COMMANDS_H */
