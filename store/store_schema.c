/* SPDX-License-Identifier: MIT */
/* store_schema.c — where a store is, its readers' connections, and the
 * event kinds of the history (store_schema.h). */
#include <stdio.h>
#include <string.h>

#include "db.h"
#include "policy.h"
#include "store_schema.h"

void store_target(const char *where, char *out, size_t cap) {
  if (db_target_is_pg(where))
    snprintf(out, cap, "%s", where);
  else
    snprintf(out, cap, "%s/gnmr.db", where);
}

int store_open_reader(const char *target, db_conn **out, char *err,
                      size_t errlen) {
  return db_open(target, 0, out, err, errlen);
}

/* ---- the event kinds of the history ------------------------------------------ */

const char *store_op_event_name(int kind) {
  static const char *const names[STORE_EV_COUNT] = {
#define STORE__EV_NAME(id, name) [STORE_EV_##id] = name,
      STORE_OP_EVENTS(STORE__EV_NAME)
#undef STORE__EV_NAME
  };
  return kind >= 0 && kind < STORE_EV_COUNT ? names[kind] : "unknown";
}

int store_event_kind_known(const char *kind) {
  static const char *const all[] = {
#define STORE__POLICY_EV(id, v, name) name,
#define STORE__OP_EV(id, name) name,
      POLICY_EVENTS(STORE__POLICY_EV) STORE_OP_EVENTS(STORE__OP_EV)
#undef STORE__POLICY_EV
#undef STORE__OP_EV
  };
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (strcmp(kind, all[i]) == 0)
      return 1;
  return 0;
}

const char *store_event_kinds(void) {
  static const char kinds[] =
#define STORE__POLICY_EV(id, v, name) ", " name
#define STORE__OP_EV(id, name) ", " name
      POLICY_EVENTS(STORE__POLICY_EV) STORE_OP_EVENTS(STORE__OP_EV)
#undef STORE__POLICY_EV
#undef STORE__OP_EV
      ;
  return kinds + 2;
}
