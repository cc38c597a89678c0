/* SPDX-License-Identifier: MIT */
/* schedule.c — `gnmrctl replay --schedule FILE`: the parameter changes of
 * a live job, so that a replay equals a run that was retuned (gnmrctl
 * set). FILE is either `gnmrctl export` output (JSON: its params rows,
 * each from its from_step; the first row, the job's own parameters, is
 * the replay's base) or text, one change per line:
 *   STEP key=value [key=value...]     # from step STEP on
 * with '#' comments; each line changes the parameters in force. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gnmr/error.h"
#include "num.h"
#include "params.h"
#include "replay.h"

static int add(gnmr_schedule *s, uint64_t step, const policy_params *p) {
  gnmr_schedule_entry *e = realloc(s->e, (s->n + 1) * sizeof *e);
  if (e == NULL)
    return GNMR_E_NOMEM;
  s->e = e;
  s->e[s->n++] = (gnmr_schedule_entry){step, *p};
  return GNMR_OK;
}

/* The params rows of an export. */
static int from_export(const char *path, json_t *root, policy_params *base,
                       gnmr_schedule *s, char *err, size_t errlen) {
  json_t *rows = json_object_get(root, "params");
  size_t i;
  json_t *row;
  if (!json_is_array(rows) || json_array_size(rows) == 0) {
    snprintf(err, errlen, "%s: no \"params\" rows (is it gnmrctl export "
             "output?)", path);
    return GNMR_E_PARSE;
  }
  json_array_foreach(rows, i, row) {
    policy_params p = *base; /* every row holds every parameter */
    json_t *from = json_object_get(row, "from_step");
    if (!json_is_integer(from) || json_integer_value(from) < 0) {
      snprintf(err, errlen, "%s: params row %zu: no from_step", path, i);
      return GNMR_E_PARSE;
    }
    for (int k = 0; k < GNMR_NPARAMS; k++) {
      json_t *v = json_object_get(row, policy_param_table[k].name);
      if (policy_param_is_f64(k) && json_is_null(v) &&
          policy_param_inherits(k) >= 0) {
        policy_param_set_f64(&p, k, NAN); /* unset: inherits */
      } else if (policy_param_is_f64(k) && json_is_number(v)) {
        policy_param_set_f64(&p, k, json_number_value(v));
      } else if (!policy_param_is_f64(k) && json_is_integer(v) &&
                 json_integer_value(v) >= 0) {
        policy_param_set_u64(&p, k, (uint64_t)json_integer_value(v));
      } else {
        snprintf(err, errlen, "%s: params row %zu: bad or missing %s", path,
                 i, policy_param_table[k].name);
        return GNMR_E_PARSE;
      }
    }
    if (policy_params_validate(&p, NULL) != GNMR_OK) {
      snprintf(err, errlen, "%s: params row %zu: invalid parameters", path,
               i);
      return GNMR_E_PARSE;
    }
    if (i == 0)
      *base = p;
    else if (add(s, (uint64_t)json_integer_value(from), &p) != GNMR_OK)
      return GNMR_E_NOMEM;
  }
  return GNMR_OK;
}

/* STEP key=value... lines. */
static int from_text(const char *path, char *text, const policy_params *base,
                     gnmr_schedule *s, char *err, size_t errlen) {
  int line = 0;
  uint64_t last = 0;
  for (char *save = NULL, *l = strtok_r(text, "\n", &save); l != NULL;
       l = strtok_r(NULL, "\n", &save)) {
    line++;
    char *hash = strchr(l, '#');
    if (hash != NULL)
      *hash = '\0';
    char *words[64], *w2 = NULL;
    int n = 0;
    for (char *w = strtok_r(l, " \t\r", &w2); w != NULL && n < 64;
         w = strtok_r(NULL, " \t\r", &w2))
      words[n++] = w;
    if (n == 0)
      continue;
    uint64_t step;
    if (gnmr__parse_u64(words[0], UINT64_MAX, &step) != 0 || step == 0 ||
        step <= last) {
      snprintf(err, errlen, "%s:%d: '%s' is not a step above the previous "
               "line's", path, line, words[0]);
      return GNMR_E_PARSE;
    }
    if (n == 1) {
      snprintf(err, errlen, "%s:%d: give key=value after the step", path,
               line);
      return GNMR_E_PARSE;
    }
    policy_params p = s->n ? s->e[s->n - 1].prm : *base;
    char why[256];
    if (gnmr__policy_settings_apply(&p, words + 1, (size_t)n - 1, why,
                                    sizeof why) != 0) {
      snprintf(err, errlen, "%s:%d: %s", path, line, why);
      return GNMR_E_PARSE;
    }
    if (add(s, step, &p) != GNMR_OK)
      return GNMR_E_NOMEM;
    last = step;
  }
  return GNMR_OK;
}

int cli_schedule_load(const char *path, policy_params *base,
                      gnmr_schedule *s, char *err, size_t errlen) {
  char *text = NULL;
  size_t len = 0;
  memset(s, 0, sizeof *s);
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    snprintf(err, errlen, "%s: cannot open", path);
    return GNMR_E_IO;
  }
  char chunk[4096];
  size_t got;
  while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
    char *t = len + got < (64u << 20) ? realloc(text, len + got + 1) : NULL;
    if (t == NULL) {
      free(text);
      fclose(f);
      snprintf(err, errlen, "%s: too large for a schedule", path);
      return GNMR_E_PARSE;
    }
    text = t;
    memcpy(text + len, chunk, got);
    len += got;
  }
  fclose(f);
  if (text == NULL && (text = malloc(1)) == NULL)
    return GNMR_E_NOMEM;
  text[len] = '\0';
  int rv;
  const char *first = text + strspn(text, " \t\r\n");
  if (*first == '{') {
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (root == NULL) {
      snprintf(err, errlen, "%s:%d: not JSON: %s", path, je.line, je.text);
      rv = GNMR_E_PARSE;
    } else {
      rv = from_export(path, root, base, s, err, errlen);
      json_decref(root);
    }
  } else {
    if (memchr(text, '\0', len) != NULL) {
      snprintf(err, errlen, "%s: a NUL byte: not a schedule", path);
      rv = GNMR_E_PARSE;
    } else {
      rv = from_text(path, text, base, s, err, errlen);
    }
  }
  free(text);
  if (rv != GNMR_OK) {
    free(s->e);
    memset(s, 0, sizeof *s);
  }
  return rv;
}
