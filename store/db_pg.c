/* SPDX-License-Identifier: MIT */
/* db_pg.c — the PostgreSQL backend of db.h, through libpq.
 *
 * SQL: "?" and "?N" become "$N" (outside quotes). A parameter bound but not
 * named in the SQL (the store binds a fixed list to SQL that leaves a filter
 * out) is sent typed as text, so that the server does not ask its type.
 * Values travel as text, blobs in binary; results come as text, bytea
 * decoded on demand.
 *
 * A statement runs once with PQexecParams; run again (the writer's step
 * statements, a unit list) it is prepared on the server under its own name
 * and executed with PQexecPrepared. A streamed statement uses single-row
 * mode, so an export reads one row at a time.
 *
 * Connection loss: the error's class is DB_ERR_CONNECTION when the
 * connection is down or the server says so (SQLSTATE class 08, 57P01..3);
 * db_reconnect() resets it, and statements prepare again on first use. */
#include <inttypes.h>
#include <libpq-fe.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "gnmr/error.h"

/* type OIDs (pg_type.h's, stable since PostgreSQL 7) */
#define OID_BOOL 16
#define OID_BYTEA 17
#define OID_INT8 20
#define OID_INT2 21
#define OID_INT4 23
#define OID_TEXT 25
#define OID_OID 26
#define OID_FLOAT4 700
#define OID_FLOAT8 701
#define OID_NUMERIC 1700

typedef struct pg {
  db_conn base;
  PGconn *c;
  char *url;
  unsigned gen;   /* connection generation: prepared names die with it */
  unsigned names; /* prepared statements named so far */
  int err_class;
  char err[512];
} pg;

typedef struct pg_stmt {
  db_stmt base;
  char *sql;     /* with $N parameters */
  int n_sql;     /* the largest $N in sql */
  unsigned char *named; /* [n_sql+1]: $i appears in sql */
  int cap, n;    /* bound values */
  char **vals;
  int *lens, *fmts;
  int stream, running, finished;
  PGresult *res;
  int row, nrows;
  unsigned runs;     /* executions so far */
  char name[24];     /* "" until prepared */
  unsigned prep_gen; /* the generation it was prepared in */
  unsigned char *blob; /* decoded bytea of (blob_row, blob_col) */
  size_t blob_len;
  int blob_row, blob_col;
} pg_stmt;

static const struct db_ops pg_ops;

#define P(d) ((pg *)(d))
#define PS(s) ((pg_stmt *)(s))

static void quiet(void *arg, const char *msg) {
  (void)arg;
  (void)msg; /* NOTICEs (IF NOT EXISTS...) are not errors */
}

/* Records the server's or libpq's message for db_errmsg, one line. */
static void set_err(pg *p, const PGresult *r) {
  const char *m = r ? PQresultErrorMessage(r) : NULL;
  if (m == NULL || m[0] == '\0')
    m = PQerrorMessage(p->c);
  snprintf(p->err, sizeof p->err, "%s", m ? m : "unknown error");
  for (char *q = p->err; *q; q++)
    if (*q == '\n')
      *q = (q[1] == '\0') ? '\0' : ' ';
  const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
  p->err_class = 0;
  if (PQstatus(p->c) == CONNECTION_BAD ||
      (state != NULL && (strncmp(state, "08", 2) == 0 ||
                         strncmp(state, "57P0", 4) == 0)))
    p->err_class = DB_ERR_CONNECTION;
}

static int connect_pg(pg *p, char *err, size_t errlen) {
  /* Over TCP, a peer that vanished shows within about 11 s instead of
   * the kernels' hours: on our side (keepalives, tcp_user_timeout) and on
   * the server's (the same settings for this session, through options),
   * so that the server ends a dead gnmrd's session, and with it its
   * leadership, that soon. The URL may say otherwise (it comes last). */
  const char *const keys[] = {"connect_timeout", "application_name",
                              "keepalives", "keepalives_idle",
                              "keepalives_interval", "keepalives_count",
                              "tcp_user_timeout", "options", "dbname", NULL};
  const char *const vals[] = {
      "5", "gnmrd", "1", "5", "2", "3", "10000",
      "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 "
      "-c tcp_keepalives_count=3 -c tcp_user_timeout=10000",
      p->url, NULL};
  p->c = PQconnectdbParams(keys, vals, 1);
  if (p->c == NULL) {
    snprintf(err, errlen, "out of memory");
    return GNMR_E_NOMEM;
  }
  if (PQstatus(p->c) != CONNECTION_OK) {
    char shown[512];
    db_target_display(p->url, shown, sizeof shown);
    snprintf(err, errlen, "%s: %s", shown, PQerrorMessage(p->c));
    size_t n = strlen(err);
    while (n > 0 && (err[n - 1] == '\n' || err[n - 1] == ' '))
      err[--n] = '\0';
    for (char *q = err; *q; q++)
      if (*q == '\n')
        *q = ' ';
    PQfinish(p->c);
    p->c = NULL;
    return GNMR_E_STORE;
  }
  PQsetNoticeProcessor(p->c, quiet, NULL);
  return GNMR_OK;
}

int db__pg_open(const char *url, unsigned flags, db_conn **out, char *err,
                size_t errlen) {
  (void)flags;
  pg *p = calloc(1, sizeof *p);
  if (p == NULL || (p->url = strdup(url)) == NULL) {
    free(p);
    return GNMR_E_NOMEM;
  }
  p->base.ops = &pg_ops;
  p->base.kind = DB_PG;
  int rv = connect_pg(p, err, errlen);
  if (rv != GNMR_OK) {
    free(p->url);
    free(p);
    return rv;
  }
  *out = &p->base;
  return GNMR_OK;
}

static int pg_exec(db_conn *d, const char *sql) {
  pg *p = P(d);
  PGresult *r = PQexec(p->c, sql);
  ExecStatusType s = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  int ok = s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK;
  if (!ok)
    set_err(p, r);
  PQclear(r);
  return ok ? GNMR_OK : GNMR_E_STORE;
}
static const char *pg_errmsg(db_conn *d) { return P(d)->err; }
static int pg_begin(db_conn *d) { return pg_exec(d, "BEGIN"); }
static int pg_error_class(db_conn *d) { return P(d)->err_class; }
static int pg_reconnect(db_conn *d) {
  pg *p = P(d);
  PQreset(p->c);
  if (PQstatus(p->c) != CONNECTION_OK) {
    set_err(p, NULL);
    p->err_class = DB_ERR_CONNECTION;
    return GNMR_E_STORE;
  }
  PQsetNoticeProcessor(p->c, quiet, NULL);
  p->gen++;
  p->err_class = 0;
  p->err[0] = '\0';
  return GNMR_OK;
}
static void pg_close(db_conn *d) {
  pg *p = P(d);
  PQfinish(p->c);
  free(p->url);
  free(p);
}

/* "?" / "?N" to "$N", outside quotes; counts the largest index. */
static char *translate(const char *sql, int *n_max, unsigned char **named) {
  size_t len = strlen(sql);
  char *out = malloc(len * 7 + 16); /* "?" -> "$65535" at most */
  unsigned char *seen = calloc(1, len + 2);
  if (out == NULL || seen == NULL) {
    free(out);
    free(seen);
    return NULL;
  }
  int next = 0, max = 0;
  char quote = 0;
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    char ch = sql[i];
    if (quote) {
      if (ch == quote)
        quote = 0;
      out[o++] = ch;
    } else if (ch == '\'' || ch == '"') {
      quote = ch;
      out[o++] = ch;
    } else if (ch == '?') {
      int k = 0;
      while (sql[i + 1] >= '0' && sql[i + 1] <= '9' && k < 100000)
        k = k * 10 + (sql[++i] - '0');
      if (k == 0)
        k = ++next;
      if (k > max)
        max = k;
      if ((size_t)k <= len)
        seen[k] = 1;
      o += (size_t)sprintf(out + o, "$%d", k);
    } else {
      out[o++] = ch;
    }
  }
  out[o] = '\0';
  *n_max = max;
  *named = seen;
  return out;
}

static int pg_prepare(db_conn *d, const char *sql, int stream, db_stmt **out) {
  pg *p = P(d);
  pg_stmt *s = calloc(1, sizeof *s);
  *out = NULL;
  if (s == NULL || (s->sql = translate(sql, &s->n_sql, &s->named)) == NULL) {
    free(s);
    snprintf(p->err, sizeof p->err, "out of memory");
    return GNMR_E_NOMEM;
  }
  s->base.ops = &pg_ops;
  s->base.owner = d;
  s->stream = stream;
  s->blob_row = -1;
  *out = &s->base;
  return GNMR_OK;
}

static void clear_result(pg_stmt *s) {
  PQclear(s->res);
  s->res = NULL;
  PQfreemem(s->blob);
  s->blob = NULL;
  s->blob_row = -1;
}

static void pg_reset(db_stmt *st) {
  pg_stmt *s = PS(st);
  pg *p = P(st->owner);
  clear_result(s);
  if (s->stream && s->running && !s->finished) {
    /* the rest of a streamed result: cancelled, then drained */
    PGcancel *cn = PQgetCancel(p->c);
    char buf[128];
    if (cn != NULL) {
      PQcancel(cn, buf, sizeof buf);
      PQfreeCancel(cn);
    }
    PGresult *r;
    while ((r = PQgetResult(p->c)) != NULL)
      PQclear(r);
  }
  s->running = s->finished = 0;
  s->row = s->nrows = 0;
}

static void pg_finalize(db_stmt *st) {
  pg_stmt *s = PS(st);
  pg *p = P(st->owner);
  pg_reset(st);
  if (s->name[0] != '\0' && s->prep_gen == p->gen &&
      PQstatus(p->c) == CONNECTION_OK) {
    char sql[48];
    snprintf(sql, sizeof sql, "DEALLOCATE %s", s->name);
    PQclear(PQexec(p->c, sql));
  }
  for (int i = 0; i < s->cap; i++)
    free(s->vals[i]);
  free(s->vals);
  free(s->lens);
  free(s->fmts);
  free(s->named);
  free(s->sql);
  free(s);
}

/* Makes room for n parameters (new ones unbound: NULL). */
static int grow(pg_stmt *s, int n) {
  if (n <= s->cap)
    return 0;
  int cap = s->cap ? s->cap : 8;
  while (cap < n)
    cap *= 2;
  char **v = realloc(s->vals, (size_t)cap * sizeof *v);
  if (v == NULL)
    return -1;
  s->vals = v;
  int *l = realloc(s->lens, (size_t)cap * sizeof *l);
  if (l == NULL)
    return -1;
  s->lens = l;
  int *f = realloc(s->fmts, (size_t)cap * sizeof *f);
  if (f == NULL)
    return -1;
  s->fmts = f;
  for (int k = s->cap; k < cap; k++) {
    s->vals[k] = NULL;
    s->lens[k] = s->fmts[k] = 0;
  }
  s->cap = cap;
  return 0;
}

/* The slot of parameter i (1-based), its old value freed; -1: none. */
static int slot(pg_stmt *s, int i) {
  if (i < 1 || i > 65535 || grow(s, i) != 0)
    return -1;
  if (i > s->n)
    s->n = i;
  free(s->vals[i - 1]);
  s->vals[i - 1] = NULL;
  s->lens[i - 1] = s->fmts[i - 1] = 0;
  return i - 1;
}

static void bind_str(db_stmt *st, int i, const char *v) {
  pg_stmt *s = PS(st);
  int k = slot(s, i);
  if (k >= 0)
    s->vals[k] = strdup(v);
}
static void pg_bind_int64(db_stmt *st, int i, int64_t v) {
  char buf[24];
  snprintf(buf, sizeof buf, "%" PRId64, v);
  bind_str(st, i, buf);
}
static void pg_bind_double(db_stmt *st, int i, double v) {
  char buf[32];
  if (isinf(v))
    snprintf(buf, sizeof buf, "%s", v > 0 ? "Infinity" : "-Infinity");
  else
    snprintf(buf, sizeof buf, "%.17g", v);
  bind_str(st, i, buf);
}
static void pg_bind_text(db_stmt *st, int i, const char *v) {
  bind_str(st, i, v);
}
static void pg_bind_blob(db_stmt *st, int i, const void *v, size_t n) {
  pg_stmt *s = PS(st);
  int k = slot(s, i);
  if (k < 0 || n > INT32_MAX)
    return;
  if ((s->vals[k] = malloc(n ? n : 1)) != NULL) {
    memcpy(s->vals[k], v, n);
    s->lens[k] = (int)n;
    s->fmts[k] = 1;
  }
}
static void pg_bind_null(db_stmt *st, int i) { slot(PS(st), i); }

/* Sends or runs the statement; the first result lands in s->res. */
static int execute(pg *p, pg_stmt *s) {
  int n = s->n > s->n_sql ? s->n : s->n_sql;
  Oid *types = calloc((size_t)(n > 0 ? n : 1), sizeof *types);
  if (types == NULL || grow(s, n) != 0) {
    free(types);
    snprintf(p->err, sizeof p->err, "out of memory");
    return GNMR_E_NOMEM;
  }
  s->n = n;
  for (int i = 0; i < n; i++)
    types[i] = (i + 1 <= s->n_sql && s->named[i + 1]) ? 0 : OID_TEXT;
  const char *const *vals = (const char *const *)s->vals;
  if (s->stream) {
    if (!PQsendQueryParams(p->c, s->sql, n, types, vals, s->lens, s->fmts,
                           0) ||
        !PQsetSingleRowMode(p->c)) {
      set_err(p, NULL);
      PGresult *r;
      while ((r = PQgetResult(p->c)) != NULL)
        PQclear(r);
      free(types);
      return GNMR_E_STORE;
    }
    s->running = 1;
    free(types);
    return GNMR_OK;
  }
  if (s->runs > 0 && (s->name[0] == '\0' || s->prep_gen != p->gen)) {
    snprintf(s->name, sizeof s->name, "gnmr_%u", ++p->names);
    PGresult *r = PQprepare(p->c, s->name, s->sql, n, types);
    int ok = r && PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok) {
      set_err(p, r);
      s->name[0] = '\0';
    }
    PQclear(r);
    if (!ok) {
      free(types);
      return GNMR_E_STORE;
    }
    s->prep_gen = p->gen;
  }
  s->runs++;
  s->res = s->name[0] != '\0'
               ? PQexecPrepared(p->c, s->name, n, vals, s->lens, s->fmts, 0)
               : PQexecParams(p->c, s->sql, n, types, vals, s->lens, s->fmts,
                              0);
  free(types);
  ExecStatusType st = s->res ? PQresultStatus(s->res) : PGRES_FATAL_ERROR;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    set_err(p, s->res);
    clear_result(s);
    return GNMR_E_STORE;
  }
  s->running = 1;
  s->nrows = PQntuples(s->res);
  s->row = -1;
  return GNMR_OK;
}

static int pg_step(db_stmt *st) {
  pg_stmt *s = PS(st);
  pg *p = P(st->owner);
  if (s->finished)
    return DB_DONE;
  if (!s->running && execute(p, s) != GNMR_OK)
    return GNMR_E_STORE;
  PQfreemem(s->blob);
  s->blob = NULL;
  s->blob_row = -1;
  if (!s->stream) {
    if (++s->row < s->nrows)
      return DB_ROW;
    s->finished = 1;
    return DB_DONE;
  }
  PQclear(s->res);
  s->res = PQgetResult(p->c);
  ExecStatusType t = s->res ? PQresultStatus(s->res) : PGRES_TUPLES_OK;
  if (t == PGRES_SINGLE_TUPLE) {
    s->row = 0;
    return DB_ROW;
  }
  int ok = t == PGRES_TUPLES_OK || t == PGRES_COMMAND_OK;
  if (!ok)
    set_err(p, s->res);
  PQclear(s->res);
  s->res = NULL;
  PGresult *r;
  while ((r = PQgetResult(p->c)) != NULL)
    PQclear(r);
  s->finished = 1;
  return ok ? DB_DONE : GNMR_E_STORE;
}

static int pg_column_count(db_stmt *st) {
  return PS(st)->res ? PQnfields(PS(st)->res) : 0;
}
static const char *pg_column_name(db_stmt *st, int c) {
  return PS(st)->res ? PQfname(PS(st)->res, c) : NULL;
}
static int has_value(pg_stmt *s, int c) {
  return s->res != NULL && s->row >= 0 && s->row < PQntuples(s->res) &&
         c >= 0 && c < PQnfields(s->res) && !PQgetisnull(s->res, s->row, c);
}
static int pg_column_type(db_stmt *st, int c) {
  pg_stmt *s = PS(st);
  if (!has_value(s, c))
    return DB_NULL;
  switch (PQftype(s->res, c)) {
  case OID_BOOL:
  case OID_INT2:
  case OID_INT4:
  case OID_INT8:
  case OID_OID:
    return DB_INT;
  case OID_FLOAT4:
  case OID_FLOAT8:
  case OID_NUMERIC:
    return DB_FLOAT;
  case OID_BYTEA:
    return DB_BLOB;
  default:
    return DB_TEXT;
  }
}
static const char *pg_column_text(db_stmt *st, int c) {
  pg_stmt *s = PS(st);
  return has_value(s, c) ? PQgetvalue(s->res, s->row, c) : NULL;
}
static int64_t pg_column_int64(db_stmt *st, int c) {
  const char *v = pg_column_text(st, c);
  if (v == NULL)
    return 0;
  if (PQftype(PS(st)->res, c) == OID_BOOL) /* "t" or "f" */
    return v[0] == 't';
  return strtoll(v, NULL, 10);
}
static double pg_column_double(db_stmt *st, int c) {
  const char *v = pg_column_text(st, c);
  return v ? strtod(v, NULL) : 0.0; /* strtod reads Infinity and NaN */
}
static const void *pg_column_blob(db_stmt *st, int c) {
  pg_stmt *s = PS(st);
  if (!has_value(s, c))
    return NULL;
  if (s->blob_row != s->row || s->blob_col != c) {
    PQfreemem(s->blob);
    s->blob = PQunescapeBytea((const unsigned char *)PQgetvalue(s->res, s->row,
                                                                c),
                              &s->blob_len);
    s->blob_row = s->blob ? s->row : -1;
    s->blob_col = c;
  }
  return s->blob;
}
static size_t pg_column_bytes(db_stmt *st, int c) {
  pg_stmt *s = PS(st);
  if (!has_value(s, c))
    return 0;
  if (PQftype(s->res, c) == OID_BYTEA)
    return pg_column_blob(st, c) ? s->blob_len : 0;
  return (size_t)PQgetlength(s->res, s->row, c);
}

int db_copies(const db_conn *d) { return d != NULL && d->kind == DB_PG; }

int db_copy_in(db_conn *d, const char *sql, const char *data, size_t len) {
  if (!db_copies(d))
    return GNMR_E_UNSUPPORTED;
  pg *p = P(d);
  PGresult *r = PQexec(p->c, sql);
  if (r == NULL || PQresultStatus(r) != PGRES_COPY_IN) {
    set_err(p, r);
    PQclear(r);
    return GNMR_E_STORE;
  }
  PQclear(r);
  int sent = 1, done = 0;
  for (size_t at = 0; sent && at < len;) {
    size_t n = len - at < ((size_t)1 << 20) ? len - at : (size_t)1 << 20;
    sent = PQputCopyData(p->c, data + at, (int)n) == 1;
    at += n;
  }
  if (!sent)
    set_err(p, NULL);
  /* ended with an error message when the rows did not all go: the
   * server then refuses the COPY, and nothing of it is kept */
  if (PQputCopyEnd(p->c, sent ? NULL : "gnmrd could not send every row") !=
          1 &&
      sent) {
    set_err(p, NULL);
    sent = 0;
  }
  while ((r = PQgetResult(p->c)) != NULL) {
    if (PQresultStatus(r) == PGRES_COMMAND_OK)
      done = 1;
    else if (sent)
      set_err(p, r), sent = 0;
    PQclear(r);
  }
  return sent && done ? GNMR_OK : GNMR_E_STORE;
}

static const struct db_ops pg_ops = {
    pg_exec,        pg_errmsg,        pg_begin,       pg_error_class,
    pg_reconnect,   pg_close,         pg_prepare,     pg_finalize,
    pg_reset,       pg_bind_int64,    pg_bind_double, pg_bind_text,
    pg_bind_blob,   pg_bind_null,     pg_step,        pg_column_count,
    pg_column_name, pg_column_type,   pg_column_int64, pg_column_double,
    pg_column_text, pg_column_blob,   pg_column_bytes,
};
