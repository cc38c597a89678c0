/* SPDX-License-Identifier: MIT */
/* commands.c — the admin command table expanded (commands.h). */
#include "commands.h"

#include <string.h>

const gnmr_admin_command gnmr_admin_commands[GNMR_CMD_COUNT] = {
#define GNMR__CMD_ROW(id, name, where, job, csv, op, changes, large, stream,   \
                      opts, synopsis, summary, help, live, query, render)      \
  [GNMR_CMD_##id] = {name,  GNMR_AT_##where, job,  csv,      op,      changes, \
                     large, stream,          opts, synopsis, summary, help},
    GNMR_ADMIN_COMMANDS(GNMR__CMD_ROW)
#undef GNMR__CMD_ROW
};

int gnmr__admin_command_find(const char *name) {
  for (int i = 0; name != NULL && i < GNMR_CMD_COUNT; i++)
    if (strcmp(name, gnmr_admin_commands[i].name) == 0)
      return i;
  return -1;
}
