/* SPDX-License-Identifier: MIT */
/* cmd_query.c — gnmrctl's questions to gnmrd: jobs, status, units, top,
 * history, decisions, set, export. Each sends one AdminRequest, and renders
 * the JSON reply as a table (default), CSV (--csv) or the JSON itself
 * (--json). `decisions --csv` prints exactly the decisions CSV of
 * docs/policy.md. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "gnmr/error.h"
#include "commands.h"
#include "db.h"
#include "num.h"
#include "params.h"
#include "store_query.h"
#include "store_schema.h"
#include "store_view.h"
#include "text.h"

enum fmt { FMT_TABLE, FMT_CSV, FMT_JSON };

/* A column of a rendered table: JSON key, header, width. */
typedef struct column {
  const char *key, *title;
  int width;
} column;

static const column job_cols[] = {
    {"name", "JOB", 20},      {"state", "STATE", 9}, {"pass", "PASS", 5},
    {"last_step", "STEP", 8}, {"reporters", "REPORTERS", 9},
    {"live", "LIVE", 5},      {NULL, NULL, 0}};
static const column run_cols[] = {
    {"run", "RUN", 6},        {"state", "STATE", 9}, {"pass", "PASS", 5},
    {"last_step", "STEP", 8}, {"reporters", "REPORTERS", 9},
    {"created_at", "CREATED (UTC)", 24}, {"nth", "NTH", 4},
    {NULL, NULL, 0}};
static const column unit_cols[] = {
    {"id", "ID", 6},        {"name", "NAME", 24},     {"shards", "SHARDS", 6},
    {"reports", "REPORTS", 8}, {"mean", "MEAN", 11},  {"g", "G", 9},
    {"d", "D", 9},          {"s", "S", 9},            {"lock", "LOCK", 4},
    {"active", "ACTIVE", 6}, {"promotions", "PROMOTED", 8},
    {NULL, NULL, 0}};
static const column event_cols[] = {
    {"pass", "PASS", 4},      {"step", "STEP", 7},    {"kind", "KIND", 16},
    {"unit", "UNIT", 6},      {"unit_name", "NAME", 20}, {"rank", "RANK", 4},
    {"outcome", "OUTCOME", 8}, {"norm", "NORM", 11},  {"g", "G", 9},
    {"d", "D", 9},            {"s", "S", 9},          {"count", "COUNT", 5},
    {"detail", "DETAIL", 0},  {NULL, NULL, 0}};

/* x as the shortest of %.15g, %.16g, %.17g that reads back as x: what
 * CSV gives scripts (issue 48: units --csv rounded means to 6 digits). */
static void exact(double x, char *buf, size_t cap) {
  for (int digits = 15; digits <= 17; digits++) {
    snprintf(buf, cap, "%.*g", digits, x);
    if (strtod(buf, NULL) == x)
      return;
  }
}

/* A JSON value as text: numbers %.6g in tables and exact in CSV, null as
 * "" (CSV) or "-" (table). */
static void cell(const json_t *v, enum fmt f, char *buf, size_t cap) {
  if (v == NULL || json_is_null(v))
    snprintf(buf, cap, "%s", f == FMT_CSV ? "" : "-");
  else if (json_is_integer(v))
    snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
  else if (json_is_real(v) && f == FMT_CSV)
    exact(json_real_value(v), buf, cap);
  else if (json_is_real(v))
    snprintf(buf, cap, "%.6g", json_real_value(v));
  else if (json_is_true(v))
    snprintf(buf, cap, "yes");
  else if (json_is_false(v))
    snprintf(buf, cap, "no");
  else if (json_is_string(v))
    gnmr__escape(json_string_value(v), buf, cap); /* whatever the db has */
  else
    snprintf(buf, cap, "?");
}

/* Epoch milliseconds as ISO 8601 UTC, 2026-12-02T18:40:05.123Z (JSON and
 * CSV keep the milliseconds: scripts compute with them). */
static void iso_ms(long long ms, char *buf, size_t cap) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  if (ms < 0 || gmtime_r(&t, &tm) == NULL ||
      strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm) == 0) {
    snprintf(buf, cap, "%lld", ms);
    return;
  }
  size_t n = strlen(buf);
  snprintf(buf + n, cap - n, ".%03lldZ", ms % 1000);
}

/* CSV field: quoted when it holds a comma, quote or newline. */
static void csv_field(const char *s) {
  if (strpbrk(s, ",\"\n") == NULL) {
    fputs(s, stdout);
    return;
  }
  putchar('"');
  for (; *s; s++) {
    if (*s == '"')
      putchar('"');
    putchar(*s);
  }
  putchar('"');
}

/* Row i's column c as text into buf (a table's times as ISO 8601). */
static void field(const json_t *row, const column *col, enum fmt f, char *buf,
                  size_t cap) {
  const json_t *v = json_object_get(row, col->key);
  size_t kl = strlen(col->key);
  if (f == FMT_TABLE && kl > 3 && strcmp(col->key + kl - 3, "_at") == 0 &&
      json_is_integer(v)) /* epoch ms: ISO 8601 UTC in a table */
    iso_ms(json_integer_value(v), buf, cap);
  else
    cell(v, f, buf, cap);
}

/* The most columns a table gives one field: past it the column is not
 * widened (the field overflows it, whole; CSV and JSON are never cut). */
#define COL_MAX 120
#define NCOLS_MAX 16

static void render_rows(const json_t *arr, const column *cols, enum fmt f) {
  char buf[512];
  size_t i;
  const json_t *row;
  int w[NCOLS_MAX] = {0}, n = 0;
  /* a table's columns as wide as their widest field (issue 63: names cut
   * the alignment at 20-24 characters) */
  for (; cols[n].key && n < NCOLS_MAX; n++)
    w[n] = cols[n].width;
  if (f == FMT_TABLE)
    json_array_foreach(arr, i, row) {
      for (int c = 0; c < n; c++) {
        field(row, &cols[c], f, buf, sizeof buf);
        int len = (int)strlen(buf);
        if (len > w[c])
          w[c] = len > COL_MAX ? (w[c] > COL_MAX ? w[c] : COL_MAX) : len;
      }
    }
  for (int c = 0; c < n; c++) {
    if (f == FMT_CSV)
      printf("%s%s", c ? "," : "", cols[c].key);
    else
      printf(c ? " %-*s" : "%-*s", w[c], cols[c].title);
  }
  putchar('\n');
  json_array_foreach(arr, i, row) {
    for (int c = 0; c < n; c++) {
      field(row, &cols[c], f, buf, sizeof buf);
      if (f == FMT_CSV) {
        if (c)
          putchar(',');
        csv_field(buf);
      } else {
        printf(c ? " %-*s" : "%-*s", w[c], buf);
      }
    }
    putchar('\n');
  }
}

static void render_params(const json_t *p) {
  const char *k;
  const json_t *v;
  char buf[64];
  json_object_foreach((json_t *)p, k, v) {
    cell(v, FMT_TABLE, buf, sizeof buf);
    printf("  %-13s %s\n", k, buf);
  }
}

static void render_status(const json_t *o, enum fmt f) {
  char buf[128], nb[1100];
  (void)f; /* no CSV: a table */
  static const char *const keys[] = {"job",        "state",   "pass",
                                     "step",       "reporters", "joined",
                                     "units",      "pending_steps",
                                     "barrier_ms", NULL};
  for (int i = 0; keys[i]; i++) {
    cell(json_object_get(o, keys[i]), FMT_TABLE, buf, sizeof buf);
    printf("%-14s %s\n", keys[i], buf);
  }
  printf("params\n");
  render_params(json_object_get(o, "params"));
  const json_t *act = json_object_get(o, "active");
  printf("active         %zu unit%s\n", json_array_size(act),
         json_array_size(act) == 1 ? "" : "s");
  size_t i;
  const json_t *u;
  json_array_foreach(act, i, u) printf(
      "  %-6lld %s\n", (long long)json_integer_value(json_object_get(u, "id")),
      gnmr__escape(json_string_value(json_object_get(u, "name")), nb,
                   sizeof nb));
}

/* --csv: the policy's decisions CSV (docs/policy.md: step,active with
 * ids), which replay prints too, so that the two compare as text; the
 * table names each unit next to its id; --json has both. */
static void render_decisions(const json_t *o, enum fmt f) {
  const json_t *arr = json_object_get(o, "decisions");
  size_t i, k;
  const json_t *row, *u;
  char nb[1100];
  printf(f == FMT_CSV ? "step,active\n" : "%-8s %-4s %s\n", "STEP", "PASS",
         "ACTIVE (ID NAME)");
  json_array_foreach(arr, i, row) {
    long long step = (long long)json_integer_value(json_object_get(row, "step"));
    if (f == FMT_CSV) {
      const char *ids = json_string_value(json_object_get(row, "active_ids"));
      printf("%lld,%s\n", step, ids ? ids : "");
      continue;
    }
    printf("%-8lld %-4lld", step,
           (long long)json_integer_value(json_object_get(row, "pass")));
    const json_t *act = json_object_get(row, "active");
    if (json_array_size(act) == 0)
      printf(" -");
    json_array_foreach(act, k, u) {
      const char *nm = json_string_value(json_object_get(u, "name"));
      printf("%s %lld %s", k ? "," : "",
             (long long)json_integer_value(json_object_get(u, "id")),
             nm ? gnmr__escape(nm, nb, sizeof nb) : "-");
    }
    putchar('\n');
  }
}

static void render_jobs(const json_t *v, enum fmt f) {
  render_rows(v, job_cols, f);
}

static void render_units(const json_t *v, enum fmt f) {
  render_rows(v, unit_cols, f);
}

static void render_history(const json_t *v, enum fmt f) {
  render_rows(json_object_get(v, "events"), event_cols, f);
}

static void render_runs(const json_t *v, enum fmt f) {
  render_rows(json_object_get(v, "runs"), run_cols, f);
}

/* each command's renderer, from its row (0: its JSON as it is) */
typedef void render_fn(const json_t *v, enum fmt f);
#define RENDER_OF(id, name, where, job, csv, op, changes, large, stream, opts, \
                  synopsis, summary, help, live, query, render)                \
  [GNMR_CMD_##id] = render,
static render_fn *const renderers[GNMR_CMD_COUNT] = {
    GNMR_ADMIN_COMMANDS(RENDER_OF)};
#undef RENDER_OF

static const char usage[] =
    "usage: gnmrctl [--admin ENDPOINT] jobs [--json|--csv]\n"
    "       gnmrctl status JOB [--json]\n"
    "       gnmrctl units JOB [--json|--csv]\n"
    "       gnmrctl top JOB [--limit N] [--json|--csv]\n"
    "       gnmrctl history JOB [--from S] [--to S] [--unit NAME] [--kind K]\n"
    "                           [--limit N] [--json|--csv]\n"
    "       gnmrctl decisions JOB [--from S] [--to S] [--json|--csv]\n"
    "       gnmrctl set JOB key=value... [--json]\n"
    "       gnmrctl export JOB\n"
    "       gnmrctl finish JOB [--json]\n"
    "       gnmrctl runs JOB [--json|--csv]\n"
    "  status, units, top, history, decisions and export take --run ID (a\n"
    "  job name's runs: gnmrctl runs JOB); the default is the latest run.\n"
    "  status, units and top answer for finished jobs too (from the\n"
    "  history); finish ends a running job whose processes are gone.\n"
    "  Common: --timeout-ms MS (default 3000).\n";

/* An export comes in chunks of JSON text: each is printed as it arrives
 * and the next asked for (env is the first; taken), so that neither gnmrd
 * nor gnmrctl holds more than a chunk. */
static int export_stream(const cli_globals *g, Gnmr__Envelope *req,
                         Gnmr__Envelope *env, int timeout) {
  int code = CLI_OK;
  for (uint64_t want = 0;; want++) {
    const Gnmr__AdminReply *rep = env->admin_reply;
    if (rep->chunk != want) { /* a chunk went elsewhere: never a hole */
      fprintf(stderr, "gnmrctl export: chunk %llu came where %llu was "
              "expected: the export is incomplete\n",
              (unsigned long long)rep->chunk, (unsigned long long)want);
      gnmr__wire_free(&env);
      return CLI_FAIL;
    }
    size_t n = strlen(rep->json);
    if (fwrite(rep->json, 1, n, stdout) != n)
      code = CLI_FAIL;
    int more = rep->more;
    req->admin_request->stream = rep->stream;
    req->admin_request->chunk = want + 1;
    gnmr__wire_free(&env);
    if (!more || code != CLI_OK)
      break;
    if ((env = cli_admin_call(g, req, timeout)) == NULL)
      return CLI_FAIL;
    if (env->body_case != GNMR__ENVELOPE__BODY_ADMIN_REPLY) {
      fprintf(stderr, "gnmrctl export: %s (after %llu chunks: the export "
              "is incomplete)\n",
              env->body_case == GNMR__ENVELOPE__BODY_ERROR
                  ? env->error->message
                  : "unexpected reply from gnmrd",
              (unsigned long long)want + 1);
      gnmr__wire_free(&env);
      return CLI_FAIL;
    }
  }
  if (fflush(stdout) != 0)
    code = CLI_FAIL;
  return code;
}

/* Each command's own help (its synopsis, what it answers, the options it
 * takes: j json, c csv, f from, t to, u unit, k kind, l limit, r run,
 * T timeout-ms) is its row in proto/commands.h; the options' own lines: */
static const struct {
  char letter;
  const char *name, *text;
} option_help[] = {
    {'j', "--json", "the answer as JSON"},
    {'c', "--csv", "the answer as CSV"},
    {'f', "--from S", "from step S (default: the first)"},
    {'t', "--to S", "to step S (default: the last)"},
    {'u', "--unit NAME", "one unit's events only"},
    {'k', "--kind K", "one kind of event only: K is one of"},
    {'l', "--limit N", "at most N rows (1..1000000)"},
    {'r', "--run ID", "that run of the job name (gnmrctl runs JOB); default "
                      "the latest"},
    {'T', "--timeout-ms MS", "how long to wait for gnmrd (default 3000)"},
};

static void command_help(int k, FILE *out) {
  if (k < 0) {
    fputs(usage, out);
    return;
  }
  const gnmr_admin_command *cmd = &gnmr_admin_commands[k];
  fprintf(out, "usage: gnmrctl %s\n\n%s\n\noptions:\n", cmd->synopsis,
          cmd->help);
  for (const char *o = cmd->opts; *o; o++)
    for (size_t i = 0; i < sizeof option_help / sizeof option_help[0]; i++)
      if (option_help[i].letter == *o) {
        fprintf(out, "  %-16s %s\n", option_help[i].name, option_help[i].text);
        if (*o == 'k')
          fprintf(out, "  %-16s   %s\n", "", store_event_kinds());
      }
  if (k == GNMR_CMD_SET)
    fprintf(out, "keys:\n  %s\n", policy_param_names());
  fputs("global options, before the command: --admin ENDPOINT, "
        "--curve-server-key,\n--key-file, --store URL|FILE (gnmrctl --help)\n",
        out);
}

static int render(int k, const json_t *v, enum fmt f);
static int from_store(const char *where, const char *cmd, store_query *q,
                      enum fmt f);

/* A query's command line. */
typedef struct query_args {
  const char *cmd;
  int k; /* its row in gnmr_admin_commands */
  enum fmt f;
  uint64_t from, to, limit, timeout, run;
  const char *unit, *kind, *job;
  size_t n_settings; /* set: key=value arguments */
  char **settings;
} query_args;

/* The options, each checked against what the command takes. -1 to go
 * on, else the exit status. */
static int parse_query_options(query_args *a, int argc, char **argv) {
  static const struct option longopts[] = {
      {"json", no_argument, NULL, 'j'},
      {"csv", no_argument, NULL, 'c'},
      {"from", required_argument, NULL, 'f'},
      {"to", required_argument, NULL, 't'},
      {"unit", required_argument, NULL, 'u'},
      {"kind", required_argument, NULL, 'k'},
      {"limit", required_argument, NULL, 'l'},
      {"run", required_argument, NULL, 'r'},
      {"timeout-ms", required_argument, NULL, 'T'},
      {"help", no_argument, NULL, 'h'},
      {0},
  };
  const char *cmd = a->cmd;
  int hk = gnmr__admin_command_find(cmd), c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    uint64_t *num = NULL, max = 0;
    switch (c) {
    case 'j':
      a->f = FMT_JSON;
      break;
    case 'c':
      a->f = FMT_CSV;
      break;
    case 'u':
      a->unit = optarg;
      break;
    case 'k':
      a->kind = optarg;
      break;
    case 'f':
      num = &a->from;
      max = UINT64_MAX;
      break;
    case 't':
      num = &a->to;
      max = UINT64_MAX;
      break;
    case 'l':
      num = &a->limit;
      max = 1000000;
      break;
    case 'r':
      num = &a->run;
      max = INT64_MAX;
      break;
    case 'T':
      num = &a->timeout;
      max = 600000;
      break;
    case 'h':
      command_help(hk, stdout);
      return CLI_OK;
    default:
      fprintf(stderr, "(gnmrctl %s --help: its options)\n", cmd);
      return CLI_USAGE;
    }
    /* an option this command does not take is a mistake, said */
    if (hk >= 0 && c != 'c' &&
        strchr(gnmr_admin_commands[hk].opts, c) == NULL) {
      const char *nm = "?";
      for (size_t i = 0; i < sizeof option_help / sizeof option_help[0]; i++)
        if (option_help[i].letter == c)
          nm = option_help[i].name;
      fprintf(stderr,
              "gnmrctl %s: %.*s is not an option of %s (gnmrctl "
              "%s --help)\n",
              cmd, (int)strcspn(nm, " "), nm, cmd, cmd);
      return CLI_USAGE;
    }
    if (num != NULL && (gnmr__parse_u64(optarg, max, num) != 0 ||
                        ((c == 'T' || c == 'r') && *num == 0))) {
      fprintf(stderr, "gnmrctl %s: '%s' is not a valid number for this "
                      "option\n", cmd, optarg);
      return CLI_USAGE;
    }
  }
  return -1;
}

/* The command and its arguments (a job, set's key=value pairs), and the
 * options together. -1 to go on, else the exit status. */
static int check_query_args(query_args *a, int argc, char **argv) {
  const char *cmd = a->cmd;
  int k = a->k = gnmr__admin_command_find(cmd);
  if (k < 0) {
    fprintf(stderr, "gnmrctl: '%s' is not an admin command\n", cmd);
    return CLI_USAGE;
  }
  int needs_job = gnmr_admin_commands[k].needs_job;
  int rest = argc - optind;
  if (needs_job && rest < 1) {
    fprintf(stderr, "gnmrctl %s: missing JOB\n", cmd);
    command_help(k, stderr);
    return CLI_USAGE;
  }
  if ((!needs_job && rest > 0) ||
      (needs_job && k != GNMR_CMD_SET && rest > 1)) {
    fprintf(stderr, "gnmrctl %s: unexpected argument '%s'\n", cmd,
            argv[optind + needs_job]);
    return CLI_USAGE;
  }
  if (k == GNMR_CMD_SET && rest < 2) {
    fputs("gnmrctl set: give at least one key=value\n", stderr);
    command_help(GNMR_CMD_SET, stderr);
    return CLI_USAGE;
  }
  if (a->to != 0 && a->to < a->from) {
    fprintf(stderr, "gnmrctl %s: --to %llu is below --from %llu\n", cmd,
            (unsigned long long)a->to, (unsigned long long)a->from);
    return CLI_USAGE;
  }
  if (a->f == FMT_CSV && !gnmr_admin_commands[k].csv) {
    fprintf(stderr, "gnmrctl %s: --csv is not available; use --json\n", cmd);
    return CLI_USAGE;
  }
  a->job = needs_job ? argv[optind] : "";
  if (k == GNMR_CMD_SET) {
    a->n_settings = (size_t)(rest - 1);
    a->settings = argv + optind + 1;
  }
  return -1;
}

/* The query answered from the store (--store). */
static int ask_store(const cli_globals *g, const query_args *a) {
  store_query q = {0};
  q.command = a->k;
  q.job = a->job;
  q.unit = a->unit;
  q.kind = a->kind;
  q.from = a->from;
  q.to = a->to;
  q.limit = a->limit ? (uint32_t)a->limit : 1000; /* gnmrd's default */
  q.run = a->run;
  q.view = store_view_job; /* status, units, top: from the last snapshot */
  return from_store(g->store, a->cmd, &q, a->f);
}

/* The query answered by gnmrd, rendered (or streamed, for a command that
 * streams). */
static int ask_gnmrd(const cli_globals *g, const query_args *a) {
  const char *cmd = a->cmd;
  Gnmr__Envelope req = GNMR__ENVELOPE__INIT;
  Gnmr__AdminRequest ar = GNMR__ADMIN_REQUEST__INIT;
  ar.command = (char *)cmd;
  ar.job = (char *)a->job;
  ar.from_step = a->from;
  ar.to_step = a->to;
  ar.unit = (char *)a->unit;
  ar.kind = (char *)a->kind;
  ar.limit = (uint32_t)a->limit;
  ar.run = a->run;
  ar.n_settings = a->n_settings;
  ar.settings = a->settings;
  req.body_case = GNMR__ENVELOPE__BODY_ADMIN_REQUEST;
  req.admin_request = &ar;
  Gnmr__Envelope *env = cli_admin_call(g, &req, (int)a->timeout);
  if (env == NULL)
    return CLI_FAIL;
  if (env->body_case == GNMR__ENVELOPE__BODY_ERROR) {
    fprintf(stderr, "gnmrctl %s: %s\n", cmd, env->error->message);
    gnmr__wire_free(&env);
    return CLI_FAIL;
  }
  if (env->body_case != GNMR__ENVELOPE__BODY_ADMIN_REPLY) {
    fprintf(stderr, "gnmrctl %s: unexpected reply from gnmrd\n", cmd);
    gnmr__wire_free(&env);
    return CLI_FAIL;
  }
  if (gnmr_admin_commands[a->k].stream) /* printed chunk by chunk */
    return export_stream(g, &req, env, (int)a->timeout);
  json_error_t jerr;
  json_t *v = json_loads(env->admin_reply->json, 0, &jerr);
  gnmr__wire_free(&env);
  if (v == NULL) {
    fprintf(stderr, "gnmrctl %s: bad JSON from gnmrd: %s\n", cmd, jerr.text);
    return CLI_FAIL;
  }
  int code = render(a->k, v, a->f);
  json_decref(v);
  return code;
}

int cmd_query(const cli_globals *g, int argc, char **argv) {
  query_args a = {
      .cmd = argv[0], .f = FMT_TABLE, .timeout = 3000, .unit = "", .kind = ""};
  int code = parse_query_options(&a, argc, argv);
  if (code < 0)
    code = check_query_args(&a, argc, argv);
  if (code >= 0)
    return code;
  if (g->store != NULL && g->store[0] != '\0')
    return ask_store(g, &a);
  return ask_gnmrd(g, &a);
}

/* Prints an answer (v) of command k in format f. */
static int render(int k, const json_t *v, enum fmt f) {
  int code = CLI_OK;
  if (f == FMT_JSON || renderers[k] == NULL) {
    json_dumpf(v, stdout, JSON_INDENT(2));
    putchar('\n');
  } else {
    renderers[k](v, f);
  }
  if (fflush(stdout) != 0)
    code = CLI_FAIL;
  return code;
}

/* Whether a gnmrd serves the SQLite store at target (a gnmr.db file):
 * it holds its data directory's gnmrd.lock (flock) while it runs. 1 yes,
 * 0 no, -1 not known (no lock file there, or it cannot be read). */
static int store_served(const char *target) {
  char dir[4200], lock[4300];
  snprintf(dir, sizeof dir, "%s", target);
  char *slash = strrchr(dir, '/');
  if (slash != NULL)
    *slash = '\0';
  else
    snprintf(dir, sizeof dir, ".");
  snprintf(lock, sizeof lock, "%s/gnmrd.lock", dir);
  int fd = open(lock, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return -1;
  int served = -1;
  if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
    served = 0; /* nobody holds it: no gnmrd */
    flock(fd, LOCK_UN);
  } else if (errno == EWOULDBLOCK) {
    served = 1;
  }
  close(fd);
  return served;
}

/* A run the store says is running while no gnmrd serves the store was
 * interrupted (its gnmrd killed): said as "interrupted" in jobs, runs and
 * status read with --store (issue 63: it read "running" for ever). */
static void mark_interrupted(json_t *v) {
  size_t i;
  json_t *row;
  if (json_is_object(v)) {
    json_t *runs = json_object_get(v, "runs");
    if (runs != NULL)
      mark_interrupted(runs);
    const char *st = json_string_value(json_object_get(v, "state"));
    if (st != NULL && strcmp(st, "running") == 0)
      json_object_set_new(v, "state", json_string("interrupted"));
    return;
  }
  json_array_foreach(v, i, row) mark_interrupted(row);
}

/* gnmrctl --store: the history read straight from the database, gnmrd
 * up or not. Only the history's commands: a live job's views and changes
 * need gnmrd. */
static int from_store(const char *where, const char *cmd, store_query *q,
                      enum fmt f) {
  char target[4200];
  struct stat st;
  if (q->command == GNMR_CMD_SET || q->command == GNMR_CMD_FINISH) {
    fprintf(stderr, "gnmrctl %s: not with --store: a job's change goes "
            "to gnmrd (--admin)\n", cmd);
    return CLI_USAGE;
  }
  /* a URL, a SQLite file, or the data directory holding gnmr.db */
  if (!db_target_is_pg(where) && stat(where, &st) == 0 && S_ISDIR(st.st_mode))
    store_target(where, target, sizeof target);
  else
    snprintf(target, sizeof target, "%s", where);
  if (!db_target_is_pg(target) && stat(target, &st) != 0) {
    fprintf(stderr, "gnmrctl %s: %s: %s (give a postgresql:// URL, a "
            "gnmr.db file or its data directory)\n", cmd, target,
            strerror(errno));
    return CLI_FAIL;
  }
  int code = CLI_OK;
  do {
    store_query_run(target, q);
    if (q->code != GNMR_OK) {
      fprintf(stderr, "gnmrctl %s: %s\n", cmd, q->err);
      store_query_clear(q);
      json_decref(q->result);
      return CLI_FAIL;
    }
    if (q->chunk != NULL) { /* export: printed chunk by chunk */
      if (fwrite(q->chunk, 1, q->chunk_len, stdout) != q->chunk_len)
        code = CLI_FAIL;
      free(q->chunk);
      q->chunk = NULL;
    }
  } while (q->more && code == CLI_OK);
  store_query_clear(q);
  if (q->result != NULL) {
    if (!db_target_is_pg(target) && store_served(target) == 0)
      mark_interrupted(q->result);
    code = render(q->command, q->result, f);
    json_decref(q->result);
  } else if (fflush(stdout) != 0) {
    code = CLI_FAIL;
  }
  return code;
}
