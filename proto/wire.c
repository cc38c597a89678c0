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

void gnmr__params_to_wire(const policy_params *p, Gnmr__Params *w) {
  gnmr__params__init(w);
  w->alpha = p->alpha;
  w->beta = p->beta;
  w->window = p->window;
  w->max_active = p->max_active;
  w->lock_steps = p->lock_steps;
  w->warmup_steps = p->warmup_steps;
  w->early_alpha = isnan(p->early_alpha) ? 0 : p->early_alpha;
  w->early_beta = isnan(p->early_beta) ? 0 : p->early_beta;
  w->early_steps = p->early_steps;
}

void gnmr__params_from_wire(const Gnmr__Params *w, policy_params *p) {
  p->alpha = w->alpha;
  p->beta = w->beta;
  p->window = w->window;
  p->max_active = w->max_active;
  p->lock_steps = w->lock_steps;
  p->warmup_steps = w->warmup_steps;
  p->early_alpha = w->early_alpha == 0 ? NAN : w->early_alpha;
  p->early_beta = w->early_beta == 0 ? NAN : w->early_beta;
  p->early_steps = w->early_steps;
}

static int same_threshold(double a, double b) {
  return (isnan(a) && isnan(b)) || a == b;
}

int gnmr__params_equal(const policy_params *a, const policy_params *b) {
  return a->alpha == b->alpha && a->beta == b->beta &&
         same_threshold(a->early_alpha, b->early_alpha) &&
         same_threshold(a->early_beta, b->early_beta) &&
         a->window == b->window && a->max_active == b->max_active &&
         a->lock_steps == b->lock_steps &&
         a->warmup_steps == b->warmup_steps &&
         a->early_steps == b->early_steps;
}
