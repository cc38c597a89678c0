/* SPDX-License-Identifier: MIT */
/* wire.c — envelope encode/decode around protobuf-c (see wire.h). The
 * unpacker bounds nothing by itself: callers bound sizes first
 * (ZMQ_MAXMSGSIZE on sockets) and the schema has no recursion. */
#include "wire.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"

static void set_err(char *err, size_t errlen, const char *msg) {
  if (err != NULL && errlen > 0)
    snprintf(err, errlen, "%s", msg);
}

/* Whether m or a message inside it kept an unknown field numbered 0.
 * protobuf-c's unpacker accepts such fields although field 0 is invalid,
 * and packs them back into bytes it cannot unpack (found by the envelope
 * fuzzer): treat them as malformed input. Only the set member of a oneof
 * is followed, since the members share storage. */
static int has_field_zero(const ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < m->n_unknown_fields; i++)
    if (m->unknown_fields[i].tag == 0)
      return 1;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    const char *base = (const char *)m;
    if (f->type != PROTOBUF_C_TYPE_MESSAGE)
      continue;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)(base + f->quantifier_offset);
      ProtobufCMessage *const *arr =
          *(ProtobufCMessage *const *const *)(base + f->offset);
      for (size_t k = 0; k < n; k++)
        if (arr[k] != NULL && has_field_zero(arr[k]))
          return 1;
      continue;
    }
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
        *(const uint32_t *)(base + f->quantifier_offset) != f->id)
      continue;
    const ProtobufCMessage *sub =
        *(const ProtobufCMessage *const *)(base + f->offset);
    if (sub != NULL && has_field_zero(sub))
      return 1;
  }
  return 0;
}

_Static_assert(GNMR_WIRE_ENVELOPE_REPORT == GNMR__ENVELOPE__BODY_REPORT,
               "Envelope.report's number in wire.h is gnmr.proto's");

size_t gnmr__varint_len(uint64_t v) {
  size_t n = 1;
  for (; v >= 0x80; v >>= 7)
    n++;
  return n;
}

size_t gnmr__varint_put(uint8_t *p, uint64_t v) {
  size_t n = 0;
  for (; v >= 0x80; v >>= 7)
    p[n++] = (uint8_t)(v | 0x80);
  p[n++] = (uint8_t)v;
  return n;
}

int gnmr__varint_get(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; *p < end && shift < 64; shift += 7) {
    uint8_t b = *(*p)++;
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80))
      return 1;
  }
  return 0;
}

int gnmr__wire_skip(const uint8_t **p, const uint8_t *end, unsigned type) {
  uint64_t v;
  switch (type) {
  case GNMR_WIRE_VARINT:
    return gnmr__varint_get(p, end, &v);
  case GNMR_WIRE_I64:
  case GNMR_WIRE_I32:
    v = type == GNMR_WIRE_I64 ? 8 : 4;
    break;
  case GNMR_WIRE_LEN:
    if (!gnmr__varint_get(p, end, &v))
      return 0;
    break;
  default:
    return 0;
  }
  if (v > (uint64_t)(end - *p))
    return 0;
  *p += v;
  return 1;
}

uint64_t gnmr__wire_report_step(const void *buf, size_t len) {
  const uint8_t *p = buf, *end = p + len;
  uint64_t key, n, step;
  while (p < end) {
    if (!gnmr__varint_get(&p, end, &key))
      return 0;
    if (key == GNMR_WIRE_KEY(GNMR_WIRE_ENVELOPE_REPORT, GNMR_WIRE_LEN)) {
      if (!gnmr__varint_get(&p, end, &n) || n > (uint64_t)(end - p))
        return 0;
      const uint8_t *q = p, *qe = p + n;
      while (q < qe) {
        if (!gnmr__varint_get(&q, qe, &key))
          return 0;
        if (key == GNMR_WIRE_KEY(GNMR_WIRE_REPORT_STEP, GNMR_WIRE_VARINT))
          return gnmr__varint_get(&q, qe, &step) ? step : 0;
        if (!gnmr__wire_skip(&q, qe, (unsigned)(key & 7)))
          return 0;
      }
      return 0;
    }
    if (!gnmr__wire_skip(&p, end, (unsigned)(key & 7)))
      return 0;
  }
  return 0;
}

/* Whether a string field of the message on the wire (p, n, with its
 * descriptor) holds a NUL byte: protobuf-c hands strings over as C
 * strings, so "a\0b" would arrive as "a" and pass every later check.
 * Runs after a successful unpack: the wire is well formed. */
static int string_has_nul(const uint8_t *p, size_t n,
                          const ProtobufCMessageDescriptor *d, int depth) {
  const uint8_t *end = p + n;
  uint64_t key, v;
  while (p < end) {
    if (!gnmr__varint_get(&p, end, &key))
      return 0;
    if ((key & 7) != GNMR_WIRE_LEN) {
      if (!gnmr__wire_skip(&p, end, (unsigned)(key & 7)))
        return 0;
      continue;
    }
    const ProtobufCFieldDescriptor *f =
        key >> 3 <= UINT32_MAX
            ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3))
            : NULL;
    if (!gnmr__varint_get(&p, end, &v) || v > (uint64_t)(end - p))
      return 0;
    if (f != NULL && f->type == PROTOBUF_C_TYPE_STRING &&
        memchr(p, 0, (size_t)v) != NULL)
      return 1;
    if (f != NULL && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < 16 &&
        string_has_nul(p, (size_t)v, f->descriptor, depth + 1))
      return 1;
    p += v;
  }
  return 0;
}

int gnmr__wire_peek_body(const void *buf, size_t len) {
  return gnmr__wire_peek(buf, len, NULL, NULL);
}

/* Report.step from a Report's bytes into *step (the last wins; 0 when
 * absent): a later Report in the envelope replaces an earlier one whole,
 * as protobuf-c reads a oneof. Nothing when the bytes do not parse (then
 * the envelope does not decode either). */
static void peek_report_step(const uint8_t *p, const uint8_t *end,
                             uint64_t *step) {
  uint64_t key, v, got = 0;
  int have = 0;
  while (p < end) {
    if (!gnmr__varint_get(&p, end, &key))
      return;
    if (key == GNMR_WIRE_KEY(GNMR_WIRE_REPORT_STEP, GNMR_WIRE_VARINT)) {
      if (!gnmr__varint_get(&p, end, &v))
        return;
      got = v;
      have = 1;
    } else if (!gnmr__wire_skip(&p, end, (unsigned)(key & 7))) {
      return;
    }
  }
  *step = have ? got : 0;
}

int gnmr__wire_peek(const void *buf, size_t len, uint32_t *version,
                    uint64_t *report_step) {
  const uint8_t *p = buf, *end = p + len;
  uint64_t key, v;
  int body = 0;
  if (version != NULL)
    *version = 0;
  if (report_step != NULL)
    *report_step = 0;
  while (p < end) { /* the last of a field wins, as in protobuf */
    const uint8_t *at;
    if (!gnmr__varint_get(&p, end, &key))
      return -1;
    if (key == GNMR_WIRE_KEY(1, GNMR_WIRE_VARINT)) { /* Envelope.version */
      if (!gnmr__varint_get(&p, end, &v))
        return -1;
      if (version != NULL)
        *version = (uint32_t)v; /* as protobuf-c reads a uint32 */
      continue;
    }
    at = p;
    if (!gnmr__wire_skip(&p, end, (unsigned)(key & 7)))
      return -1;
    if ((key & 7) == GNMR_WIRE_LEN && key >> 3 >= 10 && key >> 3 <= 64) {
      body = (int)(key >> 3);
      if (body != GNMR_WIRE_ENVELOPE_REPORT && report_step != NULL)
        *report_step = 0; /* another body member replaces the Report */
      if (body == GNMR_WIRE_ENVELOPE_REPORT && report_step != NULL) {
        uint64_t n;
        if (gnmr__varint_get(&at, p, &n)) /* the length, then the bytes */
          peek_report_step(at, p, report_step);
      }
    }
  }
  return body;
}

int gnmr__wire_decode(const void *buf, size_t len, Gnmr__Envelope **out,
                      char *err, size_t errlen) {
  Gnmr__Envelope *env;
  *out = NULL;
  env = gnmr__envelope__unpack(NULL, len, buf);
  if (env == NULL) {
    set_err(err, errlen, "not a GNMR envelope (protobuf decode failed)");
    return GNMR_E_PARSE;
  }
  if (has_field_zero(&env->base)) {
    set_err(err, errlen, "not a GNMR envelope (field number 0)");
    gnmr__envelope__free_unpacked(env, NULL);
    return GNMR_E_PARSE;
  }
  if (string_has_nul(buf, len, &gnmr__envelope__descriptor, 0)) {
    set_err(err, errlen, "a string (a job or unit name, a command...) "
                         "holds a NUL byte");
    gnmr__envelope__free_unpacked(env, NULL);
    return GNMR_E_PARSE;
  }
  if (env->version != GNMR_PROTOCOL_VERSION) {
    char m[96];
    snprintf(m, sizeof m, "protocol version %u, this side speaks %u",
             env->version, GNMR_PROTOCOL_VERSION);
    set_err(err, errlen, m);
    gnmr__envelope__free_unpacked(env, NULL);
    return GNMR_E_VERSION;
  }
  if (env->body_case == GNMR__ENVELOPE__BODY__NOT_SET) {
    /* Either empty or a body member from a newer peer. */
    set_err(err, errlen,
            env->base.n_unknown_fields ? "unsupported message type"
                                       : "empty message");
    gnmr__envelope__free_unpacked(env, NULL);
    return GNMR_E_UNSUPPORTED;
  }
  *out = env;
  return GNMR_OK;
}

void gnmr__wire_free(Gnmr__Envelope **env) {
  if (env != NULL && *env != NULL) {
    gnmr__envelope__free_unpacked(*env, NULL);
    *env = NULL;
  }
}

size_t gnmr__wire_packed_size(Gnmr__Envelope *env) {
  env->version = GNMR_PROTOCOL_VERSION;
  return gnmr__envelope__get_packed_size(env);
}

size_t gnmr__wire_pack(Gnmr__Envelope *env, uint8_t *buf) {
  env->version = GNMR_PROTOCOL_VERSION;
  return gnmr__envelope__pack(env, buf);
}

int gnmr__wire_encode(Gnmr__Envelope *env, uint8_t **buf, size_t *len) {
  env->version = GNMR_PROTOCOL_VERSION;
  size_t n = gnmr__envelope__get_packed_size(env);
  uint8_t *b = malloc(n ? n : 1);
  if (b == NULL)
    return GNMR_E_NOMEM;
  *len = gnmr__envelope__pack(env, b);
  *buf = b;
  return GNMR_OK;
}

int gnmr__wire_error(int code, const char *message, const char *ref,
                     uint64_t step, uint8_t **buf, size_t *len) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Error e = GNMR__ERROR__INIT;
  e.code = code;
  e.message = (char *)(message ? message : gnmr_strerror(code));
  e.ref = (char *)(ref ? ref : "");
  e.step = step;
  env.body_case = GNMR__ENVELOPE__BODY_ERROR;
  env.error = &e;
  return gnmr__wire_encode(&env, buf, len);
}

/* The fields of Gnmr__Params have the table's names (gnmr/params.h); an
 * unset threshold is 0 on the wire and NAN in policy_params. */
void gnmr__params_to_wire(const policy_params *p, Gnmr__Params *w) {
  gnmr__params__init(w);
#define GNMR__PARAM_TO_WIRE(name, ctype, kind, opt, env, def, inh)          \
  w->name = p->name;
  GNMR_PARAMS_MAP(GNMR__PARAM_TO_WIRE)
#undef GNMR__PARAM_TO_WIRE
#define GNMR__PARAM_UNSET_TO_WIRE(name, ctype, kind, opt, env, def, inh)    \
  if (inh[0] != '\0' && isnan((double)p->name))                             \
    w->name = 0;
  GNMR_PARAMS_MAP(GNMR__PARAM_UNSET_TO_WIRE)
#undef GNMR__PARAM_UNSET_TO_WIRE
}

void gnmr__params_from_wire(const Gnmr__Params *w, policy_params *p) {
#define GNMR__PARAM_FROM_WIRE(name, ctype, kind, opt, env, def, inh)        \
  p->name = w->name;
  GNMR_PARAMS_MAP(GNMR__PARAM_FROM_WIRE)
#undef GNMR__PARAM_FROM_WIRE
  for (int i = 0; i < GNMR_NPARAMS; i++)
    if (policy_param_inherits(i) >= 0 && policy_param_f64(p, i) == 0)
      policy_param_set_f64(p, i, NAN);
}

/* ---- a Report packed around its sums ---------------------------------------- */

void gnmr__report_plan(gnmr__report_layout *pl, const Gnmr__Report *r) {
  Gnmr__Envelope head = GNMR__ENVELOPE__INIT;
  Gnmr__Report pre = GNMR__REPORT__INIT, post = GNMR__REPORT__INIT;
  head.version = GNMR_PROTOCOL_VERSION;
  pre.job = r->job;
  pre.rank = r->rank;
  pre.step = r->step;
  post.n_nonfinite = r->n_nonfinite;
  post.nonfinite = r->nonfinite;
  post.n_not_reported = r->n_not_reported;
  post.not_reported = r->not_reported;
  post.n_shadowed = r->n_shadowed;
  post.shadowed = r->shadowed;
  post.n_measure = r->n_measure;
  post.measure = r->measure;
  post.n_missing = r->n_missing;
  post.missing = r->missing;
  pl->head = head;
  pl->pre = pre;
  pl->post = post;
  pl->sumsq = r->sumsq;
  pl->n = (uint32_t)r->n_sumsq;
  size_t data = 8 * (size_t)pl->n;
  pl->rep_len = gnmr__report__get_packed_size(&pl->pre) +
                (pl->n ? 1 + gnmr__varint_len(data) + data : 0) +
                gnmr__report__get_packed_size(&pl->post);
  pl->len = gnmr__envelope__get_packed_size(&pl->head) + 1 +
            gnmr__varint_len(pl->rep_len) + pl->rep_len;
}

uint8_t *gnmr__report_pack_head(const gnmr__report_layout *pl, uint8_t *out) {
  /* protobuf-c's bytes exactly (fields in number order): the envelope's
   * version, its report holding job, rank, step, then the sums (packed
   * doubles), then nonfinite, not_reported, shadowed, measure and
   * missing */
  uint8_t *o = out;
  o += gnmr__envelope__pack(&pl->head, o);
  *o++ = (uint8_t)GNMR_WIRE_KEY(GNMR_WIRE_ENVELOPE_REPORT, GNMR_WIRE_LEN);
  o += gnmr__varint_put(o, pl->rep_len);
  o += gnmr__report__pack(&pl->pre, o);
  if (pl->n > 0) {
    *o++ = (uint8_t)GNMR_WIRE_KEY(GNMR_WIRE_REPORT_SUMSQ, GNMR_WIRE_LEN);
    o += gnmr__varint_put(o, 8 * (uint64_t)pl->n);
  }
  return o;
}

void gnmr__report_pack_tail(const gnmr__report_layout *pl, uint8_t *o) {
  gnmr__report__pack(&pl->post, o);
}
