/* SPDX-License-Identifier: MIT */
/* gnmr/error.h — the one error table of GNMR.
 * Every library call returns 0 (GNMR_OK) or a negative GNMR_E* code; the same
 * codes travel in protocol Error replies, so their values never change. */
#ifndef GNMR_ERROR_H
#define GNMR_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GNMR_EXPORT __attribute__((visibility("default")))
#else
#define GNMR_EXPORT
#endif

/* XX(name, value, message). Values are part of the wire protocol: append only. */
#define GNMR_ERR_MAP(XX)                                                     \
  XX(OK, 0, "success")                                                       \
  XX(INVAL, -1, "invalid argument")                                          \
  XX(NOMEM, -2, "out of memory")                                             \
  XX(PARSE, -3, "malformed input")                                           \
  XX(RANGE, -4, "value out of range")                                        \
  XX(IO, -5, "input/output error")                                           \
  XX(PROTO, -6, "protocol error")                                            \
  XX(VERSION, -7, "unsupported protocol version")                            \
  XX(NOJOB, -8, "unknown job")                                               \
  XX(NOUNIT, -9, "unknown unit")                                             \
  XX(DUP, -10, "duplicate")                                                  \
  XX(STALE, -11, "stale step")                                               \
  XX(TIMEDOUT, -12, "timed out")                                             \
  XX(CLOSED, -13, "closed or not connected")                                 \
  XX(MISMATCH, -14, "disagrees with the job's settings")                     \
  XX(STORE, -15, "store error")                                              \
  XX(BUSY, -16, "busy, try again")                                           \
  XX(UNSUPPORTED, -17, "unsupported")                                        \
  XX(TOOBIG, -18, "too big")                                                 \
  XX(INTERNAL, -19, "internal error")                                        \
  XX(CUDA, -20, "CUDA error")                                                \
  XX(DENIED, -21, "not allowed for this key")

typedef enum gnmr_err {
#define GNMR__ERR_ENUM(name, value, msg) GNMR_E_##name = (value),
  GNMR_ERR_MAP(GNMR__ERR_ENUM)
#undef GNMR__ERR_ENUM
} gnmr_err;

#define GNMR_OK GNMR_E_OK

/* Message for a code; "unknown error" for values outside the table.
 * Never NULL, static storage, thread-safe. */
GNMR_EXPORT const char *gnmr_strerror(int code);

/* Stable symbolic name ("GNMR_E_PARSE") for a code, or "GNMR_E_UNKNOWN". */
GNMR_EXPORT const char *gnmr_errname(int code);

#ifdef __cplusplus
}
#endif
#endif /* GNMR_ERROR_H */
