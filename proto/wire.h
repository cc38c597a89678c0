/* SPDX-License-Identifier: MIT */
/* wire.h — encoding and first-line validation of GNMR envelopes
 * (proto/gnmr.proto), shared by gnmrd, libgnmr-agent and gnmrctl. Decoding
 * checks the version and that the body is one this side understands;
 * message-specific checks belong to whoever handles the message. */
#ifndef GNMR_WIRE_H
#define GNMR_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "params.h"
#include "proto/gnmr.pb-c.h"

#define GNMR_PROTOCOL_VERSION 1u

/* Decodes len bytes into *out (free with gnmr__wire_free). Errors:
 * GNMR_E_PARSE (not an envelope), GNMR_E_VERSION (version != 1),
 * GNMR_E_UNSUPPORTED (no body, or a body from a newer peer). On error *out
 * is NULL and err (may be NULL) says why. */
int gnmr__wire_decode(const void *buf, size_t len, Gnmr__Envelope **out,
                      char *err, size_t errlen);
void gnmr__wire_free(Gnmr__Envelope **env);

/* The field number of an envelope's body (GNMR__ENVELOPE__BODY_REPORT,
 * ...) read from the wire without decoding it, 0 for none, -1 for bytes
 * that do not parse as protobuf: so that a large message can be refused
 * for what it is before it costs a decode. */
int gnmr__wire_peek_body(const void *buf, size_t len);
/* The same, with the envelope's version (0 when absent) and, for a
 * Report, its step (0 when absent): what a refusal before decoding needs
 * to answer as a decode would (VERSION before anything else; Error.step
 * the Report's). Either pointer may be NULL. */
int gnmr__wire_peek(const void *buf, size_t len, uint32_t *version,
                    uint64_t *report_step);

/* Packs env (its version is set here) into a new malloc'd buffer.
 * Returns 0 or GNMR_E_NOMEM. */
/* Encoding into the caller's buffer: the exact size, then the bytes
 * (buf holds gnmr__wire_packed_size() bytes); both set env->version. */
size_t gnmr__wire_packed_size(Gnmr__Envelope *env);
size_t gnmr__wire_pack(Gnmr__Envelope *env, uint8_t *buf);
int gnmr__wire_encode(Gnmr__Envelope *env, uint8_t **buf, size_t *len);

/* Encodes an Error envelope. */
int gnmr__wire_error(int code, const char *message, const char *ref,
                     uint64_t step, uint8_t **buf, size_t *len);

/* ---- the wire by hand, for the paths that skip protobuf-c --------------
 * The report's fast path (libgnmr-agent packs its sums straight into the
 * message) and the peeks that must not decode megabytes (a Report's step,
 * an envelope's body). The field numbers they use are gnmr.proto's: the
 * envelope's is tied to the generated code at compile time (wire.c), the
 * report's by test_protocol against the generated descriptors. */
#define GNMR_WIRE_ENVELOPE_REPORT 12 /* Envelope.report */
#define GNMR_WIRE_ENVELOPE_HELLO 10  /* Envelope.hello */
#define GNMR_WIRE_HELLO_UNITS 5      /* Hello.units */
#define GNMR_WIRE_REPORT_STEP 3      /* Report.step */
#define GNMR_WIRE_REPORT_SUMSQ 4     /* Report.sumsq (packed doubles) */
enum { GNMR_WIRE_VARINT = 0, GNMR_WIRE_I64 = 1, GNMR_WIRE_LEN = 2,
       GNMR_WIRE_I32 = 5 };
#define GNMR_WIRE_KEY(field, type) ((uint64_t)(field) << 3 | (type))

/* Bytes of v as a varint; writes them at p, returning how many. */
size_t gnmr__varint_len(uint64_t v);
size_t gnmr__varint_put(uint8_t *p, uint64_t v);
/* Reads a varint at *p (below end) and moves past it; 0 when it is
 * truncated or longer than 64 bits. */
int gnmr__varint_get(const uint8_t **p, const uint8_t *end, uint64_t *v);
/* Moves past one field's value of wire type type; 0 when it does not fit
 * or the type is not one proto3 writes. */
int gnmr__wire_skip(const uint8_t **p, const uint8_t *end, unsigned type);
/* The step of an encoded Report envelope, read without decoding it (its
 * sums may be megabytes); 0 when it is no report or does not parse. */
uint64_t gnmr__wire_report_step(const void *buf, size_t len);

/* A Report envelope packed by hand around the caller's sums, which the
 * caller writes itself (libgnmr-agent copies and checks them in one
 * pass): the same bytes as gnmr__wire_pack. */
typedef struct gnmr__report_layout {
  Gnmr__Envelope head; /* version only */
  Gnmr__Report pre;    /* job, rank, step */
  Gnmr__Report post;   /* nonfinite, not_reported */
  const double *sumsq;
  uint32_t n;
  size_t rep_len, len; /* the Report's bytes; the whole envelope's */
} gnmr__report_layout;

/* Lays out the envelope of r (its arrays must outlive the pack). */
void gnmr__report_plan(gnmr__report_layout *pl, const Gnmr__Report *r);
/* Writes the envelope up to its sums and returns where they go: pl->n
 * little-endian doubles, after which gnmr__report_pack_tail writes the
 * rest (pl->len bytes in all). */
uint8_t *gnmr__report_pack_head(const gnmr__report_layout *pl, uint8_t *out);
void gnmr__report_pack_tail(const gnmr__report_layout *pl, uint8_t *after);

/* Parameters between their wire form (0 early thresholds = inherit) and
 * the engine's (NAN = inherit). */
void gnmr__params_to_wire(const policy_params *p, Gnmr__Params *w);
void gnmr__params_from_wire(const Gnmr__Params *w, policy_params *p);

#endif /* GNMR_WIRE_H */
