/* SPDX-License-Identifier: MIT */
/* rawpeer.h — a raw ZeroMQ DEALER speaking gnmrd's protocol by hand, for
 * the tests that feed gnmrd hostile or wrong input (test_protocol.c,
 * test_hostile.c): send envelopes or bytes, expect an Error, a body or
 * silence. */
#ifndef GNMR_RAWPEER_H
#define GNMR_RAWPEER_H

#include <zmq.h>

#include "testutil.h"
#include "wire.h"

typedef struct raw_peer {
  void *ctx, *sock;
} raw_peer;

static inline raw_peer raw_open(const char *endpoint) {
  raw_peer p;
  int zero = 0, tmo = 5000;
  p.ctx = zmq_ctx_new();
  p.sock = zmq_socket(p.ctx, ZMQ_DEALER);
  zmq_setsockopt(p.sock, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(p.sock, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  ck_assert_int_eq(zmq_connect(p.sock, endpoint), 0);
  return p;
}

/* The same over CURVE, as the holder of the pair pub/sec. */
static inline raw_peer raw_open_curve(const char *endpoint,
                                      const char *server_pub,
                                      const char *pub, const char *sec) {
  raw_peer p;
  int zero = 0, tmo = 5000;
  p.ctx = zmq_ctx_new();
  p.sock = zmq_socket(p.ctx, ZMQ_DEALER);
  zmq_setsockopt(p.sock, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(p.sock, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  zmq_setsockopt(p.sock, ZMQ_CURVE_SERVERKEY, server_pub, 41);
  zmq_setsockopt(p.sock, ZMQ_CURVE_PUBLICKEY, pub, 41);
  zmq_setsockopt(p.sock, ZMQ_CURVE_SECRETKEY, sec, 41);
  ck_assert_int_eq(zmq_connect(p.sock, endpoint), 0);
  return p;
}

static inline void raw_close(raw_peer *p) {
  zmq_close(p->sock);
  zmq_ctx_term(p->ctx);
}

static inline void raw_send(raw_peer *p, const void *buf, size_t len) {
  ck_assert_int_ge(zmq_send(p->sock, buf, len, 0), 0);
}

static inline void raw_send_env(raw_peer *p, Gnmr__Envelope *env) {
  uint8_t *buf;
  size_t len;
  ck_assert_int_eq(gnmr__wire_encode(env, &buf, &len), GNMR_OK);
  raw_send(p, buf, len);
  free(buf);
}

/* How long a reply may take: 5 s, 30 s when gnmrd runs under valgrind. */
static inline int raw_reply_ms(void) {
  return getenv("GNMR_VALGRIND") != NULL ? 30000 : 5000;
}

/* Receives one envelope, or NULL when nothing comes within timeout_ms. */
static inline Gnmr__Envelope *raw_recv(raw_peer *p, int timeout_ms) {
  zmq_setsockopt(p->sock, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
  zmq_msg_t m;
  zmq_msg_init(&m);
  if (zmq_msg_recv(&m, p->sock, 0) < 0) {
    zmq_msg_close(&m);
    return NULL;
  }
  Gnmr__Envelope *env = NULL;
  ck_assert_int_eq(gnmr__wire_decode(zmq_msg_data(&m), zmq_msg_size(&m), &env,
                                     NULL, 0),
                   GNMR_OK);
  zmq_msg_close(&m);
  return env;
}

/* Expects an Error with `code` whose message contains `part`. */
static inline void expect_error(raw_peer *p, int code, const char *part) {
  Gnmr__Envelope *env = raw_recv(p, raw_reply_ms());
  ck_assert_msg(env != NULL, "no reply (expected %s)", gnmr_errname(code));
  ck_assert_msg(env->body_case == GNMR__ENVELOPE__BODY_ERROR,
                "reply is not an Error (expected %s; body %d)",
                gnmr_errname(code), (int)env->body_case);
  ck_assert_msg(env->error->code == code, "code %s, expected %s (%s)",
                gnmr_errname(env->error->code), gnmr_errname(code),
                env->error->message);
  ck_assert_msg(strstr(env->error->message, part) != NULL,
                "message '%s' lacks '%s'", env->error->message, part);
  gnmr__wire_free(&env);
}

static inline void expect_silence(raw_peer *p) {
  Gnmr__Envelope *env = raw_recv(p, 300);
  ck_assert_msg(env == NULL, "unexpected reply (body %d)",
                env ? (int)env->body_case : 0);
}

/* A Hello as an agent that names itself `instance` ("" : none) and says
 * `start` of itself (Hello.start). */
/* A Hello's Envelope as bytes (the caller frees them): hello_xis's, to
 * send again and again without encoding it each time. */
static inline uint8_t *hello_encode(const char *job, uint32_t rank,
                                    uint32_t reporters, char **units,
                                    size_t n, double alpha,
                                    uint32_t barrier_ms, int observer,
                                    const char *instance, uint32_t start,
                                    size_t *len) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Hello h = GNMR__HELLO__INIT;
  Gnmr__Params wp;
  policy_params prm;
  policy_params_default(&prm);
  prm.alpha = alpha;
  prm.warmup_steps = 0;
  gnmr__params_to_wire(&prm, &wp);
  h.protocol = 1;
  h.job = (char *)job;
  h.rank = rank;
  h.reporters = reporters;
  h.n_units = n;
  h.units = units;
  h.params = &wp;
  h.barrier_ms = barrier_ms;
  h.observer = observer;
  h.instance = (char *)instance;
  h.start = start;
  env.body_case = GNMR__ENVELOPE__BODY_HELLO;
  env.hello = &h;
  uint8_t *buf;
  ck_assert_int_eq(gnmr__wire_encode(&env, &buf, len), GNMR_OK);
  return buf;
}

static inline void hello_xis(raw_peer *p, const char *job, uint32_t rank,
                             uint32_t reporters, char **units, size_t n,
                             double alpha, uint32_t barrier_ms, int observer,
                             const char *instance, uint32_t start) {
  size_t len;
  uint8_t *buf = hello_encode(job, rank, reporters, units, n, alpha,
                              barrier_ms, observer, instance, start, &len);
  raw_send(p, buf, len);
  free(buf);
}

/* A Hello as an agent that names itself `instance` ("" : none). */
static inline void hello_xi(raw_peer *p, const char *job, uint32_t rank,
                            uint32_t reporters, char **units, size_t n,
                            double alpha, uint32_t barrier_ms, int observer,
                            const char *instance) {
  hello_xis(p, job, rank, reporters, units, n, alpha, barrier_ms, observer,
            instance, 0);
}

static inline void hello_x(raw_peer *p, const char *job, uint32_t rank,
                    uint32_t reporters, char **units, size_t n, double alpha,
                    uint32_t barrier_ms, int observer) {
  hello_xi(p, job, rank, reporters, units, n, alpha, barrier_ms, observer,
           "");
}

static inline void hello_b(raw_peer *p, const char *job, uint32_t rank,
                    uint32_t reporters, char **units, size_t n, double alpha,
                    uint32_t barrier_ms) {
  hello_x(p, job, rank, reporters, units, n, alpha, barrier_ms, 0);
}

static inline void hello(raw_peer *p, const char *job, uint32_t rank,
                  uint32_t reporters, char **units, size_t n,
                  double alpha) {
  hello_b(p, job, rank, reporters, units, n, alpha, 60000);
}

static inline void report(raw_peer *p, const char *job, uint32_t rank,
                   uint64_t step, double *sumsq, size_t n, uint64_t *nf,
                   size_t n_nf) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Report r = GNMR__REPORT__INIT;
  r.job = (char *)job;
  r.rank = rank;
  r.step = step;
  r.n_sumsq = n;
  r.sumsq = sumsq;
  r.n_nonfinite = n_nf;
  r.nonfinite = nf;
  env.body_case = GNMR__ENVELOPE__BODY_REPORT;
  env.report = &r;
  raw_send_env(p, &env);
}

static inline Gnmr__Envelope *expect_body(raw_peer *p, int body) {
  Gnmr__Envelope *env = raw_recv(p, raw_reply_ms());
  ck_assert_msg(env != NULL, "no reply");
  ck_assert_msg((int)env->body_case == body, "body %d, expected %d%s%s",
                (int)env->body_case, body,
                env->body_case == GNMR__ENVELOPE__BODY_ERROR ? ": " : "",
                env->body_case == GNMR__ENVELOPE__BODY_ERROR
                    ? env->error->message
                    : "");
  return env;
}

/* Sends an AdminRequest for command on job; an export's next chunk when
 * stream is not 0. */
static inline void raw_admin(raw_peer *p, const char *command,
                             const char *job, uint64_t stream,
                             uint64_t chunk) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__AdminRequest r = GNMR__ADMIN_REQUEST__INIT;
  r.command = (char *)command;
  r.job = (char *)job;
  r.stream = stream;
  r.chunk = chunk;
  env.body_case = GNMR__ENVELOPE__BODY_ADMIN_REQUEST;
  env.admin_request = &r;
  raw_send_env(p, &env);
}

#endif /* GNMR_RAWPEER_H */
