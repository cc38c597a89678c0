/* SPDX-License-Identifier: MIT */
/* commands.h — the admin commands (AdminRequest.command), one table shared
 * by gnmrd (which serves them) and gnmrctl (which sends them).
 *
 *   XX(ID, name, where, needs_job, csv, operator, summary)
 *
 * where      LIVE: answered on gnmrd's loop from a running job's memory
 *            (status, units and top of a job that is not running are
 *            answered from the store, on the worker pool);
 *            HISTORY: a query of the store, on the worker pool.
 * needs_job  the request names a job.
 * csv        gnmrctl can print the answer as CSV (--csv).
 * operator   with tenancy on (keys.h), only an operator key may send it.
 * summary    gnmrctl's one line for it in --help, in this order. */
#ifndef GNMR_COMMANDS_H
#define GNMR_COMMANDS_H

#define GNMR_ADMIN_COMMANDS(XX)                                              \
  XX(JOBS, "jobs", HISTORY, 0, 1, 0, "list jobs, live and finished")         \
  XX(STATUS, "status", LIVE, 1, 0, 0,                                        \
     "a job: step, parameters, active units")                                \
  XX(UNITS, "units", LIVE, 1, 1, 0, "a job's units with their statistics")   \
  XX(TOP, "top", LIVE, 1, 1, 0, "a job's units with the highest scores")     \
  XX(HISTORY, "history", HISTORY, 1, 1, 0,                                   \
     "a job's events, filtered by step, unit, kind")                         \
  XX(DECISIONS, "decisions", HISTORY, 1, 1, 0,                               \
     "a job's decisions over a step range")                                  \
  XX(SET, "set", LIVE, 1, 0, 1,                                              \
     "change a running job's parameters (key=value)")                        \
  XX(EXPORT, "export", HISTORY, 1, 0, 1, "a job's whole history as JSON")    \
  XX(FINISH, "finish", LIVE, 1, 0, 1,                                        \
     "end a running job whose processes are gone")                           \
  XX(RUNS, "runs", HISTORY, 1, 1, 0, "the runs of a job name, oldest first")

enum gnmr_admin_cmd {
#define GNMR__CMD_ENUM(id, name, where, job, csv, op, summary) GNMR_CMD_##id,
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
  const char *summary;
} gnmr_admin_command;

extern const gnmr_admin_command gnmr_admin_commands[GNMR_CMD_COUNT];

/* The command named name, or -1. */
int gnmr__admin_command_find(const char *name);

#endif /* GNMR_COMMANDS_H */
