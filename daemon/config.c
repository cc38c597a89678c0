/* SPDX-License-Identifier: MIT */
/* config.c — the key table and the INI reader (see config.h). Unknown
 * sections and keys are errors, so a typo never passes silently. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gnmr/error.h"
#include "log.h"
#include "num.h"
#include "params.h"

enum kind {
  K_PATH,
  K_STORE,
  K_ENDPOINT,
  K_ADDR,
  K_LEVEL,
  K_U64,
  K_BOOL,
  K_POLICY
};

/* The one table of gnmrd.conf's keys: section, key, kind, field, limits,
 * the default as a config file would spell it ("": empty or derived at
 * start, main.c) and one line of help. config_defaults() applies the
 * defaults from here; `gnmrd --config-keys` prints the table, and
 * test_ops checks deploy/gnmrd.conf and gnmrd(8) against that output. */
#define F(field) offsetof(gnmrd_config, field)
typedef struct config_key {
  const char *section, *key;
  enum kind kind;
  size_t off;
  uint64_t min, max;
  const char *def, *help;
} config_key;
static const config_key keys[] = {
    {"gnmrd", "data_dir", K_PATH, F(data_dir), 0, 0, "",
     "where the history (gnmr.db) and the lock live"},
    {"gnmrd", "store", K_STORE, F(store), 0, 0, "",
     "a postgresql:// URL: the history in PostgreSQL, not data_dir"},
    {"gnmrd", "standby", K_BOOL, F(standby), 0, 1, "false",
     "with store: wait for the active gnmrd to stop, then take over"},
    {"gnmrd", "agents", K_ENDPOINT, F(agents), 0, 0, "",
     "the ZeroMQ endpoint agents report to"},
    {"gnmrd", "admin", K_ENDPOINT, F(admin), 0, 0, "",
     "the ZeroMQ endpoint gnmrctl asks"},
    {"gnmrd", "metrics", K_ADDR, F(metrics), 0, 0, "",
     "HOST:PORT of the Prometheus endpoint (empty: none)"},
    {"gnmrd", "log_level", K_LEVEL, F(log_level), 0, 0, "info",
     "error, warn, info or debug"},
    {"gnmrd", "max_msg", K_U64, F(max_msg), 1024, INT64_MAX, "268435456",
     "largest message accepted, in bytes"},
    {"gnmrd", "snapshot_every", K_U64, F(snapshot_every), 1, 1000000000, "10",
     "steps between policy-state snapshots of each job"},
    {"gnmrd", "retain_steps", K_U64, F(retain_steps), 0, UINT64_MAX, "0",
     "steps of history kept per job (0: all)"},
    {"gnmrd", "workers", K_U64, F(workers), 0, 256, "0",
     "threads deciding large steps (0: one per CPU)"},
    {"policy", "barrier_ms", K_U64, F(barrier_ms), 1, 600000, "1000",
     "how long a step waits for every rank, for Hellos that give none"},
    {"security", "curve_key_file", K_PATH, F(curve_key_file), 0, 0, "",
     "the server's CURVE key pair: CURVE on every endpoint"},
    {"security", "curve_allow_file", K_PATH, F(curve_allow_file), 0, 0, "",
     "the public keys allowed in, one per line"},
    {"security", "insecure", K_BOOL, F(insecure), 0, 1, "false",
     "allow non-loopback TCP without CURVE"},
    {"limits", "max_jobs", K_U64, F(max_jobs), 1, 1000000, "1024", "live jobs"},
    {"limits", "max_units", K_U64, F(max_units), 1, POLICY_MAX_UNITS, "1048576",
     "units of one job"},
    {"limits", "max_total_units", K_U64, F(max_total_units), 1, UINT32_MAX,
     "16777216", "units summed over every job"},
    {"limits", "max_jobs_per_key", K_U64, F(max_jobs_per_key), 0, 1000000,
     "256", "with tenancy: live jobs one agent key owns (0: no limit)"},
    {"limits", "max_units_per_key", K_U64, F(max_units_per_key), 0, UINT32_MAX,
     "4194304", "with tenancy: their units summed (0: no limit)"},
    {"limits", "max_held_mb", K_U64, F(max_held_mb), 1, 1u << 20, "1024",
     "reports held for undecided steps, all jobs (MB)"},
    {"limits", "job_idle_s", K_U64, F(job_idle_s), 0, UINT32_MAX, "86400",
     "a job with no report for this long is retired (0: never)"},
    {"limits", "store_queue_mb", K_U64, F(store_queue_mb), 1, 1u << 20, "1024",
     "history records waiting while the database is away (MB)"},
    {"limits", "first_message_ms", K_U64, F(first_message_ms), 0, 600000,
     "10000",
     "a connection silent this long after it is accepted is "
     "closed (0: never)"},
    {"limits", "max_connections", K_U64, F(max_connections), 0, 1u << 24, "",
     "agent connections at once (0: the descriptor limit less 320)"},
    /* every policy parameter, by the names of policy_opts */
    {"policy", "*", K_POLICY, 0, 0, 0, "", "the policy's parameters"},
};
#undef F

void config_defaults(gnmrd_config *c) {
  char err[256];
  memset(c, 0, sizeof *c);
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (keys[i].kind != K_POLICY && keys[i].def[0] != '\0' &&
        config_set(c, keys[i].section, keys[i].key, keys[i].def, err,
                   sizeof err) != GNMR_OK)
      abort(); /* a default the table itself refuses: a build error */
  policy_params_default(&c->policy);
}

void config_print_keys(FILE *f) {
  policy_params d;
  policy_params_default(&d);
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    if (keys[i].kind != K_POLICY) {
      fprintf(f, "%s.%s\t%s\t%s\n", keys[i].section, keys[i].key,
              keys[i].def, keys[i].help);
      continue;
    }
    for (int p = 0; p < GNMR_NPARAMS; p++) {
      char def[64] = "";
      if (!policy_param_is_f64(p))
        snprintf(def, sizeof def, "%llu",
                 (unsigned long long)policy_param_u64(&d, p));
      else if (!isnan(policy_param_f64(&d, p))) {
        double v = policy_param_f64(&d, p); /* a threshold: 2.0, 1.5 */
        snprintf(def, sizeof def, v == floor(v) ? "%.1f" : "%g", v);
      }
      fprintf(f, "%s.%s\t%s\t%s\n", keys[i].section,
              policy_param_table[p].name, def,
              def[0] ? "a policy parameter (docs/policy.md)"
                     : "a policy parameter (unset: inherits, "
                       "docs/policy.md)");
    }
  }
}

/* A [policy] key, read as `gnmrctl set` reads key=value; its refusal
 * reworded to name the key and the value. */
static int set_policy(gnmrd_config *c, const char *key, const char *value,
                      char *err, size_t errlen) {
  char setting[512];
  char *one[1] = {setting};
  snprintf(setting, sizeof setting, "%s=%s", key, value);
  if (gnmr__policy_settings_apply(&c->policy, one, 1, err, errlen) == 0)
    return GNMR_OK;
  /* "alpha=0: expected ..." or "window must be ..." (a setting's
   * refusals) -> "key 'alpha': '0': expected ..." /
   * "key 'window': '0': must be ..." */
  const char *why = strstr(err, ": ");
  size_t kl = strlen(key);
  if (why != NULL)
    why += 2;
  else if (strncmp(err, key, kl) == 0 && err[kl] == ' ')
    why = err + kl + 1;
  char tmp[256];
  snprintf(tmp, sizeof tmp, "%s", why ? why : err);
  snprintf(err, errlen, "key '%s': '%s': %s", key, value, tmp);
  return GNMR_E_PARSE;
}

/* One key of the table into its field. GNMR_OK or GNMR_E_PARSE with
 * err. */
static int set_key(const config_key *k, char *field, const char *key,
                   const char *value, char *err, size_t errlen) {
  uint64_t v;
  switch (k->kind) {
  case K_PATH:
  case K_ENDPOINT:
    if (value[0] == '\0' || strlen(value) >= 1024) {
      snprintf(err, errlen, "key '%s': expected 1..1023 characters", key);
      return GNMR_E_PARSE;
    }
    if (k->kind == K_ENDPOINT && strstr(value, "://") == NULL) {
      snprintf(err, errlen,
               "key '%s': '%s' is not a ZeroMQ endpoint "
               "(ipc:///path or tcp://host:port)",
               key, value);
      return GNMR_E_PARSE;
    }
    snprintf(field, 1024, "%s", value);
    return GNMR_OK;
  case K_STORE:
    /* SQLite lives in data_dir; store names a PostgreSQL database */
    if (value[0] != '\0' &&
        (strlen(value) >= 1024 || (strncmp(value, "postgresql://", 13) != 0 &&
                                   strncmp(value, "postgres://", 11) != 0))) {
      /* the value may hold a password: shown only up to its "://" */
      const char *sep = strstr(value, "://");
      int shown = sep != NULL && sep - value < 32 ? (int)(sep - value) + 3 : 0;
      snprintf(err, errlen,
               "key '%s': '%.*s%s' is not a postgresql:// URL (SQLite, the "
               "default, needs no store: it lives in data_dir)",
               key, shown, value, shown ? "..." : "(not shown)");
      return GNMR_E_PARSE;
    }
    snprintf(field, 1024, "%s", value);
    return GNMR_OK;
  case K_ADDR: {
    unsigned port;
    const char *colon = strrchr(value, ':');
    if (strlen(value) >= 256 || colon == NULL || colon == value ||
        sscanf(colon + 1, "%u", &port) != 1 || port > 65535) {
      snprintf(err, errlen, "key '%s': '%s' is not HOST:PORT", key, value);
      return GNMR_E_PARSE;
    }
    snprintf(field, 256, "%s", value);
    return GNMR_OK;
  }
  case K_LEVEL:
    if (gnmr__log_parse_level(value, (int *)(void *)field) != GNMR_OK) {
      snprintf(err, errlen,
               "key '%s': '%s' is not error, warn, info or "
               "debug",
               key, value);
      return GNMR_E_PARSE;
    }
    return GNMR_OK;
  case K_U64:
    if (gnmr__parse_u64(value, k->max, &v) != 0 || v < k->min) {
      snprintf(err, errlen,
               "key '%s': '%s' is not an integer from %llu to "
               "%llu",
               key, value, (unsigned long long)k->min,
               (unsigned long long)k->max);
      return GNMR_E_PARSE;
    }
    memcpy(field, &v, sizeof v);
    return GNMR_OK;
  case K_BOOL:
    if (strcmp(value, "true") == 0 || strcmp(value, "yes") == 0 ||
        strcmp(value, "1") == 0)
      v = 1;
    else if (strcmp(value, "false") == 0 || strcmp(value, "no") == 0 ||
             strcmp(value, "0") == 0)
      v = 0;
    else {
      snprintf(err, errlen, "key '%s': '%s' is not true or false", key, value);
      return GNMR_E_PARSE;
    }
    memcpy(field, &v, sizeof v);
    return GNMR_OK;
  default:
    break;
  }
  snprintf(err, errlen, "key '%s': no such kind", key);
  return GNMR_E_PARSE;
}

int config_set(gnmrd_config *c, const char *section, const char *key,
               const char *value, char *err, size_t errlen) {
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    if (strcmp(section, keys[i].section) != 0)
      continue;
    if (keys[i].kind == K_POLICY) {
      if (gnmr__policy_opts_find(key) < 0)
        break; /* an unknown key, said below */
      return set_policy(c, key, value, err, errlen);
    }
    if (strcmp(key, keys[i].key) == 0)
      return set_key(&keys[i], (char *)c + keys[i].off, key, value, err,
                     errlen);
  }
  if (strcmp(section, "policy") == 0)
    snprintf(err, errlen, "unknown key '%s' in section [policy] (%s, "
             "barrier_ms)", key, policy_param_names());
  else
    snprintf(err, errlen, "unknown key '%s' in section [%s]", key, section);
  return GNMR_E_PARSE;
}

/* What a file set so far: a key given twice, or a section opened again
 * after another, is an error (the second would silently win). */
#define CONFIG_MAX_KEYS 256
typedef struct load_ctx {
  gnmrd_config *c;
  char msg[256];
  int failed;
  char *seen[CONFIG_MAX_KEYS]; /* "section\nkey", and "section\n" */
  int n_seen;
  char last_section[64];
} load_ctx;

static int seen_before(load_ctx *l, const char *section, const char *key) {
  char one[200];
  snprintf(one, sizeof one, "%.63s\n%.120s", section, key);
  for (int i = 0; i < l->n_seen; i++)
    if (strcmp(l->seen[i], one) == 0)
      return 1;
  if (l->n_seen < CONFIG_MAX_KEYS && (l->seen[l->n_seen] = strdup(one)))
    l->n_seen++;
  return 0;
}

static void load_ctx_free(load_ctx *l) {
  for (int i = 0; i < l->n_seen; i++)
    free(l->seen[i]);
  l->n_seen = 0;
}

/* inih handler: returns 0 to stop at the first bad line. */
static int on_key(void *user, const char *section, const char *key,
                  const char *value) {
  load_ctx *l = user;
  if (l->failed)
    return 0;
  if (l->n_seen >= CONFIG_MAX_KEYS) {
    snprintf(l->msg, sizeof l->msg, "more than %d settings",
             CONFIG_MAX_KEYS - 16);
    l->failed = 1;
    return 0;
  }
  if (strcmp(section, l->last_section) != 0) {
    if (seen_before(l, section, "")) {
      snprintf(l->msg, sizeof l->msg, "section [%.63s] opened again (its "
               "keys go in one place)", section);
      l->failed = 1;
      return 0;
    }
    snprintf(l->last_section, sizeof l->last_section, "%s", section);
  }
  if (seen_before(l, section, key)) {
    snprintf(l->msg, sizeof l->msg, "key '%.64s' in [%.63s] given twice "
             "(the second would silently win)", key, section);
    l->failed = 1;
    return 0;
  }
  if (config_set(l->c, section, key, value, l->msg, sizeof l->msg) != 0) {
    l->failed = 1;
    return 0;
  }
  return 1;
}

/* inih reads lines of at most CONFIG_MAX_LINE bytes and silently splits
 * longer ones, so that the tail of a long comment could be read as a
 * setting: such a line, or a NUL byte, is an error before inih runs. So is
 * an indented line with something on it: inih reads it as the previous
 * key's value continued, a second value that silently replaces the first
 * (or, after a section line, a setting nobody sees as one). */
#define CONFIG_MAX_LINE 198
static int check_lines(const char *text, size_t len, const char *name,
                       char *err, size_t errlen) {
  size_t line = 1, col = 0;
  int indented = 0;
  for (size_t i = 0; i < len; i++) {
    if (text[i] == '\0') {
      snprintf(err, errlen, "%s:%zu: a NUL byte", name, line);
      return GNMR_E_PARSE;
    }
    if (col == 0)
      indented = text[i] == ' ' || text[i] == '\t';
    if (indented && text[i] != ' ' && text[i] != '\t' && text[i] != '\n' &&
        text[i] != '\r') {
      if (text[i] != '#' && text[i] != ';') {
        snprintf(err, errlen, "%s:%zu: an indented line (continuation lines "
                 "are not read: write the key = value on one line, starting"
                 " at its first column)", name, line);
        return GNMR_E_PARSE;
      }
      indented = 0;
    }
    if (text[i] == '\n') {
      line++;
      col = 0;
    } else if (++col > CONFIG_MAX_LINE) {
      snprintf(err, errlen, "%s:%zu: line longer than %d bytes", name, line,
               CONFIG_MAX_LINE);
      return GNMR_E_PARSE;
    }
  }
  return GNMR_OK;
}

int config_load(const char *path, gnmrd_config *c, char *err, size_t errlen) {
  /* opened without blocking and checked to be a regular file: a FIFO (or
   * a device) given as the configuration would otherwise wait forever
   * for a writer */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  struct stat sb;
  if (fd < 0) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return GNMR_E_IO;
  }
  struct stat null_sb; /* /dev/null stays a way to say "no settings" */
  if (fstat(fd, &sb) != 0 ||
      !(S_ISREG(sb.st_mode) ||
        (S_ISCHR(sb.st_mode) && stat("/dev/null", &null_sb) == 0 &&
         S_ISCHR(null_sb.st_mode) && sb.st_rdev == null_sb.st_rdev))) {
    close(fd);
    snprintf(err, errlen, "%s: not a regular file", path);
    return GNMR_E_IO;
  }
  FILE *f = fdopen(fd, "rb");
  if (f == NULL) {
    close(fd);
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return GNMR_E_IO;
  }
  char *text = NULL;
  size_t len = 0, cap = 0, n;
  char chunk[4096];
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
    if (len + n + 1 > cap || text == NULL) {
      size_t nc = cap ? cap * 2 : 8192;
      while (nc < len + n + 1)
        nc *= 2;
      char *t = nc <= (16u << 20) ? realloc(text, nc) : NULL;
      if (t == NULL) {
        free(text);
        fclose(f);
        snprintf(err, errlen, "%s: too large for a configuration file", path);
        return GNMR_E_PARSE;
      }
      text = t;
      cap = nc;
    }
    memcpy(text + len, chunk, n);
    len += n;
  }
  int rerr = ferror(f);
  fclose(f);
  if (rerr) {
    free(text);
    snprintf(err, errlen, "%s: read error", path);
    return GNMR_E_IO;
  }
  int rv = check_lines(text ? text : "", len, path, err, errlen);
  if (rv == GNMR_OK) {
    text = text ? text : strdup("");
    if (text == NULL)
      return GNMR_E_NOMEM;
    text[len] = '\0';
    rv = config_load_string(text, path, c, err, errlen);
  }
  free(text);
  return rv;
}

int config_load_string(const char *text, const char *name, gnmrd_config *c,
                       char *err, size_t errlen) {
  load_ctx l = {.c = c};
  if (check_lines(text, strlen(text), name, err, errlen) != GNMR_OK)
    return GNMR_E_PARSE;
  int line = ini_parse_string(text, on_key, &l);
  load_ctx_free(&l);
  if (line != 0) {
    snprintf(err, errlen, "%s:%d: %s", name, line,
             l.failed ? l.msg : "not valid INI syntax");
    return GNMR_E_PARSE;
  }
  return GNMR_OK;
}
