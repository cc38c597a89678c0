/* SPDX-License-Identifier: MIT */
/* metrics.c — the Prometheus text exposition (format 0.0.4) of gnmrd's
 * counters, decision-latency and store-commit histograms, store queue and
 * per-job gauges. libmicrohttpd runs with MHD_USE_EPOLL and no thread of
 * its own: the loop polls its epoll fd and calls MHD_run(), plus a timer
 * for connection timeouts.
 *
 * A slow client cannot hold the scraper out: MHD's own timeout counts
 * inactivity, so a peer sending a header byte every few seconds would
 * keep a place for ever, and 64 of them every place. Here a connection
 * must send a whole request within METRICS_REQUEST_MS of its start (or
 * of its last answer, for a kept-alive one), else it is cut; and of the
 * connections waiting for their request at most METRICS_WAITING are
 * kept: a new one cuts the oldest. A scraper's request comes whole
 * within a millisecond of its connection, so it is served whatever
 * trickles beside it. Cutting is shutdown(2) of the socket MHD owns: MHD
 * reads the end and closes it itself. */
#include "agents.h"
#include "metrics.h"

#include "num.h"
#include "views.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "gnmr/error.h"
#include "keys.h"
#include "log.h"
#include "text.h"

#define METRICS_REQUEST_MS 3000
#define METRICS_WAITING 32
#define METRICS_CONNECTIONS 128 /* MHD's: room beside the waiting ones */

/* A connection waiting for its request, oldest first. */
typedef struct mconn {
  struct mconn *prev, *next;
  int fd, waiting;
  uint64_t since_ms;
} mconn;

struct metrics {
  struct MHD_Daemon *mhd;
  uv_poll_t poll;
  uv_timer_t timer;
  int open_handles;
  mconn *head, *tail; /* the waiting connections, oldest first */
  unsigned n_waiting;
};

/* A growable text buffer. */
typedef struct text {
  char *p;
  size_t len, cap;
  int oom;
} text;

static void put(text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0,
                      fmt, ap);
    va_end(ap);
    if (n < 0 || t->oom)
      return;
    if (t->p && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = t->cap ? t->cap * 2 : 8192;
    while (cap < t->len + (size_t)n + 1)
      cap *= 2;
    char *np = realloc(t->p, cap);
    if (np == NULL) {
      t->oom = 1;
      return;
    }
    t->p = np;
    t->cap = cap;
  }
}

/* A label value with \, " and newline escaped. */
/* A label value: odd bytes escaped first (text.h), then Prometheus'
 * escapes, so the exposition stays valid UTF-8 whatever a name holds. */
static const char *label(const char *raw, char *buf, size_t cap) {
  char safe[600];
  const char *s = gnmr__printable(raw, 512) ? raw
                                            : gnmr__escape(raw, safe,
                                                           sizeof safe);
  size_t k = 0;
  for (; *s && k + 3 < cap; s++) {
    if (*s == '\\' || *s == '"') {
      buf[k++] = '\\';
      buf[k++] = *s;
    } else if (*s == '\n') {
      buf[k++] = '\\';
      buf[k++] = 'n';
    } else {
      buf[k++] = *s;
    }
  }
  buf[k] = '\0';
  return buf;
}

/* A job's labels: job="NAME", or run="ID" (tenancy: names stay private). */
static const char *job_label(const core_job *j, int by_run, char *buf,
                             size_t cap) {
  char lb[300];
  if (by_run)
    snprintf(buf, cap, "run=\"%llu\"", (unsigned long long)j->run);
  else
    snprintf(buf, cap, "job=\"%s\"", label(j->name, lb, sizeof lb));
  return buf;
}

static void counter(text *t, const char *name, const char *help,
                    uint64_t v) {
  put(t, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name,
      (unsigned long long)v);
}

/* The help of each counter family of more than one row (counters.h). */
static const struct {
  const char *metric, *help;
} family_help[] = {
    {"rejected", "Messages refused or dropped, by reason."},
    {"auth_failures", "Peers refused by CURVE, by kind."},
    {"refused", "Handshakes, Hellos and reports refused, by reason."},
};

static const struct {
  const char *metric, *labels, *help;
  size_t off;
} counter_rows[] = {
#define GNMRD__COUNTER_ROW(field, metric, labels, help)                       \
  {metric, labels, help, offsetof(gnmrd_counters, field)},
    GNMRD_COUNTERS(GNMRD__COUNTER_ROW)
#undef GNMRD__COUNTER_ROW
};

/* Every counter of the table, each family once (its rows need not be
 * next to each other). */
static void counters(text *t, const gnmrd_counters *c) {
  enum { N = sizeof counter_rows / sizeof counter_rows[0] };
  for (size_t i = 0; i < N; i++) {
    const char *m = counter_rows[i].metric, *help = counter_rows[i].help;
    size_t k = 0;
    while (k < i && strcmp(counter_rows[k].metric, m) != 0)
      k++;
    if (k < i)
      continue; /* its family is out already */
    for (size_t f = 0; f < sizeof family_help / sizeof family_help[0]; f++)
      if (strcmp(family_help[f].metric, m) == 0)
        help = family_help[f].help;
    put(t, "# HELP gnmr_%s_total %s\n# TYPE gnmr_%s_total counter\n", m, help,
        m);
    for (size_t j = i; j < N; j++) {
      if (strcmp(counter_rows[j].metric, m) != 0)
        continue;
      uint64_t v;
      memcpy(&v, (const char *)c + counter_rows[j].off, sizeof v);
      if (counter_rows[j].labels[0] != '\0')
        put(t, "gnmr_%s_total{%s} %llu\n", m, counter_rows[j].labels,
            (unsigned long long)v);
      else
        put(t, "gnmr_%s_total %llu\n", m, (unsigned long long)v);
    }
  }
}

static void histogram(text *t, const char *name, const char *help,
                      const uint64_t *buckets, uint64_t count, double sum) {
  uint64_t cum = 0;
  put(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  for (int i = 0; i < LATENCY_N_BUCKETS; i++) {
    cum += buckets[i];
    put(t, "%s_bucket{le=\"%g\"} %llu\n", name, latency_le[i],
        (unsigned long long)cum);
  }
  put(t, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name,
      (unsigned long long)count, name, sum, name, (unsigned long long)count);
}

static void render_jobs(gnmrd *d, text *t);

/* The exposition: gnmrd's own families, then the jobs'. */
static void render(gnmrd *d, text *t) {
  const gnmrd_counters *c = &d->c;
  size_t n_jobs = core_count(&d->jobs);
  store_stats ss = {0};
  jobs_quiesce_all(d); /* the gauges read engines */
  if (d->st)
    store_get_stats(d->st, &ss);
  /* who answers, and since when (issue 63) */
  put(t, "# HELP gnmr_build_info gnmrd's version.\n"
         "# TYPE gnmr_build_info gauge\n"
         "gnmr_build_info{version=\"%s\"} 1\n"
         "# HELP gnmr_start_time_seconds When gnmrd started, in seconds "
         "since the epoch.\n# TYPE gnmr_start_time_seconds gauge\n"
         "gnmr_start_time_seconds %lld\n",
      GNMR_VERSION, (long long)d->started_unix);
  put(t, "# HELP gnmr_jobs Jobs being served.\n# TYPE gnmr_jobs gauge\n"
         "gnmr_jobs %zu\n", n_jobs);
  counters(t, c);
  put(t, "# HELP gnmr_connections Connections open, by endpoint.\n"
         "# TYPE gnmr_connections gauge\n"
         "gnmr_connections{endpoint=\"agents\"} %u\n"
         "gnmr_connections{endpoint=\"admin\"} %u\n",
      server_connections(d->agents), server_connections(d->admin));
  histogram(t, "gnmr_decision_latency_seconds",
            "From a step's first report to its decision.", d->decision_latency.buckets,
            d->decision_latency.count, d->decision_latency.sum);
#define STORE__STAT_METRIC(field, name, metric, type, help)                    \
  put(t, "# HELP gnmr_" metric " " help "\n# TYPE gnmr_" metric " " #type      \
         "\ngnmr_" metric " %llu\n", (unsigned long long)ss.field);
  STORE_STATS(STORE__STAT_METRIC)
#undef STORE__STAT_METRIC
  uint64_t snaps, helped;
  policy_snap_counts(&snaps, &helped);
  counter(t, "gnmr_snapshots_total",
          "Policy-state snapshots, serialized by the store's writer.", snaps);
  counter(t, "gnmr_snapshots_loop_helped_total",
          "Snapshots whose job changed before the writer had them, so the "
          "loop serialized part of them.", helped);
  if (d->st) {
    uint64_t b[LATENCY_N_BUCKETS], count;
    double sum;
    store_commit_histogram(d->st, b, &count, &sum);
    histogram(t, "gnmr_store_commit_seconds", "Time of one batch commit.", b,
              count, sum);
  }
  render_jobs(d, t);
}

/* The per-job families. */
static void render_jobs(gnmrd *d, text *t) {
  size_t pos;
  const core_job *j;
  /* Any local user can read /metrics (plain HTTP on the loopback): with
   * tenancy on, a job is labelled by its run id, never by its name, so that
   * one tenant does not learn the others' job names; an operator maps run
   * ids to names with gnmrctl jobs --json. */
  int by_run = d->allow != NULL && d->allow->tenancy;
  put(t, "# HELP gnmr_job_step Last decided step of a job.\n"
         "# TYPE gnmr_job_step gauge\n");
  char lb[320];
  pos = 0;
  while ((j = core_next_job(&d->jobs, &pos)) != NULL)
    put(t, "gnmr_job_step{%s} %llu\n", job_label(j, by_run, lb, sizeof lb),
        (unsigned long long)j->last_decided);
  put(t, "# HELP gnmr_job_active_units Units on the recovery path.\n"
         "# TYPE gnmr_job_active_units gauge\n");
  pos = 0;
  while ((j = core_next_job(&d->jobs, &pos)) != NULL) {
    view_gauges g;
    views_gauges(j, &g);
    put(t, "gnmr_job_active_units{%s} %u\n",
        job_label(j, by_run, lb, sizeof lb), g.active);
  }
  put(t, "# HELP gnmr_job_units Units of a job.\n"
         "# TYPE gnmr_job_units gauge\n");
  pos = 0;
  while ((j = core_next_job(&d->jobs, &pos)) != NULL)
    put(t, "gnmr_job_units{%s} %u\n", job_label(j, by_run, lb, sizeof lb),
        j->n_units);
  /* what to alert on, per job (issue 48): since this gnmrd serves it */
  static const struct {
    const char *name, *help;
    size_t field; /* a uint64_t of core_job */
  } counters[] = {
      {"gnmr_job_promotions_total", "Units a job moved to the recovery path.",
       offsetof(core_job, promotions)},
      {"gnmr_job_nonfinite_steps_total",
       "Steps of a job decided with a non-finite norm (the steps the "
       "trainer callbacks skip).",
       offsetof(core_job, nonfinite_steps)},
      {"gnmr_job_shadowed_steps_total",
       "Steps of a job at which a recipe measured a unit's low-cost path "
       "as damaged (an FP8 overflow), with no NaN/Inf gradient.",
       offsetof(core_job, shadowed_steps)},
  };
  for (size_t k = 0; k < sizeof counters / sizeof counters[0]; k++) {
    put(t, "# HELP %s %s\n# TYPE %s counter\n", counters[k].name,
        counters[k].help, counters[k].name);
    pos = 0;
    while ((j = core_next_job(&d->jobs, &pos)) != NULL) {
      uint64_t v;
      memcpy(&v, (const char *)j + counters[k].field, sizeof v);
      put(t, "%s{%s} %llu\n", counters[k].name,
          job_label(j, by_run, lb, sizeof lb), (unsigned long long)v);
    }
  }
}

static void unwait(struct metrics *m, mconn *c) {
  if (!c->waiting)
    return;
  if (c->prev)
    c->prev->next = c->next;
  else
    m->head = c->next;
  if (c->next)
    c->next->prev = c->prev;
  else
    m->tail = c->prev;
  c->prev = c->next = NULL;
  c->waiting = 0;
  m->n_waiting--;
}

static void cut(gnmrd *d, mconn *c) {
  unwait(d->metrics, c);
  shutdown(c->fd, SHUT_RDWR);
  d->c.metrics_cut++;
}

/* c waits for a request from now on; the oldest waiting goes past the
 * cap. */
static void wait_request(gnmrd *d, mconn *c) {
  struct metrics *m = d->metrics;
  unwait(m, c);
  c->since_ms = uv_now(d->loop);
  c->prev = m->tail;
  if (m->tail)
    m->tail->next = c;
  else
    m->head = c;
  m->tail = c;
  c->waiting = 1;
  if (++m->n_waiting > METRICS_WAITING)
    cut(d, m->head);
}

static void on_connection(void *cls, struct MHD_Connection *conn,
                          void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
  gnmrd *d = cls;
  mconn *c = *socket_context;
  if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *fi =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    c = fi ? calloc(1, sizeof *c) : NULL;
    if (c == NULL) { /* untracked: MHD's own timeout still holds it */
      *socket_context = NULL;
      return;
    }
    c->fd = fi->connect_fd;
    *socket_context = c;
    wait_request(d, c);
  } else if (c != NULL) { /* MHD_CONNECTION_NOTIFY_CLOSED */
    unwait(d->metrics, c);
    free(c);
    *socket_context = NULL;
  }
}

static mconn *conn_of(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

/* A request answered: a kept-alive connection waits for its next. */
static void on_completed(void *cls, struct MHD_Connection *conn,
                         void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  gnmrd *d = cls;
  mconn *c = conn_of(conn);
  (void)con_cls;
  if (c != NULL && d->metrics != NULL &&
      toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
    wait_request(d, c);
}

/* Cuts the connections whose request is late. */
static void cut_late(gnmrd *d) {
  struct metrics *m = d->metrics;
  uint64_t now = uv_now(d->loop);
  while (m->head != NULL && m->head->since_ms + METRICS_REQUEST_MS <= now)
    cut(d, m->head);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  gnmrd *d = cls;
  struct MHD_Response *r;
  enum MHD_Result rv;
  (void)version;
  (void)upload;
  (void)upload_size;
  (void)con_cls;
  mconn *c = conn_of(conn);
  if (c != NULL) /* its request is whole */
    unwait(d->metrics, c);
  if (strcmp(method, "GET") != 0 || strcmp(url, "/metrics") != 0) {
    static const char nf[] = "not found: GET /metrics\n";
    r = MHD_create_response_from_buffer(sizeof nf - 1, (void *)nf,
                                        MHD_RESPMEM_PERSISTENT);
    rv = MHD_queue_response(conn, MHD_HTTP_NOT_FOUND, r);
    MHD_destroy_response(r);
    return rv;
  }
  text t = {0};
  render(d, &t);
  if (t.oom || t.p == NULL) {
    free(t.p);
    return MHD_NO;
  }
  r = MHD_create_response_from_buffer(t.len, t.p, MHD_RESPMEM_MUST_FREE);
  MHD_add_response_header(r, "Content-Type",
                          "text/plain; version=0.0.4; charset=utf-8");
  rv = MHD_queue_response(conn, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return rv;
}

static void run_mhd(gnmrd *d) { MHD_run(d->metrics->mhd); }
static void poll_cb(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  run_mhd(h->data);
}
static void timer_cb(uv_timer_t *h) {
  cut_late(h->data);
  run_mhd(h->data);
}

int metrics_addr_parse(const char *addr, struct sockaddr_in *sa,
                       char *err, size_t errlen) {
  char host[64];
  uint64_t port;
  const char *colon = strrchr(addr, ':');
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  if (colon == NULL || (size_t)(colon - addr) >= sizeof host ||
      gnmr__parse_u64(colon + 1, 65535, &port) != 0) {
    snprintf(err, errlen, "metrics address '%s': expected HOST:PORT (port "
             "0 to 65535)", addr);
    return GNMR_E_INVAL;
  }
  snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
  if (inet_pton(AF_INET, host, &sa->sin_addr) != 1) {
    snprintf(err, errlen, "metrics address '%s': HOST must be an IPv4 "
                          "address (127.0.0.1, not a name)", addr);
    return GNMR_E_INVAL;
  }
  sa->sin_port = htons((uint16_t)port);
  return GNMR_OK;
}

int metrics_open(gnmrd *d, const char *addr, char *bound, size_t cap,
                 char *err, size_t errlen) {
  struct sockaddr_in sa;
  int rv = metrics_addr_parse(addr, &sa, err, errlen);
  if (rv != GNMR_OK)
    return rv;
  uint16_t port = ntohs(sa.sin_port);
  struct metrics *m = calloc(1, sizeof *m);
  if (m == NULL)
    return GNMR_E_NOMEM;
  m->mhd = MHD_start_daemon(MHD_USE_EPOLL, port, NULL, NULL,
                            on_request, d, MHD_OPTION_SOCK_ADDR, &sa,
                            MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                            MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)METRICS_CONNECTIONS,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, d,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, d,
                            MHD_OPTION_END);
  if (m->mhd == NULL) {
    snprintf(err, errlen, "metrics: cannot listen on %s", addr);
    free(m);
    return GNMR_E_IO;
  }
  const union MHD_DaemonInfo *fd =
      MHD_get_daemon_info(m->mhd, MHD_DAEMON_INFO_EPOLL_FD);
  const union MHD_DaemonInfo *bp =
      MHD_get_daemon_info(m->mhd, MHD_DAEMON_INFO_BIND_PORT);
  d->metrics = m;
  uv_poll_init(d->loop, &m->poll, fd->epoll_fd);
  uv_timer_init(d->loop, &m->timer);
  m->poll.data = m->timer.data = d;
  uv_poll_start(&m->poll, UV_READABLE, poll_cb);
  uv_timer_start(&m->timer, timer_cb, 500, 500);
  char host[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &sa.sin_addr, host, sizeof host);
  snprintf(bound, cap, "http://%s:%u/metrics", host,
           bp ? (unsigned)bp->port : (unsigned)port);
  return GNMR_OK;
}

void metrics_stop(gnmrd *d) {
  struct metrics *m = d->metrics;
  if (m == NULL || m->mhd == NULL)
    return;
  /* the poll goes before MHD closes its epoll fd */
  uv_poll_stop(&m->poll);
  uv_close((uv_handle_t *)&m->poll, NULL);
  uv_close((uv_handle_t *)&m->timer, NULL);
  MHD_stop_daemon(m->mhd);
  m->mhd = NULL;
}

void metrics_clear(gnmrd *d) {
  free(d->metrics);
  d->metrics = NULL;
}
