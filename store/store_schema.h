/* SPDX-License-Identifier: MIT */
/* store_schema.h — what the history's readers and its writer share: where
 * a store is (a SQLite file or a PostgreSQL URL), the parameter columns
 * (generated from gnmr/params.h), and the event kinds that the events
 * table holds. gnmrd's writer (daemon/store*.c) and every reader (gnmrd's
 * admin service, `gnmrctl --store`) see this; the schema's DDL and its
 * migrations are store_migrate.c's, run by the writer alone. */
#ifndef GNMR_STORE_SCHEMA_H
#define GNMR_STORE_SCHEMA_H

#include <stddef.h>

#include "gnmr/params.h"

#define STORE_SCHEMA_VERSION 8

/* The operational events of the history (besides the policy's events,
 * POLICY_EVENTS): XX(ID, name), the name being the events table's kind. */
#define STORE_OP_EVENTS(XX)                                                  \
  XX(JOB_STARTED, "job_started")                                             \
  XX(JOB_RESUMED, "job_resumed")                                             \
  XX(JOB_FINISHED, "job_finished")                                           \
  XX(JOB_RETIRED, "job_retired")                                             \
  XX(AGENT_JOINED, "agent_joined")                                           \
  XX(AGENT_LEFT, "agent_left")                                               \
  XX(PARAMS_CHANGED, "params_changed")                                       \
  XX(HISTORY_GAP, "history_gap")                                             \
  XX(DECISIONS_RESTORED, "decisions_restored")

enum store_op_event {
#define STORE__EV_ENUM(id, name) STORE_EV_##id,
  STORE_OP_EVENTS(STORE__EV_ENUM)
#undef STORE__EV_ENUM
  STORE_EV_COUNT
};

const char *store_op_event_name(int kind);
/* Whether kind names an event of the history (the policy's or ours). */
int store_event_kind_known(const char *kind);
/* "exceed, promote, ..., params_changed": every kind, for messages. */
const char *store_event_kinds(void);

/* Column names are quoted: "window" is a keyword of PostgreSQL's. */
#define STORE__PCOL(name, ctype, kind, opt, env, def, inh) ", \"" #name "\""
#define STORE__PQ(name, ctype, kind, opt, env, def, inh) ",?"
#define STORE__PSET(name, ctype, kind, opt, env, def, inh)                   \
  ", \"" #name "\"=excluded.\"" #name "\""
#define STORE__PGTYPE_THRESHOLD " DOUBLE PRECISION"
#define STORE__PGTYPE_WINDOW " BIGINT"
#define STORE__PGTYPE_U32 " BIGINT"
#define STORE__PGTYPE_U64 " BIGINT"
#define STORE__PGTYPE_FLAG " BIGINT"
#define STORE__PGTYPE_SIGNAL " DOUBLE PRECISION"
#define STORE__PGDEF(name, ctype, kind, opt, env, def, inh)                  \
  ", \"" #name "\"" STORE__PGTYPE_##kind
/* ", "alpha", "beta", ...", ",?,?,...", ", "alpha"=excluded."alpha", ...",
 * and PostgreSQL's column definitions ", "alpha" DOUBLE PRECISION, ..." */
#define PARAM_COLS GNMR_PARAMS_MAP(STORE__PCOL)
#define PARAM_QS GNMR_PARAMS_MAP(STORE__PQ)
#define PARAM_SETS GNMR_PARAMS_MAP(STORE__PSET)
#define PARAM_PG_DEFS GNMR_PARAMS_MAP(STORE__PGDEF)

/* where: a directory (SQLite: where/gnmr.db) or a PostgreSQL URL. The
 * database's target in out: the file's path or the URL. */
void store_target(const char *where, char *out, size_t cap);

/* Opens a short-lived read connection (queries) to a target: a SQLite
 * file (busy timeout set) or a PostgreSQL URL. err: why not. */
struct db;
int store_open_reader(const char *target, struct db **out, char *err,
                      size_t errlen);

#endif /* GNMR_STORE_SCHEMA_H */
